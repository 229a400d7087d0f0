"""Helpers of the observability tests: run ctl as a real process, in a pipe or on a pseudo-terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DEADLINE_S = 180
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours: dropped
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")  # cursor moves: line breaks

SPEC = {
    "name": "mini",
    "steps": 24,
    "seed": 3,
    "eval_every": 12,
    "eval_interval_seconds": 1,
    "checkpoint_every": 3,
    "batch_size": 4,
    "threads": 1,
    "log_every": 6,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
}


def env() -> dict:
    out = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out.pop("CTL_HOME", None)
    return out


def write_spec(home: Path, **over) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    p = home / f"{over.get('name', SPEC['name'])}.json"
    p.write_text(json.dumps({**SPEC, **over}))
    return p


def ctl(home: Path, *args: str, check: bool = True, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
        env={**env(), **(extra_env or {})},
    )
    if check and p.returncode != 0:
        raise AssertionError(f"ctl {' '.join(args)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def wait_for(cond, what: str, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def last_step(metrics: Path) -> int:
    steps = (
        [json.loads(x)["step"] for x in metrics.read_text().splitlines() if x.strip().endswith("}")]
        if metrics.exists()
        else []
    )
    return steps[-1] if steps else 0


def processes_with(needle: str) -> list[int]:
    """Pids whose command line contains ``needle`` (to wait until a killed run's trainer is gone)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return [p for p in out if p != os.getpid()]


class Terminal:
    """A command on a pseudo-terminal (stdin, stdout and stderr are its tty), its screen text collected."""

    def __init__(self, argv: list[str], *, columns: int = 200):
        master, slave = pty.openpty()
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={**env(), "TERM": "xterm-256color", "COLUMNS": str(columns)},
        )
        os.close(slave)
        self.master = master
        self.raw = b""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.raw += data

    @property
    def text(self) -> str:
        with self._lock:
            return CONTROL.sub("\n", SGR.sub("", self.raw.decode(errors="replace")))

    def wait_text(self, pattern: str, what: str) -> re.Match:
        return wait_for(lambda: re.search(pattern, self.text) or self._dead(what), what)

    def _dead(self, what: str) -> None:
        if self.proc.poll() is not None:
            time.sleep(0.3)
            if not self._reader.is_alive():
                raise AssertionError(f"exited {self.proc.returncode} before {what}:\n{self.text[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        try:
            os.close(self.master)
        except OSError:
            pass
