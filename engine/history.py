"""Events: the append-only history of a workflow, and JSON helpers for what crosses into it.

Each event has a per-workflow ``seq`` (1, 2, ...), a ``type`` (below), the
clock ``time`` it was recorded and ``attrs`` (JSON). Command events carry
``cmd``, the index of the command (activity or timer) in the workflow's code
order; replay matches commands by that order.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any, NamedTuple

WORKFLOW_STARTED = "workflow_started"
WORKFLOW_COMPLETED = "workflow_completed"
WORKFLOW_FAILED = "workflow_failed"
WORKFLOW_CANCELED = "workflow_canceled"
CANCEL_REQUESTED = "cancel_requested"
ACTIVITY_SCHEDULED = "activity_scheduled"
ACTIVITY_STARTED = "activity_started"
ACTIVITY_HEARTBEAT = "activity_heartbeat"
ACTIVITY_COMPLETED = "activity_completed"
ACTIVITY_FAILED = "activity_failed"  # attrs.final says whether the step failed for good
ACTIVITY_TIMED_OUT = "activity_timed_out"  # attrs.final likewise
ACTIVITY_CANCELED = "activity_canceled"
TIMER_STARTED = "timer_started"
TIMER_FIRED = "timer_fired"
TIMER_CANCELED = "timer_canceled"

TERMINAL_EVENTS = {WORKFLOW_COMPLETED, WORKFLOW_FAILED, WORKFLOW_CANCELED}


class Event(NamedTuple):
    """One recorded event (immutable; a tuple, so cheap to build while reading long histories)."""

    seq: int
    type: str
    time: float
    attrs: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "time": self.time, "attrs": self.attrs}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Event":
        return cls(seq=int(d["seq"]), type=str(d["type"]), time=float(d["time"]), attrs=dict(d.get("attrs") or {}))


def dumps(value: Any) -> str:
    """Compact, key-sorted JSON (pydantic models are dumped in JSON mode first)."""
    return json.dumps(to_jsonable(value), separators=(",", ":"), sort_keys=True, allow_nan=False)


def to_jsonable(value: Any) -> Any:
    """A pydantic model becomes its JSON-mode dump; anything else must already be JSON-able."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    return value


def read_events(db: sqlite3.Connection, workflow_id: str, after_seq: int = 0) -> list[Event]:
    rows = db.execute(
        "SELECT seq, type, time, attrs FROM events WHERE workflow_id=? AND seq>? ORDER BY seq",
        (workflow_id, after_seq),
    ).fetchall()
    return [Event(seq, typ, t, json.loads(a)) for seq, typ, t, a in rows]


def append_event(db: sqlite3.Connection, workflow_id: str, seq: int, type: str, time: float, attrs: dict) -> Event:
    """Append one event at ``seq`` (the caller knows the last seq; the primary key guards it)."""
    db.execute(
        "INSERT INTO events(workflow_id, seq, type, time, attrs) VALUES (?,?,?,?,?)",
        (workflow_id, seq, type, time, dumps(attrs)),
    )
    return Event(seq, type, time, attrs)


def append_next(db: sqlite3.Connection, workflow_id: str, type: str, time: float, attrs: dict) -> Event:
    """Append one event after the last recorded one."""
    (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id=?", (workflow_id,)).fetchone()
    return append_event(db, workflow_id, last + 1, type, time, attrs)
