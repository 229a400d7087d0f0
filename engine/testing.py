"""The engine's testing door: what a simulator or a test may reach below the front door, on purpose.

As ``temporalio.testing`` is the SDK's one place for test environments, this module is the one place
outside ``engine/__init__.py`` where code outside ``engine/`` reaches the engine's inside: the
deterministic simulator (``simulator/``) and the tests. Everything here is named one by one, with why;
the private modules (``engine/_*.py``) stay private (tests/test_import_graph.py: nothing outside
``engine/`` and its own tests imports one). What the door opens, and for what:

- **History, as the engine writes it**: the event kinds (``ACTIVITY_SCHEDULED``, ...,
  ``TERMINAL_EVENTS``), ``dumps`` (the JSON text of an event's attrs, byte for byte), ``event_crc``,
  ``event_row`` / ``insert_events`` (write a synthetic history, tests/ui). The simulator's oracle
  reads the kinds; its state keys hash the text.
- **Replayers**: ``Replayer``, ``WorkflowRuntime``, ``DrySink`` (a replay of a workflow's own code
  that runs no activity), ``RECORD_KINDS`` / ``FINAL_ONLY`` (what ``Replayer.record`` does with each
  event type), and an engine's ``registration``, ``cached_replayer`` / ``cached_workflow_ids``,
  ``replayer_factory`` / ``set_replayer_factory`` / ``new_replayer`` (its worker's cache and hook:
  engine/_worker.py), ``worker_idle``, ``stalls`` and ``store_lock`` (held: the engine is between two
  transactions). The simulator replays a recovery dry, and shares
  one replay of a long history among recoveries (simulator/prefix.py, simulator/convergence.py).
- **Lease owners**: ``mark_dead`` / ``mark_live`` (an in-process ``Engine`` killed or paused: its
  leases are redelivered at once, or not), ``keep_parent_pid`` (a recovery forked off the simulator
  is still the same simulated process: its owners keep the parent's pid), ``HOST``.
- **Attempt output**: ``AttemptOutput`` (what the runner keeps of an attempt's stdout/stderr).

Crash injection needs none of this: it subclasses ``Store`` and overrides ``before_commit`` /
``after_commit`` (the front door's documented fault hook, engine/_store.py).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from . import _leases
from ._engine import Engine
from ._history import (
    ACTIVITY_CANCELED,
    ACTIVITY_COMPLETED,
    ACTIVITY_FAILED,
    ACTIVITY_HEARTBEAT,
    ACTIVITY_PREEMPTED,
    ACTIVITY_SCHEDULED,
    ACTIVITY_STARTED,
    ACTIVITY_TIMED_OUT,
    CANCEL_REQUESTED,
    PREEMPTED,
    TERMINAL_EVENTS,
    TIMER_CANCELED,
    TIMER_FIRED,
    TIMER_STARTED,
    WORKFLOW_CANCELED,
    WORKFLOW_COMPLETED,
    WORKFLOW_FAILED,
    WORKFLOW_STARTED,
    Event,
    dumps,
    event_crc,
    event_row,
    insert_events,
)
from ._leases import HOST, mark_dead, mark_live
from ._output import AttemptOutput
from ._replay import _FINAL_ONLY as FINAL_ONLY, _RECORD as RECORD_KINDS, DrySink, Replayer, WorkflowRuntime


def store_lock(eng: Engine) -> Any:
    """The lock ``eng``'s store holds around each transaction: held, the engine is idle between two
    (a consistent read of its database, or a pause while its files are copied)."""
    return eng.store._lock


def worker_idle(eng: Engine) -> bool:
    """``eng``'s worker has no task ready and no activity in flight (a convergence point may be here)."""
    w = eng._worker
    return not w.ready and not w.inflight


def cached_workflow_ids(eng: Engine) -> tuple[str, ...]:
    """The workflows whose replayers ``eng``'s worker keeps, sorted."""
    return tuple(sorted(eng._worker.cache))


def stalls(eng: Engine) -> int:
    """How often ``eng`` found nothing to do while work was due (0 when it never counted)."""
    return getattr(eng, "_stalls", 0)


def registration(eng: Engine, workflow_name: str) -> Any:
    """The registered workflow ``workflow_name`` of ``eng`` (its function and input type), or None."""
    return eng._workflows.get(workflow_name)


def cached_replayer(eng: Engine, workflow_id: str) -> Replayer | None:
    """The replayer ``eng``'s worker keeps for ``workflow_id`` (None: none cached)."""
    return eng._worker.cache.get(workflow_id)


def new_replayer(eng: Engine, reg: Any, workflow_id: str, input_json: str, sink: Any) -> Replayer:
    """A replayer made as ``eng``'s worker makes one (through its current factory)."""
    return eng._worker.new_replayer(reg, workflow_id, input_json, sink)


def replayer_factory(eng: Engine) -> Callable[..., Replayer]:
    """How ``eng``'s worker makes a replayer now (``factory(reg, workflow_id, input_json, sink)``)."""
    return eng._worker.new_replayer


def set_replayer_factory(eng: Engine, factory: Callable[..., Replayer]) -> None:
    """``eng``'s worker makes its replayers with ``factory(reg, workflow_id, input_json, sink)`` from now on."""
    eng._worker.new_replayer = factory


class _ParentPid:
    """``os`` as the lease owners see it in a forked child: the pid is the parent's."""

    def __init__(self, pid: int):
        self._pid = pid

    def getpid(self) -> int:
        return self._pid

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def keep_parent_pid(pid: int) -> None:
    """In a forked child: the engine's lease owners are this process as ``pid`` (its parent's).

    A simulated worker is an ``Engine`` instance, not a process: a killed one is told dead by its
    instance leaving the live set (``mark_dead``), which the engine consults for owners of *this*
    process. A recovery forked off a sweep is that same simulated process (its leases, its events'
    ``worker`` name), so there it keeps the parent's pid."""
    _leases.os = _ParentPid(pid)  # type: ignore[assignment]


__all__ = [
    "ACTIVITY_CANCELED",
    "ACTIVITY_COMPLETED",
    "ACTIVITY_FAILED",
    "ACTIVITY_HEARTBEAT",
    "ACTIVITY_PREEMPTED",
    "ACTIVITY_SCHEDULED",
    "ACTIVITY_STARTED",
    "ACTIVITY_TIMED_OUT",
    "CANCEL_REQUESTED",
    "PREEMPTED",
    "TERMINAL_EVENTS",
    "TIMER_CANCELED",
    "TIMER_FIRED",
    "TIMER_STARTED",
    "WORKFLOW_CANCELED",
    "WORKFLOW_COMPLETED",
    "WORKFLOW_FAILED",
    "WORKFLOW_STARTED",
    "Event",
    "dumps",
    "event_crc",
    "event_row",
    "insert_events",
    "HOST",
    "mark_dead",
    "mark_live",
    "keep_parent_pid",
    "AttemptOutput",
    "FINAL_ONLY",
    "RECORD_KINDS",
    "DrySink",
    "Replayer",
    "WorkflowRuntime",
    "registration",
    "cached_replayer",
    "new_replayer",
    "replayer_factory",
    "set_replayer_factory",
    "cached_workflow_ids",
    "worker_idle",
    "stalls",
    "store_lock",
]
