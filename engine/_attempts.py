"""How an attempt ends other than by its own result: failure and retry, timeouts, heartbeats, a dead
worker's leftovers (its process tree killed before redelivery), and cancel checks.

``Attempts`` is an object the worker (engine/_worker.py) owns; it gets the store, the clock, the
worker's transactions (engine/_tx.py), the lease owner's recorded text and the one callback it needs
(``run_task``: the workflow task an expiry makes due). It is also what a live activity context calls
(``engine._activity.AttemptHooks``: heartbeat, cancel check, process tag, child record). Every
method runs in, or opens, one of the worker's transactions.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from . import _history as h
from . import _leases as leases, _proctree as proctree
from ._activity import Lease
from ._errors import LeaseLost, NonRetryableError, Preempted
from ._history import append_next, dumps
from ._options import StepOptions
from ._replay import error_to_json
from ._store import Store
from ._tx import Transactions

log = logging.getLogger("engine")


class Attempts:
    """Attempt endings, heartbeats and the expiry poll of one worker."""

    def __init__(self, store: Store, clock: Any, tx: Transactions, owner_json: str, run_task: Callable[..., None]):
        self.store = store
        self.clock = clock
        self.tx = tx
        self.owner_json = owner_json  # the worker's lease owner as recorded (never changes)
        self.run_task = run_task  # (db, after, workflow_id): the workflow task an expiry makes due
        self._scope: str | None = None  # engine/_proctree.py's scope of this database, once asked
        self.stop: Any = None  # the worker's polite stop (engine/_stop.py StopRequest), once asked
        self.preempted: list[dict] = []  # what this worker's stop recorded: {workflow_id, activity_id, ...}

    def preempt(self, db, lease: Lease, exc: Preempted, *, now: float) -> None:
        """The attempt ended on a polite stop: ``activity_preempted``, due again at once, no retry counted
        (``lost`` + 1, as for a dead worker). Under a cancel it is the cancel's end instead."""
        base = {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt}
        (cancel,) = db.execute("SELECT cancel_requested FROM workflows WHERE id=?", (lease.workflow_id,)).fetchone()
        if cancel:
            append_next(
                db,
                lease.workflow_id,
                h.ACTIVITY_CANCELED,
                now,
                {**base, "error": error_to_json(exc), "reason": "stopped after cancel"},
            )
            close_activity(db, lease.workflow_id, lease.activity_id)
            return
        attrs = {**base, **exc.attrs(), "retry_at": now}
        append_next(db, lease.workflow_id, h.ACTIVITY_PREEMPTED, now, attrs)
        db.execute(
            "UPDATE activities SET state='scheduled', due_at=?, lost=lost+1, hb_deadline=NULL, close_deadline=NULL, "
            "owner=NULL WHERE workflow_id=? AND activity_id=?",
            (now, lease.workflow_id, lease.activity_id),
        )
        self.preempted.append({"workflow_id": lease.workflow_id, **attrs})

    def note_stopped(self, workflow_id: str, attrs: dict) -> None:
        """A polite stop reached this worker while ``workflow_id`` had no attempt of it running (a durable
        wait): one ``preempted`` event says so (the wait's remainder is waited later)."""
        with self.tx("stop") as (db, _after):
            row = db.execute("SELECT state FROM workflows WHERE id=?", (workflow_id,)).fetchone()
            if row is None or row[0] != "running":
                return
            append_next(db, workflow_id, h.PREEMPTED, self.clock.now(), attrs)

    def fail(self, db, lease: Lease, exc: BaseException, *, lost: int, now: float) -> None:
        base = {"cmd": lease.cmd, "activity_id": lease.activity_id, "attempt": lease.attempt}
        err = error_to_json(exc)
        (cancel,) = db.execute("SELECT cancel_requested FROM workflows WHERE id=?", (lease.workflow_id,)).fetchone()
        if cancel:
            append_next(db, lease.workflow_id, h.ACTIVITY_CANCELED, now, {**base, "error": err})
            close_activity(db, lease.workflow_id, lease.activity_id)
            return
        policy = lease.options.retry
        non_retryable = (
            isinstance(exc, NonRetryableError)
            or err["type"] in policy.non_retryable
            or type(exc).__name__ in policy.non_retryable
        )
        err["non_retryable"] = non_retryable
        counted = lease.attempt - lost
        if non_retryable or (policy.max_attempts and counted >= policy.max_attempts):
            append_next(
                db, lease.workflow_id, h.ACTIVITY_FAILED, now, {**base, "error": err, "final": True, "retryable": False}
            )
            close_activity(db, lease.workflow_id, lease.activity_id)
            return
        retry_at = now + policy.delay_s(counted)
        append_next(
            db,
            lease.workflow_id,
            h.ACTIVITY_FAILED,
            now,
            {**base, "error": err, "final": False, "retryable": True, "retry_at": retry_at},
        )
        db.execute(
            "UPDATE activities SET state='scheduled', due_at=?, hb_deadline=NULL, close_deadline=NULL, owner=NULL "
            "WHERE workflow_id=? AND activity_id=?",
            (retry_at, lease.workflow_id, lease.activity_id),
        )

    def time_out(self, db, workflow_id: str, activity_id: str, kind: str, *, lost: bool) -> None:
        """The running attempt is over (deadline passed, or its worker died): redeliver or fail for good."""
        cmd, attempt, options_json, nlost = db.execute(
            "SELECT cmd, attempt, options, lost FROM activities WHERE workflow_id=? AND activity_id=?",
            (workflow_id, activity_id),
        ).fetchone()
        now = self.clock.now()
        policy = StepOptions.from_json(json.loads(options_json)).retry
        base = {"cmd": cmd, "activity_id": activity_id, "attempt": attempt, "kind": kind}
        (cancel,) = db.execute("SELECT cancel_requested FROM workflows WHERE id=?", (workflow_id,)).fetchone()
        if cancel:
            append_next(db, workflow_id, h.ACTIVITY_CANCELED, now, {**base, "reason": f"{kind} after cancel"})
            close_activity(db, workflow_id, activity_id)
            return
        nlost += 1 if lost else 0
        counted = attempt - nlost
        err = {"type": "WorkerLost" if lost else "Timeout", "message": f"attempt {attempt}: {kind}"}
        if not lost and policy.max_attempts and counted >= policy.max_attempts:
            append_next(db, workflow_id, h.ACTIVITY_TIMED_OUT, now, {**base, "error": err, "final": True})
            close_activity(db, workflow_id, activity_id)
            return
        retry_at = now if lost else now + policy.delay_s(counted)
        append_next(
            db, workflow_id, h.ACTIVITY_TIMED_OUT, now, {**base, "error": err, "final": False, "retry_at": retry_at}
        )
        db.execute(
            "UPDATE activities SET state='scheduled', due_at=?, lost=?, hb_deadline=NULL, close_deadline=NULL, "
            "owner=NULL WHERE workflow_id=? AND activity_id=?",
            (retry_at, nlost, workflow_id, activity_id),
        )

    def heartbeat(self, lease: Lease, details: Any, now: float) -> None:
        if details is not None:
            details = json.loads(dumps(details))
        lost = None
        with self.tx("heartbeat") as (db, _after):
            row = db.execute(
                "SELECT state, attempt, hb_deadline, close_deadline FROM activities "
                "WHERE workflow_id=? AND activity_id=?",
                (lease.workflow_id, lease.activity_id),
            ).fetchone()
            late = overdue(row[2], row[3], now) if row else None
            if row is None or row[0] != "running" or row[1] != lease.attempt:
                lost = f"attempt {lease.attempt} is no longer current"
            elif late:
                self.time_out(db, lease.workflow_id, lease.activity_id, late, lost=False)
                lost = f"attempt {lease.attempt} {late}"
            else:
                hb = lease.options.heartbeat_timeout_s
                db.execute(
                    "UPDATE activities SET hb_deadline=?, last_hb_at=?, details=COALESCE(?, details) "
                    "WHERE workflow_id=? AND activity_id=?",
                    (
                        now + hb if hb else None,
                        now,
                        dumps(details) if details is not None else None,
                        lease.workflow_id,
                        lease.activity_id,
                    ),
                )
                if details is not None:
                    lease.appended = True  # (the cached replayer has not seen it: no fast completion)
                    append_next(
                        db,
                        lease.workflow_id,
                        h.ACTIVITY_HEARTBEAT,
                        now,
                        {
                            "cmd": lease.cmd,
                            "activity_id": lease.activity_id,
                            "attempt": lease.attempt,
                            "details": details,
                        },
                    )
        if lost:
            raise LeaseLost(f"{lease.workflow_id}/{lease.activity_id}: {lost}; stop this attempt")

    def process_tag(self, workflow_id: str, activity_id: str, attempt: int) -> str:
        if self._scope is None:
            self._scope = proctree.scope_of(self.store.path)
        return proctree.attempt_tag(self._scope, workflow_id, activity_id, attempt)

    def _kill_dead_attempt(self, workflow_id: str, activity_id: str, attempt: int, child_json: str | None) -> None:
        """Before a dead worker's attempt is redelivered: every process it started is gone (engine/_proctree.py).

        An attempt that recorded no child started no process (the runner records one before it spawns), so
        no scan of /proc is needed for it (the simulator expires thousands of those)."""
        if not child_json:
            return
        child = json.loads(child_json)
        if leases.kill_leftover(child):
            log.warning("killed the leftover process group of %s/%s attempt %d", workflow_id, activity_id, attempt)
        left = proctree.kill_attempt(self.process_tag(workflow_id, activity_id, attempt))
        if left:
            log.error(
                "processes %s of %s/%s attempt %d could not be killed", sorted(left), workflow_id, activity_id, attempt
            )

    def record_child(self, lease: Lease, pid: int | None) -> None:
        child = {"pid": pid, "pstart": leases.proc_start(pid) if pid is not None else None}
        with self.tx("child") as (db, _after):
            db.execute(
                "UPDATE activities SET child=? WHERE workflow_id=? AND activity_id=? AND attempt=? AND state='running'",
                (dumps(child), lease.workflow_id, lease.activity_id, lease.attempt),
            )

    def cancel_requested(self, lease: Lease) -> bool:
        row = self.store.query_one(
            "SELECT w.state, w.cancel_requested, a.state, a.attempt FROM workflows w JOIN activities a "
            "ON a.workflow_id = w.id WHERE w.id=? AND a.activity_id=?",
            (lease.workflow_id, lease.activity_id),
        )
        return row is None or row[0] != "running" or bool(row[1]) or row[2] != "running" or row[3] != lease.attempt

    def expire(self) -> bool:
        now = self.clock.now()
        # this worker's own leases without deadlines can neither be late nor dead while it runs this
        rows = self.store.query(
            "SELECT workflow_id, activity_id, attempt, hb_deadline, close_deadline, owner FROM activities "
            "WHERE state='running' AND NOT (owner IS ? AND hb_deadline IS NULL AND close_deadline IS NULL) "
            "ORDER BY workflow_id, activity_id",
            (self.owner_json,),
        )
        did = False
        dead_owners: dict[str | None, bool] = {}  # one liveness check per owner (it reads /proc)
        for wf, aid, attempt, hb, close, owner_json in rows:
            late = overdue(hb, close, now)
            if not late and owner_json not in dead_owners:
                dead_owners[owner_json] = leases.owner_dead(json.loads(owner_json) if owner_json else None)
            dead = not late and dead_owners[owner_json]
            if not (late or dead):
                continue
            if dead:  # outside the transaction (it waits for the kills); the dead owner cannot renew the lease
                (child_json,) = self.store.query_one(
                    "SELECT child FROM activities WHERE workflow_id=? AND activity_id=?", (wf, aid)
                ) or (None,)
                self._kill_dead_attempt(wf, aid, attempt, child_json)
            with self.tx("expire") as (db, after):
                row = db.execute(
                    "SELECT state, attempt FROM activities WHERE workflow_id=? AND activity_id=?", (wf, aid)
                ).fetchone()
                if row[0] != "running" or row[1] != attempt:
                    continue
                if dead:
                    log.warning("worker of %s/%s attempt %d is gone; redelivering", wf, aid, attempt)
                self.time_out(db, wf, aid, late or "worker lost", lost=dead)
                (pending,) = db.execute("SELECT task_pending FROM workflows WHERE id=?", (wf,)).fetchone()
                if pending:
                    self.run_task(db, after, wf)
            did = True
        return did


def close_activity(db, workflow_id: str, activity_id: str, *, mark: bool = True) -> None:
    """The attempt's row is closed: deleted (the table holds open activities only; how it ended is
    its history's last event for it, see ``Engine.activities``); its workflow's task is due
    (``mark=False``: the caller runs it in this transaction, which leaves ``task_pending`` as the
    task ends it)."""
    db.execute("DELETE FROM activities WHERE workflow_id=? AND activity_id=?", (workflow_id, activity_id))
    if mark:
        mark_task(db, workflow_id)


def mark_task(db, workflow_id: str) -> None:
    """The workflow's task is due (a worker's poll runs it)."""
    db.execute("UPDATE workflows SET task_pending=1 WHERE id=? AND state='running'", (workflow_id,))


def overdue(hb_deadline: float | None, close_deadline: float | None, now: float) -> str | None:
    if close_deadline is not None and now > close_deadline:
        return "start-to-close timeout"
    if hb_deadline is not None and now > hb_deadline:
        return "heartbeat timeout"
    return None
