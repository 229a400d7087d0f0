"""A fresh replay of a history prefix, made once and shared by the recoveries after it (by fork).

Each distinct kill state of a sweep is recovered by a fresh engine, whose first workflow task
replays the whole history from scratch: O(history) per recovery, the quadratic term of a long
sweep. Python cannot copy a coroutine, but ``os.fork`` can: the sweep makes a fresh replay of
the uninterrupted run's history up to a *cut* (``build_prefix``), and runs each recovery after
that cut in a forked child, whose fresh engine takes its copy of that replayer on its first task
(``use_prefix``) and reads, checks and feeds only the events after the cut.

What a recovery still does for real: its own engine on its own copy of the files, its own
expiry of the dead worker's leases, its own transactions; its first workflow task reads every
event after the cut from its own database (checksums verified), feeds them to the replayer and
runs the workflow code on from where the prefix replay left it, exactly as the engine's task
does with a replayer it has. The events up to the cut were replayed by a *fresh* replayer
(the worker's own ``new_replayer``: the recorded input decoded and checked against event 1,
every event read from 0 and checksummed, the code run from its start), once per cut.

Why the result equals a fresh replay of the recovery's whole history (the argument):

1. The recovery's database holds the cut's events byte for byte: its events 1..c have the
   checksums the prefix replay verified (compared in the child; else no prefix is used), and
   the workflow row's input text is the one the prefix decoded.
2. A replayer's indexes (``Replayer.record``) are a fold over the events in order; feeding
   1..c then c+1..n builds the same indexes as feeding 1..n.
3. The workflow code is a coroutine that sees only the values sent to it and the runtime's
   ``now``/``is_replaying``. At the cut it is blocked on command k, recorded in 1..c and not
   resolved there, no cancel recorded, no new command issued (checked by ``build_prefix``).
   A fresh replay of 1..n runs the code over commands 0..k-1 with the same recorded outcomes
   and times, then reaches k; from there both runs see the same history (all of 1..n) before
   the code resumes, so they send the same values and answer ``is_replaying`` alike (it is
   read while the code runs, after everything is fed in both). So the code issues the same
   commands with the same inputs, and the sink gets the same calls.

4. The spine (``advance_prefix``): one prefix replayer, made fresh once, is fed the uninterrupted
   run's events in chunks, one per convergence point, and advanced after each, instead of a fresh
   replay at each cut. Its indexes are the same fold (2.). Its code is sent, for each command j, the
   outcome of j's resolution as it stood when the code reached j; a fresh replay sends the one
   standing after all events. They are the same where no command is resolved twice, which the feed
   checks (else the spine is dropped and the next cut is replayed fresh). ``now`` is the resolution's
   time in both; ``is_replaying`` is True for every command in both, since after each chunk the code
   is blocked on a recorded command and issued none (checked after each chunk, as in 3.). A cancel
   recorded anywhere drops the spine. So after each chunk the spine's replayer is the state a fresh
   replay of the whole history up to that cut reaches, and 3. applies to the cut as it does to a
   ``build_prefix`` one. ``tests/simulator`` compares spine-forked recoveries with literal reruns.

6. Indexes only (``use_prefix``'s ``index``): a recovery that has no replayer to start from (none
   donated, none forked) replays its code from scratch, but its replayer's *indexes* for events 1..c
   are copied from the spine's instead of read, checksummed, decoded and folded again from its own
   database: the same checksums are compared first (1.), the indexes are the fold over the same events
   (2.) and a fold depends on nothing but the events (the spine's code issued no new command, the only
   way code writes an index: ``Replayer._command`` adds a new activity id; checked by ``build_prefix``
   and ``advance_prefix``); the code then starts from its first line as in any fresh replay, over the
   events 1..n. The copies are the spine's lists and maps (its ``Event`` objects are shared, as the
   spine shares them with every donated replay: nothing writes into an event). It saves the read of
   c events per such recovery, O(history) each, about half of a fresh replay's cost at 100 segments.

A bug that only a fresh replay of the events after the cut would show is therefore one in
the engine's incremental feed, which every uninterrupted run exercises at every task;
``tests/simulator`` runs the sweep with a prefix at every cut and compares every position's
outcome with a literal rerun from the start, and a prefix built without its checks (a replayer
not blocked on a recorded command) makes that comparison fail.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from engine import read_events

# the simulator's documented hook into the replayer (engine/__init__.py's docstring): not public API
from engine import testing  # the engine's testing door: replayers, the worker's replayer factory, lease owners
from engine.testing import FINAL_ONLY, RECORD_KINDS, DrySink, Replayer, WorkflowRuntime

MAX_REPLY_BYTES = 1 << 31  # a child's reply larger than this is a runaway
_RESOLVES = {t for t, kind in RECORD_KINDS.items() if kind == 1}  # the events that resolve a command


@dataclass
class ReplayPrefix:
    """A replayer that replayed a workflow's events 1..``seq`` fresh, blocked on a recorded command."""

    workflow_id: str
    seq: int
    crcs: str  # the checksums of events 1..seq, in order (their bytes, via event_crc)
    input_text: str  # the workflow row's input, as the replayer decoded it
    replayer: Replayer
    used: bool = False  # a coroutine runs on once: the first engine to take it consumes it
    indexed: int = 0  # replays from scratch that copied its indexes (``use_prefix``'s ``index``)


