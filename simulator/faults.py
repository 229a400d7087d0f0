"""The fault plan: where the simulated worker dies, driven by one seed (VOPR style).

A *position* is a moment where a real worker could die: right before and right after each
commit of the engine's store, at each step, checkpoint and evaluation of a fake activity, and
at each timer wait of the clock. Positions are numbered in the order they happen over the
whole scenario (all worker lives together). The plan kills at chosen positions by raising
``SimulatedCrash``, a ``BaseException`` the engine does not catch; the simulator then drops
the engine (all in-memory state) and starts a fresh one on the same files.

Faults come only from wrappers of the engine's own interfaces (``Store.before_commit`` /
``after_commit``, the injected clock) and from the fake activities' hook: nothing in
``engine/`` knows it is being simulated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from engine import Store


class SimulatedCrash(BaseException):
    """The worker dies here. Not an ``Exception``, so no ``except Exception`` swallows it."""

    def __init__(self, position: int, kind: str, label: str):
        super().__init__(f"simulated crash at position {position} ({kind} {label})")
        self.position, self.kind, self.label = position, kind, label


@dataclass
class FaultPlan:
    """Numbers the positions and kills at ``kills``; runs ``actions[n]`` at position n first.

    An action gets the position's kind and returns False to be tried again at the next
    position (e.g. a cancel cannot be written while the worker's transaction is open).
    ``trace`` (when ``record``) lists every position as ``(kind, label)``.
    """

    kills: set[int] = field(default_factory=set)
    actions: dict[int, Callable[[str], bool]] = field(default_factory=dict)
    record: bool = False
    count: int = 0
    trace: list[tuple[str, str]] = field(default_factory=list)
    crashes: list[SimulatedCrash] = field(default_factory=list)
    observer: Callable[[int, str, str], None] | None = None  # called at every position (snapshots)
    observe_only: tuple[str, ...] = ()  # when set: the observer sees only these kinds (steps stay in bulk)
    short_wait: bool = False  # a polite stop came at this timer wait: it ends halfway (the rest is waited later)

    def free(self, n: int) -> int:
        """Pass up to ``n`` positions in bulk where nothing happens; return how many passed.

        A fake activity's inner loop asks this before a run of steps: the positions are
        numbered exactly as if ``point`` had been called for each (0 while recording).
        """
        watched = self.observer is not None and (not self.observe_only or "step" in self.observe_only)
        if self.record or watched or n <= 0:
            return 0
        c = self.count
        nxt = min((k for k in self.kills if k >= c), default=None)
        if self.actions:
            a = min(self.actions)
            nxt = a if nxt is None else min(nxt, a)
        m = n if nxt is None else max(0, min(n, nxt - c))
        self.count = c + m
        return m

    def point(self, kind: str, label: str) -> None:
        n = self.count
        self.count = n + 1
        if self.record:
            self.trace.append((kind, label))
        if self.observer is not None and (not self.observe_only or kind in self.observe_only):
            self.observer(n, kind, label)
        action = self.actions.pop(n, None)
        if action is not None and not action(kind):
            self.actions[n + 1] = action
        if n in self.kills:
            crash = SimulatedCrash(n, kind, label)
            self.crashes.append(crash)
            raise crash


def random_kills(seed: int, positions: int, kills: int) -> list[int]:
    """``kills`` increasing kill positions drawn by ``seed``.

    Positions count over every worker life, and each restart adds positions (replays,
    redone steps), so later kills fall within the same expected range: each next kill is
    drawn after the previous one within the uninterrupted run's length.
    """
    rng = random.Random(seed)
    out, at = [], -1
    for _ in range(kills):
        at = at + 1 + rng.randrange(max(positions, 1))
        out.append(at)
    return out


class FaultyStore(Store):
    """The engine's SQLite store with a crash position before and after every commit.

    Same SQL, same transactions, same commit points as ``Store``; a crash raised in
    ``before_commit`` rolls the transaction back, one raised in ``after_commit`` leaves it
    durable, exactly as the store's hook contract says.
    """

    def __init__(self, path, plan: FaultPlan, **kw):
        self.plan = plan
        super().__init__(path, **kw)

    def before_commit(self, label: str) -> None:
        self.plan.point("before-commit", label)

    def after_commit(self, label: str) -> None:
        self.plan.point("after-commit", label)


class FaultyClock:
    """Wraps a clock (a ``VirtualClock``): a crash position at every wait, time delegated.

    The engine waits on a virtual clock by ``advance`` (to the next timer, retry or deadline),
    on a real one by ``sleep``; both are positions.
    """

    def __init__(self, clock, plan: FaultPlan):
        self._clock = clock
        self.plan = plan
        self.virtual = getattr(clock, "virtual", False)

    def now(self) -> float:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        self.plan.point("timer-wait", f"{seconds:g}s")
        self._clock.sleep(self._cut(seconds))

    def advance(self, seconds: float) -> None:
        """The engine's idle wait on a virtual clock (``Engine._wait``): a crash position."""
        self.plan.point("timer-wait", f"{seconds:g}s")
        self._clock.advance(self._cut(seconds))

    def _cut(self, seconds: float) -> float:
        """A polite stop at this wait (``FaultPlan.short_wait``) wakes the engine halfway through it."""
        if self.plan.short_wait:
            self.plan.short_wait = False
            return seconds / 2
        return seconds

    def set(self, t: float) -> None:
        self._clock.set(t)

    def __getattr__(self, name: str):
        return getattr(self._clock, name)
