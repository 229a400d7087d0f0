"""A durable, replaying workflow engine over one SQLite file.

Public surface: ``Engine`` (engine/engine.py), the clocks, ``StepOptions`` /
``RetryPolicy``, the errors, the ``Runtime`` / ``ActivityContext`` seam, and
``Store`` (the one transaction helper; subclass it to inject crashes), and the helpers the app's
tools read a home with: ``read_events``, ``damage_report`` / ``DamagedRecord``, ``check_id``,
``owner_dead`` (is a lease's owner gone) and ``run_subprocess`` (the activity runner for trainers).

Callers outside ``engine/`` import from here only. Two exceptions: ``engine.temporal`` is a
separate optional subpackage (imported lazily, needs the ``temporal`` extra), and the simulator's
deep hooks into the replayer stay ``from engine.replay import ...`` in ``simulator/`` (marked
there); they are not public.
"""
from .clock import SystemClock, VirtualClock
from .engine import ActivityInfo, Engine, ReplayResult, WorkflowStatus, replay_history
from .errors import (
    ActivityError,
    BadInput,
    Canceled,
    DamagedRecord,
    EngineError,
    LeaseLost,
    NondeterminismError,
    NonRetryableError,
    NotFound,
    WorkflowCanceled,
    WorkflowFailed,
    WorkflowRunning,
    is_canceled,
)
from .history import Event, read_events
from .ids import check_id
from .leases import owner_dead
from .options import RetryPolicy, StepOptions
from .seam import ActivityContext, Runtime
from .store import Store, damage_report
from .subprocess_runner import SubprocessFailed, run_subprocess

__all__ = [
    "ActivityContext", "ActivityError", "ActivityInfo", "BadInput", "Canceled", "DamagedRecord", "Engine",
    "EngineError", "Event", "LeaseLost", "NondeterminismError", "NonRetryableError", "NotFound", "ReplayResult",
    "RetryPolicy", "Runtime", "StepOptions", "Store", "SystemClock", "VirtualClock", "WorkflowCanceled",
    "WorkflowFailed", "WorkflowRunning", "WorkflowStatus", "check_id", "damage_report", "is_canceled", "owner_dead",
    "read_events", "replay_history", "run_subprocess", "SubprocessFailed",
]
