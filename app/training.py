"""``ctl train``'s orchestration without the terminal: open the run's backend, start or attach to (or continue,
or restart) its workflow with this command's operational flags, trace it, keep its MLflow run's status.

``ctl/cli.py`` drives a ``TrainSession`` and says what happened (the terminal, exit codes, the live display,
the polite stop's handler are ctl's):

1. ``TrainSession(home, request, flags, warn)``: the run's tracer when tracing is on (``run_tracer``);
2. ``open()``: the backend (``open_engine``), the tracer's ``TRACEPARENT`` given to each attempt;
3. ``start(restart)``: the heartbeat timeouts the run had, the trace context (recorded in the input, read
   back by every later ``ctl train``), the restart (``ctl train --restart``: a callable of ctl's that ends the
   newest workflow and moves the run's files aside), ``start_run``, the tracer following the run's
   generations, this command's heartbeat timeouts for the attempts it runs here (``heartbeat_override``);
   returns a ``TrainStart`` (what ctl says about it);
4. ``following()`` / ``stopped()`` / ``ended(state)``: the MLflow run's status (app/runsinks.py), the tracer
   closed before the result is printed; ``close()`` at the end in any case.

Operational flags (``TrainFlags``) change how the run is run here, never its identity (app/runs.py
``OPERATIONAL``): a rerun with other values continues the run with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import workflows
from engine import Event, WorkflowStatus
from tinyllm.sinks import tracing
from workflows.models import TraceContext

from . import backends, runsinks
from .backend import Backend
from .errors import BadRequest
from .requests import TrainRequest
from .runs import (
    Started,
    heartbeat_in_use,
    heartbeat_override,
    latest_run,
    open_engine,
    run_generations,
    start_run,
)

if TYPE_CHECKING:
    from .traces import RunTracer

Warn = Callable[[str], None]
"""Where a warning line goes (ctl: stderr)."""


class Restarted(Protocol):
    """What ``ctl train --restart`` did before the new workflow starts (ctl/restart.py ``Restarted``)."""

    epoch: int  # the restart count the new workflow records (TrainRunInput.restart)
    line: str  # what was done (kept, ended, moved)


@dataclass(frozen=True)
class TrainFlags:
    """How this ``ctl train`` runs the run (operational: not the run's identity)."""

    heartbeat_timeout_s: float = 60.0  # --heartbeat-timeout: a silent trainer is stopped after this
    eval_heartbeat_timeout_s: float = 120.0  # --eval-heartbeat-timeout
    trace_file: str | None = None  # --trace-file ($OTEL_EXPORTER_OTLP_ENDPOINT otherwise)


@dataclass(frozen=True)
class HeartbeatChange:
    """A heartbeat timeout this command gives that differs from the one the run had."""

    flag: str  # --heartbeat-timeout or --eval-heartbeat-timeout
    was_s: float
    now_s: float
    applied: bool  # False: the backend applies no per-attempt override (``attempt_overrides``)


@dataclass
class TrainStart:
    """What ``TrainSession.start`` did: ``started`` (new or attached, the work reused), the restart, the changed
    heartbeat timeouts, and where the trace goes (None: not traced)."""

    started: Started
    restarted: Restarted | None = None
    heartbeat_changes: list[HeartbeatChange] = field(default_factory=list)
    trace: tuple[str, str] | None = None  # (trace id, destination)

    @property
    def workflow_id(self) -> str:
        return self.started.workflow_id


def run_tracer(home: Path, run_id: str, trace_file: str | None, warn: Warn) -> RunTracer | None:
    """The run's tracer (app/traces.py) when tracing is on (--trace-file, $OTEL_EXPORTER_OTLP_ENDPOINT), else
    None; nothing of OpenTelemetry is imported then. --trace-file without the trace extra is bad input (exit 2);
    the environment's endpoint without it is one warning line, and the run goes on untraced."""
    where = tracing.destination(os.environ, trace_file)
    if where is None:
        return None
    if backends.chosen().name == backends.TEMPORAL:
        warn("ctl: warning: traces are made from the embedded engine's history; not on --backend temporal")
        return None
    try:
        from . import traces  # lazy: the optional [trace] extra

        return traces.RunTracer(home, run_id, where)
    except ImportError as e:
        if trace_file:
            raise BadRequest(f"--trace-file: {e}") from None
        warn(f"ctl: warning: traces off: {e}")
        return None


class TrainSession:
    """One ``ctl train`` of one request (see the module docstring)."""

    def __init__(self, home: Path, request: TrainRequest, flags: TrainFlags, *, warn: Warn) -> None:
        self.home, self.request, self.flags, self.warn = home, request, flags, warn
        self.base = request.workflow_id
        self.input = request.input.model_copy(
            update={
                "train_heartbeat_timeout_s": flags.heartbeat_timeout_s,
                "eval_heartbeat_timeout_s": flags.eval_heartbeat_timeout_s,
            }
        )
        self.tracer = run_tracer(home, self.base, flags.trace_file, warn)
        self._engine: Backend | None = None

    @property
    def engine(self) -> Backend:
        if self._engine is None:
            raise RuntimeError("TrainSession.open() first")
        return self._engine

    def open(self) -> Backend:
        """The run's backend (the workflows and the real activities registered)."""
        tracer = self.tracer
        self._engine = open_engine(self.home, create=True, attempt_env=tracer.attempt_env if tracer else None)
        return self._engine

    def _histories(self) -> list[tuple[str, list[Event]]]:
        return [(st.workflow_id, self.engine.history(st.workflow_id)) for st in run_generations(self.engine, self.base)]

    def start(self, restart: Callable[[Backend], Restarted] | None = None) -> TrainStart:
        """Start the run's workflow, attach to it or continue it (app/runs.py ``start_run``), with this command's
        operational flags; ``restart``: ``ctl train --restart``'s first steps (ctl/restart.py)."""
        engine, flags, inp = self.engine, self.flags, self.input
        current = latest_run(engine, self.base)
        was_s = heartbeat_in_use(engine, current.workflow_id) if current is not None else None
        was_eval_s = (
            heartbeat_in_use(engine, current.workflow_id, workflows.ACTIVITY_EVAL, "eval_heartbeat_timeout_s")
            if current is not None
            else None
        )
        trace: dict[str, Any] | None = None
        if self.tracer is not None:  # the run's trace: recorded in its history, read back by every later ctl train
            trace = self.tracer.context(self._histories, os.environ)
            inp = inp.model_copy(update={"trace": TraceContext(**trace)})
        restarted = restart(engine) if restart is not None else None
        started = start_run(
            engine,
            workflows.WORKFLOW_TRAIN_RUN,
            self.base,
            inp,
            restart=restarted.epoch if restarted is not None else None,
        )
        out = TrainStart(started, restarted)
        if self.tracer is not None and trace is not None:  # each poll reads only the events since the last
            gens = [st.workflow_id for st in run_generations(engine, self.base)]
            self.tracer.bind(
                self._histories, trace, lambda seen: [(w, engine.history(w, after_seq=seen.get(w, 0))) for w in gens]
            )
            self.tracer.start()
            out.trace = (str(self.tracer.trace_id), str(self.tracer.where))
        if engine.attempt_overrides:  # an operational setting: this command's value from now on
            engine.attempt_options = heartbeat_override(
                started.workflow_id, flags.heartbeat_timeout_s, flags.eval_heartbeat_timeout_s
            )
        for flag, was, now_s in (
            ("--heartbeat-timeout", was_s, flags.heartbeat_timeout_s),
            ("--eval-heartbeat-timeout", was_eval_s, flags.eval_heartbeat_timeout_s),
        ):
            if was is not None and was != now_s:
                out.heartbeat_changes.append(HeartbeatChange(flag, was, now_s, engine.attempt_overrides))
        return out

    def status(self, workflow_id: str) -> WorkflowStatus:
        return self.engine.status(workflow_id)

    def following(self, workflow_id: str) -> None:
        """This command runs the workflow here now: a continuation's closed MLflow run reopens."""
        runsinks.workflow_state(self.home, workflow_id, "running", self.warn)

    def stopped(self, workflow_id: str) -> None:
        """A polite stop saved the step (the workflow stays running): the MLflow run says preempted."""
        runsinks.workflow_state(self.home, workflow_id, "preempted", self.warn)
        self.close_tracer()

    def ended(self, st: WorkflowStatus) -> None:
        """The MLflow run's status from the workflow's (also after an earlier kill); the trace's last spans out
        before the result is printed."""
        runsinks.workflow_state(self.home, st.workflow_id, st.state, self.warn)
        self.close_tracer()

    def close_tracer(self) -> None:
        if self.tracer is not None:
            tracer, self.tracer = self.tracer, None
            tracer.close()

    def close(self) -> None:
        try:
            self.close_tracer()
        finally:
            if self._engine is not None:
                self._engine.close()


__all__ = ["HeartbeatChange", "Restarted", "TrainFlags", "TrainSession", "TrainStart", "run_tracer"]
