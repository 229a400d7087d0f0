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
2. **The database.** Besides the replayer's reads, the engine reads (engine/_worker.py,
   engine/_engine.py): the workflow rows (all columns in the key); activity rows that are
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
point are equal.

**Equal but for the history** (``checked_splice``). A recovery that redid its segment from
that segment's own last checkpoint gets a train result naming another ``resumed_from``: its
history digest never equals the uninterrupted run's again, though nothing else differs. When
every other component of its key equals the uninterrupted run's at the same point, the workflow
code, as the recovery's own engine holds it there (its cached replayer, fed the recovery's own
history; the engine is stopped at this point anyway), goes on dry over the uninterrupted run's
events after the point. If the code then asks for exactly the commands recorded there (same
activity names, ids, inputs and options, same timer durations) and completes, the recovery's
future is that future with the code's own result at the end: by induction over the commands
after the point, each is recorded with the same attributes in both runs, runs on the same
rows, files, clock and input, so returns the same result and writes the same files, and the
code, given the same resolutions, asks for the same next command; only the value it finally
returns can differ, and the replay computes it. If the code's later inputs depend on what
differs, the splice is refused there and the recovery is made again from its kill, without
this shortcut (its replayer was spent), and runs on (to a later point, or the end). Going on from
the recovery's own replayer costs O(the future) per splice, not O(the whole history): that
replayer is the very code state the recovery would run on with.

``tests/simulator`` checks the spliced outcomes against runs that really ran to the end, run
for run, and shows that a key without its history digest, or a checked splice without its
comparison of the commands, makes those tests fail.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from engine import testing as h  # the engine's testing door: event kinds, attrs' JSON text, dry replayers
from engine.testing import DrySink, Replayer

