"""A durable, replaying workflow engine over one SQLite file.

This module is the engine's one front door. Public surface: ``Engine``, the clocks, ``StepOptions``
/ ``RetryPolicy``, the errors, the ``Runtime`` / ``ActivityContext`` seam, and ``Store`` (the one
transaction helper), and the helpers the app's tools read a home with: ``read_events``,
``damage_report`` / ``DamagedRecord``, ``check_id``, ``owner_dead`` (is a lease's owner gone),
``run_subprocess`` (the activity runner for trainers) with ``read_kept_output`` / ``output_log_path`` /
``OUTPUT_STREAMS`` (the attempt output it keeps: engine/_output.py; ``ctl logs`` reads it), and the process-tree sweep ``ATTEMPT_ENV`` /
``attempt_tag`` / ``scope_of`` / ``kill_attempt`` (tag an attempt's environment, then SIGKILL every process
carrying the tag, also those that left its process group: ctl verify-resume), and the polite stop
(``Engine.request_stop``, ``StopRequest``, ``Preempted``, ``EXIT_PREEMPTED``, ``STOP_SIGNAL_ENV``:
engine/_stop.py).

Every other module here is private (``engine/_*.py``) and may change without notice:
``_engine`` (the public class), which owns a ``_worker.Worker`` (transitions and loop steps), which
owns ``_tx.Transactions``, ``_attempts.Attempts`` and ``_runners.Runners`` as objects; ``_replay``,
``_live_sink``, ``_activity``, ``_store``, ``_history``, ``_schema``, ``_leases``, ``_proctree``,
``_subprocess_runner``, ``_output``, ``_options``, ``_errors``, ``_ids``, ``_seam``, ``_clock``.

Callers outside ``engine/`` import from here only (tests/test_import_graph.py enforces it), or
through one of two other doors:

- ``engine.testing``: the testing door (as ``temporalio.testing``), for the deterministic simulator and
  the tests: the event kinds, replayers, an engine's worker cache and replayer factory, lease owners
  marked dead or live, named one by one with why (engine/testing.py). Crash injection needs none of
  it: it subclasses ``Store`` and overrides ``before_commit`` / ``after_commit`` (the documented fault
  hook, engine/_store.py), passed as ``Engine(store=...)``.
- ``engine.temporal``: a separate optional subpackage (imported lazily, needs the ``temporal`` extra).
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._clock import SystemClock, VirtualClock
from ._errors import (
    ActivityError,
    BadInput,
    Canceled,
    DamagedRecord,
    EngineError,
    LeaseLost,
    NondeterminismError,
    NonRetryableError,
    NotFound,
    Preempted,
    Unsupported,
    WorkflowCanceled,
    WorkflowFailed,
    WorkflowRunning,
    is_canceled,
)
from ._history import Event, read_events
from ._ids import check_id
from ._leases import owner_dead
from ._options import RetryPolicy, StepOptions
from ._reader import ActivityInfo, Reader, WorkflowStatus
from ._seam import ActivityContext, Runtime
from ._stop import StopRequest, stop_request
from ._store import Store, damage_report

if TYPE_CHECKING:  # loaded on first use (``__getattr__`` below); the names as they are, for type checkers
    from ._engine import Engine, ReplayResult, replay_history
    from ._forkserver import ForkServer
    from ._output import STREAMS as OUTPUT_STREAMS, log_path as output_log_path, read_kept as read_kept_output
    from ._proctree import ENV_TAG as ATTEMPT_ENV, attempt_tag, kill_attempt, scope_of
    from ._subprocess_runner import EXIT_PREEMPTED, STOP_SIGNAL_ENV, SubprocessFailed, dies_with_parent, run_subprocess

# The running side (the worker loop, replay, the subprocess runner: ~20 ms of imports on an idle core) is loaded
# when first used, so that a process that only reads a home (``ctl status``, ``ctl history``: ``Reader``) does
# not pay for it. name -> (private module, its name there).
_LAZY = {
    "Engine": ("_engine", "Engine"),
    "ReplayResult": ("_engine", "ReplayResult"),
    "replay_history": ("_engine", "replay_history"),
    "OUTPUT_STREAMS": ("_output", "STREAMS"),
    "output_log_path": ("_output", "log_path"),
    "read_kept_output": ("_output", "read_kept"),
    "ATTEMPT_ENV": ("_proctree", "ENV_TAG"),
    "attempt_tag": ("_proctree", "attempt_tag"),
    "kill_attempt": ("_proctree", "kill_attempt"),
    "scope_of": ("_proctree", "scope_of"),
    "EXIT_PREEMPTED": ("_subprocess_runner", "EXIT_PREEMPTED"),
    "STOP_SIGNAL_ENV": ("_subprocess_runner", "STOP_SIGNAL_ENV"),
    "SubprocessFailed": ("_subprocess_runner", "SubprocessFailed"),
    "dies_with_parent": ("_subprocess_runner", "dies_with_parent"),
    "run_subprocess": ("_subprocess_runner", "run_subprocess"),
    "ForkServer": ("_forkserver", "ForkServer"),
}


def __getattr__(name: str) -> Any:
    """``engine.Engine`` and the other running-side names of ``_LAZY``, imported on first use (PEP 562)."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where[0]}"), where[1])
    globals()[name] = value
    return value


__all__ = [
    "ActivityContext",
    "ActivityError",
    "ForkServer",
    "ActivityInfo",
    "BadInput",
    "Canceled",
    "DamagedRecord",
    "Engine",
    "EngineError",
    "Event",
    "LeaseLost",
    "NondeterminismError",
    "NonRetryableError",
    "NotFound",
    "ReplayResult",
    "RetryPolicy",
    "Runtime",
    "StepOptions",
    "Store",
    "SystemClock",
    "VirtualClock",
    "WorkflowCanceled",
    "WorkflowFailed",
    "WorkflowRunning",
    "WorkflowStatus",
    "check_id",
    "damage_report",
    "is_canceled",
    "owner_dead",
    "read_events",
    "replay_history",
    "run_subprocess",
    "SubprocessFailed",
    "dies_with_parent",
    "ATTEMPT_ENV",
    "attempt_tag",
    "kill_attempt",
    "scope_of",
    "Preempted",
    "StopRequest",
    "stop_request",
    "Unsupported",
    "EXIT_PREEMPTED",
    "STOP_SIGNAL_ENV",
    "OUTPUT_STREAMS",
    "output_log_path",
    "read_kept_output",
    "Reader",
]