class _PrefixSink(DrySink):
    """A dry sink that has the database the worker's ``new_replayer`` reads the input from."""

    def __init__(self, db):
        super().__init__()
        self.db = db
        self.canceled: list[int] = []
        self.finished = False

    def cancel_pending(self, r, k):
        self.canceled.append(k)

    def finish(self, r, state, payload):
        self.finished = True


def event_crcs(conn, workflow_id: str, seq: int) -> str | None:
    """The checksums of events 1..``seq`` of ``workflow_id``, or None if those are not all there."""
    n, text = conn.execute(
        "SELECT COUNT(*), group_concat(crc, ',') FROM (SELECT crc FROM events WHERE workflow_id=? AND seq<=? "
        "ORDER BY seq)",
        (workflow_id, seq),
    ).fetchone()
    return text if n == seq else None


def build_prefix(eng, workflow_id: str, workflow_name: str) -> ReplayPrefix | None:
    """A fresh replay of the history of ``workflow_id`` in ``eng``'s database as it stands (the caller
    holds the engine idle, no transaction open); None where the history ends anywhere but with the
    code blocked on a recorded, unresolved command (see the module docstring, 3.)."""
    reg = testing.registration(eng, workflow_name)
    if reg is None:
        return None
    conn = eng.store.conn
    with testing.store_lock(eng):
        row = conn.execute("SELECT input, state FROM workflows WHERE id=?", (workflow_id,)).fetchone()
        if row is None or row[1] != "running":
            return None
        sink = _PrefixSink(conn)
        r = testing.new_replayer(eng, reg, workflow_id, row[0], sink)
        if r.fn is not reg.fn:  # the input no longer validates: nothing to share
            return None
        events = read_events(conn, workflow_id, 0)
        if _resolved_twice(events, set()):  # (the spine's chunks need it: see 4.)
            return None
        r.feed(events)
        r.advance()
        crcs = event_crcs(conn, workflow_id, r.last_seq)
    k = r.blocked_on
    ok = (
        not r.done
        and not sink.new
        and not sink.canceled
        and not sink.finished
        and r.cancel_event is None
        and r.terminal is None
        and k is not None
        and k < len(r.commands)
        and k not in r.resolutions
    )
    if not ok or crcs is None:
        return None
    r.sink = DrySink()  # detached: whoever next drives the prefix's replayer hands it its sink
    return ReplayPrefix(workflow_id, r.last_seq, crcs, row[0], r)


