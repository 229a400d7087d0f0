"""Convergence: a recovery stops where its state equals one already verified at the same point.

A run killed at position k is recovered by a fresh engine on the files the kill left, and
runs to the end; its outcome is then checked. Most of that run repeats what another run
already did: once the interrupted segment is redone, the recovered run is back in the state
the uninterrupted run was in at the same point, and from there both do the same. So at each
*convergence point* of a recovery we compute a ``state_key``; when an already verified run
(the uninterrupted run, or an earlier recovery that ran on) had the same key at the same
point, the recovery stops there and its outcome is its own past spliced to that run's future
(``Verified.splice``): its own events, ledger and files up to the point, the other run's
events, ledger entries, end state, result and final files after it. Every check then runs on
that spliced outcome, with the position's own ledger, as if the recovery had run to the end.

Why equal keys give equal futures (the argument the splice rests on). A convergence point is
a ``timer-wait`` position: the engine is idle on its virtual clock (``Engine._wait``), inside
no transaction, with no activity leased or running (inline activities run to their end within
a tick; ``_ready`` and ``_inflight`` are empty, which the key asserts). What the process does
from there is a deterministic function of what it reads from then on:

1. **The workflow code's state.** The engine's cached ``Replayer`` holds the workflow
   coroutine. Workflow code is deterministic and reads nothing but the seam, so its state is
   fixed by the values the replayer fed it: the recorded commands and their resolutions, with
   their times (``Replayer.record``/``_outcome_of``: workflow started, activity scheduled,
   timer started, activity completed (its result), canceled, failed or timed out *for good*,
   timer fired or canceled, cancel requested, workflow ended). The key holds a running digest
   of exactly those events, in order, with their full attributes but for ``attempt`` of a
   completed activity (which the replayer never reads); it leaves out what the replayer skips:
   activity started, heartbeat, and failures or time-outs that are retried. Which workflows
   have a cached replayer is in the key too: a fresh engine that has not replayed yet is not
   at the same point as one that has (its next task replays from scratch, which is exactly what
   a kill there must exercise), so it does not converge before its first replay.
2. **The database.** Besides the replayer's reads, the engine reads (engine/worker.py,
   engine/engine.py): the workflow rows (all columns in the key); activity rows that are
   scheduled or running, by state filter or by id for the attempt in hand (all their columns
   in the key: attempt, lost, due time, heartbeat details, owner...); activity rows that ended
   only through filters on state and through the primary key of new rows, and every row is
   inserted with its ``activity_scheduled`` event (in the digest), so their ids are fixed by
   the digest and their count per state is in the key; pending timers (all columns) and the
   others' count per state likewise; and ``MAX(seq)`` of the history, where a different
   offset only shifts the sequence numbers of the events to come (nothing branches on them).
3. **The files.** The fake activities read checkpoints, LATEST and evaluation inputs from the
   home folder and write nothing that they do not also digest: the key holds an
   order-independent digest of every file's path and bytes that they wrote
   (``FakeActivities.files``), which a recovery inherits with its copy of the files.
4. **The rest of the process:** the virtual clock, the retryable failures still to come
   (``oom_left``), the engine's stall counter. The owner id of the live engine differs between
   runs but is only compared with itself (its own leases) from here on; the ledger is only
   written; the positions to come carry no kill.

So two states with equal keys at a timer-wait make the same transactions, the same activity
executions and the same file writes from there to the end, up to the sequence numbers of new
events: their end state, result, final files and the events and ledger entries after the
point are equal. ``tests/simulator`` checks the spliced outcomes against runs that really ran
to the end, run for run, and shows that a key missing a component makes that test fail.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from engine import history as h

from .ledger import Ledger

CONVERGENCE_KIND = "timer-wait"

_SKIPPED = {h.ACTIVITY_STARTED, h.ACTIVITY_HEARTBEAT}
_RETRIED = {h.ACTIVITY_FAILED, h.ACTIVITY_TIMED_OUT}
_MAX_EVENTS_READ = 1_000_000  # a history longer than this is a runaway run: stop and say so


class Converged(BaseException):
    """Raised at a convergence point whose key is already verified: the recovery stops here."""

    def __init__(self, target: "Target"):
        super().__init__("converged")
        self.target = target


class HistoryDigest:
    """A running digest, per workflow, of the history events the workflow code can see (see 1.)."""

    def __init__(self) -> None:
        self.last_seq: dict[str, int] = {}
        self.digest: dict[str, bytes] = {}

    def copy(self) -> "HistoryDigest":
        out = HistoryDigest()
        out.last_seq, out.digest = dict(self.last_seq), dict(self.digest)
        return out

    def catch_up(self, conn) -> tuple:
        """Read the events committed since the last call; the digests of every workflow."""
        rows = conn.execute("SELECT workflow_id, MAX(seq) FROM events GROUP BY workflow_id").fetchall()
        for wf, top in rows:
            last = self.last_seq.get(wf, 0)
            if top <= last:
                continue
            if top - last > _MAX_EVENTS_READ:
                raise RuntimeError(f"history of {wf!r} grew by {top - last} events")
            d = self.digest.get(wf, b"")
            for seq, typ, t, attrs in conn.execute(
                "SELECT seq, type, time, attrs FROM events WHERE workflow_id=? AND seq>? ORDER BY seq", (wf, last)
            ):
                if seq != last + 1:
                    raise RuntimeError(f"history of {wf!r} has a gap at seq {seq}")
                last = seq
                seen = _visible(typ, attrs)
                if seen is not None:
                    d = hashlib.blake2b(d + f"{typ}\0{float(t).hex()}\0{seen}".encode(), digest_size=20).digest()
            self.last_seq[wf], self.digest[wf] = last, d
        return tuple(sorted(self.digest.items()))


def _visible(typ: str, attrs_text: str) -> str | None:
    """The attributes of an event as the replayer reads them; None for an event it skips."""
    if typ in _SKIPPED:
        return None
    if typ in _RETRIED or typ == h.ACTIVITY_COMPLETED:
        attrs = json.loads(attrs_text)
        if typ in _RETRIED and not attrs.get("final"):
            return None
        if typ == h.ACTIVITY_COMPLETED:
            attrs.pop("attempt", None)
        return json.dumps(attrs, sort_keys=True, separators=(",", ":"))
    return attrs_text


def state_key(label: str, eng, clock, fakes, history: HistoryDigest) -> tuple | None:
    """The key of the state at a convergence point (see the module docstring); None: not one."""
    if eng._ready or eng._inflight:  # not idle: not a convergence point
        return None
    conn = eng.store.conn
    with eng.store._lock:
        digest = history.catch_up(conn)
        workflows = tuple(conn.execute("SELECT * FROM workflows ORDER BY id").fetchall())
        live = tuple(conn.execute(
            "SELECT * FROM activities WHERE state IN ('scheduled', 'running') ORDER BY workflow_id, activity_id"
        ).fetchall())
        ended = tuple(conn.execute(
            "SELECT workflow_id, state, COUNT(*) FROM activities WHERE state NOT IN ('scheduled', 'running') "
            "GROUP BY workflow_id, state ORDER BY workflow_id, state").fetchall())
        timers = tuple(conn.execute(
            "SELECT * FROM timers WHERE state='pending' ORDER BY workflow_id, cmd").fetchall())
        timers_ended = tuple(conn.execute(
            "SELECT workflow_id, state, COUNT(*) FROM timers WHERE state!='pending' "
            "GROUP BY workflow_id, state ORDER BY workflow_id, state").fetchall())
    return (label, clock.now(), digest, tuple(sorted(eng._cache)), getattr(eng, "_stalls", 0),
            workflows, live, ended, timers, timers_ended, fakes.files_digest(), tuple(sorted(fakes.oom_left.items())))


@dataclass
class Verified:
    """The end of a run that was checked (or spliced from checked ones): what a splice reuses."""

    state: str
    result: Any
    error: dict | None
    events: list
    ledger: list[dict]
    state_lines: list[str] | None  # its outcome and files checks (None: not a completed-run check)
    file_lines: list[str]  # its final files' checks


@dataclass
class Target:
    """A verified run at one convergence point: where its future starts in its events and ledger."""

    run: Verified | None  # None until that run has ended
    events_at: int
    ledger_at: int


def splice_ledger(own: Ledger, target: Target) -> Ledger:
    """This run's ledger up to the point, then the target's entries after its point (renumbered)."""
    led = Ledger()
    base = len(own.entries)
    led.entries = own.entries + [{**e, "seq": base + i} for i, e in enumerate(target.run.ledger[target.ledger_at:])]
    return led
