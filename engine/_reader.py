"""The read side of the engine: a workflow's status, its history, every workflow, its activities.

``Reader(store)`` reads one engine database through a ``Store`` (a read-only one for ``ctl status`` /
``history`` / ``show`` / ``ctl ui``: ``Store(path, readonly=True)``) and writes nothing. ``Engine``
(engine/_engine.py) is a ``Reader`` that also runs workflows; a process that only reads imports this
module and not the running side (the worker loop, replay, the subprocess runner).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from . import _history as h
from ._errors import BadInput, DamagedRecord, NotFound
from ._history import Event, damaged, decode_json, read_events
from ._ids import check_id
from ._store import Store

TERMINAL = ("completed", "failed", "canceled")


@dataclass
class WorkflowStatus:
    workflow_id: str
    workflow: str
    state: str  # running | completed | failed | canceled
    created_at: float
    updated_at: float
    cancel_requested: bool
    error: dict | None = None
    result: Any = None
    waiting_on: str | None = None
    """What a running workflow waits for, e.g. ``activity train-000500 (running, attempt 2)``."""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ActivityInfo:
    activity_id: str
    name: str
    state: str  # scheduled | running | completed | failed | canceled
    attempt: int
    due_at: float
    heartbeat_deadline: float | None
    last_heartbeat_details: Any


class Reader:
    """Reads workflows of one engine database (``store``); writes nothing. Of ``app.backend.Backend`` it has
    the read side; the capability flags below say it runs nothing (``Engine`` sets its own); it has no ``owner``, ``stop``,
    ``start`` or ``run_until_complete``: a read-only command calls none."""

    backend = "embedded"
    polite_stop = False
    attempt_overrides = False

    def __init__(self, store: Store):
        self.store = store

    def _row(self, workflow_id: str) -> tuple:
        check_id(workflow_id)
        row = self.store.query_one(
            "SELECT id, CAST(name AS BLOB), CAST(state AS BLOB), created_at, updated_at, cancel_requested, "
            "CAST(error AS BLOB), CAST(result AS BLOB) FROM workflows WHERE id=?",
            (workflow_id,),
        )
        if row is None:
            raise NotFound(f"no workflow with id {workflow_id!r}")
        out = list(row)
        out[4] = self._updated_at(workflow_id, out[4])
        for i, column in ((1, "name"), (2, "state"), (6, "error"), (7, "result")):
            if out[i] is not None:
                try:
                    out[i] = bytes(out[i]).decode("utf-8")
                except UnicodeDecodeError:
                    with self.store._lock:
                        raise damaged(self.store.conn, workflow_id, f"its {column}", "not UTF-8 text") from None
        return tuple(out)

    def _updated_at(self, workflow_id: str, row_time: Any) -> Any:
        """When the workflow last changed: the later of its row's time and its last event's (a task
        that only appends events leaves the row as it is: one page less to write per activity). A
        damaged history is reported where it is read, not here."""
        try:
            last = self.store.query_one(
                "SELECT time FROM events WHERE workflow_id=? ORDER BY seq DESC LIMIT 1", (workflow_id,)
            )
        except sqlite3.DatabaseError:
            return row_time
        if last and isinstance(last[0], (int, float)) and isinstance(row_time, (int, float)):
            return max(row_time, last[0])
        return row_time

    def status(self, workflow_id: str) -> WorkflowStatus:
        wid, name, state, created, updated, cancel, error, result = self._row(workflow_id)
        with self.store._lock:
            db = self.store.conn
            if state not in ("running", *TERMINAL) or not isinstance(name, str):
                raise damaged(db, workflow_id, "its workflow row", f"unknown state {state!r}")
            st = WorkflowStatus(
                wid,
                name,
                state,
                created,
                updated,
                bool(cancel),
                decode_json(db, error, workflow_id=wid, record="its error") if error else None,
                decode_json(db, result, workflow_id=wid, record="its result") if result else None,
            )
        if state == "running":
            st.waiting_on = self._waiting_on(workflow_id)
        return st

    def _waiting_on(self, workflow_id: str) -> str | None:
        row = self.store.query_one(
            "SELECT activity_id, state, attempt, due_at FROM activities WHERE workflow_id=? "
            "AND state IN ('scheduled', 'running') ORDER BY cmd DESC LIMIT 1",
            (workflow_id,),
        )
        if row:
            aid, state, attempt, due = row
            if state == "running":
                return f"activity {aid} (running, attempt {attempt})"
            return f"activity {aid} (scheduled, attempt {attempt + 1} due at {due:.3f})"
        row = self.store.query_one("SELECT fire_at FROM timers WHERE workflow_id=? AND state='pending'", (workflow_id,))
        if row:
            return f"timer (fires at {row[0]:.3f})"
        return "workflow task"

    def history(self, workflow_id: str, after_seq: int = 0) -> list[Event]:
        """The workflow's events (only those after ``after_seq``: a reader that follows it, app/traces.py)."""
        self._row(workflow_id)
        with self.store._lock:
            events = read_events(self.store.conn, workflow_id, after_seq)
            if after_seq > 0:
                return events
            if not events or events[0].type != h.WORKFLOW_STARTED:  # started and its event are one transaction
                raise damaged(self.store.conn, workflow_id, "event 1", "missing: no workflow_started event")
            return events

    def describe(self) -> str:
        """Where this engine keeps its state, for a log line: the database file."""
        return self.store.path

    def generations(self, base: str) -> list[WorkflowStatus]:
        """The workflows of a run continued by fresh workflows: ``base``, ``base/2``, ``base/3``... that exist,
        oldest first (app/runs.py names them). A damaged row is left out (``list_readable`` reports it)."""
        try:
            rows = self.store.query(
                "SELECT CAST(id AS BLOB) FROM workflows WHERE id = ? OR substr(id, 1, ?) = ?",
                (base, len(base) + 1, base + "/"),
            )
        except sqlite3.DatabaseError as e:
            with self.store._lock:
                raise damaged(self.store.conn, "(all)", "the workflow table", f"SQLite: {e}") from None
        found = []
        for (raw,) in rows:
            try:
                wid = bytes(raw).decode("utf-8")
                rest = wid[len(base) + 1 :]
                if wid == base or rest.isdigit():
                    found.append((1 if wid == base else int(rest), self.status(wid)))
            except (UnicodeDecodeError, BadInput, sqlite3.DatabaseError):
                continue
        return [st for _, st in sorted(found, key=lambda x: x[0])]

    def list_workflows(self) -> list[WorkflowStatus]:
        rows = self.store.query("SELECT id FROM workflows ORDER BY created_at, id")
        return [self.status(r[0]) for r in rows]

    def list_readable(self) -> tuple[list[WorkflowStatus], list[DamagedRecord]]:
        """Every workflow whose row can be read, and the damage found in the others."""

        try:
            rows = self.store.query("SELECT CAST(id AS BLOB) FROM workflows ORDER BY created_at, id")
        except sqlite3.DatabaseError as e:
            with self.store._lock:
                raise damaged(self.store.conn, "(all)", "the workflow table", f"SQLite: {e}") from None
        good, bad = [], []
        for (raw,) in rows:
            try:
                wid = bytes(raw).decode("utf-8")
                check_id(wid)
                good.append(self.status(wid))
            except (UnicodeDecodeError, BadInput, sqlite3.DatabaseError) as e:
                if not isinstance(e, DamagedRecord):
                    with self.store._lock:
                        e = damaged(self.store.conn, repr(bytes(raw))[2:-1], "its workflow row", str(e))
                bad.append(e)
        return good, bad

    def activities(self, workflow_id: str) -> list[ActivityInfo]:
        """Every activity the workflow scheduled, in command order: an open one (scheduled or running)
        as its row says, a closed one (its row deleted) as its history says."""
        infos: dict[str, ActivityInfo] = {}
        for e in self.history(workflow_id):
            a = e.attrs
            info = infos.get(a.get("activity_id"))  # type: ignore[arg-type]
            if e.type == h.ACTIVITY_SCHEDULED:
                infos[a["activity_id"]] = ActivityInfo(a["activity_id"], a["name"], "scheduled", 0, e.time, None, None)
            elif info is None:
                continue
            elif e.type == h.ACTIVITY_STARTED:
                info.state, info.attempt = "running", a["attempt"]
            elif e.type == h.ACTIVITY_HEARTBEAT and a.get("details") is not None:
                info.last_heartbeat_details = a["details"]
            elif e.type == h.ACTIVITY_COMPLETED:
                info.state = "completed"
            elif e.type == h.ACTIVITY_CANCELED:
                info.state = "canceled"
            elif e.type in (h.ACTIVITY_FAILED, h.ACTIVITY_TIMED_OUT):
                info.state = "failed" if a.get("final") else "scheduled"
                info.due_at = a.get("retry_at", info.due_at)
        rows = self.store.query(
            "SELECT activity_id, state, attempt, due_at, hb_deadline, details FROM activities WHERE workflow_id=?",
            (workflow_id,),
        )
        open_rows = {r[0]: r for r in rows}
        for aid, info in infos.items():
            row = open_rows.get(aid)
            if row is not None:
                _, info.state, info.attempt, info.due_at, info.heartbeat_deadline, det = row
                if det:
                    info.last_heartbeat_details = json.loads(det)
            elif info.state in ("scheduled", "running"):
                info.state = "canceled"  # closed when its workflow ended (no event of its own)
        return list(infos.values())

    def close(self) -> None:
        try:
            self.store.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Reader", "WorkflowStatus", "ActivityInfo", "TERMINAL"]
