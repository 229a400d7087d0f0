"""Temporal's event history read as the embedded engine's events (``engine._history.Event``).

The same event types and attributes, so that ``ctl history``, ``--json`` and the run continuation
(``workflows.collect_prior``) read either backend alike: ``workflow_started`` (``workflow``,
``input``), ``activity_scheduled`` (``activity_id``, ``name``, ``input``, ``options``),
``activity_started``/``completed``/``failed``/``timed_out``/``canceled`` (``activity_id``,
``attempt``, ``result`` or ``error``), ``timer_started`` (``seconds``, ``fire_at``) / ``fired`` /
``canceled``, ``cancel_requested``, ``workflow_completed``/``failed``/``canceled``.

Differences that come from Temporal itself: retried attempts are not events (only the final
outcome is, with its attempt number), heartbeats are not events (the last details live with the
pending activity, see ``TemporalEngine.status``), and workflow-task events are left out.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure

from .. import _history as h
from .._history import Event

_SKIPPED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
}


def _payloads(converter: Any, payloads: Any) -> list[Any]:
    if payloads is None or not payloads.payloads:
        return []
    try:
        return list(converter.from_payloads(payloads.payloads))
    except Exception:  # noqa: BLE001 - an undecodable payload is shown, not fatal
        return ["<undecodable payload>"]


def failure_json(failure: Failure, converter: Any) -> dict[str, Any]:
    """A Temporal failure as the engine records errors: type, message, non_retryable, details, cause."""
    d: dict[str, Any] = {"message": failure.message}
    if failure.HasField("application_failure_info"):
        info = failure.application_failure_info
        d["type"] = info.type or "ApplicationError"
        d["non_retryable"] = info.non_retryable
        details = _payloads(converter, info.details)
        if details:
            d["details"] = details[0]
    elif failure.HasField("timeout_failure_info"):
        d["type"] = "TimedOut"
        d["timeout"] = TimeoutType.Name(failure.timeout_failure_info.timeout_type).removeprefix("TIMEOUT_TYPE_").lower()
    elif failure.HasField("canceled_failure_info"):
        d["type"] = "Canceled"
    elif failure.HasField("activity_failure_info"):
        d["type"] = "ActivityError"
        d["activity_id"] = failure.activity_failure_info.activity_id
    else:
        d["type"] = "Failure"
    if failure.HasField("cause"):
        cause = failure_json(failure.cause, converter)
        d["cause"] = {"type": cause.get("type"), "message": cause.get("message")}
        if d["type"] == "ActivityError":  # show the activity's own error, not the wrapper
            d["type"], d["message"] = cause.get("type", d["type"]), cause.get("message", d["message"])
            for key in ("non_retryable", "details"):
                if key in cause:
                    d[key] = cause[key]
    return d


def _seconds(duration: Any) -> float:
    return duration.seconds + duration.nanos / 1e9


def convert_history(events: Any, converter: Any, workflow_type: str = "") -> list[Event]:
    """Temporal history events (protos) -> engine events, numbered 1, 2, ... in order."""
    out: list[Event] = []
    scheduled: dict[int, str] = {}  # scheduled event id -> activity id
    started: dict[int, int] = {}  # scheduled event id -> attempt
    timers: dict[str, float] = {}
    for ev in events:
        et = ev.event_type
        if et in _SKIPPED:
            continue
        t = ev.event_time.seconds + ev.event_time.nanos / 1e9
        typ: str
        attrs: dict[str, Any]
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            a = ev.workflow_execution_started_event_attributes
            args = _payloads(converter, a.input)
            typ, attrs = (
                h.WORKFLOW_STARTED,
                {"workflow": a.workflow_type.name or workflow_type, "input": args[0] if args else None},
            )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            scheduled[ev.event_id] = a.activity_id
            args = _payloads(converter, a.input)
            rp = a.retry_policy
            typ, attrs = (
                h.ACTIVITY_SCHEDULED,
                {
                    "activity_id": a.activity_id,
                    "name": a.activity_type.name,
                    "input": args[0] if args else None,
                    "options": {
                        "id": a.activity_id,
                        "start_to_close_timeout_s": _seconds(a.start_to_close_timeout),
                        "heartbeat_timeout_s": _seconds(a.heartbeat_timeout) or None,
                        "retry": {
                            "max_attempts": rp.maximum_attempts,
                            "initial_interval_s": _seconds(rp.initial_interval),
                            "backoff": rp.backoff_coefficient,
                            "max_interval_s": _seconds(rp.maximum_interval),
                            "non_retryable": list(rp.non_retryable_error_types),
                        },
                    },
                },
            )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            started[a.scheduled_event_id] = a.attempt
            typ, attrs = (
                h.ACTIVITY_STARTED,
                {"activity_id": scheduled.get(a.scheduled_event_id, ""), "attempt": a.attempt},
            )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = ev.activity_task_completed_event_attributes
            res = _payloads(converter, a.result)
            typ, attrs = (
                h.ACTIVITY_COMPLETED,
                {
                    "activity_id": scheduled.get(a.scheduled_event_id, ""),
                    "attempt": started.get(a.scheduled_event_id, 1),
                    "result": res[0] if res else None,
                },
            )
        elif et in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            a = (
                ev.activity_task_failed_event_attributes
                if et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
                else ev.activity_task_timed_out_event_attributes
            )
            typ = h.ACTIVITY_FAILED if et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED else h.ACTIVITY_TIMED_OUT
            attrs = {
                "activity_id": scheduled.get(a.scheduled_event_id, ""),
                "attempt": started.get(a.scheduled_event_id, 1),
                "final": True,
                "error": failure_json(a.failure, converter),
            }
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            a = ev.activity_task_cancel_requested_event_attributes
            typ, attrs = "activity_cancel_requested", {"activity_id": scheduled.get(a.scheduled_event_id, "")}
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            a = ev.activity_task_canceled_event_attributes
            typ, attrs = (
                h.ACTIVITY_CANCELED,
                {
                    "activity_id": scheduled.get(a.scheduled_event_id, ""),
                    "attempt": started.get(a.scheduled_event_id, 1),
                },
            )
        elif et == EventType.EVENT_TYPE_TIMER_STARTED:
            a = ev.timer_started_event_attributes
            seconds = _seconds(a.start_to_fire_timeout)
            timers[a.timer_id] = seconds
            typ, attrs = h.TIMER_STARTED, {"timer_id": a.timer_id, "seconds": seconds, "fire_at": t + seconds}
        elif et == EventType.EVENT_TYPE_TIMER_FIRED:
            typ, attrs = h.TIMER_FIRED, {"timer_id": ev.timer_fired_event_attributes.timer_id}
        elif et == EventType.EVENT_TYPE_TIMER_CANCELED:
            typ, attrs = h.TIMER_CANCELED, {"timer_id": ev.timer_canceled_event_attributes.timer_id}
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            typ, attrs = h.CANCEL_REQUESTED, {}
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            res = _payloads(converter, ev.workflow_execution_completed_event_attributes.result)
            typ, attrs = h.WORKFLOW_COMPLETED, {"result": res[0] if res else None}
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            typ, attrs = (
                h.WORKFLOW_FAILED,
                {"error": failure_json(ev.workflow_execution_failed_event_attributes.failure, converter)},
            )
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            typ, attrs = h.WORKFLOW_CANCELED, {"error": {"type": "Canceled", "message": "workflow canceled"}}
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            reason = ev.workflow_execution_terminated_event_attributes.reason
            typ, attrs = h.WORKFLOW_FAILED, {"error": {"type": "Terminated", "message": reason or "terminated"}}
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            typ, attrs = h.WORKFLOW_FAILED, {"error": {"type": "TimedOut", "message": "workflow timed out"}}
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            f = ev.workflow_task_failed_event_attributes.failure
            typ, attrs = (
                "workflow_task_failed",
                {"error": {"type": "WorkflowTaskFailed", "message": f.message.splitlines()[0] if f.message else ""}},
            )
        else:
            name = EventType.Name(et).removeprefix("EVENT_TYPE_").lower()
            typ, attrs = name, {}
        out.append(Event(len(out) + 1, typ, t, attrs))
    return out
