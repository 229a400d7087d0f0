"""The application layer under ``ctl``: starting, attaching to and continuing runs; no click, no rich.

``ctl`` (click, rendering, the terminal), ``ctl ui`` and the benchmarks drive runs through this package;
it drives the workflows (``workflows``) on a backend (``app.backend.Backend``: the embedded engine or the
Temporal adapter). Dependencies point one way: ``ctl -> app -> workflows -> engine``.

Modules: ``runs`` (home, generations ``train/x/2``, the start-request diff, outcomes), ``requests`` (the
typed request built once from a spec), ``training`` (``ctl train``'s orchestration: tracer, heartbeat
overrides, MLflow status), ``backend`` (the ``Backend`` protocol), ``backends`` (which one this command
drives), ``runview`` (the run read-model), ``traces`` (OpenTelemetry spans; the optional [trace] extra,
imported only when tracing), ``errors`` (``CtlError``/``BadRequest`` and their exit codes).
This front door re-exports what ``ctl`` calls most.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .backend import Backend, Unsupported
from .errors import BadRequest, CtlError, DiskFull
from .runs import (
    ENDED,
    OPERATIONAL,
    Started,
    check_run_writable,
    db_path,
    disk_full_message,
    error_line,
    exit_code,
    generation,
    heartbeat_in_use,
    heartbeat_override,
    latest_run,
    open_engine,
    outcome_json,
    permission_message,
    readable_workflows,
    recorded_input,
    resolve_home,
    resolve_id,
    run_generations,
    start_run,
    stopped,
    train_workflow_id,
)

if TYPE_CHECKING:  # loaded on first use (``__getattr__`` below)
    from .requests import DEFAULT_SUITES, TrainRequest, check_suites, eval_request, train_request

# The requests are pydantic models checked against the spec's (~0.2 s of imports): loaded where a request is
# built (ctl train, eval, release), never by a command that only reads (ctl status, list, history, show).
_LAZY = {
    name: "requests" for name in ("DEFAULT_SUITES", "TrainRequest", "check_suites", "eval_request", "train_request")
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY`` imported from its module on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'app' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_SUITES",
    "ENDED",
    "OPERATIONAL",
    "Backend",
    "BadRequest",
    "CtlError",
    "DiskFull",
    "Started",
    "TrainRequest",
    "Unsupported",
    "check_run_writable",
    "check_suites",
    "db_path",
    "disk_full_message",
    "error_line",
    "eval_request",
    "exit_code",
    "generation",
    "heartbeat_in_use",
    "heartbeat_override",
    "latest_run",
    "open_engine",
    "outcome_json",
    "permission_message",
    "readable_workflows",
    "recorded_input",
    "resolve_home",
    "resolve_id",
    "run_generations",
    "start_run",
    "stopped",
    "train_request",
    "train_workflow_id",
]
