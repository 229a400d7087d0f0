"""The context an activity function ``fn(ctx, input)`` gets (see ``engine._seam.ActivityContext``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ._options import StepOptions


@dataclass
class Lease:
    """One leased attempt: what the worker needs to run it and to record its outcome."""

    workflow_id: str
    activity_id: str
    name: str
    cmd: int
    attempt: int
    input: Any
    options: StepOptions
    details: Any
    started_at: float
    appended: bool = False
    """An event of this attempt (a heartbeat's details) was appended since it was leased."""


class AttemptHooks(Protocol):
    """What a live context asks of the worker that leased its attempt (``engine._attempts.Attempts``)."""

    def process_tag(self, workflow_id: str, activity_id: str, attempt: int) -> str: ...

    def cancel_requested(self, lease: Lease) -> bool: ...

    @property
    def stop(self) -> Any: ...

    def heartbeat(self, lease: Lease, details: Any, now: float) -> None: ...

    def record_child(self, lease: Lease, pid: int | None) -> None: ...


class LiveActivityContext:
    """Backed by the engine's store: heartbeats are durable and fenced by the attempt number."""

    def __init__(self, hooks: AttemptHooks, clock: Any, lease: Lease):
        self._hooks = hooks
        self._lease = lease
        self._last_write = lease.started_at
        self.clock = clock
        """The engine's clock (virtual in tests and the simulator)."""

    @property
    def workflow_id(self) -> str:
        return self._lease.workflow_id

    @property
    def activity_id(self) -> str:
        return self._lease.activity_id

    @property
    def activity_name(self) -> str:
        return self._lease.name

    @property
    def attempt(self) -> int:
        return self._lease.attempt

    @property
    def options(self) -> StepOptions:
        return self._lease.options

    @property
    def process_tag(self) -> str:
        """The tag every process of this attempt carries (engine/_proctree.py)."""
        return self._hooks.process_tag(self._lease.workflow_id, self._lease.activity_id, self._lease.attempt)

    @property
    def last_heartbeat_details(self) -> Any:
        return self._lease.details

    @property
    def cancel_requested(self) -> bool:
        """True once the workflow's cancel was requested (or it ended, or this attempt lost its lease)."""
        return self._hooks.cancel_requested(self._lease)

    @property
    def stop_request(self) -> Any:
        """The worker's polite stop (engine/_stop.py ``StopRequest``), or None: the attempt should end
        as soon as it can (its trainer checkpoints where it is), by the request's deadline."""
        return self._hooks.stop

    def heartbeat(self, details: Any = None) -> None:
        """Record ``details`` (when given) and extend the lease; raises ``LeaseLost`` in a stale attempt.

        A heartbeat without details is throttled (at most one write per quarter
        of the heartbeat timeout, or per 30 s without one).
        """
        now = self.clock.now()
        if details is None:
            hb = self._lease.options.heartbeat_timeout_s
            if now - self._last_write < (hb / 4 if hb else 30.0):
                return
        self._hooks.heartbeat(self._lease, details, now)
        self._last_write = now

    def record_child(self, pid: int | None) -> None:
        """Record a subprocess's pid (None: one is about to start) so that a recovering worker kills
        this attempt's processes if this worker dies."""
        self._hooks.record_child(self._lease, pid)
