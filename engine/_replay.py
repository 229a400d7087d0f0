"""Replay: drive an ``async def f(rt, input)`` workflow against its recorded history.

The workflow coroutine is stepped by hand (no event loop). Each
``await rt.execute_activity(...)`` / ``await rt.sleep(...)`` yields a command.
The ``Replayer`` numbers commands in code order and matches command ``k``
against the ``k``-th recorded command:

- recorded and resolved: the recorded result (or error) is returned at once;
- recorded, not resolved: the workflow blocks there until a later event;
- not recorded: a new command, handed to the ``sink`` which records it durably
  (the live engine) or just notes it (a dry replay);
- recorded but different (kind, activity id or name): ``NondeterminismError``,
  the workflow stops as failed; the code never gets to run past it.

A replayer may be kept between workflow tasks (a sticky cache): history is
append-only, so feeding it the events recorded since is the same as replaying
from scratch. Replay is linear in the history length.
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Callable, Coroutine, NamedTuple, Protocol

from . import _history as h
from ._errors import ActivityError, BadInput, Canceled, NondeterminismError, NonRetryableError, is_canceled
from ._history import Event
from ._ids import check_id
from ._options import StepOptions


class Command(NamedTuple):
    """What workflow code asked for; ``activity_id``/``name`` are None for timers (a tuple: made and
    compared once per command of every replay)."""

    kind: str  # "activity" | "timer"
    activity_id: str | None = None
    name: str | None = None

    def describe(self) -> str:
        return "timer" if self.kind == "timer" else f"activity {self.name!r} id {self.activity_id!r}"


class _Request:
    """The awaitable a command is: yields itself to the driver, receives ``(ok, value)``."""

    __slots__ = ("command", "payload")

    def __init__(self, command: Command, payload: dict):
        self.command = command
        self.payload = payload

    def __await__(self):
        outcome = yield self
        return outcome


class WorkflowRuntime:
    """The ``Runtime`` handed to workflow code (see ``engine._seam.Runtime``)."""

    def __init__(self, replayer: "Replayer"):
        self._r = replayer

    @property
    def workflow_id(self) -> str:
        return self._r.workflow_id

    @property
    def is_replaying(self) -> bool:
        """True while the code runs over commands already in the history (e.g. to silence logs)."""
        return self._r.next_cmd < len(self._r.commands)

    def now(self) -> float:
        return self._r.now

    async def execute_activity(self, name: str, input: Any, options: StepOptions, *, result_type: Any = None) -> Any:
        if not isinstance(options, StepOptions):
            raise TypeError(f"options must be a StepOptions, got {type(options).__name__}")
        check_id(options.id, what="activity id")
        # the input is encoded only for a new command (a recorded one already holds it)
        ok, value = await _Request(Command("activity", options.id, name), {"input": input, "options": options})
        if not ok:
            raise value
        if result_type is not None and value is not None and hasattr(result_type, "model_validate"):
            return result_type.model_validate(value)
        return value

    async def sleep(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"sleep needs a non-negative number of seconds, got {seconds}")
        ok, value = await _Request(Command("timer"), {"seconds": seconds})
        if not ok:
            raise value


class Sink(Protocol):
    """Where a replayer's new facts go (the live engine writes them in its transaction)."""

    def new_command(self, r: "Replayer", k: int, cmd: Command, payload: dict) -> None: ...

    def cancel_pending(self, r: "Replayer", k: int) -> None: ...

    def finish(self, r: "Replayer", state: str, payload: Any) -> None: ...


class DrySink:
    """Records nothing: new commands are noted, the workflow blocks on the first of them."""

    def __init__(self):
        self.new: list[Command] = []

    def new_command(self, r, k, cmd, payload):
        self.new.append(cmd)

    def cancel_pending(self, r, k):
        pass

    def finish(self, r, state, payload):
        pass


class _Recorded(NamedTuple):
    command: Command
    event: Event


_RECORD = {  # what Replayer.record does with an event type
    h.ACTIVITY_COMPLETED: 1,
    h.ACTIVITY_CANCELED: 1,
    h.TIMER_FIRED: 1,
    h.TIMER_CANCELED: 1,
    h.ACTIVITY_FAILED: 1,
    h.ACTIVITY_TIMED_OUT: 1,
    h.ACTIVITY_SCHEDULED: 2,
    h.TIMER_STARTED: 2,
    h.WORKFLOW_STARTED: 3,
    h.CANCEL_REQUESTED: 4,
    **{t: 5 for t in h.TERMINAL_EVENTS},
}
_FINAL_ONLY = (h.ACTIVITY_FAILED, h.ACTIVITY_TIMED_OUT)