def advance_prefix(eng, prefix: ReplayPrefix, workflow_name: str) -> bool:
    """The spine: ``prefix``'s replayer (made fresh by ``build_prefix``) fed the events of ``eng``'s database
    recorded since its cut, read and checksummed as the engine's task reads them, and advanced, in place;
    its cut moves to the history's end. False (``prefix`` is then unusable: drop it) where the feed would
    not equal a fresh replay of the whole history (see the module docstring, 4.): an event resolving a
    command already resolved, or the code not left blocked on a recorded, unresolved command."""
    reg = testing.registration(eng, workflow_name)
    r = prefix.replayer
    if reg is None or r.fn is not reg.fn or prefix.used:
        return False
    conn = eng.store.conn
    with testing.store_lock(eng):
        row = conn.execute("SELECT input, state FROM workflows WHERE id=?", (prefix.workflow_id,)).fetchone()
        if row is None or row[1] != "running" or row[0] != prefix.input_text:
            return False
        new = read_events(conn, prefix.workflow_id, prefix.seq)
        crcs = None
        if new:
            crcs = event_crcs(conn, prefix.workflow_id, new[-1].seq)
    if not new:
        return True
    if _resolved_twice(new, set(r.resolutions)):  # a fresh replay would read the later one instead
        return False
    sink = _PrefixSink(conn)
    r.sink = sink
    try:
        r.feed(new)
        r.advance()
    finally:
        r.sink = DrySink()  # detached: the index's replayer gets its sink from whoever next drives it
    k = r.blocked_on
    ok = (
        not r.done
        and not sink.new
        and not sink.canceled
        and not sink.finished
        and r.cancel_event is None
        and r.terminal is None
        and k is not None
        and k < len(r.commands)
        and k not in r.resolutions
    )
    if not ok or crcs is None:
        return False
    prefix.seq, prefix.crcs = r.last_seq, crcs
    return True


def _resolved_twice(events, resolved: set) -> bool:
    """Whether a command is resolved twice, by ``events`` or by them after ``resolved`` (commands)."""
    for e in events:
        if e.type in _RESOLVES and (e.type not in FINAL_ONLY or e.attrs.get("final")):
            k = e.attrs.get("cmd")
            if k in resolved:
                return True
            resolved.add(k)
    return False


class NotingRuntime(WorkflowRuntime):
    """The seam as the engine hands it to workflow code, noting whether the code read ``is_replaying``
    (the one value a fresh replay and a live run give the code differently: see ``adopt_donor``)."""

    read_replaying = False

    @property
    def is_replaying(self) -> bool:
        self.read_replaying = True
        return super().is_replaying  # the engine's own answer


def use_prefix(eng, prefix: ReplayPrefix | None, index: ReplayPrefix | None = None) -> None:
    """Make ``eng``'s first replay of ``prefix.workflow_id`` start from ``prefix`` (used once), where its
    database holds the same input and events 1..seq; otherwise the engine replays from scratch, and the
    fresh replayer's seam notes reads of ``is_replaying`` (``NotingRuntime``; no prefix: only that).
    ``index``: a prefix (the spine) whose indexes a replay from scratch copies where its database holds
    the same input and events 1..``index.seq`` (see the module docstring, 6.); its code is not used."""
    fresh = testing.replayer_factory(eng)  # the worker's documented hook (engine/_worker.py's docstring)

    def new_replayer(reg, workflow_id, input_json, sink):
        if (
            prefix is not None
            and not prefix.used
            and workflow_id == prefix.workflow_id
            and input_json == prefix.input_text
            and reg.fn is prefix.replayer.fn
            and event_crcs(sink.db, workflow_id, prefix.seq) == prefix.crcs
        ):
            prefix.used = True
            return prefix.replayer
        r = fresh(reg, workflow_id, input_json, sink)
        if not r.started:  # (its code has not run: it gets the noting seam from its start)
            r.rt = NotingRuntime(r)
        if (
            index is not None
            and workflow_id == index.workflow_id
            and input_json == index.input_text
            and r.fn is reg.fn
            and not r.started
            and r.last_seq == 0
            and index.replayer.last_seq == index.seq
            and event_crcs(sink.db, workflow_id, index.seq) == index.crcs
        ):
            copy_indexes(index.replayer, r)
            index.indexed += 1
        return r

    testing.set_replayer_factory(eng, new_replayer)


