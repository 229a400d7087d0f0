"""Injected clocks: the system clock in production, a virtual one in tests and the simulator.

Every time the engine records (event times, lease deadlines, timer fire times,
retry due times) comes from ``clock.now()``; every wait goes through
``clock.sleep()``. With ``VirtualClock`` nothing ever waits for real.
"""

from __future__ import annotations

import threading
import time


class SystemClock:
    """Wall-clock time (seconds since the epoch); ``sleep`` really sleeps."""

    virtual = False

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def advance(self, seconds: float) -> None:
        """A system clock cannot be moved; this just sleeps."""
        self.sleep(seconds)


class VirtualClock:
    """Deterministic time that only moves when told: ``sleep`` and ``advance`` jump forward."""

    virtual = True

    def __init__(self, start: float = 1_700_000_000.0):
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds} s")
        with self._lock:
            self._now += seconds

    def set(self, t: float) -> None:
        """Jump to ``t`` (never backwards)."""
        with self._lock:
            if t > self._now:
                self._now = float(t)
