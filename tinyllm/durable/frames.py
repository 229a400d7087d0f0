"""Per-step frames of ``tinyllm.durable`` and the integrations, written off the training thread.

The training thread hands each step's raw figures (step, wall time, loss, learning rates, a snapshot of
the batch, the test-only fingerprint) to ``FrameWriter.put``: an append to a deque, a microsecond or two.
A background thread turns them into the JSON lines of ``runs/<name>/metrics.jsonl`` (``float.hex`` of
the loss and the learning rates, the batch digest) and writes them in batches, every ``interval_s``.
The file reads exactly as when each frame was written at its step, and nothing a proof reads is weaker:

- order: frames are taken from one deque in order and written under one lock, by the thread or by
  ``flush()`` on the training thread; the lines are in step order;
- a checkpoint: the helper and the integrations ``flush()`` before a checkpoint is written, so every
  frame up to its step is in the file (written to the OS, which a SIGKILL does not lose) before LATEST
  can name it; a resume from it never misses a step's record (``ctl verify-resume`` compares them all).
  Frames a SIGKILL loses are frames after the last checkpoint, which the resume drops anyway;
- the end: ``close()`` writes what is left (the loop's end, a stop's exit 130; ``atexit`` for a script
  that dies of an exception before the loop could close it); ``trainer.hold`` (verify-resume holds a
  trainer at a step until its signal) flushes first, so the poller sees that step's frame;
- the batch digest: the training thread takes a snapshot of the batch (``tinyllm/durable/state.py``'s ``snapshot``:
  tensors cloned on their device, no device sync) and the writer hashes the snapshot: the digest of the
  batch as it was at the step, even for a loop that refills one buffer in place;
- bounded: more than ``max_pending`` frames waiting (a writer that falls behind) are written by the
  training thread itself;
- errors: an error of the writer (a full disk) is raised on the training thread at its next ``put``,
  ``flush`` or ``close``, as a synchronous write would have raised it (one step later at most).

The console line of a step (every ``log_every`` steps) goes the same way: a print to a terminal or a
pipe whose reader lags can take milliseconds (seen: 2 ms a line to a pipe on a loaded machine). The
helper flushes before it prints a line of its own (a stop, the end), so they read in order.

Liveness progress lines are not frames: they stay on the training thread (the contract's "heartbeats mean
progress": a hung loop goes silent).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ..sinks.metrics import JsonlSink

INTERVAL_S = 0.2  # the writer's batch: at most this late in the file (checkpoints and holds flush at once)
MAX_PENDING = 256  # frames waiting before the training thread writes them itself

# a frame's parts: step, wall time, loss, learning rates, batch digest (a string, or a callable the
# writer calls: the digest of a snapshot), extra keys (the test-only state fingerprint), console line?
Frame = tuple[int, float, float, "Sequence[float] | None", "str | Callable[[], str] | None", "dict | None", bool]


def frame_line(frame: Frame) -> str:
    """One line of metrics.jsonl, as the helper wrote it synchronously (same keys, same order)."""
    step, wall, loss, lrs, batch, extra, _ = frame
    out: dict[str, Any] = {"step": step, "time": wall, "train/loss": loss, "train/loss_hex": loss.hex()}
    if lrs:
        out["optim/lr"] = lrs[0]
        out["optim/lr_hex"] = [lr.hex() for lr in lrs]
    if batch is not None:
        out["data/batch"] = batch() if callable(batch) else batch
    if extra:
        out.update(extra)
    return json.dumps(out) + "\n"


class FrameWriter:
    """``metrics.jsonl`` of one run, its frames written by a background thread (see the module docstring).

    ``resumed_step``: frames after it are dropped first (a killed run's lost steps; -1: a fresh run).
    ``name``, ``total_steps``, ``console``: the console line ``<name>: step S/<total> | loss L | lr R``."""

    def __init__(
        self,
        path: Path,
        resumed_step: int,
        *,
        name: str = "",
        total_steps: int = 0,
        console: IO[str] | None = None,
        interval_s: float = INTERVAL_S,
        max_pending: int = MAX_PENDING,
    ):
        self.sink = JsonlSink(path, resumed_step)
        self.name, self.total_steps, self.console = name, int(total_steps), console or sys.stderr
        self.path = path
        self.interval_s, self.max_pending = float(interval_s), int(max_pending)
        self._pending: collections.deque[Frame] = collections.deque()
        self._lock = threading.Lock()  # one writer at a time: the thread or flush()
        self._wake = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.written = 0  # frames in the file so far
        self._pid = os.getpid()  # a forked child (a loader worker) inherits the atexit hook: not its frames
        atexit.register(self._at_exit)

    # -- the training thread -----------------------------------------------------------------

    def put(
        self,
        step: int,
        loss: float,
        lrs: Sequence[float] | None = None,
        batch: str | Callable[[], str] | None = None,
        extra: dict | None = None,
        say: bool = False,
    ) -> None:
        """Queue the frame of ``step`` (cheap: the writer formats and writes it); ``say``: its console line too."""
        if self._error is not None or self._closed:
            self._check()
        self._pending.append((step, time.time(), loss, lrs, batch, extra, say))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="durable-frames", daemon=True)
            self._thread.start()
        if len(self._pending) >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Write every queued frame now (before a checkpoint, a hold, the end); raise the writer's error."""
        with self._lock:
            if self._error is None:
                try:
                    self._write_pending()
                except BaseException as e:  # noqa: BLE001 - raised below, as put() would have
                    self._error = e
        self._check()

    def close(self) -> None:
        """Write what is left, stop the thread, close the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        try:
            with self._lock:
                if self._error is None:
                    self._write_pending()
        finally:
            self.sink.close()
        if self._error is not None:
            raise self._error

    # -- the writer ----------------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ValueError(f"{self.path}: frames put after close()")

    def _write_pending(self) -> None:
        """Format and write the queued frames, in order (the caller holds the lock)."""
        lines, said = [], []
        while True:
            try:
                frame = self._pending.popleft()
            except IndexError:
                break
            lines.append(frame_line(frame))
            if frame[6]:
                said.append(self.console_line(frame))
        if lines:
            self.sink.file.write("".join(lines))
            self.sink.file.flush()
            self.written += len(lines)
        if said:
            self.console.write("".join(said))
            self.console.flush()

    def console_line(self, frame: Frame) -> str:
        step, _, loss, lrs, _, _, _ = frame
        lr = f" | lr {lrs[0]:.3e}" if lrs else ""
        return f"{self.name}: step {step:>6}/{self.total_steps} | loss {loss:.4f}{lr}\n"

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            with self._lock:
                if self._error is not None or self._closed:
                    return
                try:
                    self._write_pending()
                except BaseException as e:  # noqa: BLE001 - raised on the training thread
                    self._error = e
                    return

    def _at_exit(self) -> None:
        if os.getpid() != self._pid:
            return
        with contextlib.suppress(BaseException):  # at exit there is nobody left to tell
            self.close()
