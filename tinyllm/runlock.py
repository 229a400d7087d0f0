"""The run-directory lock: one live trainer per ``runs/<name>/`` (importable without torch).

The trainer holds an exclusive ``flock`` on ``runs/<name>/.lock`` for its whole life; the kernel
drops it when the process dies, so ``is_locked`` also tells whether a killed worker's trainer is gone.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from .errors import RunLocked

LOCK_NAME = ".lock"


def acquire(run_dir: Path, name: str) -> IO[str]:
    """Take the lock (or raise ``RunLocked``); it lasts until the returned file is closed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / LOCK_NAME, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RunLocked(f"run {name!r} is locked by another live trainer ({run_dir / LOCK_NAME})") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def is_locked(run_dir: Path) -> bool:
    """True while a live process holds the run's lock (probes without keeping it)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (one that cannot be signalled counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not running
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False