class Replayer:
    """The state of one workflow's code over its history (see the module docstring)."""

    def __init__(self, workflow_id: str, fn: Callable, input_value: Any, sink: Sink):
        self.workflow_id = workflow_id
        self.fn = fn
        self.input_value = input_value
        self.sink = sink
        self.rt = WorkflowRuntime(self)
        self.last_seq = 0
        self.commands: list[_Recorded] = []
        self.resolutions: dict[int, Event] = {}
        self.activity_ids: set[str] = set()
        self.cancel_event: Event | None = None
        self.start_event: Event | None = None
        self.terminal: Event | None = None
        self.now: float = 0.0
        self.coro: Coroutine[Any, Any, Any] | None = None
        self.started = False
        self.done = False
        self.next_cmd = 0
        self.blocked_on: int | None = None
        self.issued: list[Command] = []  # commands the code issued, in order (for tests and tools)
        self.outcome: tuple[str, Any] | None = None  # ("completed", result) | ("failed"|"canceled", error)
        self._cancel_tried: set[int] = set()

    # ---- history -----------------------------------------------------------------------------

    def feed(self, events: list[Event]) -> None:
        for e in events:
            self.record(e)

    def record(self, e: Event) -> None:
        """Index one event (in seq order, without gaps)."""
        if e.seq != self.last_seq + 1:
            raise RuntimeError(f"history of {self.workflow_id!r} has a gap: seq {e.seq} after {self.last_seq}")
        self.last_seq = e.seq
        t, a = e.type, e.attrs
        kind = _RECORD.get(t)
        if kind is None:  # started, heartbeat: nothing the code reads
            return
        if kind == 1:  # a resolution (failed or timed out: only when final)
            if t in _FINAL_ONLY and not a.get("final"):
                return
            self.resolutions[a["cmd"]] = e
        elif kind == 2:  # a command
            if a["cmd"] != len(self.commands):
                raise RuntimeError(f"history of {self.workflow_id!r}: command {a['cmd']} out of order")
            if t == h.ACTIVITY_SCHEDULED:
                cmd = Command("activity", a["activity_id"], a["name"])
                self.activity_ids.add(a["activity_id"])
            else:
                cmd = Command("timer")
            self.commands.append(_Recorded(cmd, e))
        elif kind == 3:
            self.start_event = e
        elif kind == 4:
            if self.cancel_event is None:
                self.cancel_event = e
        else:
            self.terminal = e

    # ---- driving the code ---------------------------------------------------------------------

    def advance(self) -> None:
        """Run the workflow code as far as the history allows (until blocked or done)."""
        if self.done:
            return
        if not self.started:
            if self.start_event is None:
                raise RuntimeError(f"history of {self.workflow_id!r} has no workflow_started event")
            self.started = True
            self.now = self.start_event.time
            try:
                self.coro = self.fn(self.rt, self.input_value)
            except Exception as exc:
                self._finish_err(exc)
                return
            if not hasattr(self.coro, "send"):
                self._finish_err(TypeError("a workflow function must be `async def f(rt, input)`"))
                return
            self._step(None)
        while not self.done and self.blocked_on is not None:
            k = self.blocked_on
            res = self.resolutions.get(k)
            if res is None:
                if self.cancel_event is not None and k not in self._cancel_tried:
                    self._cancel_tried.add(k)
                    self.sink.cancel_pending(self, k)
                    continue
                return
            self.blocked_on = None
            self.now = res.time
            self._step(self._outcome_of(k, res))

    def _step(self, outcome: tuple[bool, Any] | None) -> None:
        """Resume the coroutine with a command's outcome, until it blocks or ends."""
        value, exc = outcome, None
        coro = self.coro
        assert coro is not None  # (advance started it)
        while True:
            try:
                req = coro.throw(exc) if exc is not None else coro.send(value)
            except StopIteration as stop:
                self._finish_ok(stop.value)
                return
            except Exception as err:  # BaseException (a crash) propagates untouched
                self._finish_err(err)
                return
            value, exc = None, None
            if not isinstance(req, _Request):
                exc = TypeError(f"workflow code awaited {req!r}; only rt.execute_activity and rt.sleep may be awaited")
                continue
            try:
                outcome = self._command(req)
            except NondeterminismError as err:
                self._nondeterminism(err)
                return
            if outcome is None:
                return  # blocked
            value = outcome

    def _command(self, req: _Request) -> tuple[bool, Any] | None:
        cmd = req.command
        k = self.next_cmd
        if k < len(self.commands):
            rec = self.commands[k].command
            if rec != cmd:
                raise NondeterminismError(
                    f"workflow {self.workflow_id!r}: command #{k} is {cmd.describe()} but the history "
                    f"recorded {rec.describe()} at that position (the workflow code changed?)"
                )
            self.next_cmd += 1
            self.issued.append(cmd)
            self.blocked_on = k
            res = self.resolutions.get(k)
            if res is None:
                return None
            self.blocked_on = None
            self.now = res.time
            return self._outcome_of(k, res)
        if self.terminal is not None:
            raise NondeterminismError(
                f"workflow {self.workflow_id!r}: the code issued {cmd.describe()} after the recorded end"
            )
        if cmd.kind == "activity" and cmd.activity_id in self.activity_ids:
            return False, BadInput(f"activity id {cmd.activity_id!r} used twice in workflow {self.workflow_id!r}")
        if self.cancel_event is not None:
            self.now = self.cancel_event.time
            return False, Canceled(f"workflow {self.workflow_id!r} was canceled")
        if cmd.kind == "activity":
            try:
                req.payload["input"] = h.normalized(req.payload["input"])
            except (TypeError, ValueError) as e:
                return False, TypeError(f"input of activity {cmd.activity_id!r} is not JSON-able: {e}")
        self.next_cmd += 1
        self.issued.append(cmd)
        self.blocked_on = k
        if cmd.kind == "activity":
            assert cmd.activity_id is not None  # (an activity's command has its id)
            self.activity_ids.add(cmd.activity_id)
        self.sink.new_command(self, k, cmd, req.payload)
        return None

    def _outcome_of(self, k: int, e: Event) -> tuple[bool, Any]:
        a = e.attrs
        cmd = self.commands[k].command
        if e.type == h.ACTIVITY_COMPLETED:
            return True, a.get("result")
        if e.type == h.TIMER_FIRED:
            return True, None
        if e.type == h.TIMER_CANCELED:
            return False, Canceled(f"timer canceled: workflow {self.workflow_id!r} was canceled")
        assert cmd.activity_id is not None and cmd.name is not None  # the other events are an activity's
        if e.type == h.ACTIVITY_CANCELED:
            err = ActivityError(
                f"activity {cmd.activity_id!r} canceled",
                activity_id=cmd.activity_id,
                activity_name=cmd.name,
                attempt=a.get("attempt", 0),
                type="Canceled",
            )
            err.__cause__ = Canceled(f"workflow {self.workflow_id!r} was canceled")
            return False, err
        failure = a.get("error") or {}
        kind = "timed out" if e.type == h.ACTIVITY_TIMED_OUT else "failed"
        return False, ActivityError(
            f"activity {cmd.activity_id!r} {kind} (attempt {a.get('attempt')}): "
            f"{failure.get('type', 'Error')}: {failure.get('message', '')}",
            activity_id=cmd.activity_id,
            activity_name=cmd.name,
            attempt=a.get("attempt", 0),
            type=failure.get("type", "ActivityError"),
            non_retryable=bool(failure.get("non_retryable")),
            details=failure.get("details"),
        )

    # ---- the end -------------------------------------------------------------------------------

    def _finish_ok(self, value: Any) -> None:
        try:
            result = json.loads(h.dumps(value))
        except (TypeError, ValueError) as e:
            self._finish_err(TypeError(f"workflow result is not JSON-able: {e}"))
            return
        self.done = True
        self.outcome = ("completed", result)
        self.sink.finish(self, "completed", result)

    def _finish_err(self, exc: BaseException) -> None:
        self.done = True
        state = "canceled" if is_canceled(exc) else "failed"
        self.outcome = (state, error_to_json(exc))
        self.sink.finish(self, state, self.outcome[1])

    def _nondeterminism(self, err: NondeterminismError) -> None:
        try:
            if self.coro is not None:
                self.coro.close()
        except BaseException:  # noqa: BLE001 - the code is being abandoned; a crash here is not its
            pass
        self.done = True
        self.outcome = ("failed", error_to_json(err))
        self.sink.finish(self, "failed", self.outcome[1])


def error_to_json(exc: BaseException) -> dict[str, Any]:
    """How an error is recorded: type, message, details, cause chain and a traceback tail."""
    d: dict[str, Any] = {
        "type": getattr(exc, "type", None) if isinstance(getattr(exc, "type", None), str) else type(exc).__name__,
        "class": type(exc).__name__,
        "message": str(exc),
    }
    if isinstance(exc, (ActivityError,)):
        d["activity_id"] = exc.activity_id
        d["non_retryable"] = exc.non_retryable
    details = getattr(exc, "details", None)
    if details is not None:
        try:
            d["details"] = json.loads(h.dumps(details))
        except (TypeError, ValueError):
            d["details"] = repr(details)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        d["cause"] = {"type": type(cause).__name__, "message": str(cause)}
    if isinstance(exc, NonRetryableError):
        d["non_retryable"] = True
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    d["traceback"] = tb[-4000:]
    return d
