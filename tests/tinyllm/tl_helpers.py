"""Helpers of the tinyllm tests: the small test spec, running the real CLI, polling progress.

A module of its own (not conftest): several test folders have a conftest.py, and
``from conftest import ...`` would pick whichever was imported first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL_SPEC = REPO / "specs" / "test-small.json"


def write_spec(path: Path, **changes) -> Path:
    data = json.loads(SMALL_SPEC.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


def tinyllm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinyllm.cli", *args]


def run_tinyllm(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        tinyllm_cmd(*args, "--home", str(home)), capture_output=True, text=True, timeout=timeout, cwd=home
    )


def start_tinyllm(home: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        tinyllm_cmd(*args, "--home", str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=home,
        env={**os.environ, **env} if env else None,
    )


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def wait_for_progress(path: Path, min_step: int, proc: subprocess.Popen, deadline_s: float = 90) -> dict:
    """Poll the progress file until a line with step >= min_step appears (no fixed sleeps)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if "checkpoint" in entry and entry["step"] >= min_step:  # a checkpoint line
                    return entry
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited {proc.returncode} before step {min_step}: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError(f"no progress line with step >= {min_step} within {deadline_s}s")


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def cli_in_process(home: Path, *args: str):
    """The real CLI through click's runner, in this process (no torch import per call): for exit
    codes and messages of checks that happen after the spec loads. Signal handlers are restored."""
    import signal

    from click.testing import CliRunner

    from tinyllm.cli import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return CliRunner().invoke(main, [*args, "--home", str(home)])
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
