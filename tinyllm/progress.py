"""The ``--progress`` file: JSON lines the engine's runner turns into heartbeats (no torch here; the line format
is the contract's, contracts/progress.py).

Two kinds of line (contracts/subprocess-activity.md):

- a checkpoint line ``{"step", "loss", "loss_hex", "checkpoint", "time"}`` after each checkpoint,
  fsynced: the runner records it as the heartbeat's details, and a redelivered attempt resumes
  from its ``checkpoint``;
- a liveness line ``{"event", "time", ...}`` (``event`` is ``starting``, ``ready`` or ``progress``
  with ``step``, ``loss``, ``last_checkpoint`` when training, ``done``, ``of``, ``unit`` when
  evaluating), at most every ``every_s`` seconds of work: it only extends the lease. It is written by the loop that does the work, never by a side thread,
  so a hung loop goes silent and is stopped once the heartbeat timeout passes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from contracts.progress import format_line

from .diskfull import writing

PROGRESS_EVERY_S = 2.0


class ProgressFile:
    """Appends lines to ``path`` (None: writes nothing)."""

    def __init__(self, path: str | os.PathLike | None, every_s: float = PROGRESS_EVERY_S):
        self.path = Path(path) if path is not None else None
        self.every_s = every_s
        self.last_at = float("-inf")

    def write(self, line: dict[str, Any], *, durable: bool = False) -> None:
        """Append one line (``durable``: fsynced before returning)."""
        if self.path is None:
            return
        with writing(self.path):  # a full disk: DiskFull naming this file (exit 74)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(format_line(line, time.time()))
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        self.last_at = time.monotonic()

    def event(self, event: str, **fields: Any) -> None:
        """A liveness line now."""
        self.write({"event": event, **fields})

    def due(self) -> bool:
        """Whether ``tick`` would write a line now (a caller may skip building its fields otherwise)."""
        return self.path is not None and time.monotonic() - self.last_at >= self.every_s

    def tick(self, **fields: Any) -> None:
        """A ``progress`` liveness line, if ``every_s`` passed since the last line of any kind."""
        if self.due():
            self.event("progress", **fields)


_ACTIVE = ProgressFile(None)  # the command's progress file, for loops deep inside it (evals)


def activate(path: str | os.PathLike | None) -> ProgressFile:
    """Make ``path`` the progress file that ``tick`` writes to; returns it."""
    global _ACTIVE
    _ACTIVE = ProgressFile(path)
    return _ACTIVE


def tick(**fields: Any) -> None:
    """A timed ``progress`` line to the active progress file (a no-op without one)."""
    _ACTIVE.tick(**fields)


def event(name: str, **fields: Any) -> None:
    """A liveness line now, to the active progress file (a no-op without one)."""
    _ACTIVE.event(name, **fields)
