"""Events: the append-only history of a workflow, and JSON helpers for what crosses into it.

Each event has a per-workflow ``seq`` (1, 2, ...), a ``type`` (below), the
clock ``time`` it was recorded and ``attrs`` (JSON). Command events carry
``cmd``, the index of the command (activity or timer) in the workflow's code
order; replay matches commands by that order.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from typing import Any, NamedTuple

from ._errors import DamagedRecord

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
ACTIVITY_PREEMPTED = "activity_preempted"  # a polite stop ended the attempt; not a failure, no retry counted
PREEMPTED = "preempted"  # a polite stop reached the worker while the workflow had no attempt running (a wait)
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


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)  # built once: json.dumps
# with arguments builds a new encoder per call, a tenth of an activity's Python time
_SCALARS = (int, str, bool, type(None))
_encode_str = json.encoder.encode_basestring_ascii  # what _ENCODER.encode does with a str (ensure_ascii)
try:  # the C encoder behind _ENCODER, made once (JSONEncoder.encode makes one per call): no circular-reference
    # markers, so a cycle is a RecursionError, reported as the ValueError json gives
    # (the C accelerator json.encoder imports when it can; typeshed leaves it out)
    from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]

    _C_ENCODE = (
        _c_make_encoder(
            None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, False
        )
        if _c_make_encoder is not None
        else None
    )
except ImportError:  # pragma: no cover - CPython has it
    _C_ENCODE = None


def dumps(value: Any) -> str:
    """Compact, key-sorted JSON (pydantic models are dumped in JSON mode first); the same text as
    ``_ENCODER.encode``, scalars and containers without building an encoder per call."""
    t = type(value)
    if t is str:
        return _encode_str(value)
    if t is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is float and value - value == 0.0:  # finite (NaN and infinities: the encoder's ValueError)
        return float.__repr__(value)
    value = to_jsonable(value)
    if _C_ENCODE is None or not isinstance(value, (dict, list, tuple)):
        return _ENCODER.encode(value)
    try:
        return "".join(_C_ENCODE(value, 0))
    except RecursionError:
        raise ValueError("Circular reference detected") from None


def normalized(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists, models dicts); ``TypeError`` or
    ``ValueError`` if it is not JSON-able. Ints, strings, booleans and None are returned as they are."""
    if type(value) in _SCALARS:
        return value
    return json.loads(dumps(value))


def to_jsonable(value: Any) -> Any:
    """A pydantic model becomes its JSON-mode dump; anything else must already be JSON-able."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    return value


def event_crc(workflow_id: str, seq: int, type: str, time: float, attrs_json: str) -> int:
    """The checksum stored beside each event: damage inside a page that SQLite cannot see (its
    integrity check stays ok) is found when the event is read back."""
    text = f"{workflow_id}\x00{seq}\x00{type}\x00{float(time).hex()}\x00{attrs_json}"
    return zlib.crc32(text.encode("utf-8"))


def database_file(db: sqlite3.Connection) -> str:
    """The file behind a connection (for messages), from SQLite itself."""
    try:
        return str(db.execute("PRAGMA database_list").fetchone()[2] or "(in memory)")
    except sqlite3.Error:
        return "(unknown)"


def decode_json(db: sqlite3.Connection, raw: str | bytes | None, *, workflow_id: str, record: str) -> Any:
    """JSON of one stored record, or ``DamagedRecord`` naming the database, workflow and record."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if text is None:
            raise ValueError("empty")
        return json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise damaged(db, workflow_id, record, f"not valid JSON ({type(e).__name__})") from None


def damaged(db: sqlite3.Connection, workflow_id: str, record: str, why: str) -> DamagedRecord:
    return DamagedRecord(
        f"engine database {database_file(db)} is damaged: workflow {workflow_id}: {record} cannot be read ({why}); "
        f"nothing was written; `ctl doctor` lists every damaged record",
        workflow_id=workflow_id,
        record=record,
    )


