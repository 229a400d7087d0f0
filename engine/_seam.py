"""The seam between workflow code and whatever engine runs it.

Workflow code depends only on ``Runtime`` (and activity code only on
``ActivityContext``), so the same functions can later run on another
durable engine (e.g. Temporal) behind an adapter.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ._options import StepOptions

T = TypeVar("T")


class Runtime(Protocol):
    """What a workflow function ``async def f(rt, input)`` may use."""

    @property
    def workflow_id(self) -> str: ...

    def now(self) -> float:
        """Deterministic workflow time (seconds since the epoch), replayed from history."""
        ...

    async def execute_activity(
        self,
        name: str,
        input: Any,
        options: StepOptions,
        *,
        result_type: type[T] | None = None,
    ) -> T | Any:
        """Run activity ``name`` once (by ``options.id``); return its recorded result.

        ``input`` is a pydantic model or a JSON-able value; the result is JSON,
        validated into ``result_type`` (a pydantic model class) when given.
        Raises ``ActivityError`` when it fails for good, ``Canceled`` on cancel,
        ``NondeterminismError`` when the command differs from history.
        """
        ...

    async def sleep(self, seconds: float) -> None:
        """Durable timer: its fire time is recorded; a restart waits only the remainder."""
        ...


class ActivityContext(Protocol):
    """What an activity function ``fn(ctx, input)`` gets."""

    @property
    def workflow_id(self) -> str: ...

    @property
    def activity_id(self) -> str: ...

    @property
    def attempt(self) -> int:
        """1 for the first attempt; also the lease's fencing token."""
        ...

    @property
    def last_heartbeat_details(self) -> Any:
        """The details of the last heartbeat recorded by any earlier attempt (or None)."""
        ...

    @property
    def cancel_requested(self) -> bool: ...

    def heartbeat(self, details: Any = None) -> None:
        """Extend the lease and record ``details`` durably."""
        ...
