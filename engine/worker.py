"""The worker: state transitions of workflow tasks, activities and timers, and the polling loop.

Everything a worker does is one ``Store.transaction``:

- ``task``: replay the workflow code over its history and record what it asks
  for next (activity scheduled, timer started, workflow ended). When this
  worker can run a newly scheduled activity right away, its lease is taken in
  the same transaction (eager dispatch).
- ``lease``: attempt ``n+1`` of a due activity is leased (the fencing token).
- ``complete`` / ``fail``: the attempt's outcome, then the workflow task that
  follows, then the next eager lease: one transaction per activity in a chain.
- ``expire``: a lease past its heartbeat or start-to-close deadline, or whose
  owner is known dead, is timed out and redelivered (or fails for good).
- ``timer``: a due timer fires, then the workflow task that follows.
- ``heartbeat``: details and a later deadline, only for the current attempt.

``Engine`` (engine/engine.py) mixes this in and adds the public API.
"""
from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from . import history as h
from . import leases, proctree
from .activity import Lease, LiveActivityContext
from .errors import BadInput, LeaseLost, NonRetryableError
from .history import append_event, append_next, dumps, normalized, read_events
from .options import StepOptions
from .replay import Replayer, error_to_json

log = logging.getLogger("engine")

CACHE_SIZE = 256


class _Redo(Exception):
    """A fast path's assumption did not hold: its transaction is rolled back and the plain path runs."""


GROUP_MAX = 256  # outcomes recorded by one group commit at most


class _LiveSink:
    """Writes a replayer's new commands, cancels and end into the open transaction.

    The writes are held until ``flush`` (``Worker._run_task`` calls it once the code is blocked or
    done): the events of a transition go in with one INSERT, the other statements after it, in the
    order they were made. Nothing reads them before: a cancel, the only path that reads the
    database, flushes first."""

    def __init__(self, worker: "Worker", db):
        self.w = worker
        self.db = db
        self.scheduled: list[tuple[str, int, Any, StepOptions, float, tuple]] = []  # inserted leased:
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
            # one this worker can run at once is inserted already leased (``Worker._lease`` appends its
            # started event once the code is blocked); else it waits, scheduled, for any worker
            take = self.w._can_take(cmd.name)
            hb, close = self.w._deadlines(opts, now) if take else (None, None)
            input_text, opts_text = dumps(payload["input"]), opts.to_text()
            self.stmts.append((
                "INSERT INTO activities(workflow_id, activity_id, cmd, name, input, options, state, attempt, due_at, "
                "hb_deadline, close_deadline, last_hb_at, owner) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (r.workflow_id, cmd.activity_id, k, cmd.name, input_text, opts_text,
                 "running" if take else "scheduled", 1 if take else 0, now, hb, close, now if take else None,
                 self.w._owner_json() if take else None),
            ))
            attrs = {"cmd": k, "activity_id": cmd.activity_id, "name": cmd.name, "input": payload["input"],
                     "options": opts_json}
            # the attrs' JSON from the pieces just encoded: the same text as dumps(attrs) (keys in order)
            text = (f'{{"activity_id":{dumps(cmd.activity_id)},"cmd":{int(k)},"input":{input_text},'
                    f'"name":{dumps(cmd.name)},"options":{opts_text}}}')
            seq = r.last_seq + 1
            if take:  # inserted with its started event, one statement (``Worker._lease``)
                row = h.event_row(r.workflow_id, seq, h.ACTIVITY_SCHEDULED, now, text)
                r.record(h.Event(seq, h.ACTIVITY_SCHEDULED, now, attrs))
                self.scheduled.append((cmd.activity_id, k, payload["input"], opts, now, row))
            else:
                self.rows.append(h.event_row(r.workflow_id, seq, h.ACTIVITY_SCHEDULED, now, text))
                r.record(h.Event(seq, h.ACTIVITY_SCHEDULED, now, attrs))
        else:
            fire_at = now + payload["seconds"]
            self.stmts.append(("INSERT INTO timers(workflow_id, cmd, fire_at, state) VALUES (?,?,?, 'pending')",
                               (r.workflow_id, k, fire_at)))
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
            self.db.execute("DELETE FROM activities WHERE workflow_id=? AND activity_id=?",
                            (r.workflow_id, cmd.activity_id))  # closed: canceled
            self._append(
                r, h.ACTIVITY_CANCELED,
                {"cmd": k, "activity_id": cmd.activity_id, "attempt": row[1], "reason": "canceled before it ran"},
            )
        # running: the attempt sees ctx.cancel_requested; its outcome resolves the command

    def finish(self, r, state, payload):
        now = self.w.clock.now()
        typ = {"completed": h.WORKFLOW_COMPLETED, "failed": h.WORKFLOW_FAILED, "canceled": h.WORKFLOW_CANCELED}[state]
        text = dumps(payload)
        self._append(r, typ, {"result": payload} if state == "completed" else {"error": payload},
                     text=f'{{"result":{text}}}' if state == "completed" else f'{{"error":{text}}}')
        self.stmts.append((
            "UPDATE workflows SET state=?, result=?, error=?, updated_at=?, task_pending=0 WHERE id=?",
            (state, text if state == "completed" else None, None if state == "completed" else text, now,
             r.workflow_id),
        ))
        # nothing is recorded after the end: a still-running attempt becomes stale (its heartbeat raises
        # LeaseLost, its outcome is dropped, ctx.cancel_requested is True); its row is closed (canceled).
        # Only a command without a resolution in the history can have an open row or a pending timer.
        if len(r.resolutions) < len(r.commands):
            self.stmts.append(("DELETE FROM activities WHERE workflow_id=?", (r.workflow_id,)))
            self.stmts.append(("UPDATE timers SET state='canceled' WHERE workflow_id=? AND state='pending'",
                               (r.workflow_id,)))
        if state == "failed":
            log.error("workflow %s failed: %s: %s", r.workflow_id, payload.get("type"), payload.get("message"))


