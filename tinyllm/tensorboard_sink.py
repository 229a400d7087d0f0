"""The TensorBoard sink of the metrics reporter (optional extra ``[tensorboard]``).

Writes ``runs/<name>/tensorboard/events.out.tfevents.*``: one event per frame (per step), its
scalars under the same names as ``metrics.jsonl`` (``train/loss``, ``optim/lr``,
``optim/grad_norm``, ``timer/tokens_per_s``, ``val/...``), flushed at every frame so that what
a checkpoint covers is on disk before the checkpoint is.

Resume: before writing, every existing event file is cut back to the steps up to the resumed
step (rewritten to a temporary file, fsynced, renamed over the old one; a file with nothing
left is removed), exactly as ``metrics.jsonl`` is, so a resumed run continues the same step
axis without duplicates; a fresh start (``resumed_step`` -1) drops all of them.

``tensorboard`` (and torch's ``torch.utils.tensorboard``) are imported only at the sink's first
frame (its cut-back then too); without them ``ImportError`` at construction says what to install
and the reporter goes on without it.
"""
from __future__ import annotations

import os
from pathlib import Path

INSTALL_HINT = "pip install 'durable-train[tensorboard]'"


def _imports():
    try:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(f"the tensorboard sink needs tensorboard ({INSTALL_HINT}): {e}") from None
    return RawEventFileLoader, Event, Summary, RecordWriter, SummaryWriter


def event_files(log_dir: Path) -> list[Path]:
    return sorted(p for p in Path(log_dir).glob("events.out.tfevents.*") if p.is_file())


def cut_back(log_dir: Path, keep_step: int) -> None:
    """Drop every summary event with ``step > keep_step`` from the event files of ``log_dir``."""
    RawEventFileLoader, Event, _, RecordWriter, _ = _imports()
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
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:  # the cheap check; imported when first used
            raise ImportError(f"the tensorboard sink needs tensorboard ({INSTALL_HINT})")
        self.log_dir, self.resumed_step, self.writer = Path(log_dir), resumed_step, None

    def _cut_back(self) -> None:
        if self.log_dir.is_dir():
            for stale in self.log_dir.glob(".events.out.tfevents.*.tmp-*"):
                stale.unlink(missing_ok=True)
            cut_back(self.log_dir, self.resumed_step)

    def write(self, step: int, frame: dict) -> None:
        if self.writer is None:
            _, _, self._Summary, _, SummaryWriter = _imports()
            self._cut_back()
            self.writer = SummaryWriter(log_dir=str(self.log_dir))
        values = [self._Summary.Value(tag=k, simple_value=float(v)) for k, v in frame.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if values:
            self.writer._get_file_writer().add_summary(self._Summary(value=values), step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is None:
            self._cut_back()  # no frame this time: the files still read as one run
        else:
            self.writer.close()


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file of ``log_dir``, in file order (for tests, plots)."""
    RawEventFileLoader, Event, _, _, _ = _imports()
    out: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(log_dir):
        for record in RawEventFileLoader(str(path)).Load():
            e = Event.FromString(record)
            if e.HasField("summary"):
                for v in e.summary.value:
                    out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out
