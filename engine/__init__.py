"""A durable, replaying workflow engine over one SQLite file.

Public surface: ``Engine`` (engine/engine.py), the clocks, ``StepOptions`` /
``RetryPolicy``, the errors, the ``Runtime`` / ``ActivityContext`` seam, and
``Store`` (the one transaction helper; subclass it to inject crashes).
"""
from .clock import SystemClock, VirtualClock
from .engine import ActivityInfo, Engine, ReplayResult, WorkflowStatus, replay_history
from .errors import (
    ActivityError,
    BadInput,
    Canceled,
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
from .history import Event
from .options import RetryPolicy, StepOptions
from .seam import ActivityContext, Runtime
from .store import Store

__all__ = [
    "ActivityContext", "ActivityError", "ActivityInfo", "BadInput", "Canceled", "Engine", "EngineError", "Event",
    "LeaseLost", "NondeterminismError", "NonRetryableError", "NotFound", "ReplayResult", "RetryPolicy", "Runtime",
    "StepOptions", "Store", "SystemClock", "VirtualClock", "WorkflowCanceled", "WorkflowFailed", "WorkflowRunning",
    "WorkflowStatus", "is_canceled", "replay_history",
]