def read_events(db: sqlite3.Connection, workflow_id: str, after_seq: int = 0, limit: int = -1) -> list[Event]:
    """The events after ``after_seq`` (at most ``limit``), each checked against its checksum
    (``DamagedRecord`` if not). Read as text, the common case; where SQLite cannot give a column as
    UTF-8 text, or a column holds something else, read again as bytes to name the record."""
    try:
        rows = db.execute(
            "SELECT seq, type, time, attrs, crc FROM events WHERE workflow_id=? AND seq>? ORDER BY seq LIMIT ?",
            (workflow_id, after_seq, limit),
        ).fetchall()
    except sqlite3.OperationalError as e:
        if "decode" not in str(e):
            raise damaged(db, workflow_id, "its history", f"SQLite: {e}") from None
        rows = None
    except sqlite3.DatabaseError as e:
        raise damaged(db, workflow_id, "its history", f"SQLite: {e}") from None
    out: list[Event] = []
    if rows is None:
        return _read_events_as_bytes(db, workflow_id, after_seq, limit)
    expect = after_seq + 1
    decode = _DECODE
    for seq, typ, t, attrs, crc in rows:
        if type(typ) is not str or type(attrs) is not str or type(seq) is not int or type(t) is not float:
            return _read_events_as_bytes(db, workflow_id, after_seq, limit)
        if crc is not None and crc != zlib.crc32(
            f"{workflow_id}\x00{seq}\x00{typ}\x00{t.hex()}\x00{attrs}".encode("utf-8")
        ):  # = event_crc
            raise damaged(db, workflow_id, f"event {seq}", "checksum mismatch")
        if seq != expect:
            raise damaged(db, workflow_id, f"event {expect}", f"missing (next recorded is {seq})")
        try:
            value, end = decode(attrs)
        except (ValueError, RecursionError):
            value, end = None, -1
        if end != len(attrs):  # trailing text, or not JSON: as json.loads says
            value = decode_json(db, attrs, workflow_id=workflow_id, record=f"event {seq}")
        if type(value) is not dict:
            raise damaged(db, workflow_id, f"event {seq}", "attributes are not an object")
        out.append(Event(seq, typ, t, value))
        expect += 1
    return out


_DECODE = json.JSONDecoder().raw_decode  # json.loads without its wrappers (the end is checked by the caller)


def _read_events_as_bytes(db: sqlite3.Connection, workflow_id: str, after_seq: int, limit: int) -> list[Event]:
    """``read_events`` with the text columns read as bytes: names the record that is not UTF-8 text."""
    try:
        rows = db.execute(
            "SELECT seq, CAST(type AS BLOB), time, CAST(attrs AS BLOB), crc FROM events "
            "WHERE workflow_id=? AND seq>? ORDER BY seq LIMIT ?",
            (workflow_id, after_seq, limit),
        ).fetchall()
    except sqlite3.DatabaseError as e:
        raise damaged(db, workflow_id, "its history", f"SQLite: {e}") from None
    out = []
    expect = after_seq + 1
    for seq, typ, t, attrs, crc in rows:
        record = f"event {seq}"
        try:
            typ_s, attrs_s = bytes(typ).decode("utf-8"), bytes(attrs).decode("utf-8")
        except (TypeError, UnicodeDecodeError):
            raise damaged(db, workflow_id, record, "not UTF-8 text") from None
        if not isinstance(seq, int) or not isinstance(t, (int, float)):
            raise damaged(db, workflow_id, record, "a number column holds something else")
        if crc is not None and crc != event_crc(workflow_id, seq, typ_s, t, attrs_s):
            raise damaged(db, workflow_id, record, "checksum mismatch")
        if seq != expect:
            raise damaged(db, workflow_id, f"event {expect}", f"missing (next recorded is {seq})")
        value = decode_json(db, attrs_s, workflow_id=workflow_id, record=record)
        if not isinstance(value, dict):
            raise damaged(db, workflow_id, record, "attributes are not an object")
        out.append(Event(seq, typ_s, t, value))
        expect += 1
    return out


_INSERT_EVENTS = "INSERT INTO events(workflow_id, seq, type, time, attrs, crc) VALUES (?,?,?,?,?,?)"


def event_row(workflow_id: str, seq: int, type: str, time: float, text: str) -> tuple:
    """The columns of one event as ``insert_events`` writes them (``text``: ``dumps`` of its attrs)."""
    return (workflow_id, seq, type, time, text, event_crc(workflow_id, seq, type, time, text))


def insert_events(db: sqlite3.Connection, rows: list[tuple]) -> None:
    """Insert ``event_row``s with one statement (the primary key guards each seq)."""
    n = len(rows)
    sql = _INSERT_N[n] if n < len(_INSERT_N) else _INSERT_EVENTS + ",(?,?,?,?,?,?)" * (n - 1)
    db.execute(sql, rows[0] if n == 1 else [x for row in rows for x in row])


_INSERT_N = ["", *(_INSERT_EVENTS + ",(?,?,?,?,?,?)" * (n - 1) for n in range(1, 9))]  # by the rows' count


def append_event(
    db: sqlite3.Connection, workflow_id: str, seq: int, type: str, time: float, attrs: dict, text: str | None = None
) -> Event:
    """Append one event at ``seq`` (the caller knows the last seq; the primary key guards it).
    ``text``: ``dumps(attrs)`` where the caller has it already."""
    db.execute(_INSERT_EVENTS, event_row(workflow_id, seq, type, time, dumps(attrs) if text is None else text))
    return Event(seq, type, time, attrs)


def append_next(db: sqlite3.Connection, workflow_id: str, type: str, time: float, attrs: dict) -> Event:
    """Append one event after the last recorded one."""
    (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id=?", (workflow_id,)).fetchone()
    return append_event(db, workflow_id, last + 1, type, time, attrs)
