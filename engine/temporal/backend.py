"""``TemporalEngine``: the embedded ``Engine``'s surface (register, start, status, history, cancel,
list, run a worker) over a Temporal cluster, so that ``ctl`` and tests drive either backend alike.

Workflow ids are Temporal workflow ids (``train/tiny``), started with a reuse policy that refuses
a second workflow under an id that was ever used (as the embedded engine does). The input is the
model's JSON; the activities are the registered ``fn(ctx, input)`` functions behind one dynamic
Temporal activity; the workflows the registered ``async def f(rt, input)`` functions behind one
dynamic Temporal workflow (engine/temporal/workflow.py). A worker runs in this process while
``run_until_complete`` or ``run_forever`` runs; other workers may serve the same task queue from
other hosts (they must share the home folder, see docs/scale-out.md).

The SDK is asynchronous; this class runs one event loop in a daemon thread and offers blocking
methods, like the embedded engine's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from temporalio import client as tc
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode, TLSConfig
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from .._errors import BadInput, EngineError, NotFound, Unsupported, WorkflowCanceled, WorkflowFailed, WorkflowRunning
from .._reader import WorkflowStatus
from .._history import Event, to_jsonable
from .._ids import check_id
from .activity import seam_activity
from .config import TemporalConfig, explain_connect_error
from .history import convert_history
from .runtime import register_workflow
from .workflow import SeamWorkflow

# The workflow sandbox takes these from outside instead of re-importing them: the engine's own and its
# models' library; the app's packages come from the caller (``passthrough_modules``) and the registered
# workflow code's top-level packages.
PASSTHROUGH_MODULES = ("engine", "pydantic", "pydantic_core", "annotated_types")
_STATES = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "canceled",
    WorkflowExecutionStatus.TERMINATED: "failed",
    WorkflowExecutionStatus.TIMED_OUT: "failed",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "completed",
}
MAX_GENERATIONS = 10_000
MAX_LISTED = 10_000


class Unreachable(EngineError):
    """The Temporal cluster cannot be reached (address, TLS, API key or namespace)."""


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _tls(cfg: TemporalConfig) -> bool | TLSConfig:
    if not cfg.uses_tls:
        return False
    if cfg.tls_cert or cfg.tls_ca:
        return TLSConfig(
            server_root_ca_cert=_read(cfg.tls_ca),
            client_cert=_read(cfg.tls_cert),
            client_private_key=_read(cfg.tls_key),
        )
    return True


class TemporalEngine:
    """The embedded engine's surface over a Temporal cluster (see the module docstring).

    One of the two backends of ``app.backend.Backend``. What it lacks it says by its capability flags and
    ``Unsupported``, never by a missing attribute: no local store and no lease owner (the cluster keeps the
    state: ``store`` and ``owner`` are None), no polite stop of its own (``polite_stop`` False:
    ``request_stop`` and setting ``stop_grace_s`` raise ``Unsupported``; ``stop`` is None, ``preempted``
    empty), no per-attempt option overrides (``attempt_overrides`` False: setting ``attempt_options``
    raises ``Unsupported``).
    """

    backend = "temporal"
    store = None  # the state lives on the cluster, not in a local SQLite file
    owner = None  # no lease owner of this process (the cluster leases activities to workers)
    polite_stop = False
    attempt_overrides = False

    def __init__(
        self,
        config: TemporalConfig,
        *,
        max_concurrent_activities: int = 4,
        heartbeat_throttle_s: float = 1.0,
        on_heartbeat: Callable[[str, Any], None] | None = None,
        connect_timeout_s: float = 30.0,
        passthrough_modules: tuple[str, ...] = (),
    ):
        self.config = config
        self.passthrough_modules = tuple(passthrough_modules)
        self.max_concurrent_activities = max_concurrent_activities
        self.heartbeat_throttle_s = heartbeat_throttle_s
        self.on_heartbeat = on_heartbeat
        self._workflows: dict[str, tuple[Callable, Any]] = {}
        self._activities: dict[str, Callable] = {}
        logging.getLogger("temporalio").setLevel(logging.ERROR)  # no SDK tracebacks on the user's terminal
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="temporal-loop", daemon=True)
        self._thread.start()
        try:
            self.client: Client = self._call(self._connect(connect_timeout_s))
        except BaseException:
            self.close()
            raise

    # --- plumbing ------------------------------------------------------------------------

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _connect(self, timeout_s: float) -> Client:
        """Connect; a frontend that is up but "not healthy yet" (a dev server just started) is retried."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                return await asyncio.wait_for(
                    Client.connect(cfg.address, namespace=cfg.namespace, api_key=cfg.api_key, tls=_tls(cfg)),
                    max(deadline - loop.time(), 0.1),
                )
            except (asyncio.TimeoutError, RuntimeError, RPCError) as e:
                text = str(e)
                if "not healthy yet" in text and loop.time() < deadline:
                    await asyncio.sleep(0.5)
                    continue
                first = text.splitlines()[0] if text else type(e).__name__
                if cfg.api_key:
                    first = first.replace(cfg.api_key, "***")
                why = explain_connect_error(first, cfg)
                detail = f"{why} [{first[:200]}]" if why else first[:300]
                raise Unreachable(f"cannot reach {cfg.describe()}: {detail}") from None

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> "TemporalEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- registration (workflows.register calls these) ----------------------------------------

    def register_workflow(self, name: str, fn: Callable, *, input_type: Any = None) -> None:
        register_workflow(name, fn, input_type)
        self._workflows[name] = (fn, input_type)

    def register_activity(self, name: str, fn: Callable, *, input_type: Any = None) -> None:
        self._activities[name] = fn

    def workflow_function(self, name: str) -> Callable:
        """The function registered as workflow ``name`` (the same object on both backends)."""
        return self._workflows[name][0]

    # --- starting and inspecting -------------------------------------------------------------

    def start(self, workflow_name: str, workflow_id: str, input: Any = None) -> str:
        check_id(workflow_id)
        if workflow_name not in self._workflows:
            raise NotFound(f"no workflow registered under {workflow_name!r}")
        _, input_type = self._workflows[workflow_name]
        if input_type is not None and hasattr(input_type, "model_validate"):
            try:
                input = input_type.model_validate(to_jsonable(input))
            except Exception as e:  # noqa: BLE001
                raise BadInput(f"invalid input for {workflow_name}: {str(e).splitlines()[0]}") from None

        async def go() -> None:
            await self.client.start_workflow(
                workflow_name,
                to_jsonable(input),
                id=workflow_id,
                task_queue=self.config.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )

        try:
            self._call(go())
        except WorkflowAlreadyStartedError:
            raise BadInput(f"workflow {workflow_id!r} already exists") from None
        return workflow_id

    async def _describe(self, workflow_id: str) -> Any:
        try:
            return await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise NotFound(f"no workflow {workflow_id!r}") from None
            raise

    async def _events(self, workflow_id: str) -> list[Any]:
        try:
            hist = await self.client.get_workflow_handle(workflow_id).fetch_history()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise NotFound(f"no workflow {workflow_id!r}") from None
            raise
        return list(hist.events)

    def history(self, workflow_id: str, after_seq: int = 0) -> list[Event]:
        """The workflow's events (only those after ``after_seq``, as the embedded engine's)."""
        events = convert_history(self._call(self._events(workflow_id)), self.client.data_converter.payload_converter)
        return [e for e in events if e.seq > after_seq] if after_seq else events

    def describe(self) -> str:
        """Where this backend keeps its state, for a log line: the cluster and its task queue."""
        return self.config.describe()

    # --- capabilities it lacks (app.backend.Backend; the class docstring) ----------------------------

    @property
    def attempt_options(self) -> None:
        return None

    @attempt_options.setter
    def attempt_options(self, hook: Any) -> None:
        if hook is not None:
            raise Unsupported("per-attempt option overrides are not applied on the Temporal backend")

    def request_stop(self, signal: str = "SIGTERM", *, grace_s: float | None = None) -> None:
        raise Unsupported("the Temporal backend has no polite stop of its own (ctl/interrupt.py stops the trainers)")

    @property
    def stop_grace_s(self) -> float | None:
        return None

    @stop_grace_s.setter
    def stop_grace_s(self, value: float | None) -> None:
        raise Unsupported("the Temporal backend has no polite stop of its own")

    @property
    def stop(self) -> None:
        return None

    @property
    def preempted(self) -> list[dict]:
        return []

    def status(self, workflow_id: str) -> WorkflowStatus:
        desc = self._call(self._describe(workflow_id))
        events = self.history(workflow_id)
        state = _STATES.get(desc.status, "running")
        st = WorkflowStatus(
            workflow_id,
            desc.workflow_type,
            state,
            desc.start_time.timestamp(),
            (desc.close_time or desc.execution_time or desc.start_time).timestamp(),
            any(e.type == "cancel_requested" for e in events),
        )
        last = events[-1] if events else None
        if state == "completed" and last is not None and last.type == "workflow_completed":
            st.result = last.attrs.get("result")
            st.updated_at = last.time
        elif state in ("failed", "canceled") and last is not None:
            st.error = last.attrs.get("error") or {"type": state, "message": f"workflow {state}"}
            st.updated_at = last.time
        elif state == "running":
            st.waiting_on = self._waiting_on(desc, events)
            if events:
                st.updated_at = events[-1].time
        return st

    @staticmethod
    def _waiting_on(desc: Any, events: list[Event]) -> str:
        pending = list(desc.raw_description.pending_activities)
        if pending:
            p = pending[-1]
            started = p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            what = "running" if started else "scheduled"
            return f"activity {p.activity_id} ({what}, attempt {p.attempt})"
        fired = {e.attrs.get("timer_id") for e in events if e.type in ("timer_fired", "timer_canceled")}
        for e in reversed(events):
            if e.type == "timer_started" and e.attrs.get("timer_id") not in fired:
                return f"timer (fires at {e.attrs['fire_at']:.3f})"
        return "workflow task"

    def last_heartbeat_details(self, workflow_id: str) -> dict[str, Any]:
        """The pending activities' last heartbeat details, by activity id."""
        desc = self._call(self._describe(workflow_id))
        conv = self.client.data_converter.payload_converter
        out = {}
        for p in desc.raw_description.pending_activities:
            values = conv.from_payloads(p.heartbeat_details.payloads) if p.heartbeat_details.payloads else []
            out[p.activity_id] = values[0] if values else None
        return out

    def result(self, workflow_id: str) -> Any:
        st = self.status(workflow_id)
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
            raise WorkflowCanceled(f"workflow {workflow_id!r} was canceled", workflow_id=workflow_id)
        raise WorkflowRunning(f"workflow {workflow_id!r} is still running")

    def cancel(self, workflow_id: str) -> bool:
        """Request the cancel; False when the workflow already ended or its cancel was requested."""
        st = self.status(workflow_id)
        if st.state != "running" or st.cancel_requested:
            return False
        self._call(self.client.get_workflow_handle(workflow_id).cancel())
        return True

    def list_workflows(self) -> list[WorkflowStatus]:
        """Every workflow of the namespace (Temporal's visibility: may trail a fresh start by a moment)."""

        async def go() -> list[WorkflowStatus]:
            rows: list[WorkflowStatus] = []
            async for w in self.client.list_workflows(limit=MAX_LISTED):
                rows.append(
                    WorkflowStatus(
                        w.id,
                        w.workflow_type,
                        _STATES.get(w.status, "running") if w.status else "running",
                        w.start_time.timestamp(),
                        (w.close_time or w.start_time).timestamp(),
                        False,
                    )
                )
            return sorted(rows, key=lambda s: (s.created_at, s.workflow_id))

        return self._call(go())

    def list_readable(self) -> tuple[list[WorkflowStatus], list[Any]]:
        """``list_workflows()`` and no damaged records (the cluster's state is not a file here)."""
        return self.list_workflows(), []

    def generations(self, base: str) -> list[WorkflowStatus]:
        """The workflows of run ``base`` (``base``, ``base/2``, ...), oldest first, read consistently."""
        try:
            found = [self.status(base)]
        except NotFound:
            return []
        for n in range(2, MAX_GENERATIONS):
            try:
                found.append(self.status(f"{base}/{n}"))
            except NotFound:
                break
        return found

    # --- running a worker here ---------------------------------------------------------------

    def _worker(self) -> Worker:
        registered = {
            m.split(".")[0]
            for fn, input_type in self._workflows.values()
            for m in (getattr(fn, "__module__", None), getattr(input_type, "__module__", None))
            if m
        }
        passthrough = sorted({*PASSTHROUGH_MODULES, *self.passthrough_modules, *registered})
        restrictions = SandboxRestrictions.default.with_passthrough_modules(*passthrough)
        return Worker(
            self.client,
            task_queue=self.config.task_queue,
            workflows=[SeamWorkflow],
            activities=[seam_activity(self._activities, self.on_heartbeat)],
            activity_executor=concurrent.futures.ThreadPoolExecutor(max_workers=self.max_concurrent_activities),
            max_concurrent_activities=self.max_concurrent_activities,
            workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
            max_heartbeat_throttle_interval=timedelta(seconds=self.heartbeat_throttle_s),
            default_heartbeat_throttle_interval=timedelta(seconds=self.heartbeat_throttle_s),
            graceful_shutdown_timeout=timedelta(0),  # on stop: cancel at once; the trainer checkpoints, exits 130
            # and the attempt is retried (by another worker) from that checkpoint
        )

    async def _serve(self, until: Callable[[], Any]) -> None:
        worker = self._worker()
        run = asyncio.ensure_future(worker.run())
        done = asyncio.ensure_future(until())
        try:
            finished, _ = await asyncio.wait({run, done}, return_when=asyncio.FIRST_COMPLETED)
            if run in finished:
                run.result()  # a fatal worker error surfaces here
        finally:
            done.cancel()
            if not run.done():
                await worker.shutdown()
            await asyncio.gather(run, return_exceptions=True)

    def run_until_complete(self, workflow_id: str, *, timeout_s: float | None = None) -> WorkflowStatus:
        """Serve the task queue here until ``workflow_id`` ends; its final status."""

        async def ended() -> None:
            try:
                await self.client.get_workflow_handle(workflow_id).result(follow_runs=False)
            except (tc.WorkflowFailureError, RPCError):
                pass

        async def go() -> None:
            await asyncio.wait_for(self._serve(ended), timeout_s)

        self._call(go())
        return self.status(workflow_id)

    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """Serve the task queue here until ``stop_event`` is set (then shut down gracefully)."""
        stop = stop_event or threading.Event()

        async def stopped() -> None:
            # stop is a threading.Event set from another thread: an asyncio.Event could not be set from there
            while not stop.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.2)

        self._call(self._serve(stopped))
