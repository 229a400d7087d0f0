"""Run a command line as (the body of) an activity: heartbeats from its progress file, cancel, no orphans.

The child runs in its own process group (``start_new_session``) with a
parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): if the worker dies,
the kernel kills the child. ``PR_SET_PDEATHSIG`` fires when the *thread* that
forked exits, so ``run_subprocess`` blocks in its calling thread until the
child has ended. The child's pid is also recorded with the lease
(``ctx.record_child``) so that a recovering worker kills a leftover group
before it redelivers the attempt.

Each new complete line of ``progress_path`` (JSON) becomes
``ctx.heartbeat(line)``; in between, plain heartbeats keep the lease alive.
On ``ctx.cancel_requested`` the group gets SIGTERM, then SIGKILL after
``term_grace_s``. Exit codes (contracts/subprocess-activity.md): 0 done, 130
``Canceled``, 2 ``NonRetryableError(type="BadInput")``, anything else a
retryable ``SubprocessFailed``.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from .errors import Canceled, NonRetryableError

PR_SET_PDEATHSIG = 1
EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 74  # the trainer found no space (contracts/subprocess-activity.md): non-retryable DiskFull
EXIT_LOCKED = 75
EXIT_CANCELED = 130

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


@dataclass
class SubprocessResult:
    returncode: int
    result: Any  # the last stdout line parsed as JSON, or None
    stdout_tail: str
    stderr_tail: str


class SubprocessFailed(Exception):
    """The command exited with a code other than 0, 2 or 130: a retryable failure."""

    type = "SubprocessFailed"

    def __init__(self, message: str, *, returncode: int, stderr_tail: str):
        super().__init__(message)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.details = {"returncode": returncode, "stderr_tail": stderr_tail[-2000:]}


def _preexec(parent_pid: int):
    def setup() -> None:  # runs in the child between fork and exec
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(137)

    return setup


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(f, limit: int) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")


class _Progress:
    """Reads complete new lines of the progress file (starting at its size when the run began)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        self.buf = b""

    def new_lines(self) -> list[Any]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.buf = (self.buf + data).split(b"\n")
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a malformed progress line is not worth failing the run for
        return out


def run_subprocess(
    ctx: Any,
    argv: Sequence[str],
    *,
    progress_path: str | os.PathLike,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    poll_interval_s: float = 0.2,
    term_grace_s: float = 30.0,
    tail_bytes: int = 8192,
) -> SubprocessResult:
    """Run ``argv`` to its end under ``ctx`` (see the module docstring); returns or raises by exit code."""
    progress = _Progress(progress_path)
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        start_new_session=True, preexec_fn=_preexec(os.getpid()),
    )
    try:
        record = getattr(ctx, "record_child", None)
        if record is not None:
            record(proc.pid)
        term_at: float | None = None
        killed = False
        while True:
            try:
                proc.wait(timeout=poll_interval_s)
            except subprocess.TimeoutExpired:
                pass
            for line in progress.new_lines():
                ctx.heartbeat(line)
            if proc.returncode is not None:
                break
            if term_at is None and ctx.cancel_requested:
                _signal_group(proc.pid, signal.SIGTERM)
                term_at = time.monotonic()
            elif term_at is not None and not killed and time.monotonic() - term_at > term_grace_s:
                _signal_group(proc.pid, signal.SIGKILL)
                killed = True
            ctx.heartbeat()
    finally:
        if proc.poll() is None:  # leaving early (lease lost, a crash): stop the child first
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=term_grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # whatever is left of its group
    rc = proc.returncode
    stdout_tail, stderr_tail = _tail(out, tail_bytes), _tail(err, tail_bytes)
    out.close()
    err.close()
    if rc == 0:
        lines = [ln for ln in stdout_tail.splitlines() if ln.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        return SubprocessResult(rc, result, stdout_tail, stderr_tail)
    if rc == EXIT_CANCELED or (term_at is not None and rc in (-signal.SIGTERM, -signal.SIGKILL)):
        raise Canceled(f"{argv[0]} stopped on cancel (exit {rc})")
    last = next((ln for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    if rc == EXIT_BAD_INPUT:
        raise NonRetryableError(last or f"{argv[0]}: bad input (exit 2)", type="BadInput",
                                details={"returncode": rc, "stderr_tail": stderr_tail[-2000:]})
    if rc == EXIT_DISK_FULL:  # retrying cannot help until space is freed; the run resumes then
        raise NonRetryableError(last or f"{argv[0]}: disk full (exit {rc})", type="DiskFull",
                                details={"returncode": rc, "stderr_tail": stderr_tail[-2000:]})
    what = "run directory locked by another trainer" if rc == EXIT_LOCKED else f"exit {rc}"
    raise SubprocessFailed(f"{argv[0]} failed ({what}): {last}", returncode=rc, stderr_tail=stderr_tail)
