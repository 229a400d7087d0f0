"""Run a command line as (the body of) an activity: heartbeats on progress only, cancel, no orphans.

The child runs in its own process group (``start_new_session``) with a
parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): if the worker dies,
the kernel kills the child. ``PR_SET_PDEATHSIG`` fires when the *thread* that
forked exits, so ``run_subprocess`` blocks in its calling thread until the
child has ended. Every process of the attempt, grandchildren in their own
sessions included, carries the attempt's tag (``DURABLE_ATTEMPT``, see
engine/_proctree.py): before the child starts, whatever is left of earlier
attempts of the same activity is stopped (SIGTERM, a bounded wait for a
trainer still checkpointing, then SIGKILL), and when the attempt ends, however
it ends, nothing of it is left. The child's pid is recorded with the lease
(``ctx.record_child``) and a recovering worker kills a dead worker's attempt
by its tag before it redelivers it.

Heartbeats mean progress: each new complete line of ``progress_path`` (JSON)
extends the lease; a line naming a ``checkpoint`` not named before is recorded
as the heartbeat's details (the redelivered attempt resumes from it), the
others are liveness lines (``ctx.heartbeat()``, throttled: no history event). A child silent for longer than
the heartbeat timeout is presumed hung: its tree is stopped and the attempt
fails with a retryable ``ProgressTimeout``, so it is redelivered. On
``ctx.cancel_requested`` (a cancel, or this attempt lost its lease) the tree
gets SIGTERM, then SIGKILL after ``term_grace_s``. Exit codes
(contracts/subprocess-activity.md): 0 done, 130 ``Canceled``, 2
``NonRetryableError(type="BadInput")``, anything else a retryable
``SubprocessFailed``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from contracts import exits
from contracts import progress as progress_lines

from . import _proctree as proctree
from ._output import AttemptOutput
from ._errors import Canceled, NonRetryableError, Preempted

log = logging.getLogger("engine")

PR_SET_PDEATHSIG = 1
# the trainer contract's exit codes (contracts/exits.py): 74 = no space, a non-retryable DiskFull; 143 = ctl's
# exit after a polite stop it saved
EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_LOCKED, EXIT_CANCELED, EXIT_PREEMPTED = (
    exits.EXIT_BAD_INPUT,
    exits.EXIT_DISK_FULL,
    exits.EXIT_LOCKED,
    exits.EXIT_CANCELED,
    exits.EXIT_PREEMPTED,
)
STOP_SIGNAL_ENV = "DURABLE_STOP_SIGNAL"  # a signal name the trainer treats as SIGTERM (ctl --stop-signal)

_prctl: ctypes._NamedFuncPointer | None
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


class ProgressTimeout(SubprocessFailed):
    """The command wrote no progress line for longer than the heartbeat timeout: presumed hung (retryable)."""

    type = "ProgressTimeout"


def _preexec(parent_pid: int):
    def setup() -> None:  # runs in the child between fork and exec
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(137)

    return setup


def dies_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen`` whose child is SIGKILLed by the kernel when this process
    dies, however it dies (``PR_SET_PDEATHSIG``, as the runner's children; Linux only). Call it on the
    thread that starts the child and keeps living: the signal fires when that thread exits."""
    return _preexec(os.getpid())


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
            # a malformed progress line is not worth failing the run for; a damaged line that is still JSON
            # (not an object, or a non-finite number) is no heartbeat either (contracts/progress.py)
            value = progress_lines.parse_line(line)
            if value is not None:
                out.append(value)
        return out


def _attempt_tag(ctx: Any) -> str:
    tag = getattr(ctx, "process_tag", None)
    if tag:
        return str(tag)
    return proctree.attempt_tag("", ctx.workflow_id, ctx.activity_id, ctx.attempt)


def _heartbeat_timeout_s(ctx: Any) -> float | None:
    options = getattr(ctx, "options", None)
    return getattr(options, "heartbeat_timeout_s", None)


def _stop_request(ctx: Any) -> Any:
    """The worker's polite stop (engine/_stop.py), or None; a context without one (Temporal's) has none."""
    return getattr(ctx, "stop_request", None)


