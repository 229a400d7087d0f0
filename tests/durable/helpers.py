"""Shared bits of the tests/durable tests: the example trainer's specs, bounded polling."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEADLINE_S = 180


def example_spec(name: str = "spirals", **changes) -> dict:
    spec = json.loads((EXAMPLES / "specs" / "durable.json").read_text())
    spec.update(name=name, **changes)
    return spec


def write_spec(folder: Path, spec: dict) -> Path:
    path = folder / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return path


def wait_for(cond, what: str, proc: subprocess.Popen | None = None, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        time.sleep(0.05)  # a poll interval, not a wait for the outcome
    raise AssertionError(f"timed out waiting for {what}")


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def start_example(spec_path: Path, home: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "durable_train.py"), "--spec", str(spec_path), "--home", str(home), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
