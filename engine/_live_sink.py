"""The live sink: a replayer's new commands, cancels and end, written into the worker's open transaction.

``Worker.run_task`` (engine/_worker.py) gives a replayer one per transaction; during replay the
replayer's sink is a no-op, only a live transition writes. What it needs of the worker is
``SinkHooks``: the clock, whether the worker takes an activity at once, its lease owner's text, and
the options it runs an attempt with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from . import _history as h
from ._history import dumps
from ._options import StepOptions, attempt_deadlines
from ._replay import Replayer

log = logging.getLogger("engine")


@dataclass(frozen=True)
class SinkHooks:
    """The few things of its worker a live sink reads (built once per worker)."""

    clock: Any
    can_take: Callable[[str], bool]
    """Whether the worker leases a newly scheduled activity of this name in the same transaction."""
    owner_json: str
    """The worker's lease owner, as recorded in an activity row."""
    attempt_options: Callable[[str, str, Any], Any]
    """(workflow id, activity name, scheduled options) -> the options the worker runs the attempt with."""


class LiveSink:
    """Writes a replayer's new commands, cancels and end into the open transaction.

    The writes are held until ``flush`` (``Worker.run_task`` calls it once the code is blocked or
    done): the events of a transition go in with one INSERT, the other statements after it, in the
    order they were made. Nothing reads them before: a cancel, the only path that reads the
    database, flushes first."""

    __slots__ = ("w", "db", "scheduled", "rows", "stmts")

    def __init__(self, hooks: SinkHooks, db):
        self.w = hooks
        self.db = db
        self.scheduled: list[tuple[str, int, Any, StepOptions, float, tuple, float | None]] = []  # inserted leased:
        # (activity_id, cmd, input, options, leased at, its scheduled event's row, not inserted yet)
        self.rows: list[tuple] = []  # event rows not inserted yet (``h.event_row``), in seq order
        self.stmts: list[tuple[str, tuple]] = []  # statements not run yet, in order

    def flush(self) -> None:
        if self.rows:
            h.insert_events(self.db, self.rows)
            self.rows = []
        if self.stmts:
            for sql, params in self.stmts:
                self.db.execute(sql, params)
            self.stmts = []

    def _append(self, r: Replayer, type: str, attrs: dict, text: str | None = None) -> h.Event:
        seq, now = r.last_seq + 1, self.w.clock.now()
        self.rows.append(h.event_row(r.workflow_id, seq, type, now, dumps(attrs) if text is None else text))
        ev = h.Event(seq, type, now, attrs)
        r.record(ev)
        return ev

    def new_command(self, r, k, cmd, payload):
        now = self.w.clock.now()
        if cmd.kind == "activity":
            opts: StepOptions = payload["options"]
            opts_json = opts.to_json()
            # one this worker can run at once is inserted already leased (``Worker.lease`` appends its
            # started event once the code is blocked); else it waits, scheduled, for any worker
            take = self.w.can_take(cmd.name)
            run_opts = self.w.attempt_options(r.workflow_id, cmd.name, opts) if take else opts
            hb, close = attempt_deadlines(run_opts, now) if take else (None, None)
            input_text, opts_text = dumps(payload["input"]), opts.to_text()
            self.stmts.append(
                (
                    "INSERT INTO activities(workflow_id, activity_id, cmd, name, input, options, state, attempt, due_at, "
                    "hb_deadline, close_deadline, last_hb_at, owner) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        r.workflow_id,
                        cmd.activity_id,
                        k,
                        cmd.name,
                        input_text,
                        opts_text,
                        "running" if take else "scheduled",
                        1 if take else 0,
                        now,
                        hb,
                        close,
                        now if take else None,
                        self.w.owner_json if take else None,
                    ),
                )
            )
            attrs = {
                "cmd": k,
                "activity_id": cmd.activity_id,
                "name": cmd.name,
                "input": payload["input"],
                "options": opts_json,
            }
            # the attrs' JSON from the pieces just encoded: the same text as dumps(attrs) (keys in order)
            text = (
                f'{{"activity_id":{dumps(cmd.activity_id)},"cmd":{int(k)},"input":{input_text},'
                f'"name":{dumps(cmd.name)},"options":{opts_text}}}'
            )
            seq = r.last_seq + 1
            if take:  # inserted with its started event, one statement (``Worker.lease``)
                row = h.event_row(r.workflow_id, seq, h.ACTIVITY_SCHEDULED, now, text)
                r.record(h.Event(seq, h.ACTIVITY_SCHEDULED, now, attrs))
                self.scheduled.append(
                    (cmd.activity_id, k, payload["input"], run_opts, now, row, opts.heartbeat_timeout_s)
                )
            else:
                self.rows.append(h.event_row(r.workflow_id, seq, h.ACTIVITY_SCHEDULED, now, text))
                r.record(h.Event(seq, h.ACTIVITY_SCHEDULED, now, attrs))
        else:
            fire_at = now + payload["seconds"]
            self.stmts.append(
                (
                    "INSERT INTO timers(workflow_id, cmd, fire_at, state) VALUES (?,?,?, 'pending')",
                    (r.workflow_id, k, fire_at),
                )
            )
            self._append(r, h.TIMER_STARTED, {"cmd": k, "seconds": payload["seconds"], "fire_at": fire_at})

    def cancel_pending(self, r, k):
        self.flush()  # it reads the rows
        cmd = r.commands[k].command
        if cmd.kind == "timer":
            n = self.db.execute(
                "UPDATE timers SET state='canceled' WHERE workflow_id=? AND cmd=? AND state='pending'",
                (r.workflow_id, k),
            ).rowcount
            if n:
                self._append(r, h.TIMER_CANCELED, {"cmd": k})
            return
        row = self.db.execute(
            "SELECT state, attempt FROM activities WHERE workflow_id=? AND activity_id=?",
            (r.workflow_id, cmd.activity_id),
        ).fetchone()
        if row is not None and row[0] == "scheduled":
            self.db.execute(
                "DELETE FROM activities WHERE workflow_id=? AND activity_id=?", (r.workflow_id, cmd.activity_id)
            )  # closed: canceled
            self._append(
                r,
                h.ACTIVITY_CANCELED,
                {"cmd": k, "activity_id": cmd.activity_id, "attempt": row[1], "reason": "canceled before it ran"},
            )
        # running: the attempt sees ctx.cancel_requested; its outcome resolves the command

    def finish(self, r, state, payload):
        now = self.w.clock.now()
        typ = {"completed": h.WORKFLOW_COMPLETED, "failed": h.WORKFLOW_FAILED, "canceled": h.WORKFLOW_CANCELED}[state]
        text = dumps(payload)
        self._append(
            r,
            typ,
            {"result": payload} if state == "completed" else {"error": payload},
            text=f'{{"result":{text}}}' if state == "completed" else f'{{"error":{text}}}',
        )
        self.stmts.append(
            (
                "UPDATE workflows SET state=?, result=?, error=?, updated_at=?, task_pending=0 WHERE id=?",
                (
                    state,
                    text if state == "completed" else None,
                    None if state == "completed" else text,
                    now,
                    r.workflow_id,
                ),
            )
        )
        # nothing is recorded after the end: a still-running attempt becomes stale (its heartbeat raises
        # LeaseLost, its outcome is dropped, ctx.cancel_requested is True); its row is closed (canceled).
        # Only a command without a resolution in the history can have an open row or a pending timer.
        if len(r.resolutions) < len(r.commands):
            self.stmts.append(("DELETE FROM activities WHERE workflow_id=?", (r.workflow_id,)))
            self.stmts.append(
                ("UPDATE timers SET state='canceled' WHERE workflow_id=? AND state='pending'", (r.workflow_id,))
            )
        if state == "failed":
            log.error("workflow %s failed: %s: %s", r.workflow_id, payload.get("type"), payload.get("message"))