def _ask_to_stop(pid: int) -> None:
    """SIGTERM (then SIGCONT, so a stopped one can act on it) to the trainer's main process only: its
    loader workers and helpers leave the stop to it (a group signal would kill them under it)."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class _Steps:
    """What the attempt's progress lines say of its steps: the last saved (a checkpoint or the resume),
    the furthest reached, and the ``stopping`` line (the step and signal the trainer stopped at)."""

    def __init__(self) -> None:
        self.saved: int | None = None
        self.checkpoint: str | None = None
        self.reached: int | None = None
        self.stopping: int | None = None
        self.signal: str | None = None

    def see(self, line: dict) -> None:
        step = progress_lines.int_step(line)
        event = line.get("event")
        saved = progress_lines.saved_checkpoint(line)
        if saved is not None:
            # a checkpoint line: tinyllm's have no event, the helper's and the integrations' say "checkpoint"
            # (their other lines carry the newest checkpoint too, at another step: not a save at that step)
            self.saved, self.checkpoint = step, saved
        elif event == "resume" and step is not None and self.saved is None:
            self.saved = step
            if isinstance(line.get("checkpoint"), str):
                self.checkpoint = line["checkpoint"]
        elif event == "stopping":
            self.stopping = step
            if isinstance(line.get("signal"), str):
                self.signal = line["signal"]
        if step is not None and (self.reached is None or step > self.reached):
            self.reached = step


def run_subprocess(
    ctx: Any,
    argv: Sequence[str],
    *,
    progress_path: str | os.PathLike,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    poll_interval_s: float = 0.2,
    term_grace_s: float = 30.0,
    heartbeat_timeout_s: float | None = None,
    tail_bytes: int = 8192,
    output_dir: str | os.PathLike | None = None,
    launcher: Any = None,
) -> SubprocessResult:
    """Run ``argv`` to its end under ``ctx`` (see the module docstring); returns or raises by exit code.

    ``heartbeat_timeout_s`` (None: the activity's) is how long the child may go without a progress
    line before the runner presumes it hung (0: never; the lease still expires without progress).
    ``output_dir``: the child's stdout and stderr go to ``stdout.log`` and ``stderr.log`` there, bounded and
    kept after the attempt (engine/_output.py); None: temporary files, gone with the attempt.
    ``launcher``: a fork server (engine/_forkserver.py) that may start ``argv`` warm; where it declines
    (any doubt), the child is started the ordinary way. Either way it is a fresh process in its own
    session, tagged, with a parent-death signal, and everything below treats it alike.
    """
    tag = _attempt_tag(ctx)
    silence_s = heartbeat_timeout_s if heartbeat_timeout_s is not None else _heartbeat_timeout_s(ctx)
    # an earlier attempt's trainer may still be checkpointing in its SIGTERM grace: wait for it (bounded,
    # heartbeating: the wait ends by itself), never start beside it
    left = proctree.stop(lambda: proctree.of_earlier_attempts(tag), grace_s=term_grace_s, on_wait=ctx.heartbeat)
    if left:
        raise SubprocessFailed(
            f"{argv[0]}: processes of an earlier attempt could not be stopped (pids "
            f"{sorted(left)}); not starting beside them",
            returncode=-1,
            stderr_tail="",
        )
    record = getattr(ctx, "record_child", None)
    if record is not None:
        record(None)  # a worker dying between here and the next record still has its attempt's processes killed
    progress = _Progress(progress_path)
    kept = AttemptOutput(output_dir) if output_dir is not None else None
    out = kept.stdout if kept is not None else tempfile.TemporaryFile()
    err = kept.stderr if kept is not None else tempfile.TemporaryFile()
    child_env = dict(os.environ if env is None else env)
    child_env[proctree.ENV_TAG] = tag
    if os.environ.get(STOP_SIGNAL_ENV) and STOP_SIGNAL_ENV not in child_env:  # ctl --stop-signal: the trainer's too
        child_env[STOP_SIGNAL_ENV] = os.environ[STOP_SIGNAL_ENV]
    proc: Any = None
    if launcher is not None:
        proc = launcher.spawn(argv, cwd=cwd, env=child_env, stdout=out, stderr=err, on_wait=ctx.heartbeat)
    try:
        if proc is None:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_preexec(os.getpid()),
            )
    except (FileNotFoundError, NotADirectoryError, PermissionError) as e:  # the same argv fails the same way again
        out.close()
        err.close()
        raise NonRetryableError(
            f"cannot start {argv[0]!r} (in {cwd or os.getcwd()}): {e.strerror or e}", type="BadInput"
        ) from None
    stopping: str | None = None  # why the attempt is being stopped: "cancel", "preempt" or "hung"
    stop_by: float | None = None  # time.monotonic() by which a stopping child must have exited
    killed_at_grace = False
    steps = _Steps()
    try:
        if record is not None:
            record(proc.pid)
        last_progress = time.monotonic()
        last_checkpoint: str | None = None
        while True:
            try:
                proc.wait(timeout=poll_interval_s)
            except subprocess.TimeoutExpired:
                pass
            for line in progress.new_lines():
                last_progress = time.monotonic()
                steps.see(line)
                ckpt = line.get("checkpoint") if isinstance(line, dict) else None
                if isinstance(ckpt, str) and ckpt and ckpt != last_checkpoint:
                    ctx.heartbeat(line)  # durable details: where a redelivered attempt resumes
                    last_checkpoint = ckpt
                else:
                    ctx.heartbeat()  # liveness (or the same checkpoint again): extends the lease, throttled
            if kept is not None:
                kept.bound()
            if proc.returncode is not None:
                break
            if stopping is None:
                stop = _stop_request(ctx)
                if ctx.cancel_requested:
                    stopping, stop_by = "cancel", time.monotonic() + term_grace_s
                elif stop is not None:
                    left_s = stop.left_s()
                    stopping, stop_by = "preempt", None if left_s is None else time.monotonic() + left_s
                elif silence_s and time.monotonic() - last_progress > silence_s:
                    stopping = "hung"
                    break
                if stopping:  # the trainer finishes its step, checkpoints there and exits: wait for it
                    _ask_to_stop(proc.pid)
            elif stop_by is not None and time.monotonic() >= stop_by:
                killed_at_grace = True  # it did not end within the grace: its whole tree is killed below
                break
    finally:
        # however the attempt ends (done, cancel, hung, lease lost, a crash): nothing of it is left; what a
        # wrapper left behind when a stop's SIGTERM ended it gets the rest of the grace to end too
        ended_by_signal = (proc.poll() or 0) < 0 and stopping in ("cancel", "preempt")
        grace_s = term_grace_s if proc.poll() is None else 0
        if ended_by_signal and not killed_at_grace:
            grace_s = term_grace_s if stop_by is None else max(0.0, stop_by - time.monotonic())
        if killed_at_grace:
            grace_s = 0
        left = proctree.stop(lambda: proctree.of_attempt(tag), groups=[proc.pid], grace_s=grace_s)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if left:
            log.error("processes %s of attempt %s could not be killed", sorted(left), tag)
    rc = proc.wait()  # (it has ended, above): its exit status
    stdout_tail, stderr_tail = _tail(out, tail_bytes), _tail(err, tail_bytes)
    out.close()
    err.close()
    if stopping == "hung":
        raise ProgressTimeout(
            f"{argv[0]} wrote no progress line for {silence_s:g} s; stopped it (exit {rc})",
            returncode=rc,
            stderr_tail=stderr_tail,
        )
    if rc == 0:
        lines = [ln for ln in stdout_tail.splitlines() if ln.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        return SubprocessResult(rc, result, stdout_tail, stderr_tail)
    if stopping == "cancel" and (rc == EXIT_CANCELED or rc in (-signal.SIGTERM, -signal.SIGKILL) or killed_at_grace):
        raise Canceled(f"{argv[0]} stopped on cancel (exit {rc})")
    if stopping == "preempt" or (rc == EXIT_CANCELED and not ctx.cancel_requested):
        # a polite stop: ours (ctl got the signal), or one that reached the trainer directly (its group's)
        stop = _stop_request(ctx)
        name = steps.signal or (stop.signal if stop is not None else None) or "SIGTERM"
        how = (
            "killed: it did not exit within the stop's grace"
            if killed_at_grace
            else "checkpointed and exited"
            if rc == EXIT_CANCELED
            else f"exit {rc} on the stop"
        )
        raise Preempted(
            f"{argv[0]} stopped by {name} ({how})",
            signal=name,
            checkpoint=steps.checkpoint,
            step=steps.saved,
            stopping_step=steps.stopping,
            last_step=steps.reached,
            killed_at_grace=killed_at_grace,
        )
    if rc == EXIT_CANCELED:
        raise Canceled(f"{argv[0]} stopped on cancel (exit {rc})")
    last = next((ln for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    if rc == EXIT_BAD_INPUT:
        raise NonRetryableError(
            last or f"{argv[0]}: bad input (exit 2)",
            type="BadInput",
            details={"returncode": rc, "stderr_tail": stderr_tail[-2000:]},
        )
    if rc == EXIT_DISK_FULL:  # retrying cannot help until space is freed; the run resumes then
        raise NonRetryableError(
            last or f"{argv[0]}: disk full (exit {rc})",
            type="DiskFull",
            details={"returncode": rc, "stderr_tail": stderr_tail[-2000:]},
        )
    what = "run directory locked by another trainer" if rc == EXIT_LOCKED else f"exit {rc}"
    raise SubprocessFailed(f"{argv[0]} failed ({what}): {last}", returncode=rc, stderr_tail=stderr_tail)
