"""A polite stop of a worker: what was asked, and by when every attempt must have ended.

A polite stop (SIGTERM, SIGINT, a preemption signal such as Slurm's ``--signal=B:USR1@N``) is
asked of an engine with ``Engine.request_stop``; it is safe to call from a signal handler (one
assignment). From then on the worker starts nothing new; each attempt in flight is asked to stop
(the subprocess runner sends SIGTERM to its trainer, which finishes its step, checkpoints there and
exits 130) and ends as ``activity_preempted``: not a failure, no retry counted, due again at once
for the next worker. An attempt still running at ``deadline`` is killed (its event says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopRequest:
    """One polite stop of a worker."""

    signal: str
    """The name of the signal that asked for it (``SIGTERM``, ``SIGINT``, ``SIGUSR1``...)."""

    deadline: float | None
    """``time.monotonic()`` by which every attempt must have ended (None: no limit)."""

    at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when it was asked."""

    def left_s(self) -> float | None:
        """Seconds until the deadline (never negative; None: no limit)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


def stop_request(grace_s: float | None, signal: str = "SIGTERM") -> StopRequest:
    """A stop asked now, with ``grace_s`` seconds for the attempts in flight (None: no limit)."""
    now = time.monotonic()
    return StopRequest(signal=signal, deadline=None if grace_s is None else now + grace_s, at=now)