def copy_indexes(src: Replayer, dst: Replayer) -> None:
    """``dst`` (fresh, nothing fed) given the indexes ``src`` folded over its events 1..``src.last_seq``
    (see the module docstring, 6.): as if ``dst`` had been fed those events itself."""
    if dst.started or dst.last_seq != 0 or src.cancel_event is not None or src.terminal is not None:
        raise ValueError("indexes are copied into a fresh replayer, from a prefix with no cancel and no end")
    dst.last_seq, dst.commands, dst.resolutions = src.last_seq, list(src.commands), dict(src.resolutions)
    dst.activity_ids, dst.start_event = set(src.activity_ids), src.start_event


def adopt_donor(spine: ReplayPrefix, r: Replayer) -> ReplayPrefix | None:
    """A shared replay at the spine's cut made of ``r``, the cached replayer of a recovery that stopped at
    this very cut with its visible history equal to the uninterrupted run's (the caller compares the
    digests: see 5.), or None where ``r`` does not qualify. Its code state is ``r``'s (that recovery is
    over: its coroutine goes on nowhere else); its indexes are the spine's (the uninterrupted run's
    events, checksummed), so the recovery that takes it reads and feeds only the events after the cut."""
    s = spine.replayer
    rt = r.rt
    if (
        type(rt) is not NotingRuntime
        or rt.read_replaying
        or rt._r is not r
        or r.fn is not s.fn
        or not r.started
        or r.done
        or s.done
        or r.cancel_event is not None
        or r.terminal is not None
        or r._cancel_tried
        or r.next_cmd != s.next_cmd
        or r.blocked_on != s.blocked_on
        or r.now != s.now
        or r.issued != s.issued
        or r.activity_ids != s.activity_ids
        or r.resolutions.keys() != s.resolutions.keys()
        or [c.command for c in r.commands] != [c.command for c in s.commands]
        or r.input_value != s.input_value
    ):
        return None
    out = Replayer(s.workflow_id, s.fn, r.input_value, DrySink())  # (its driver hands it its sink)
    out.rt, rt._r = rt, out  # the code's seam now answers for the new replayer
    out.last_seq, out.commands, out.resolutions = s.last_seq, list(s.commands), dict(s.resolutions)
    out.activity_ids, out.start_event = set(s.activity_ids), s.start_event
    out.coro, out.started, out.now = r.coro, True, r.now
    out.next_cmd, out.blocked_on, out.issued = r.next_cmd, r.blocked_on, list(r.issued)
    r.coro, r.done = None, True  # (spent: nothing may drive it again)
    return ReplayPrefix(spine.workflow_id, spine.seq, spine.crcs, spine.input_text, out)


def in_child(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a forked child process; its result (pickled) comes back, its side effects do not.

    An exception in the child is raised here as a ``RuntimeError`` with the child's traceback;
    a child that dies without a reply likewise.
    """
    sys.stdout.flush()
    sys.stderr.flush()

    parent = os.getpid()
    rfd, wfd = os.pipe()
    # the child's collector would otherwise touch (copy) every page of the parent: the child starts with it
    # off. (Not gc.freeze(): the parent's young garbage, frozen then thawed into the oldest generation at
    # each fork, waits for a full collection; a sweep that forked thousands of times grew to a gigabyte.)
    enabled, pid = gc.isenabled(), -1
    gc.disable()
    try:
        pid = os.fork()
    finally:
        if enabled and pid != 0:
            gc.enable()
    if pid == 0:  # the child: never returns
        os.close(rfd)
        testing.keep_parent_pid(parent)
        code = 0
        try:
            try:
                data = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:  # noqa: BLE001 - reported to the parent
                data = pickle.dumps((False, traceback.format_exc()), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view) :]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    chunks, size = [], 0
    try:
        while True:
            b = os.read(rfd, 1 << 20)
            if not b:
                break
            size += len(b)
            if size > MAX_REPLY_BYTES:
                os.kill(pid, 9)
                raise RuntimeError("a recovery process sent more than 2 GiB")
            chunks.append(b)
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        raise RuntimeError(f"a recovery process died without a reply (wait status {status})")
    ok, value = pickle.loads(b"".join(chunks))
    if not ok:
        raise RuntimeError(f"a recovery process raised:\n{value}")
    return value