class Worker:
    """Transitions and the loop; state set up by ``Engine.__init__``."""

    # set by Engine.__init__: store, clock, owner, _workflows, _activities, _inline, _max_concurrent,
    # poll_interval_s, _cache, _ready, _inflight, _done_q

    def _init_worker(self) -> None:
        self._cache: OrderedDict[str, Replayer] = OrderedDict()
        self._ready: deque[Lease] = deque()
        self._inflight: dict[tuple[str, str], Lease] = {}
        self._run_q: queue.SimpleQueue = queue.SimpleQueue()  # leases for the runner threads (None: exit);
        # SimpleQueue (C, unbounded: at most one lease per runner is in it) hands off in a fraction of Queue's time
        self._runners: list[threading.Thread] = []
        self._runner_lock = threading.Lock()
        self._idle_runners = 0  # runners waiting on _run_q and not promised a lease yet
        self._done_q: queue.SimpleQueue = queue.SimpleQueue()  # outcomes: at most one per runner
        self._group_after: tuple[int, list] | None = None  # (thread, acknowledgements) of an open group
        self._polls_due = 0.0  # time.monotonic() of the threaded loop's next polls (_tick)
        self._awaited: dict[str, tuple | None] = {}  # workflows execute_workflow waits on: their outcome once
        # their end is durable

    def _tx(self, label: str, *, group: bool = False) -> "_Tx":
        """A ``Store.transaction`` entered as ``(db, after)``; ``after`` holds what acknowledges it (a
        lease handed to a runner, a replayer cached), run only once its COMMIT returned: for a member
        of a group commit, once the group's COMMIT returned."""
        return _Tx(self, label, group)

    # ---- workflow tasks ---------------------------------------------------------------------

    def _run_task(self, db, after: list, workflow_id: str, fresh: h.Event | None = None,
                  wf_row: tuple | None = None, fresh_row: tuple | None = None, cached: Replayer | None = None) -> None:
        """Replay ``workflow_id`` and record its next commands; eagerly lease what we can run.

        ``fresh``: the event this transaction just appended (at the end of the history); a cached
        replayer that has everything before it is fed it as is, without reading it back; ``fresh_row``:
        its row when it is not inserted yet (it goes in with the task's own events). ``wf_row``: the
        workflow's (name, input, state, task_pending), read in this transaction already; ``cached``: its
        replayer, taken from the cache by the caller."""
        sink = _LiveSink(self, db)
        if fresh_row is not None:
            sink.rows.append(fresh_row)
        row = wf_row or db.execute(
            "SELECT name, input, state, task_pending FROM workflows WHERE id=?", (workflow_id,)).fetchone()
        if row is None:
            sink.flush()
            return
        name, input_json, state, pending = row
        if state != "running":
            sink.flush()
            db.execute("UPDATE workflows SET task_pending=0 WHERE id=?", (workflow_id,))
            return
        r = cached if cached is not None else self._cache.pop(workflow_id, None)
        if r is None:
            reg = self._workflows.get(name)
            if reg is None:
                sink.flush()
                db.execute("UPDATE workflows SET task_pending=1 WHERE id=?", (workflow_id,))
                return  # another worker may know it; leave the task pending
            sink.flush()  # (a fresh replayer reads event 1)
            r = self._new_replayer(reg, workflow_id, input_json, sink)
        r.sink = sink
        if fresh is not None and fresh.seq == r.last_seq + 1:
            r.record(fresh)
        else:
            sink.flush()
            r.feed(read_events(db, workflow_id, r.last_seq))
        r.advance()
        if r.done and workflow_id in self._awaited:
            after.append(lambda: self._awaited.__setitem__(workflow_id, r.outcome))
        if not r.done:
            if pending or wf_row is None:  # (its updated_at is its last event's time: Engine._row)
                db.execute("UPDATE workflows SET task_pending=0, updated_at=? WHERE id=?", (self.clock.now(), workflow_id))
            after.append(lambda: self._cache_put(workflow_id, r))
        for activity_id, cmd, input_raw, opts, leased_at, sched_row in sink.scheduled:
            lease = self._lease(db, workflow_id, activity_id, known=(r, cmd, input_raw, opts, leased_at, sched_row),
                                rows=sink.rows)
            after.append(lambda lease=lease: self._ready.append(lease))
        sink.flush()

    def _new_replayer(self, reg, workflow_id: str, input_json: str, sink) -> Replayer:
        raw = _recorded_input(sink.db, workflow_id, input_json)  # DamagedRecord: nothing is written
        try:
            value = reg.decode_input(raw)
            fn = reg.fn
        except Exception as e:  # noqa: BLE001 - recorded as the workflow's failure
            err = BadInput(f"recorded input of workflow {workflow_id!r} no longer validates: {e}")

            def fn(rt, _input, err=err):
                raise err

            value = None
        return Replayer(workflow_id, fn, value, sink)

    def _cache_put(self, workflow_id: str, r: Replayer) -> None:
        self._cache[workflow_id] = r
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _mark_task(self, db, workflow_id: str) -> None:
        db.execute("UPDATE workflows SET task_pending=1 WHERE id=? AND state='running'", (workflow_id,))

    # ---- activities ---------------------------------------------------------------------------

    def _can_take(self, name: str) -> bool:
        if name not in self._activities:
            return False
        if self._inline:
            return True
        return len(self._inflight) + len(self._ready) < self._max_concurrent

    def _lease(self, db, workflow_id: str, activity_id: str, known: tuple | None = None,
               rows: list | None = None) -> Lease | None:
        """Attempt n+1 of a due activity, in the open transaction. ``known``: ``(replayer, cmd, input,
        options, leased at, scheduled event row)`` of an activity this very transaction inserted already
        leased (attempt 1, ``_LiveSink.new_command``): its scheduled event (recorded in the replayer, not
        inserted yet) and its started event, at the replayer's end, go to ``rows`` (the sink's events, inserted
        together by its flush)."""
        if known is not None:
            r, cmd, input_raw, opts, now, sched_row = known
            worker = self._worker_name()
            attrs = {"cmd": cmd, "activity_id": activity_id, "attempt": 1, "worker": worker}
            text = f'{{"activity_id":{dumps(activity_id)},"attempt":1,"cmd":{int(cmd)},"worker":{dumps(worker)}}}'
            seq = r.last_seq + 1
            rows.append(sched_row)  # (the sink's rows: the scheduled row stays in its seq place)
            rows.append(h.event_row(workflow_id, seq, h.ACTIVITY_STARTED, now, text))
            r.record(h.Event(seq, h.ACTIVITY_STARTED, now, attrs))
            return Lease(workflow_id, activity_id, r.commands[cmd].command.name, cmd, 1, input_raw, opts, None, now)
        now = self.clock.now()
        row = db.execute(
            "SELECT name, cmd, input, options, state, attempt, details, due_at FROM activities "
            "WHERE workflow_id=? AND activity_id=?",
            (workflow_id, activity_id),
        ).fetchone()
        if row is None or row[4] != "scheduled" or row[7] > now:
            return None
        name, cmd, input_json, options_json, _, attempt, details_json, _ = row
        opts = StepOptions.from_json(json.loads(options_json))
        input_raw = json.loads(input_json)
        details = json.loads(details_json) if details_json is not None else None
        attempt += 1
        hb, close = self._deadlines(opts, now)
        db.execute(
            "UPDATE activities SET state='running', attempt=?, hb_deadline=?, close_deadline=?, last_hb_at=?, "
            "owner=?, child=NULL WHERE workflow_id=? AND activity_id=?",
            (attempt, hb, close, now, self._owner_json(), workflow_id, activity_id),
        )
        append_next(db, workflow_id, h.ACTIVITY_STARTED, now,
                    {"cmd": cmd, "activity_id": activity_id, "attempt": attempt,
                     "worker": self._worker_name()})
        return Lease(workflow_id, activity_id, name, cmd, attempt, input_raw, opts, details, now)

    @staticmethod
    def _deadlines(opts: StepOptions, now: float) -> tuple[float | None, float | None]:
        """Heartbeat and start-to-close deadlines of an attempt leased at ``now``."""
        hb = now + opts.heartbeat_timeout_s if opts.heartbeat_timeout_s else None
        close = now + opts.start_to_close_timeout_s if opts.start_to_close_timeout_s else None
        return hb, close

    def _worker_name(self) -> str:
        """``host:pid``, as started events record the worker (the owner never changes after
        ``Engine.__init__``)."""
        name = self.__dict__.get("_worker_text")
        if name is None:
            name = self._worker_text = f"{self.owner['host']}:{self.owner['pid']}"
        return name

    def _owner_json(self) -> str:
        """The lease owner as recorded (it never changes after ``Engine.__init__``)."""
        if getattr(self, "_owner_text", None) is None:
            self._owner_text = dumps(self.owner)
        return self._owner_text

    def _execute(self, lease: Lease) -> tuple[bool, Any]:
        """Run one attempt; ``(True, result_json)`` or ``(False, exception)``. Crashes propagate."""
        reg = self._activities[lease.name]
        ctx = LiveActivityContext(self, lease)
        try:
            try:
                value = reg.decode_input(lease.input)
            except Exception as e:  # noqa: BLE001 - a recorded input that does not validate never will
                raise NonRetryableError(f"input of activity {lease.name!r} is invalid: {e}", type="BadInput") from None
            result = reg.fn(ctx, value)
            try:
                return True, normalized(result)
            except (TypeError, ValueError) as e:
                raise NonRetryableError(f"activity result is not JSON-able: {e}", type="BadResult") from None
        except Exception as e:  # noqa: BLE001 - recorded as the attempt's failure
            return False, e

    def _record_outcome(self, lease: Lease, ok: bool, value: Any) -> None:
        if ok and not lease.appended:
            r = self._cache.pop(lease.workflow_id, None)
            if r is not None:
                if r.cancel_event is None and not r.done:
                    try:
                        return self._complete_cached(lease, value, r)
                    except _Redo:
                        pass  # rolled back: the plain path below reads the rows and says why
                else:
                    self._cache_put(lease.workflow_id, r)
        with self._tx("complete" if ok else "fail") as (db, after):
            row = db.execute(
                "SELECT a.state, a.attempt, a.hb_deadline, a.close_deadline, a.lost, "
                "(SELECT MAX(seq) FROM events WHERE workflow_id=?1), w.name, w.input, w.state, w.task_pending "
                "FROM activities a JOIN workflows w ON w.id = a.workflow_id "
                "WHERE a.workflow_id=?1 AND a.activity_id=?2",
                (lease.workflow_id, lease.activity_id),
            ).fetchone()
            if row is None or row[0] != "running" or row[1] != lease.attempt:
                log.warning("dropping the outcome of stale attempt %d of %s/%s", lease.attempt,
                            lease.workflow_id, lease.activity_id)
                return
            now = self.clock.now()
            late = _late(row[2], row[3], now)
            if late:
                self._time_out(db, lease.workflow_id, lease.activity_id, late, lost=False)
            elif ok:
                attrs = {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt, "result": value}
                text = (f'{{"activity_id":{dumps(lease.activity_id)},"attempt":{int(lease.attempt)},'
                        f'"cmd":{int(lease.cmd)},"result":{dumps(value)}}}')  # = dumps(attrs): keys in order
                ev = append_event(db, lease.workflow_id, row[5] + 1, h.ACTIVITY_COMPLETED, now, attrs, text=text)
                self._close_activity(db, lease, mark=False)
                self._run_task(db, after, lease.workflow_id, fresh=ev, wf_row=row[6:])  # the task it makes due
                return
            else:
                self._fail(db, lease, value, lost=row[4], now=now)
            (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (lease.workflow_id,)).fetchone()
            if pending:
                self._run_task(db, after, lease.workflow_id)

    def _complete_cached(self, lease: Lease, value: Any, r: Replayer) -> None:
        """The plain path's completion in fewer statements, for an attempt whose workflow has a cached
        replayer (taken from the cache): its row deleted where it is still this attempt's, running and
        not late (the fencing check and the close in one statement); then the completed event at the
        replayer's end, in one INSERT with the events of the task that follows. Someone else's event
        since (a cancel) makes that seq taken: ``_Redo``, after a rollback (the replayer is dropped);
        so does a row that is not this running attempt's (the replayer goes back to the cache)."""
        wid, aid = lease.workflow_id, lease.activity_id
        with self._tx("complete") as (db, after):
            now = self.clock.now()
            if not db.execute(
                "DELETE FROM activities WHERE workflow_id=?1 AND activity_id=?2 AND state='running' AND attempt=?3 "
                "AND (hb_deadline IS NULL OR hb_deadline>=?4) AND (close_deadline IS NULL OR close_deadline>=?4)",
                (wid, aid, lease.attempt, now),
            ).rowcount:
                self._cache_put(wid, r)
                raise _Redo
            seq = r.last_seq + 1
            attrs = {"cmd": lease.cmd, "activity_id": aid, "attempt": lease.attempt, "result": value}
            text = (f'{{"activity_id":{dumps(aid)},"attempt":{int(lease.attempt)},'
                    f'"cmd":{int(lease.cmd)},"result":{dumps(value)}}}')  # = dumps(attrs): keys in order
            try:
                self._run_task(db, after, wid, fresh=h.Event(seq, h.ACTIVITY_COMPLETED, now, attrs),
                               wf_row=(None, None, "running", 0), cached=r,
                               fresh_row=h.event_row(wid, seq, h.ACTIVITY_COMPLETED, now, text))
            except sqlite3.IntegrityError:
                raise _Redo from None

    def _close_activity(self, db, lease: Lease, *, mark: bool = True) -> None:
        """The attempt's row is closed: deleted (the table holds open activities only; how it ended is
        its history's last event for it, see ``Engine.activities``); its workflow's task is due
        (``mark=False``: the caller runs it in this transaction, which leaves ``task_pending`` as the
        task ends it)."""
        db.execute("DELETE FROM activities WHERE workflow_id=? AND activity_id=?",
                   (lease.workflow_id, lease.activity_id))
        if mark:
            self._mark_task(db, lease.workflow_id)

    def _fail(self, db, lease: Lease, exc: BaseException, *, lost: int, now: float) -> None:
        base = {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt}
        err = error_to_json(exc)
        (cancel,) = db.execute("SELECT cancel_requested FROM workflows WHERE id=?", (lease.workflow_id,)).fetchone()
        if cancel:
            append_next(db, lease.workflow_id, h.ACTIVITY_CANCELED, now, {**base, "error": err})
            self._close_activity(db, lease)
            return
        policy = lease.options.retry
        non_retryable = (
            isinstance(exc, NonRetryableError) or err["type"] in policy.non_retryable
            or type(exc).__name__ in policy.non_retryable
        )
        err["non_retryable"] = non_retryable
        counted = lease.attempt - lost
        if non_retryable or (policy.max_attempts and counted >= policy.max_attempts):
            append_next(db, lease.workflow_id, h.ACTIVITY_FAILED, now,
                        {**base, "error": err, "final": True, "retryable": False})
            self._close_activity(db, lease)
            return
        retry_at = now + policy.delay_s(counted)
        append_next(db, lease.workflow_id, h.ACTIVITY_FAILED, now,
                    {**base, "error": err, "final": False, "retryable": True, "retry_at": retry_at})
        db.execute(
            "UPDATE activities SET state='scheduled', due_at=?, hb_deadline=NULL, close_deadline=NULL, owner=NULL "
            "WHERE workflow_id=? AND activity_id=?",
            (retry_at, lease.workflow_id, lease.activity_id),
        )

    def _time_out(self, db, workflow_id: str, activity_id: str, kind: str, *, lost: bool) -> None:
        """The running attempt is over (deadline passed, or its worker died): redeliver or fail for good."""
        cmd, attempt, options_json, nlost = db.execute(
            "SELECT cmd, attempt, options, lost FROM activities WHERE workflow_id=? AND activity_id=?",
            (workflow_id, activity_id),
        ).fetchone()
        now = self.clock.now()
        policy = StepOptions.from_json(json.loads(options_json)).retry
        base = {"cmd": cmd, "activity_id": activity_id, "attempt": attempt, "kind": kind}
        (cancel,) = db.execute("SELECT cancel_requested FROM workflows WHERE id=?", (workflow_id,)).fetchone()
        lease = Lease(workflow_id, activity_id, "", cmd, attempt, None, None, None, now)  # type: ignore[arg-type]
        if cancel:
            append_next(db, workflow_id, h.ACTIVITY_CANCELED, now, {**base, "reason": f"{kind} after cancel"})
            self._close_activity(db, lease)
            return
        nlost += 1 if lost else 0
        counted = attempt - nlost
        err = {"type": "WorkerLost" if lost else "Timeout", "message": f"attempt {attempt}: {kind}"}
        if not lost and policy.max_attempts and counted >= policy.max_attempts:
            append_next(db, workflow_id, h.ACTIVITY_TIMED_OUT, now, {**base, "error": err, "final": True})
            self._close_activity(db, lease)
            return
        retry_at = now if lost else now + policy.delay_s(counted)
        append_next(db, workflow_id, h.ACTIVITY_TIMED_OUT, now,
                    {**base, "error": err, "final": False, "retry_at": retry_at})
        db.execute(
            "UPDATE activities SET state='scheduled', due_at=?, lost=?, hb_deadline=NULL, close_deadline=NULL, "
            "owner=NULL WHERE workflow_id=? AND activity_id=?",
            (retry_at, nlost, workflow_id, activity_id),
        )

    def _heartbeat(self, lease: Lease, details: Any, now: float) -> None:
        if details is not None:
            details = json.loads(dumps(details))
        lost = None
        with self._tx("heartbeat") as (db, _after):
            row = db.execute(
                "SELECT state, attempt, hb_deadline, close_deadline FROM activities "
                "WHERE workflow_id=? AND activity_id=?",
                (lease.workflow_id, lease.activity_id),
            ).fetchone()
            late = _late(row[2], row[3], now) if row else None
            if row is None or row[0] != "running" or row[1] != lease.attempt:
                lost = f"attempt {lease.attempt} is no longer current"
            elif late:
                self._time_out(db, lease.workflow_id, lease.activity_id, late, lost=False)
                lost = f"attempt {lease.attempt} {late}"
            else:
                hb = lease.options.heartbeat_timeout_s
                db.execute(
                    "UPDATE activities SET hb_deadline=?, last_hb_at=?, details=COALESCE(?, details) "
                    "WHERE workflow_id=? AND activity_id=?",
                    (now + hb if hb else None, now, dumps(details) if details is not None else None,
                     lease.workflow_id, lease.activity_id),
                )
                if details is not None:
                    lease.appended = True  # (the cached replayer has not seen it: no fast completion)
                    append_next(db, lease.workflow_id, h.ACTIVITY_HEARTBEAT, now,
                                {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt,
                                 "details": details})
        if lost:
            raise LeaseLost(f"{lease.workflow_id}/{lease.activity_id}: {lost}; stop this attempt")

    def _process_tag(self, workflow_id: str, activity_id: str, attempt: int) -> str:
        if not hasattr(self, "_scope"):
            self._scope = proctree.scope_of(self.store.path)
        return proctree.attempt_tag(self._scope, workflow_id, activity_id, attempt)

    def _kill_dead_attempt(self, workflow_id: str, activity_id: str, attempt: int, child_json: str | None) -> None:
        """Before a dead worker's attempt is redelivered: every process it started is gone (engine/proctree.py).

        An attempt that recorded no child started no process (the runner records one before it spawns), so
        no scan of /proc is needed for it (the simulator expires thousands of those)."""
        if not child_json:
            return
        child = json.loads(child_json)
        if leases.kill_leftover(child):
            log.warning("killed the leftover process group of %s/%s attempt %d", workflow_id, activity_id, attempt)
        left = proctree.kill_attempt(self._process_tag(workflow_id, activity_id, attempt))
        if left:
            log.error("processes %s of %s/%s attempt %d could not be killed", sorted(left), workflow_id,
                      activity_id, attempt)

    def _record_child(self, lease: Lease, pid: int | None) -> None:
        child = {"pid": pid, "pstart": leases.proc_start(pid) if pid is not None else None}
        with self._tx("child") as (db, _after):
            db.execute(
                "UPDATE activities SET child=? WHERE workflow_id=? AND activity_id=? AND attempt=? AND state='running'",
                (dumps(child), lease.workflow_id, lease.activity_id, lease.attempt),
            )

    def _cancel_requested(self, lease: Lease) -> bool:
        row = self.store.query_one(
            "SELECT w.state, w.cancel_requested, a.state, a.attempt FROM workflows w JOIN activities a "
            "ON a.workflow_id = w.id WHERE w.id=? AND a.activity_id=?",
            (lease.workflow_id, lease.activity_id),
        )
        return row is None or row[0] != "running" or bool(row[1]) or row[2] != "running" or row[3] != lease.attempt

    # ---- the loop -----------------------------------------------------------------------------

    def _tick(self) -> bool:
        """Do one round of runnable work; False when nothing was runnable."""
        if self._ready:
            if self._inline:
                lease = self._ready.popleft()
                ok, value = self._execute(lease)
                self._record_outcome(lease, ok, value)
            else:
                while self._ready:
                    self._spawn(self._ready.popleft())
            return True
        did = self._drain_done()
        if self._inflight or did:  # threaded: while attempts finish, the polls below run once a poll interval
            wait_s = self._polls_due - time.monotonic()
            if wait_s > 0:
                if not did:  # an attempt is running: wait for it (at most until the polls are due)
                    did = self._drain_done(timeout_s=wait_s)
                if did:
                    return True
        did = self._expire() or did
        did = self._fire_timers() or did
        did = self._run_pending_tasks() or did
        did = self._start_due() or did
        self._polls_due = time.monotonic() + self.poll_interval_s
        return did

    def _spawn(self, lease: Lease) -> None:
        """Hand ``lease`` to an idle runner thread, or to a new one when none is idle (a thread start
        costs more than a no-op activity; a hung attempt never holds up another one)."""
        self._inflight[(lease.workflow_id, lease.activity_id)] = lease
        with self._runner_lock:
            reuse = self._idle_runners > 0
            self._idle_runners -= reuse
        self._run_q.put(lease)
        if not reuse:
            t = threading.Thread(target=self._runner, name="activity runner", daemon=True)
            self._runners.append(t)
            t.start()

    def _runner(self) -> None:
        me = threading.current_thread()
        while True:
            lease = self._run_q.get()
            if lease is None:
                return
            me.name = f"activity {lease.workflow_id}/{lease.activity_id}"
            try:
                ok, value = self._execute(lease)
            except BaseException as crash:  # noqa: BLE001 - handed to the loop, which re-raises it
                self._done_q.put((lease, None, crash))
                return
            with self._runner_lock:  # idle before the loop hears of it: the loop may hand it the next lease
                self._idle_runners += 1
            self._done_q.put((lease, ok, value))

    def _stop_runners(self) -> None:
        """Idle runners exit (busy ones after their attempt)."""
        for _ in self._runners:
            self._run_q.put(None)
        self._runners = []

    def _drain_done(self, timeout_s: float | None = None) -> bool:
        """Record the outcomes of finished attempts: all that are waiting (at most ``GROUP_MAX``) in one
        group commit, each its own member transaction (the ones that finish during a COMMIT's fsync
        wait for the next one). A member's error rolls back that member alone and is raised once the
        others are durable."""
        did = False
        while True:
            batch = []
            try:
                batch.append(self._done_q.get(timeout=timeout_s) if (timeout_s and not did) else self._done_q.get_nowait())
                while len(batch) < GROUP_MAX:
                    batch.append(self._done_q.get_nowait())
            except queue.Empty:
                pass
            if not batch:
                return did
            for lease, ok, value in batch:
                self._inflight.pop((lease.workflow_id, lease.activity_id), None)
                if ok is None:
                    raise value
            if len(batch) == 1:
                self._record_outcome(*batch[0])
            else:
                errors = []
                with self._tx("group", group=True):
                    for item in batch:
                        try:
                            self._record_outcome(*item)
                        except Exception as e:  # noqa: BLE001 - raised below, after the others commit
                            errors.append(e)
                if errors:
                    raise errors[0]
            did = True

    def _expire(self) -> bool:
        now = self.clock.now()
        # this worker's own leases without deadlines can neither be late nor dead while it runs this
        rows = self.store.query(
            "SELECT workflow_id, activity_id, attempt, hb_deadline, close_deadline, owner FROM activities "
            "WHERE state='running' AND NOT (owner IS ? AND hb_deadline IS NULL AND close_deadline IS NULL) "
            "ORDER BY workflow_id, activity_id", (self._owner_json(),)
        )
        did = False
        dead_owners: dict[str | None, bool] = {}  # one liveness check per owner (it reads /proc)
        for wf, aid, attempt, hb, close, owner_json in rows:
            late = _late(hb, close, now)
            if not late and owner_json not in dead_owners:
                dead_owners[owner_json] = leases.owner_dead(json.loads(owner_json) if owner_json else None)
            dead = not late and dead_owners[owner_json]
            if not (late or dead):
                continue
            if dead:  # outside the transaction (it waits for the kills); the dead owner cannot renew the lease
                (child_json,) = self.store.query_one(
                    "SELECT child FROM activities WHERE workflow_id=? AND activity_id=?", (wf, aid))
                self._kill_dead_attempt(wf, aid, attempt, child_json)
            with self._tx("expire") as (db, after):
                row = db.execute(
                    "SELECT state, attempt FROM activities WHERE workflow_id=? AND activity_id=?", (wf, aid)
                ).fetchone()
                if row[0] != "running" or row[1] != attempt:
                    continue
                if dead:
                    log.warning("worker of %s/%s attempt %d is gone; redelivering", wf, aid, attempt)
                self._time_out(db, wf, aid, late or "worker lost", lost=dead)
                (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (wf,)).fetchone()
                if pending:
                    self._run_task(db, after, wf)
            did = True
        return did

    def _fire_timers(self) -> bool:
        rows = self.store.query(
            "SELECT workflow_id, cmd FROM timers WHERE state='pending' AND fire_at<=? ORDER BY fire_at, workflow_id, cmd",
            (self.clock.now(),),
        )
        for wf, cmd in rows:
            with self._tx("timer") as (db, after):
                n = db.execute(
                    "UPDATE timers SET state='fired' WHERE workflow_id=? AND cmd=? AND state='pending'", (wf, cmd)
                ).rowcount
                if n:
                    append_next(db, wf, h.TIMER_FIRED, self.clock.now(), {"cmd": cmd})
                    self._mark_task(db, wf)
                    self._run_task(db, after, wf)
        return bool(rows)

    def _run_pending_tasks(self) -> bool:
        rows = self.store.query(
            "SELECT id, name FROM workflows WHERE task_pending=1 AND state='running' ORDER BY created_at, id"
        )
        did = False
        for wf, name in rows:
            if name not in self._workflows:
                continue
            with self._tx("task") as (db, after):
                (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (wf,)).fetchone()
                if pending:
                    self._run_task(db, after, wf)
            did = True
        return did

    def _start_due(self) -> bool:
        room = 1_000_000 if self._inline else self._max_concurrent - len(self._inflight) - len(self._ready)
        if room <= 0 or not self._activities:
            return False
        rows = self.store.query(
            "SELECT workflow_id, activity_id, name FROM activities WHERE state='scheduled' AND due_at<=? "
            "ORDER BY due_at, workflow_id, activity_id",
            (self.clock.now(),),
        )
        rows = [r for r in rows if r[2] in self._activities][:room]
        if not rows:
            return False
        with self._tx("lease") as (db, after):
            for wf, aid, _ in rows:
                lease = self._lease(db, wf, aid)
                if lease is not None:
                    after.append(lambda lease=lease: self._ready.append(lease))
        return True

    def _next_wake(self) -> float | None:
        """The earliest time at which something becomes runnable without new events."""
        names = list(self._activities) or [""]
        marks = ",".join("?" * len(names))
        (a,) = self.store.query_one(
            f"SELECT MIN(due_at) FROM activities WHERE state='scheduled' AND name IN ({marks})", tuple(names)
        )
        (t,) = self.store.query_one("SELECT MIN(fire_at) FROM timers WHERE state='pending'")
        hb, close = self.store.query_one(
            "SELECT MIN(hb_deadline), MIN(close_deadline) FROM activities WHERE state='running'"
        )
        # a deadline expires strictly after it passes
        cands = [x for x in (a, t) if x is not None] + [x + 1e-6 for x in (hb, close) if x is not None]
        return min(cands) if cands else None