from .ledger import Ledger, SplicedLedger

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
        rows = conn.execute("SELECT id FROM workflows ORDER BY id").fetchall()  # each started with its event 1
        for (wf,) in rows:
            (top,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id=?", (wf,)).fetchone()
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
    if not h.worker_idle(eng):  # not idle: not a convergence point
        return None
    conn = eng.store.conn
    with h.store_lock(eng):
        digest = history.catch_up(conn)
        workflows = tuple(conn.execute("SELECT * FROM workflows ORDER BY id").fetchall())
        live = tuple(
            conn.execute(
                "SELECT * FROM activities WHERE state IN ('scheduled', 'running') ORDER BY workflow_id, activity_id"
            ).fetchall()
        )
        ended = tuple(
            conn.execute(
                "SELECT workflow_id, state, COUNT(*) FROM activities WHERE state NOT IN ('scheduled', 'running') "
                "GROUP BY workflow_id, state ORDER BY workflow_id, state"
            ).fetchall()
        )
        timers = tuple(conn.execute("SELECT * FROM timers WHERE state='pending' ORDER BY workflow_id, cmd").fetchall())
        timers_ended = tuple(
            conn.execute(
                "SELECT workflow_id, state, COUNT(*) FROM timers WHERE state!='pending' "
                "GROUP BY workflow_id, state ORDER BY workflow_id, state"
            ).fetchall()
        )
    return (
        label,
        clock.now(),
        digest,
        h.cached_workflow_ids(eng),
        h.stalls(eng),
        workflows,
        live,
        ended,
        timers,
        timers_ended,
        fakes.files_digest(),
        tuple(sorted(fakes.oom_left.items())),
    )


@dataclass
class Verified:
    """The end of a run that was checked (or spliced from checked ones): what a splice reuses."""

    state: str
    result: Any
    error: dict | None
    events: list
    ledger: list[dict]
    file_lines: list[str]  # its final files' checks


@dataclass
class Target:
    """A verified run at one convergence point: where its future starts in its events and ledger."""

    run: Verified | None  # None until that run has ended
    events_at: int
    ledger_at: int


def splice_ledger(own: Ledger, target: Target) -> Ledger:
    """This run's ledger up to the point, then the target's entries after its point (renumbered; made
    when read: the sweep checks the pieces, simulator/ledger_folds.py)."""
    run = target.run
    assert run is not None  # (a target splices once its run has ended)
    return SplicedLedger(own.entries, [(run.ledger, target.ledger_at, len(run.ledger))])


# --- a splice checked by replaying the workflow code ------------------------------------------------


def without_history(key: tuple) -> tuple:
    """A state key less its history digest (component 2)."""
    return key[:2] + key[3:]


class _RecordingRuntime:
    """The seam, passed through, noting what the code asks for as the live engine would record it."""

    def __init__(self, rt, calls: list):
        self._rt, self._calls = rt, calls

    def __getattr__(self, name: str):
        return getattr(self._rt, name)

    async def execute_activity(self, name, input, options, *, result_type=None):
        try:
            self._calls.append(("activity", name, options.id, json.loads(h.dumps(input)), options.to_json()))
        except Exception:  # noqa: BLE001 - not JSON-able: the replayer says so; here, just no match
            self._calls.append(("unrecordable", name))
        return await self._rt.execute_activity(name, input, options, result_type=result_type)

    async def sleep(self, seconds):
        self._calls.append(("timer", float(seconds)))
        return await self._rt.sleep(seconds)


def _command_view(e) -> tuple:
    a = e.attrs
    if e.type == h.ACTIVITY_SCHEDULED:
        return ("activity", a["name"], a["activity_id"], a["input"], a["options"])
    return ("timer", float(a["seconds"]))


def recording_replayer(reg, workflow_id: str, events: list) -> tuple[Any, list]:
    """A fresh dry replayer of ``reg``'s code over ``events`` (not advanced), whose runtime notes every
    command the code asks for (``_RecordingRuntime``), and that list."""
    if not events or events[0].type != h.WORKFLOW_STARTED:
        raise ValueError("a history starts with a workflow_started event")
    calls: list = []

    async def recorded(rt, input):
        return await reg.fn(_RecordingRuntime(rt, calls), input)

    r = Replayer(workflow_id, recorded, reg.decode_input(events[0].attrs.get("input")), DrySink())
    r.feed(events)
    return r, calls


def _request_view(req) -> tuple:
    """A command request as ``_RecordingRuntime`` notes it (the same tuple from the same call)."""
    cmd, payload = req.command, req.payload
    if cmd.kind != "activity":
        return ("timer", float(payload["seconds"]))
    try:
        return (
            "activity",
            cmd.name,
            cmd.activity_id,
            json.loads(h.dumps(payload["input"])),
            payload["options"].to_json(),
        )
    except Exception:  # noqa: BLE001 - not JSON-able: the replayer says so; here, just no match
        return ("unrecordable", cmd.name)


def go_on_dry(r, calls: list) -> None:
    """Turn the recovery's own cached replayer ``r`` (its engine stops here, at a convergence point)
    into a dry one that notes the commands its code asks for from now on, as ``_RecordingRuntime``
    does: the code goes on from exactly where the recovery's engine left it, with nothing written."""
    command = r._command

    def noted(req):
        calls.append(_request_view(req))
        return command(req)

    r.sink = DrySink()
    r._command = noted  # (an instance attribute: ``Replayer._step`` calls ``self._command``)


class JoinedEvents:
    """``head[:n] + tail`` as a read-only sequence, made without copying ``head`` (a recovery's own history:
    the uninterrupted run's first ``n`` events, then its own; a forked recovery touches no more of them
    than it reads, simulator/prefix.py)."""

    def __init__(self, head: list, n: int, tail: list):
        self.head, self.n, self.tail = head, n, tail

    def __len__(self) -> int:
        return self.n + len(self.tail)

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return list(self)[i]
            out = self.head[start : min(stop, self.n)] if start < self.n else []
            return out + self.tail[max(start - self.n, 0) : max(stop - self.n, 0)]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.head[i] if i < self.n else self.tail[i - self.n]

    def __iter__(self):
        for i in range(self.n):
            yield self.head[i]
        yield from self.tail


NO_SPLICE = object()  # ``splice_replay``: the future does not hold for this run


def checked_splice(
    reg, workflow_id: str, own, near: Target, ledger_entries: list[dict], live=None
) -> tuple[Target | None, bool]:
    """The future of a run whose state at a convergence point equals ``near``'s but for its history.

    Such a run (e.g. a recovery that resumed from its segment's last checkpoint: its train result
    names another ``resumed_from``) differs from ``near``'s run only in the values the workflow code
    received so far. The code, as it stands after the run's own events ``own``, is fed the events of
    ``near``'s future; when it asks for exactly the commands recorded there after the point (same
    activities, inputs and options, same timer durations) and ends completed, the run's future is
    that future with the code's own result at the end: the engine's other state, the files and the
    clock are equal (the key), so every transaction, activity execution and file write after the
    point is the same, by induction over the commands, and only the result the code returns can
    differ, which the replay computes. Returns (the target, or None when it does not hold: the run
    then runs on; whether ``live`` was spent).
    ``live``: the run's own cached replayer (its engine is idle at the point), whose code goes on dry
    from exactly where the run left it (``go_on_dry``): no replay of ``own`` from its start. Once fed,
    it is spent: a run refused here cannot run on with it (the caller recovers it again, without).
    Without it the code is replayed dry from scratch over ``own``, then the future.
    (``splice_replay`` then ``splice_target``: a forked recovery makes the first, the sweep the second.)
    """
    result, spent = splice_replay(reg, workflow_id, own, near, live=live)
    if result is NO_SPLICE:
        return None, spent
    return splice_target(list(own), near, ledger_entries, result), spent


def splice_replay(reg, workflow_id: str, own, near: Target, live=None) -> tuple[Any, bool]:
    """``checked_splice``'s check: the result the code returns over ``near``'s future, or ``NO_SPLICE``;
    and whether ``live`` was spent. ``own``: a sequence of the run's events (``JoinedEvents``)."""
    run = near.run
    assert run is not None  # (a target splices once its run has ended)
    suffix = run.events[near.events_at :]
    if run.state != "completed" or not suffix or suffix[-1].type != h.WORKFLOW_COMPLETED:
        return NO_SPLICE, False
    body = suffix[:-1]
    if any(e.type in h.TERMINAL_EVENTS for e in body):
        return NO_SPLICE, False
    base = len(own)
    if own and own[-1].seq != base:
        return NO_SPLICE, False
    shifted = _shifted(body, base)
    want = [_command_view(e) for e in body if e.type in (h.ACTIVITY_SCHEDULED, h.TIMER_STARTED)]
    spent = False
    if live is not None and not live.done and live.blocked_on is not None and 0 < live.last_seq <= base:
        r, calls, spent = live, list[Any](), True
        go_on_dry(r, calls)
        r.feed(own[r.last_seq :])  # what its own engine wrote since its last task (as its next task would)
        if r.next_cmd != len(r.commands):  # the code asked for something not in its history: no match
            return NO_SPLICE, spent
        k0 = 0  # calls are noted from here on
    else:
        r, calls = recording_replayer(reg, workflow_id, own)
        k0 = sum(1 for e in own if e.type in (h.ACTIVITY_SCHEDULED, h.TIMER_STARTED))
    r.feed(shifted)
    r.advance()
    if not r.done or r.sink.new or r.outcome is None or r.outcome[0] != "completed":
        return NO_SPLICE, spent
    if len(calls) != k0 + len(want) or calls[k0:] != want:
        return NO_SPLICE, spent
    return r.outcome[1], spent


def _shifted(body: list, base: int) -> list:
    return [h.Event(base + 1 + i, e.type, e.time, e.attrs) for i, e in enumerate(body)]


def splice_target(own: list, near: Target, ledger_entries: list[dict], result: Any) -> Target:
    """The target ``checked_splice`` makes of a run whose ``splice_replay`` gave ``result``: its own events
    and ledger, then ``near``'s future (renumbered), ending completed with ``result``."""
    run = near.run
    assert run is not None  # (a target splices once its run has ended)
    suffix = run.events[near.events_at :]
    body, base = suffix[:-1], len(own)
    end = h.Event(base + len(body) + 1, h.WORKFLOW_COMPLETED, suffix[-1].time, {"result": result})
    spliced = Verified(
        "completed",
        result,
        None,
        own + _shifted(body, base) + [end],
        ledger_entries + run.ledger[near.ledger_at :],
        run.file_lines,
    )
    return Target(spliced, base, len(ledger_entries))
