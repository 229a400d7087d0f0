"""The TensorBoard sink of the metrics reporter (optional extra ``[tensorboard]``).

Writes ``runs/<name>/tensorboard/events.out.tfevents.*``: one event per frame (per step), its
scalars under the same names as ``metrics.jsonl`` (``train/loss``, ``optim/lr``,
``optim/grad_norm``, ``timer/tokens_per_s``, ``val/...``), flushed at every frame so that what
a checkpoint covers is on disk before the checkpoint is.

Resume: before writing, every existing event file is cut back to the steps up to the resumed
step (rewritten to a temporary file, fsynced, renamed over the old one; a file with nothing
left is removed), exactly as ``metrics.jsonl`` is, so a resumed run continues the same step
axis without duplicates; a fresh start (``resumed_step`` -1) drops all of them.

``tensorboard`` is imported only at the sink's first frame (its cut-back then too); without it
``ImportError`` at construction says what to install and the reporter goes on without it.

The events are written by the training loop itself (``EventFile``: the file name, first event and
record framing of ``torch.utils.tensorboard.SummaryWriter``), not by SummaryWriter's writer thread:
that thread woke for every frame and the flush waited for it, 120-150 us of each step (2-3 thread
hand-offs, a third runnable thread beside two OpenMP threads on two cores); now about 30 us per
frame by a micro-benchmark (bench/train.py --only phases: 0.12-0.15 ms of a step for the sink).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import socket
import time
from pathlib import Path

INSTALL_HINT = "pip install 'durable-train[tensorboard]'"


def _imports():
    try:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as e:
        raise ImportError(f"the tensorboard sink needs tensorboard ({INSTALL_HINT}): {e}") from None
    return RawEventFileLoader, Event, Summary, RecordWriter


_FILE_IDS = itertools.count()  # as tensorboard's writer numbers the files of one process


class EventFile:
    """One event file written in the caller's thread: ``events.out.tfevents.<time>.<host>.<pid>.<n>``,
    opened with the ``file_version`` event; ``write`` appends one event and flushes it to the OS."""

    def __init__(self, log_dir: Path):
        _, self._Event, _, RecordWriter = _imports()
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_IDS)}"
        self.path = log_dir / name
        self.file = open(self.path, "wb")
        self.records = RecordWriter(self.file)
        self.write(self._Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, event) -> None:
        self.records.write(event.SerializeToString())
        self.file.flush()

    def summary(self, step: int, summary) -> None:
        self.write(self._Event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self) -> None:
        self.file.close()


def event_files(log_dir: Path) -> list[Path]:
    return sorted(p for p in Path(log_dir).glob("events.out.tfevents.*") if p.is_file())


def cut_back(log_dir: Path, keep_step: int) -> None:
    """Drop every summary event with ``step > keep_step`` from the event files of ``log_dir``."""
    RawEventFileLoader, Event, _, RecordWriter = _imports()
    for path in event_files(log_dir):
        records = list(RawEventFileLoader(str(path)).Load())  # a record torn by a kill is not yielded
        events = [Event.FromString(r) for r in records]
        kept = [r for r, e in zip(records, events) if not e.HasField("summary") or e.step <= keep_step]
        if not any(Event.FromString(r).HasField("summary") for r in kept):
            path.unlink()
            continue
        if len(kept) == len(records):
            continue
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            writer = RecordWriter(f)
            for r in kept:
                writer.write(r)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class TensorBoardSink:
    """Opened at its first frame (or at close when none came): tensorboard's import (a tenth of a
    second) and the cut-back come after the resumed step's first frame, not before it."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, resumed_step: int = -1):
        if importlib.util.find_spec("tensorboard") is None:  # the cheap check; imported when first used
            raise ImportError(f"the tensorboard sink needs tensorboard ({INSTALL_HINT})")
        self.log_dir, self.resumed_step = Path(log_dir), resumed_step
        self.writer: EventFile | None = None

    def _cut_back(self) -> None:
        if self.log_dir.is_dir():
            for stale in self.log_dir.glob(".events.out.tfevents.*.tmp-*"):
                stale.unlink(missing_ok=True)
            cut_back(self.log_dir, self.resumed_step)

    def write(self, step: int, frame: dict) -> None:
        if self.writer is None:
            _, _, self._Summary, _ = _imports()
            self._cut_back()
            self.writer = EventFile(self.log_dir)
        values = [
            self._Summary.Value(tag=k, simple_value=float(v))
            for k, v in frame.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        if values:
            self.writer.summary(step, self._Summary(value=values))

    def close(self) -> None:
        if self.writer is None:
            self._cut_back()  # no frame this time: the files still read as one run
        else:
            self.writer.close()