class _Tx:
    """``Worker._tx``'s context manager (a class: cheaper than a generator-based one)."""

    __slots__ = ("w", "label", "group", "after", "tx", "member")

    def __init__(self, w: Worker, label: str, group: bool):
        self.w, self.label, self.after = w, label, []
        ga = w._group_after
        self.member = ga is not None and ga[0] == threading.get_ident()  # a member of this thread's group
        self.group = group and not self.member
        self.tx = None

    def __enter__(self) -> tuple:
        w = self.w
        if self.group:
            w._group_after = (threading.get_ident(), self.after)
        try:
            self.tx = w.store.transaction(self.label, group=self.group)
            return self.tx.__enter__(), self.after
        except BaseException:
            if self.group:
                w._group_after = None
            raise

    def __exit__(self, exc_type, exc, tb) -> bool:
        w = self.w
        try:
            self.tx.__exit__(exc_type, exc, tb)
        finally:
            if self.group:
                w._group_after = None
        if exc_type is None:
            if self.member:
                w._group_after[1].extend(self.after)  # held until the group is durable
            else:
                for f in self.after:
                    f()
        return False


def _late(hb_deadline: float | None, close_deadline: float | None, now: float) -> str | None:
    if close_deadline is not None and now > close_deadline:
        return "start-to-close timeout"
    if hb_deadline is not None and now > hb_deadline:
        return "heartbeat timeout"
    return None


def _recorded_input(db, workflow_id: str, input_json: str) -> Any:
    """The workflow's input, which must equal the (checksummed) input of its started event."""
    from .history import damaged, decode_json

    raw = decode_json(db, input_json, workflow_id=workflow_id, record="its input")
    first = read_events(db, workflow_id, 0, limit=1)
    if first and first[0].attrs.get("input") != raw:
        raise damaged(db, workflow_id, "its input", "differs from the input recorded in event 1")
    return raw
