"""The worker: state transitions of workflow tasks, activities and timers, and the polling loop.

Everything a worker does is one ``Store.transaction`` (entered through engine/_tx.py):

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

``Engine`` (engine/_engine.py) owns one ``Worker`` and adds the public API. The worker owns its
parts as objects: ``Transactions`` (engine/_tx.py), ``Attempts`` (engine/_attempts.py: failure,
retry, timeouts, heartbeats, a dead worker's leftovers; also what a live activity context calls)
and ``Runners`` (engine/_runners.py: runner threads and group commit); a live sink
(engine/_live_sink.py) gets ``SinkHooks``.

``new_replayer`` is an attribute on purpose: the simulator (simulator/prefix.py) replaces it on one
worker to start a replay from a shared prefix, through engine/testing.py (``set_replayer_factory``);
it is the one documented hook into a worker.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import OrderedDict, deque
from typing import Any, Callable

from . import _history as h
from ._activity import Lease, LiveActivityContext
from ._attempts import Attempts, close_activity, mark_task, overdue
from ._errors import BadInput, NonRetryableError, Preempted
from ._history import append_event, append_next, damaged, decode_json, dumps, normalized, read_events
from ._live_sink import LiveSink, SinkHooks
from ._options import StepOptions, attempt_deadlines
from ._replay import Replayer
from ._runners import Runners
from ._stop import StopRequest
from ._store import Store
from ._tx import Transactions

log = logging.getLogger("engine")

CACHE_SIZE = 256


class _Redo(Exception):
    """A fast path's assumption did not hold: its transaction is rolled back and the plain path runs."""


