"""The public engine: register workflows and activities, start, run a worker, inspect, cancel.

    eng = Engine("home/.ctl/engine.db", clock=VirtualClock(), inline_activities=True)
    eng.register_activity("add", lambda ctx, x: x + 1)
    eng.register_workflow("count", count)           # async def count(rt, n): ...
    eng.start("count", "count/1", 3)
    eng.run_until_complete("count/1")
    eng.result("count/1")

The engine owns a ``Worker`` (engine/_worker.py: the transactions and the loop's steps) and adds the
public API; engine/_replay.py replays. Reading (status, history, every workflow, activities) is its base
class ``Reader``'s (engine/_reader.py), which a process that only reads uses alone.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _history as h
from . import _leases as leases
from ._clock import SystemClock
from ._errors import BadInput, EngineError, NotFound, WorkflowCanceled, WorkflowFailed, WorkflowRunning
from ._history import Event, append_event, dumps, normalized, to_jsonable
from ._ids import check_id
from ._options import StepOptions
from ._reader import TERMINAL, ActivityInfo, Reader, WorkflowStatus
from ._replay import Command, DrySink, Replayer
from ._stop import StopRequest, stop_request
from ._store import Store
from ._worker import Worker


@dataclass
class ReplayResult:
    """A dry replay: the commands the code issued, and where it stopped."""

    commands: list[Command]
    done: bool
    outcome: tuple[str, Any] | None  # ("completed", result) | ("failed"|"canceled", error)
    new_commands: list[Command] = field(default_factory=list)


@dataclass
class _Registered:
    name: str
    fn: Callable
    input_type: Any = None

    def decode_input(self, raw: Any) -> Any:
        if self.input_type is not None and hasattr(self.input_type, "model_validate"):
            return self.input_type.model_validate(raw)
        return raw


def replay_history(
    fn: Callable, events: list[Event], *, workflow_id: str = "replay", input_type: Any = None
) -> ReplayResult:
    """Dry-replay workflow function ``fn`` over ``events`` (its input is the started event's)."""
    if not events or events[0].type != h.WORKFLOW_STARTED:
        raise BadInput("a history starts with a workflow_started event")
    reg = _Registered("replay", fn, input_type)
    sink = DrySink()
    r = Replayer(workflow_id, fn, reg.decode_input(events[0].attrs.get("input")), sink)
    r.feed(events)
    r.advance()
    return ReplayResult(list(r.issued), r.done, r.outcome, sink.new)


class Engine(Reader):
    """A durable workflow engine over one SQLite file; also an in-process worker.

    ``inline_activities=True`` runs activities one at a time on the calling
    thread (deterministic: tests, the simulator). Otherwise each activity runs
    in its own thread (at most ``max_concurrent_activities``) while the loop
    keeps polling the database for cancels, timeouts and timers.

    It owns its ``Worker`` (``_worker``, engine/_worker.py), which owns the attempts and runners;
    the loops below drive it.

    It is one of the two backends of ``app.backend.Backend`` (the other: engine/temporal's
    ``TemporalEngine``); the class attributes below are that protocol's capability flags.
    """

    backend = "embedded"
    polite_stop = True  # request_stop, stop, preempted, stop_grace_s (engine/_stop.py)
    attempt_overrides = True  # attempt_options applies to the attempts this engine starts

    def __init__(
        self,
        db_path: Any = None,
        *,
        clock: Any = None,
        store: Store | None = None,
        worker_id: str | None = None,
        inline_activities: bool = False,
        max_concurrent_activities: int = 4,
        poll_interval_s: float = 0.1,
        attempt_options: Callable[[str, str, StepOptions], StepOptions] | None = None,
    ):
        if store is None:
            if db_path is None:
                raise BadInput("Engine needs a database path (or a store)")
            store = Store(db_path)
        super().__init__(store)
        self.clock = clock if clock is not None else SystemClock()
        self.owner = leases.new_owner()
        if worker_id:
            self.owner["worker_id"] = worker_id
        self._workflows: dict[str, _Registered] = {}
        self._activities: dict[str, _Registered] = {}
        self._dead = False
        self._stalls = 0  # idle waits in a row with work due and not run (virtual clock)
        self._worker = Worker(
            self.store,
            self.clock,
            self.owner,
            self._workflows,
            self._activities,
            inline=inline_activities,
            max_concurrent=max(1, max_concurrent_activities),
            poll_interval_s=poll_interval_s,
            attempt_options=attempt_options,
        )

    @property
    def poll_interval_s(self) -> float:
        """How long an idle worker waits between polls of the database (its worker's, one value)."""
        return self._worker.poll_interval_s

    @poll_interval_s.setter
    def poll_interval_s(self, value: float) -> None:
        self._worker.poll_interval_s = value

    @property
    def attempt_options(self) -> Callable[[str, str, StepOptions], StepOptions] | None:
        """(workflow id, activity name, scheduled options) -> the options this engine's worker runs an
        attempt with (an operational setting of the command running it, e.g. ``ctl train
        --heartbeat-timeout``; recorded in the attempt's started event, never replayed). Settable."""
        return self._worker.attempt_options

    @attempt_options.setter
    def attempt_options(self, hook: Callable[[str, str, StepOptions], StepOptions] | None) -> None:
        self._worker.attempt_options = hook

    # ---- registration ---------------------------------------------------------------------------

    def register_workflow(self, name: str, fn: Callable, *, input_type: Any = None) -> None:
        check_id(name, what="workflow name")
        if not inspect.iscoroutinefunction(fn):
            raise BadInput(f"workflow {name!r} must be an `async def f(rt, input)` function")
        self._workflows[name] = _Registered(name, fn, input_type)

    def register_activity(self, name: str, fn: Callable, *, input_type: Any = None) -> None:
        check_id(name, what="activity name")
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise BadInput(f"activity {name!r} must be a plain (synchronous) function fn(ctx, input)")
        self._activities[name] = _Registered(name, fn, input_type)

    # ---- starting, inspecting, canceling ----------------------------------------------------------

    def start(self, workflow_name: str, workflow_id: str, input: Any = None) -> str:
        """Start ``workflow_name`` as ``workflow_id``; an id that exists is returned unchanged."""
        return self._start(workflow_name, workflow_id, input, eager=False)

    def execute_workflow(
        self, workflow_name: str, workflow_id: str, input: Any = None, *, timeout_s: float | None = None
    ) -> Any:
        """Start ``workflow_id`` (or attach to it) and work on it in this process until it ends; its
        result, or ``WorkflowFailed`` / ``WorkflowCanceled``.

        A new workflow's first task runs in the start's own transaction and leases the activities it
        schedules to this worker (one commit fewer than ``start`` + ``run_until_complete``): use it only
        where this engine goes on to run them, as here."""
        self._guard(self._start, workflow_name, workflow_id, input, True)
        return self._guard(self._execute_until_end, workflow_id, timeout_s)

    def _execute_until_end(self, workflow_id: str, timeout_s: float | None) -> Any:
        """Run the leases this engine holds until ``workflow_id`` has ended durably (its end's COMMIT
        returned) and none is left; its result straight from the replayer, without polling or reading
        it back. Anything else (a timer, work for another worker, a failure) goes the way of
        ``run_until_complete``."""
        w = self._worker
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        w.awaited[workflow_id] = None
        try:
            while (w.ready or w.inflight) and (give_up is None or time.monotonic() < give_up):
                if w.stop is not None:
                    break
                if w.tick():
                    if w.awaited[workflow_id] is not None and not w.ready and not w.inflight:
                        break
                    continue
                if w.inflight:
                    w.runners.drain(timeout_s=self.poll_interval_s)
            outcome = w.awaited[workflow_id]
        finally:
            del w.awaited[workflow_id]
        if outcome is not None and outcome[0] == "completed" and not w.ready and not w.inflight:
            return outcome[1]
        row = self._row(workflow_id)
        if row[1] not in self._workflows:
            raise NotFound(f"workflow {workflow_id!r} is a {row[1]!r}, which this engine has not registered")
        left_s = None if give_up is None else max(0.0, give_up - time.monotonic())
        return self._result_of(self._until_complete(workflow_id, left_s))

    def _start(self, workflow_name: str, workflow_id: str, input: Any, eager: bool) -> str:
        check_id(workflow_id)
        reg = self._workflows.get(workflow_name)
        if reg is None:
            raise NotFound(
                f"no workflow registered as {workflow_name!r} (known: {', '.join(sorted(self._workflows)) or 'none'})"
            )
        if not eager and self.store.query_one("SELECT 1 FROM workflows WHERE id=?", (workflow_id,)):
            return workflow_id  # (execute_workflow finds it in its transaction below)
        try:
            raw = normalized(input)
            value = reg.decode_input(raw)
            raw = json.loads(dumps(value)) if reg.input_type is not None else raw
        except (TypeError, ValueError) as e:
            raise BadInput(f"input of workflow {workflow_name!r} is invalid: {e}") from None
        now = self.clock.now()
        input_text = dumps(raw)
        with self._worker.tx("start") as (db, after):
            # an eager start runs the first task in this transaction, which leaves task_pending as it ends
            if not db.execute(
                "INSERT INTO workflows(id, name, input, state, created_at, updated_at, task_pending) "
                "VALUES (?,?,?, 'running', ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (workflow_id, workflow_name, input_text, now, now, 0 if eager else 1),
            ).rowcount:
                return workflow_id  # it exists: unchanged
            text = f'{{"input":{input_text},"workflow":{dumps(workflow_name)}}}'  # = dumps(attrs): keys in order
            attrs = {"workflow": workflow_name, "input": raw}
            if not eager:
                append_event(db, workflow_id, 1, h.WORKFLOW_STARTED, now, attrs, text=text)
            else:  # the replayer starts from the input and this event, which goes in with the task's own events
                self._worker.run_task(
                    db,
                    after,
                    workflow_id,
                    fresh=Event(1, h.WORKFLOW_STARTED, now, attrs),
                    wf_row=(workflow_name, input_text, "running", 0),
                    fresh_row=h.event_row(workflow_id, 1, h.WORKFLOW_STARTED, now, text),
                    cached=Replayer(workflow_id, reg.fn, value, DrySink()),
                )  # (run_task gives it its sink)
        return workflow_id

    def result(self, workflow_id: str) -> Any:
        """The recorded result; raises ``WorkflowFailed``, ``WorkflowCanceled`` or ``WorkflowRunning``."""
        return self._result_of(self.status(workflow_id))

    @staticmethod
    def _result_of(st: WorkflowStatus) -> Any:
        workflow_id = st.workflow_id
        if st.state == "completed":
            return st.result
        err = st.error or {}
        if st.state == "failed":
            raise WorkflowFailed(
                f"workflow {workflow_id!r} failed: {err.get('type')}: {err.get('message')}",
                workflow_id=workflow_id,
                type=err.get("type", "Error"),
                details=err.get("details"),
            )
        if st.state == "canceled":
            raise WorkflowCanceled(
                f"workflow {workflow_id!r} was canceled: {err.get('message')}", workflow_id=workflow_id
            )
        raise WorkflowRunning(f"workflow {workflow_id!r} is still running ({st.waiting_on})")

    def cancel(self, workflow_id: str) -> bool:
        """Record a cancel request (any process may call this); False if ended or already requested."""
        self._row(workflow_id)
        with self._worker.tx("cancel") as (db, _after):
            state, cancel = db.execute(
                "SELECT state, cancel_requested FROM workflows WHERE id=?", (workflow_id,)
            ).fetchone()
            if state != "running" or cancel:
                return False
            h.append_next(db, workflow_id, h.CANCEL_REQUESTED, self.clock.now(), {})
            db.execute(
                "UPDATE workflows SET cancel_requested=1, task_pending=1, updated_at=? WHERE id=?",
                (self.clock.now(), workflow_id),
            )
        return True

    def replay(self, workflow_id: str, events: list[Event] | None = None) -> ReplayResult:
        """Re-run the workflow's code over its history (or ``events``) without recording anything."""
        row = self._row(workflow_id)
        reg = self._workflows.get(row[1])
        if reg is None:
            raise NotFound(f"no workflow registered as {row[1]!r}")
        if events is None:
            events = self.history(workflow_id)
        return replay_history(reg.fn, events, workflow_id=workflow_id, input_type=reg.input_type)

    # ---- a polite stop (engine/_stop.py) ------------------------------------------------------------

    def request_stop(self, signal: str = "SIGTERM", *, grace_s: float | None = None) -> None:
        """Stop politely (safe in a signal handler: one assignment). The running loop starts nothing new,
        asks every attempt in flight to stop (a trainer checkpoints the step it is at and exits), records
        each as ``activity_preempted`` (no retry counted; due again at once), and returns; attempts not
        ended within ``grace_s`` are killed (their event says ``killed_at_grace``)."""
        self._worker.request_stop(stop_request(grace_s, signal))

    @property
    def stop_grace_s(self) -> float | None:
        """The grace of a polite stop that reaches this engine through one of its trainers (a signal sent to the
        trainer or its group, not to this process): its other attempts get this long. Settable; None: no bound."""
        return self._worker.stop_grace_s

    @stop_grace_s.setter
    def stop_grace_s(self, value: float | None) -> None:
        self._worker.stop_grace_s = value

    @property
    def stop(self) -> StopRequest | None:
        """The polite stop asked of this engine (``request_stop``, or a trainer stopped by a signal
        sent to it directly), or None."""
        return self._worker.stop

    @property
    def preempted(self) -> list[dict]:
        """The attempts this engine's stop ended: ``activity_preempted`` attrs with ``workflow_id``."""
        return list(self._worker.attempts.preempted)

    def _stop_drain(self, follow: str | None) -> None:
        """After a stop was asked: wait for the attempts in flight to end (their runners enforce the
        deadline) and record them; leases not started end preempted; ``follow`` (the workflow a
        ``ctl train`` follows), when no attempt of it was running, gets a ``preempted`` event."""
        w = self._worker
        while w.inflight:
            w.runners.drain(timeout_s=self.poll_interval_s)
        w.runners.drain()
        w.release_ready()
        if follow is not None and not any(p["workflow_id"] == follow for p in w.attempts.preempted):
            stop = w.stop
            w.attempts.note_stopped(
                follow,
                {
                    "signal": stop.signal if stop else None,
                    "worker": w.worker_name,
                    "waiting_on": self._waiting_on(follow),
                },
            )

    # ---- running --------------------------------------------------------------------------------------

    def _guard(self, f: Callable, *args: Any) -> Any:
        """Run worker code; a crash (a BaseException that is not an Exception) kills this instance."""
        if self._dead:
            raise EngineError("this Engine crashed or was closed; open a new one on the same file")
        try:
            return f(*args)
        except Exception:
            raise
        except BaseException:
            self._dead = True
            leases.mark_dead(self.owner)
            self._worker.cache.clear()
            self._worker.runners.stop()
            raise

    def run_until_idle(self) -> None:
        """Run every workflow task, activity and due timer runnable now; return when none is left."""
        self._guard(self._until_idle)

    def _until_idle(self) -> None:
        w = self._worker
        while True:
            if w.stop is not None:
                return
            if w.tick():
                continue
            if not w.inflight:
                return
            w.runners.drain(timeout_s=self.poll_interval_s)

    def run_until_complete(self, workflow_id: str, *, timeout_s: float | None = None) -> WorkflowStatus:
        """Work until ``workflow_id`` has ended, waiting on the clock (a virtual clock just advances)."""
        row = self._row(workflow_id)
        if row[1] not in self._workflows:
            raise NotFound(f"workflow {workflow_id!r} is a {row[1]!r}, which this engine has not registered")
        return self._guard(self._until_complete, workflow_id, timeout_s)

    def _until_complete(self, workflow_id: str, timeout_s: float | None) -> WorkflowStatus:
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._until_idle()
            if self._worker.stop is not None:  # a polite stop: the run stays open, resumable
                self._stop_drain(workflow_id)
                return self.status(workflow_id)
            st = self.status(workflow_id)
            if st.state in TERMINAL:
                return st
            unknown = self.store.query_one(
                "SELECT name FROM activities WHERE workflow_id=? AND state='scheduled'", (workflow_id,)
            )
            if unknown and unknown[0] not in self._activities:
                raise NotFound(
                    f"workflow {workflow_id!r} waits on activity {unknown[0]!r}, which this engine has not registered"
                )
            if give_up is not None and time.monotonic() > give_up:
                raise TimeoutError(f"workflow {workflow_id!r} still running after {timeout_s} s ({st.waiting_on})")
            self._wait()

    def _wait(self) -> None:
        """Idle: let time pass until the next wake-up (virtual: jump there), or one poll interval."""
        w = self._worker
        wake = w.next_wake()
        now = self.clock.now()
        if getattr(self.clock, "virtual", False):
            if wake is None:
                raise EngineError("nothing is scheduled and no time can make progress (is a worker missing?)")
            if wake <= now:
                self._stalls += 1
                if self._stalls > 1000:
                    raise EngineError(f"work due at {wake} is not being run (stalled)")
            else:
                self._stalls = 0
            self.clock.advance(max(0.0, wake - now))
            return
        delay = self.poll_interval_s if wake is None else min(max(wake - now, 0.0), self.poll_interval_s)
        w.runners.drain(timeout_s=delay) if w.inflight else self.clock.sleep(delay)

    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """The long-running worker loop; returns when ``stop_event`` is set."""
        stop = stop_event or threading.Event()
        w = self._worker

        def loop():
            while not stop.is_set():
                if w.stop is not None:  # a polite stop: the attempts in flight end preempted, then return
                    self._stop_drain(None)
                    return
                if w.tick():
                    continue
                if w.inflight:
                    w.runners.drain(timeout_s=self.poll_interval_s)
                    continue
                wake = w.next_wake() if getattr(self.clock, "virtual", False) else None
                if wake is not None:
                    self.clock.advance(max(0.0, wake - self.clock.now()))
                else:
                    stop.wait(self.poll_interval_s)
            if w.inflight and w.stop is not None:  # stopped both ways: record what the stop ended
                self._stop_drain(None)

        self._guard(loop)

    def close(self) -> None:
        self._worker.runners.stop()
        if not self._dead:
            self._dead = True
            leases.mark_dead(self.owner)
        try:
            self.store.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Engine", "WorkflowStatus", "ActivityInfo", "ReplayResult", "replay_history", "to_jsonable"]
