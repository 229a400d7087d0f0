"""``Backend``: what ``ctl``, ``ctl ui`` and the benchmarks drive, on either engine.

Two classes implement it: the embedded engine (``engine.Engine``, over one SQLite file) and the Temporal
adapter (``engine.temporal.TemporalEngine``, over a cluster). It is a ``typing.Protocol``: neither imports
this module (``engine`` imports nothing above it), and a type checker holds them to it
(tests/app/test_backend.py checks it at run time too).

What one backend lacks is said explicitly, never by a missing attribute (no ``hasattr`` in ctl):

- ``store`` / ``owner``: the local SQLite store and this process's lease owner; None where the state
  lives on a cluster (Temporal). Readers that need the local tables (timers, leases, the worker log)
  ask ``store is None``.
- ``polite_stop``: the backend stops its attempts itself on ``request_stop`` (each trainer checkpoints
  the step it is at, the attempt is recorded preempted: engine/_stop.py) and reports ``stop``,
  ``preempted`` and takes ``stop_grace_s``. False (Temporal): ``request_stop`` and setting
  ``stop_grace_s`` raise ``Unsupported``, ``stop`` is None, ``preempted`` empty; ctl/interrupt.py stops
  the trainers below ctl instead.
- ``attempt_overrides``: ``attempt_options`` (a hook ``(workflow_id, activity, scheduled) -> options``)
  changes the options this process's attempts run with (``ctl train --heartbeat-timeout`` on a run
  started with another). False (Temporal): setting a hook raises ``Unsupported``; the recorded
  options apply.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from engine import Event, StepOptions, StopRequest, Store, Unsupported, WorkflowStatus

AttemptOptions = Callable[[str, str, StepOptions], StepOptions]
"""``(workflow_id, activity name, scheduled options) -> options`` of one attempt (``attempt_options``)."""


class Backend(Protocol):
    """The engine surface the application layer and ctl use (see the module docstring)."""

    backend: str  # "embedded" | "temporal"
    polite_stop: bool
    attempt_overrides: bool

    @property
    def store(self) -> Store | None: ...

    @property
    def owner(self) -> dict[str, Any] | None: ...

    def describe(self) -> str:
        """Where the state is kept, for a log line (the database file; the cluster and task queue)."""
        ...

    def start(self, workflow_name: str, workflow_id: str, input: Any = None) -> str: ...

    def status(self, workflow_id: str) -> WorkflowStatus: ...

    def history(self, workflow_id: str, after_seq: int = 0) -> list[Event]: ...

    def cancel(self, workflow_id: str) -> bool: ...

    def list_workflows(self) -> list[WorkflowStatus]: ...

    def list_readable(self) -> tuple[list[WorkflowStatus], list[Any]]:
        """Every workflow whose record can be read, and the damaged records (none on a cluster)."""
        ...

    def generations(self, base: str) -> list[WorkflowStatus]:
        """The workflows ``base``, ``base/2``, ... of a run (app/runs.py), oldest first."""
        ...

    def run_until_complete(self, workflow_id: str, *, timeout_s: float | None = None) -> WorkflowStatus: ...

    def run_forever(self, stop_event: threading.Event | None = None) -> None: ...

    def close(self) -> None: ...

    @property
    def attempt_options(self) -> AttemptOptions | None: ...

    @attempt_options.setter
    def attempt_options(self, hook: AttemptOptions | None) -> None: ...

    def request_stop(self, signal: str = "SIGTERM", *, grace_s: float | None = None) -> None: ...

    @property
    def stop_grace_s(self) -> float | None: ...

    @stop_grace_s.setter
    def stop_grace_s(self, value: float | None) -> None: ...

    @property
    def stop(self) -> StopRequest | None: ...

    @property
    def preempted(self) -> list[dict[str, Any]]: ...


__all__ = ["AttemptOptions", "Backend", "Unsupported"]


if TYPE_CHECKING:  # a type checker holds both backends to the protocol (nothing is imported at run time)
    from engine import Engine
    from engine.temporal.backend import TemporalEngine

    def _both_are_backends(embedded: Engine, temporal: TemporalEngine) -> list[Backend]:
        return [embedded, temporal]