class Worker:
    """Transitions and the loop over one store, for the workflows and activities registered with it.

    ``workflows`` / ``activities``: the engine's registries (the same dicts: a later registration is
    seen); ``owner``: the lease owner this worker records (engine/_leases.py); ``inline``: attempts
    run on the calling thread, one at a time, else on runner threads, at most ``max_concurrent``."""

    def __init__(
        self,
        store: Store,
        clock: Any,
        owner: dict,
        workflows: dict,
        activities: dict,
        *,
        inline: bool,
        max_concurrent: int,
        poll_interval_s: float,
        attempt_options: Callable[[str, str, StepOptions], StepOptions] | None = None,
    ):
        self.store = store
        self.clock = clock
        self.workflows = workflows
        self.activities = activities
        self.inline = inline
        self.max_concurrent = max_concurrent
        self.poll_interval_s = poll_interval_s
        # (workflow id, activity name, scheduled options) -> the options this worker runs an attempt with
        # (an operational setting of the command running it; recorded in the started event, never replayed)
        self.attempt_options = attempt_options
        self.owner_json = dumps(owner)  # the lease owner as recorded (it never changes after this)
        self.worker_name = f"{owner['host']}:{owner['pid']}"  # as started events record the worker
        self.tx = Transactions(store)
        self.attempts = Attempts(store, clock, self.tx, self.owner_json, self.run_task)
        self.runners = Runners(self.execute, self.record_outcome, self.tx)
        self.sink_hooks = SinkHooks(clock, self.can_take, self.owner_json, self.run_options)
        self.cache: OrderedDict[str, Replayer] = OrderedDict()
        self.ready: deque[Lease] = deque()
        self.inflight = self.runners.inflight  # (the same dict: attempts handed to a runner thread)
        self.awaited: dict[str, tuple | None] = {}  # workflows execute_workflow waits on: their outcome once
        # their end is durable
        self.new_replayer = self._new_replayer  # (the simulator's hook: see the module docstring)
        self._polls_due = 0.0  # time.monotonic() of the threaded loop's next polls (tick)
        self.stop_grace_s: float | None = None  # the grace of a stop that comes from a stopped trainer (stop_from)

    # ---- workflow tasks ---------------------------------------------------------------------

    def run_task(
        self,
        db,
        after: list,
        workflow_id: str,
        fresh: h.Event | None = None,
        wf_row: tuple | None = None,
        fresh_row: tuple | None = None,
        cached: Replayer | None = None,
    ) -> None:
        """Replay ``workflow_id`` and record its next commands; eagerly lease what we can run.

        ``fresh``: the event this transaction just appended (at the end of the history); a cached
        replayer that has everything before it is fed it as is, without reading it back; ``fresh_row``:
        its row when it is not inserted yet (it goes in with the task's own events). ``wf_row``: the
        workflow's (name, input, state, task_pending), read in this transaction already; ``cached``: its
        replayer, taken from the cache by the caller."""
        sink = LiveSink(self.sink_hooks, db)
        if fresh_row is not None:
            sink.rows.append(fresh_row)
        row = (
            wf_row
            or db.execute(
                "SELECT name, input, state, task_pending FROM workflows WHERE id=?", (workflow_id,)
            ).fetchone()
        )
        if row is None:
            sink.flush()
            return
        name, input_json, state, pending = row
        if state != "running":
            sink.flush()
            db.execute("UPDATE workflows SET task_pending=0 WHERE id=?", (workflow_id,))
            return
        r = cached if cached is not None else self.cache.pop(workflow_id, None)
        if r is None:
            reg = self.workflows.get(name)
            if reg is None:
                sink.flush()
                db.execute("UPDATE workflows SET task_pending=1 WHERE id=?", (workflow_id,))
                return  # another worker may know it; leave the task pending
            sink.flush()  # (a fresh replayer reads event 1)
            r = self.new_replayer(reg, workflow_id, input_json, sink)
        r.sink = sink
        if fresh is not None and fresh.seq == r.last_seq + 1:
            r.record(fresh)
        else:
            sink.flush()
            r.feed(read_events(db, workflow_id, r.last_seq))
        r.advance()
        if r.done and workflow_id in self.awaited:
            after.append(lambda: self.awaited.__setitem__(workflow_id, r.outcome))
        if not r.done:
            if pending or wf_row is None:  # (its updated_at is its last event's time: Engine._row)
                db.execute(
                    "UPDATE workflows SET task_pending=0, updated_at=? WHERE id=?", (self.clock.now(), workflow_id)
                )
            after.append(lambda: self.cache_put(workflow_id, r))
        for activity_id, cmd, input_raw, opts, leased_at, sched_row, sched_hb in sink.scheduled:
            lease = self.lease(
                db,
                workflow_id,
                activity_id,
                known=(r, cmd, input_raw, opts, leased_at, sched_row, sched_hb),
                rows=sink.rows,
            )
            after.append(lambda lease=lease: self.ready.append(lease))
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

    def cache_put(self, workflow_id: str, r: Replayer) -> None:
        self.cache[workflow_id] = r
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)

    # ---- activities ---------------------------------------------------------------------------

    def can_take(self, name: str) -> bool:
        if name not in self.activities:
            return False
        if self.inline:
            return True
        return len(self.inflight) + len(self.ready) < self.max_concurrent

    def lease(
        self, db, workflow_id: str, activity_id: str, known: tuple | None = None, rows: list | None = None
    ) -> Lease | None:
        """Attempt n+1 of a due activity, in the open transaction. ``known``: ``(replayer, cmd, input,
        options it runs with, leased at, scheduled event row, scheduled heartbeat timeout)`` of an activity this very transaction inserted already
        leased (attempt 1, ``LiveSink.new_command``): its scheduled event (recorded in the replayer, not
        inserted yet) and its started event, at the replayer's end, go to ``rows`` (the sink's events, inserted
        together by its flush)."""
        if known is not None:
            assert rows is not None  # (the sink's rows come with what it knows)
            r, cmd, input_raw, opts, now, sched_row, sched_hb = known
            worker = self.worker_name
            attrs = {"cmd": cmd, "activity_id": activity_id, "attempt": 1, "worker": worker}
            text = f'{{"activity_id":{dumps(activity_id)},"attempt":1,"cmd":{int(cmd)},"worker":{dumps(worker)}}}'
            if opts.heartbeat_timeout_s != sched_hb:
                attrs["heartbeat_timeout_s"] = opts.heartbeat_timeout_s  # this worker's own (attempt_options)
                text = dumps(attrs)
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
        scheduled = StepOptions.from_json(json.loads(options_json))
        opts = self.run_options(workflow_id, name, scheduled)
        input_raw = json.loads(input_json)
        details = json.loads(details_json) if details_json is not None else None
        attempt += 1
        hb, close = attempt_deadlines(opts, now)
        db.execute(
            "UPDATE activities SET state='running', attempt=?, hb_deadline=?, close_deadline=?, last_hb_at=?, "
            "owner=?, child=NULL WHERE workflow_id=? AND activity_id=?",
            (attempt, hb, close, now, self.owner_json, workflow_id, activity_id),
        )
        started = {"cmd": cmd, "activity_id": activity_id, "attempt": attempt, "worker": self.worker_name}
        if opts.heartbeat_timeout_s != scheduled.heartbeat_timeout_s:
            started["heartbeat_timeout_s"] = opts.heartbeat_timeout_s  # this worker's own (attempt_options)
        append_next(db, workflow_id, h.ACTIVITY_STARTED, now, started)
        return Lease(workflow_id, activity_id, name, cmd, attempt, input_raw, opts, details, now)

    def run_options(self, workflow_id: str, name: str, scheduled: StepOptions) -> StepOptions:
        """The options this worker runs an attempt with: the scheduled ones, or what the engine's
        ``attempt_options`` hook makes of them (an operational setting of the command running the
        worker, e.g. ``ctl train --heartbeat-timeout``). Never part of replay: the scheduled options
        stay recorded as they were, and a changed heartbeat timeout is recorded in the started event."""
        hook = self.attempt_options
        return scheduled if hook is None else hook(workflow_id, name, scheduled)

    def execute(self, lease: Lease) -> tuple[bool, Any]:
        """Run one attempt; ``(True, result_json)`` or ``(False, exception)``. Crashes propagate."""
        reg = self.activities[lease.name]
        ctx = LiveActivityContext(self.attempts, self.clock, lease)
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

    def record_outcome(self, lease: Lease, ok: bool, value: Any) -> None:
        if ok and not lease.appended:
            r = self.cache.pop(lease.workflow_id, None)
            if r is not None:
                if r.cancel_event is None and not r.done:
                    try:
                        return self._complete_cached(lease, value, r)
                    except _Redo:
                        pass  # rolled back: the plain path below reads the rows and says why
                else:
                    self.cache_put(lease.workflow_id, r)
        with self.tx("complete" if ok else "fail") as (db, after):
            row = db.execute(
                "SELECT a.state, a.attempt, a.hb_deadline, a.close_deadline, a.lost, "
                "(SELECT MAX(seq) FROM events WHERE workflow_id=?1), w.name, w.input, w.state, w.task_pending "
                "FROM activities a JOIN workflows w ON w.id = a.workflow_id "
                "WHERE a.workflow_id=?1 AND a.activity_id=?2",
                (lease.workflow_id, lease.activity_id),
            ).fetchone()
            if row is None or row[0] != "running" or row[1] != lease.attempt:
                log.warning(
                    "dropping the outcome of stale attempt %d of %s/%s",
                    lease.attempt,
                    lease.workflow_id,
                    lease.activity_id,
                )
                return
            now = self.clock.now()
            late = overdue(row[2], row[3], now)
            if late:
                self.attempts.time_out(db, lease.workflow_id, lease.activity_id, late, lost=False)
            elif ok:
                attrs = {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt, "result": value}
                text = (
                    f'{{"activity_id":{dumps(lease.activity_id)},"attempt":{int(lease.attempt)},'
                    f'"cmd":{int(lease.cmd)},"result":{dumps(value)}}}'
                )  # = dumps(attrs): keys in order
                ev = append_event(db, lease.workflow_id, row[5] + 1, h.ACTIVITY_COMPLETED, now, attrs, text=text)
                close_activity(db, lease.workflow_id, lease.activity_id, mark=False)
                self.run_task(db, after, lease.workflow_id, fresh=ev, wf_row=row[6:])  # the task it makes due
                return
            elif isinstance(value, Preempted):
                self.attempts.preempt(db, lease, value, now=now)
                if self.attempts.stop is None:  # its trainer was stopped directly (a signal to it or its group):
                    after.append(lambda: self.stop_from(value))  # this worker stops with it
            else:
                self.attempts.fail(db, lease, value, lost=row[4], now=now)
            (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (lease.workflow_id,)).fetchone()
            if pending:
                self.run_task(db, after, lease.workflow_id)

    def _complete_cached(self, lease: Lease, value: Any, r: Replayer) -> None:
        """The plain path's completion in fewer statements, for an attempt whose workflow has a cached
        replayer (taken from the cache): its row deleted where it is still this attempt's, running and
        not late (the fencing check and the close in one statement); then the completed event at the
        replayer's end, in one INSERT with the events of the task that follows. Someone else's event
        since (a cancel) makes that seq taken: ``_Redo``, after a rollback (the replayer is dropped);
        so does a row that is not this running attempt's (the replayer goes back to the cache)."""
        wid, aid = lease.workflow_id, lease.activity_id
        with self.tx("complete") as (db, after):
            now = self.clock.now()
            if not db.execute(
                "DELETE FROM activities WHERE workflow_id=?1 AND activity_id=?2 AND state='running' AND attempt=?3 "
                "AND (hb_deadline IS NULL OR hb_deadline>=?4) AND (close_deadline IS NULL OR close_deadline>=?4)",
                (wid, aid, lease.attempt, now),
            ).rowcount:
                self.cache_put(wid, r)
                raise _Redo
            seq = r.last_seq + 1
            attrs = {"cmd": lease.cmd, "activity_id": aid, "attempt": lease.attempt, "result": value}
            text = (
                f'{{"activity_id":{dumps(aid)},"attempt":{int(lease.attempt)},'
                f'"cmd":{int(lease.cmd)},"result":{dumps(value)}}}'
            )  # = dumps(attrs): keys in order
            try:
                self.run_task(
                    db,
                    after,
                    wid,
                    fresh=h.Event(seq, h.ACTIVITY_COMPLETED, now, attrs),
                    wf_row=(None, None, "running", 0),
                    cached=r,
                    fresh_row=h.event_row(wid, seq, h.ACTIVITY_COMPLETED, now, text),
                )
            except sqlite3.IntegrityError:
                raise _Redo from None

    # ---- a polite stop (engine/_stop.py) ---------------------------------------------------------

    @property
    def stop(self) -> Any:
        """The polite stop asked of this worker (a ``StopRequest``), or None."""
        return self.attempts.stop

    def request_stop(self, request: Any) -> None:
        """Ask for a polite stop (one assignment: safe in a signal handler); the first one asked stays."""
        if self.attempts.stop is None:
            self.attempts.stop = request

    def stop_from(self, exc: Preempted) -> None:
        """A trainer of this worker was stopped by a signal sent to it (its group's): the worker stops too,
        its other attempts bounded by ``stop_grace_s`` (None: no bound)."""
        grace = self.stop_grace_s
        self.request_stop(
            StopRequest(signal=exc.signal or "SIGTERM", deadline=None if grace is None else time.monotonic() + grace)
        )

    def release_ready(self) -> None:
        """Leases taken but not handed to a runner when the stop came: each ends preempted, never run."""
        while self.ready:
            lease = self.ready.popleft()
            exc = Preempted("not started: the worker was stopping", signal=self.stop.signal if self.stop else None)
            with self.tx("stop") as (db, _after):
                row = db.execute(
                    "SELECT state, attempt FROM activities WHERE workflow_id=? AND activity_id=?",
                    (lease.workflow_id, lease.activity_id),
                ).fetchone()
                if row is not None and row[0] == "running" and row[1] == lease.attempt:
                    self.attempts.preempt(db, lease, exc, now=self.clock.now())

    # ---- the loop -----------------------------------------------------------------------------

    def tick(self) -> bool:
        """Do one round of runnable work; False when nothing was runnable. Once a polite stop was asked,
        only the outcomes of attempts in flight are recorded: nothing new starts."""
        if self.attempts.stop is not None:
            return self.runners.drain()
        if self.ready:
            if self.inline:
                lease = self.ready.popleft()
                ok, value = self.execute(lease)
                self.record_outcome(lease, ok, value)
            else:
                while self.ready:
                    self.runners.spawn(self.ready.popleft())
            return True
        did = self.runners.drain()
        if self.inflight or did:  # threaded: while attempts finish, the polls below run once a poll interval
            wait_s = self._polls_due - time.monotonic()
            if wait_s > 0:
                if not did:  # an attempt is running: wait for it (at most until the polls are due)
                    did = self.runners.drain(timeout_s=wait_s)
                if did:
                    return True
        did = self.attempts.expire() or did
        did = self.fire_timers() or did
        did = self.run_pending_tasks() or did
        did = self.start_due() or did
        self._polls_due = time.monotonic() + self.poll_interval_s
        return did

    def fire_timers(self) -> bool:
        rows = self.store.query(
            "SELECT workflow_id, cmd FROM timers WHERE state='pending' AND fire_at<=? ORDER BY fire_at, workflow_id, cmd",
            (self.clock.now(),),
        )
        for wf, cmd in rows:
            with self.tx("timer") as (db, after):
                n = db.execute(
                    "UPDATE timers SET state='fired' WHERE workflow_id=? AND cmd=? AND state='pending'", (wf, cmd)
                ).rowcount
                if n:
                    append_next(db, wf, h.TIMER_FIRED, self.clock.now(), {"cmd": cmd})
                    mark_task(db, wf)
                    self.run_task(db, after, wf)
        return bool(rows)

    def run_pending_tasks(self) -> bool:
        rows = self.store.query(
            "SELECT id, name FROM workflows WHERE task_pending=1 AND state='running' ORDER BY created_at, id"
        )
        did = False
        for wf, name in rows:
            if name not in self.workflows:
                continue
            with self.tx("task") as (db, after):
                (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (wf,)).fetchone()
                if pending:
                    self.run_task(db, after, wf)
            did = True
        return did

    def start_due(self) -> bool:
        room = 1_000_000 if self.inline else self.max_concurrent - len(self.inflight) - len(self.ready)
        if room <= 0 or not self.activities:
            return False
        rows = self.store.query(
            "SELECT workflow_id, activity_id, name FROM activities WHERE state='scheduled' AND due_at<=? "
            "ORDER BY due_at, workflow_id, activity_id",
            (self.clock.now(),),
        )
        rows = [r for r in rows if r[2] in self.activities][:room]
        if not rows:
            return False
        with self.tx("lease") as (db, after):
            for wf, aid, _ in rows:
                lease = self.lease(db, wf, aid)
                if lease is not None:
                    after.append(lambda lease=lease: self.ready.append(lease))
        return True

    def next_wake(self) -> float | None:
        """The earliest time at which something becomes runnable without new events."""
        names = list(self.activities) or [""]
        marks = ",".join("?" * len(names))
        # (an aggregate always gives its one row)
        (a,) = self.store.query_one(
            f"SELECT MIN(due_at) FROM activities WHERE state='scheduled' AND name IN ({marks})", tuple(names)
        ) or (None,)
        (t,) = self.store.query_one("SELECT MIN(fire_at) FROM timers WHERE state='pending'") or (None,)
        hb, close = self.store.query_one(
            "SELECT MIN(hb_deadline), MIN(close_deadline) FROM activities WHERE state='running'"
        ) or (None, None)
        # a deadline expires strictly after it passes
        cands = [x for x in (a, t) if x is not None] + [x + 1e-6 for x in (hb, close) if x is not None]
        return min(cands) if cands else None


def _recorded_input(db, workflow_id: str, input_json: str) -> Any:
    """The workflow's input, which must equal the (checksummed) input of its started event."""
    raw = decode_json(db, input_json, workflow_id=workflow_id, record="its input")
    first = read_events(db, workflow_id, 0, limit=1)
    if first and first[0].attrs.get("input") != raw:
        raise damaged(db, workflow_id, "its input", "differs from the input recorded in event 1")
    return raw
