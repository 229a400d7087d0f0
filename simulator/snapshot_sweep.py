"""The snapshot-kill sweep (``Simulator.snapshot_kills``) and its recovery machinery.

One uninterrupted run is paused at each position while its files are copied to a snapshot folder,
where a fresh engine recovers and runs to the end (``_recover``). With dedup, positions that leave
the same durable state share one recovery, and a recovery stops at convergence and is spliced to
a verified run (simulator/convergence.py); recoveries after a long history start off a shared
replay of it, forked or donated (simulator/prefix.py: ``_refresh_prefix``, ``_admit``,
``_run_forked``). ``SnapshotSweep`` is an object a ``simulator.sweep.Simulator`` owns; it is handed
the simulator's ``SweepContext`` (its checks, reference run and caches: simulator/sweep_context.py).
"""

from __future__ import annotations

import re
import resource
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from engine import VirtualClock, read_events, testing
from workflows.models import WORKFLOW_TRAIN_RUN

from .checks import compare_with, final_files_lines
from .convergence import (
    CONVERGENCE_KIND,
    Converged,
    HistoryDigest,
    NO_SPLICE,
    JoinedEvents,
    Target,
    Verified,
    splice_ledger,
    splice_replay,
    splice_target,
    state_key,
    without_history,
)
from .faults import FaultPlan
from .ledger import Ledger, SplicedLedger, TailLedger
from .ledger_folds import PrefixFold, TailCache, position_lines
from .prefix import adopt_donor, advance_prefix, build_prefix, in_child
from .report import Mismatch, rerun_command
from .scenario import START_TIME, Outcome, recover_from_snapshot, run_scenario
from .snapshot_home import SnapshotHome, new_home, remove_home, unread_of
from .sweep_context import SweepContext


def position_key(live: dict, clock: VirtualClock) -> tuple:
    """What a kill here leaves, within one uninterrupted run: its committed transactions, the
    files written, the time, the faults still to come (the same key: byte-identical files)."""
    fakes = live["fakes"]
    return live["engine"].store.commits, fakes.writes, clock.now(), tuple(sorted(fakes.oom_left.items()))


_DIGITS = re.compile(r"\d+")
_SPENT = Target(None, 0, 0)  # a checked splice refused after it spent the recovery's replayer


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (forked recoveries)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class SnapshotSweep:
    """Kills recovered from snapshots of one uninterrupted run.

    A ``Simulator`` (simulator/sweep.py) owns one and hands it its ``SweepContext``: the sweep uses its
    scenario and settings (``scn``, ``workflow_fn``, ``mutant``, ``share_*``, ``reuse_snapshot_home``,
    ``verify_snapshots``), its reference run and checks (``reference``, ``targets``, ``near``, ``check``,
    ``state_lines``, ``spliced_state_lines``, ``finish``, ``drop_home``) and its counters (``stats``,
    ``timing``); it sets the context's ``pool`` (the running sweep's snapshot folder) while it runs. The
    sweep's own state is its shared replays (``_index``, ``_donations``)."""

    def __init__(self, ctx: SweepContext):
        self.ctx = ctx
        self._index = None  # the spine, for the running in-process recovery's replays from scratch
        self._donations: list = []  # (cut, replayer, digest) handed over by the running recovery

    def snapshot_kills(
        self, positions: list[int], *, stop_at_first: bool = False, dedup: bool = True
    ) -> list[Mismatch | None]:
        """Kills at ``positions`` (increasing), recovered from snapshots of one uninterrupted run.

        ``dedup``: two shortcuts, each exact (``tests/simulator`` compares them with literal runs).
        (a) Positions where the durable state is the same (same committed transactions, same
        files written, same clock; e.g. the steps between two checkpoints, where nothing is
        written) recover identically, since the recovery is deterministic and reads nothing
        else: the first is run, the next ones reuse its outcome with their own ledger (what
        the worker did before the kill), on which the ledger checks run again. The durable
        state only grows along the run, so only the previous position's recovery is kept.
        (b) A recovery stops at the first convergence point where its state key equals that
        of a verified run at the same point (simulator/convergence.py): the uninterrupted run,
        or an earlier recovery that ran on (kept until the uninterrupted run's next
        convergence point, after which no later kill can reach its states).
        """
        self.ctx.reference()
        todo, out = set(positions), []
        home, ledger, clock, live = new_home(), Ledger(), VirtualClock(START_TIME), dict[str, Any]()
        last: list = [None, None]  # the previous recovery: its start key, and (outcome, state_lines, ledger suffix)
        found: dict[tuple, Target] = {}  # convergence points of recoveries that ran on
        src_history = HistoryDigest()  # the uninterrupted run's, brought up to date at its convergence points
        wf = self.ctx.scn.workflow_id
        folds = PrefixFold(ledger, self.ctx.scn, wf)  # the ledger checks, piecewise
        tails = TailCache(self.ctx.scn, wf, ref=self.ctx.reference().ledger.entries)

        def ledger_lines(state: str, head: list, own: list, tail) -> list[str] | None:
            """``check_completed_ledger`` of ``ledger[:p] + head[p:] + own pieces + tail``, p = len(ledger)."""
            if state != "completed":
                return []
            p = len(ledger.entries)
            fold, generation = folds.at()
            fold.feed(head, p, len(head))
            lines = position_lines(fold, own, len(head), tail, tails)
            folds.check(generation)
            return lines

        if dedup and self.ctx.share_replay:  # what children would each make again: made here once
            compare_with(self.ctx.reference(), self.ctx.reference())
            self.ctx.result_lines(self.ctx.reference())
        for name in ("recoveries", "converged", "ran on", "checked splices", "refused splices", "shared replays"):
            self.ctx.stats.setdefault(name, 0)

        prefix: list = [None]  # the current shared fresh replay of the uninterrupted run (simulator/prefix.py)
        donors: dict[int, list] = {}  # cut -> replayers of recoveries that stopped there (``_admit``)
        ready: list = []  # shared replays made of them, each for one in-process recovery

        gives_back: dict[tuple, bool] = {}  # kind of position -> whether its last in-process recovery donated
        conv_at = [0]  # the uninterrupted run's last convergence point

        def observe(n: int, kind: str, label: str) -> None:
            if dedup and kind == CONVERGENCE_KIND:
                conv_at[0] = n
                found.clear()
                with testing.store_lock(live["engine"]):
                    src_history.catch_up(live["engine"].store.conn)
                if self.ctx.share_replay:
                    self._refresh_prefix(prefix, live["engine"], src_history.last_seq.get(self.ctx.scn.workflow_id, 0))
                    # (forked recoveries start from it)
                    tails.get(self.ctx.reference().ledger.entries).warm(len(ledger.entries))
                    self._admit(prefix[0], src_history.digest.get(wf), donors, ready)
            if n not in todo:
                return
            where = f"{kind} {label}"
            key = position_key(live, clock)
            if dedup and last[0] == key:
                rep, state_lines, (own, tail) = last[1]
                if tail is not None and tail[0] is None:
                    tail = (self.ctx.reference().ledger.entries, tail[1])
                head = Ledger()
                head.entries = list(ledger.entries)
                head.record("crash", position=n, where=where)
                o = replace(
                    rep,
                    ledger=SplicedLedger(
                        head.entries, own + ([] if tail is None else [(tail[0], tail[1], len(tail[0]))])
                    ),
                )
                lines = ledger_lines(o.state, head.entries, own, tail)
                o.extra = {**o.extra, "ledger_lines": lines}
                m = self.ctx.check(o, what="kill", kills=[n], state_lines=state_lines, ledger_lines=lines)
                if m is not None:
                    m.lines.insert(0, f"killed at position {n}: {where}")
                    self.ctx.finish(o, m)
            else:
                last[0] = last[1] = None

                def recover_and_check():
                    try:
                        o = self._recover(
                            n,
                            where,
                            home,
                            live,
                            ledger,
                            clock,
                            found if dedup else None,
                            src_history.copy() if dedup else None,
                            prefix=pre,
                            fork=fork,
                        )
                    except Exception as e:  # noqa: BLE001 - an engine error is a finding, not a crash of the sweep
                        return Mismatch(
                            "kill",
                            [n],
                            [
                                f"killed at position {n}: {where}",
                                f"recovery raised {str(e)[-2000:] if isinstance(e, RuntimeError) else repr(e)}",
                            ],
                            rerun_command(self.ctx.scn, [n], mutant=self.ctx.mutant),
                        ), None
                    state_lines = o.extra.pop("state_lines", None)
                    if state_lines is None and not self.ctx.scn.fail_suites:
                        state_lines = self.ctx.state_lines(o)
                    crash = len(ledger.entries)
                    tail = o.extra.pop("ledger_tail", None)
                    head = o.ledger.head if isinstance(o.ledger, SplicedLedger) else o.ledger.entries
                    lines = o.extra["ledger_lines"] = ledger_lines(o.state, head, [], tail)
                    m = self.ctx.check(o, what="kill", kills=[n], state_lines=state_lines, ledger_lines=lines)
                    if m is not None:
                        m.lines.insert(0, f"killed at position {n}: {where}")
                        self.ctx.finish(o, m)
                    own = head[crash + 1 :]
                    if tail is not None and tail[0] is self.ctx.reference().ledger.entries:
                        tail = (None, tail[1])  # (a forked recovery sends this back: not the reference's ledger)
                    return m, (replace(o, ledger=Ledger()), state_lines, ([(own, 0, len(own))], tail))

                # Where a recovery's replay starts (each way exact; only the cost differs): forked off the
                # spine where the history is long enough and this kind of position did not donate last time
                # (its donated replays are kept for those that give one back), else a donated replay
                # (in-process), else forked where long enough, else a fresh replay in-process. (A forked
                # recovery that dies or raises: a mismatch.)
                pre, fork = None, False
                kind_here = (kind, _DIGITS.sub("#", label), n - conv_at[0])
                long_enough = dedup and prefix[0] is not None and prefix[0].seq >= self.ctx.share_min_events
                if long_enough and not gives_back.get(kind_here, True):
                    pre, fork = prefix[0], True
                elif dedup and ready:
                    pre = ready.pop()
                    self.ctx.stats["recoveries from a donated replay"] += 1
                elif long_enough:
                    pre, fork = prefix[0], True
                self.ctx.stats["forked recoveries"] += fork
                self._donations = []
                self._index = prefix[0] if self.ctx.share_indexes and not fork else None
                indexed = 0 if self._index is None else self._index.indexed
                c0, k0 = time.process_time(), _children_cpu() if fork else 0.0
                try:
                    m, payload = recover_and_check()
                finally:
                    grew = 0 if self._index is None else self._index.indexed - indexed
                    self.ctx.stats["replays from scratch on the spine's indexes"] += grew
                    self._index = None
                    start = (
                        "forked"
                        if fork
                        else "donated"
                        if pre is not None
                        else "from scratch, indexes copied"
                        if grew
                        else "from scratch"
                    )
                    self.ctx.stats[f"recoveries started {start}"] += 1
                    self.ctx.timing[f"cpu: recoveries started {start}"] += (
                        time.process_time() - c0 + (_children_cpu() - k0 if fork else 0.0)
                    )
                if not fork:
                    gives_back[kind_here] = bool(self._donations)
                if self.ctx.share_donors:
                    for cut, r, digest in self._donations:
                        donors.setdefault(cut, []).append((r, digest))
                self._donations = []
                if dedup and payload is not None:
                    last[0], last[1] = key, payload
            out.append(m)
            if stop_at_first and m is not None:
                todo.clear()

        if self.ctx.reuse_snapshot_home:
            self.ctx.pool = SnapshotHome(home, unread_of(bool(self.ctx.scn.release)))
            self.ctx.pool.verify = self.ctx.verify_snapshots
        try:
            src = run_scenario(
                self.ctx.scn,
                home,
                FaultPlan(observer=observe),
                workflow_fn=self.ctx.workflow_fn,
                ledger=ledger,
                clock=clock,
                live=live,
            )
        finally:
            if self.ctx.pool is not None:
                self.ctx.pool.drop()
                self.ctx.pool = None
            remove_home(home)
        ref = self.ctx.reference()
        differs = compare_with(src, ref)
        if [(e.type, e.time) for e in src.events] != [(e.type, e.time) for e in ref.events]:
            differs.append("their histories differ")
        if differs:
            out.append(
                Mismatch(
                    "reference",
                    [],
                    ["two uninterrupted runs differ: the simulation is not deterministic"] + differs,
                    rerun_command(self.ctx.scn, [], mutant=self.ctx.mutant),
                )
            )
        return out

    def _refresh_prefix(self, prefix: list, eng, events: int) -> None:
        """At a convergence point of the uninterrupted run: the shared replay (simulator/prefix.py) moved to
        this cut, once the history grew by ``share_every`` events since the last cut. The first is a fresh
        replay (``build_prefix``); later ones feed the same replayer the events since (``advance_prefix``:
        the spine, O(new events)); one the spine refuses is made fresh again. Recoveries fork off it only
        where the history has ``share_min_events`` events; it also checks donated replays (``_admit``)."""
        cur = prefix[0]
        if cur is not None and events - cur.seq < self.ctx.share_every:
            return
        t0 = time.perf_counter()
        new = None
        try:
            if cur is not None and self.ctx.share_spine and advance_prefix(eng, cur, WORKFLOW_TRAIN_RUN):
                new = cur
                self.ctx.stats["spine cuts"] += 1
            else:
                prefix[0] = None  # (a refused spine is unusable)
                new = build_prefix(eng, self.ctx.scn.workflow_id, WORKFLOW_TRAIN_RUN)
                self.ctx.stats["fresh shared replays"] += new is not None
        except Exception:  # noqa: BLE001 - then each recovery replays from scratch, and meets it itself
            new = None
        self.ctx.timing["shared replays"] += time.perf_counter() - t0
        if new is not None:
            self.ctx.stats["shared replays"] += 1
        prefix[0] = new

    def _admit(self, spine, digest, donors: dict, ready: list) -> None:
        """At a convergence point of the uninterrupted run, its spine at this cut: the replayers donated by
        recoveries that stopped at this very cut become shared replays (``prefix.adopt_donor``) where their
        visible history's digest is the uninterrupted run's here; those of earlier cuts are dropped."""
        if spine is None:
            donors.clear()
            ready.clear()
            return
        for r, theirs in donors.pop(spine.seq, ()):
            p = adopt_donor(spine, r) if theirs == digest and digest is not None else None
            self.ctx.stats["donated replays" if p is not None else "refused donations"] += 1
            if p is not None:
                ready.append(p)
        for cut in [c for c in donors if c < spine.seq]:
            del donors[cut]
        del ready[: -self.ctx.share_ready_max]  # (older cuts are still good; the newest are used first)

    def _recover(
        self,
        n: int,
        where: str,
        home,
        live: dict,
        ledger: Ledger,
        clock: VirtualClock,
        found: dict | None,
        history: HistoryDigest | None,
        prefix=None,
        fork: bool = False,
    ) -> Outcome:
        """The recovery of a kill at ``n``; with ``found``, stopped at convergence and spliced; ``fork``: in a
        forked child, off the shared replay ``prefix``."""
        self.ctx.stats["recoveries"] += 1
        t0, before = time.perf_counter(), self.ctx.stats["converged"]
        try:
            return self._recover_timed(n, where, home, live, ledger, clock, found, history, prefix, fork)
        finally:
            kind = "converged" if self.ctx.stats["converged"] > before else "ran on"
            self.ctx.stats[kind] += kind == "ran on"
            self.ctx.timing[kind] += time.perf_counter() - t0

    def _recover_timed(
        self,
        n: int,
        where: str,
        home,
        live: dict,
        ledger: Ledger,
        clock: VirtualClock,
        found: dict | None,
        history: HistoryDigest | None,
        prefix,
        fork: bool,
    ) -> Outcome:
        if found is None:
            return recover_from_snapshot(
                self.ctx.scn, home, n, where, live, ledger, clock, workflow_fn=self.ctx.workflow_fn, pool=self.ctx.pool
            )
        assert history is not None  # (comes with found)
        args = (n, where, home, live, ledger, clock, found, history, prefix)
        raw = self._run_forked(args) if fork else self._run_twice(*args, lean=False)
        c0 = time.process_time()
        try:
            return self._recover_finish(*raw)
        finally:
            self.ctx.timing["cpu: splicing and outcome checks"] += time.process_time() - c0

    def _run_twice(
        self,
        n: int,
        where: str,
        home,
        live: dict,
        ledger: Ledger,
        clock: VirtualClock,
        found: dict,
        history: HistoryDigest,
        prefix,
        *,
        lean: bool,
    ) -> tuple:
        """``_recover_run``, and again without the recovery's own replayer where a checked splice spent it."""
        raw = self._recover_run(
            n, where, home, live, ledger, clock, found, history.copy(), prefix, live_splice=True, lean=lean
        )
        if raw is None:  # a checked splice was refused after it spent the recovery's replayer: again, without it
            self.ctx.stats["recoveries made again"] += 1
            raw = self._recover_run(
                n, where, home, live, ledger, clock, found, history, prefix, live_splice=False, lean=lean
            )
            assert raw is not None  # (None only where the live splice spent the replayer)
        return raw

    def _run_forked(self, args: tuple) -> tuple:
        """``_run_twice`` in a forked child, which takes its copy of the shared replay (simulator/prefix.py).

        The child runs the recovery only, up to its convergence point or its end, and touches as little of
        the sweep's memory as it can (every object it touches is a page copied, and the sweep's memory
        grows with the history): back come its own events and ledger entries, which point it converged
        to (by key), the points it passed, its counts. The parent splices and checks (``_recover_finish``)
        with its own objects and caches, exactly as an in-process recovery does."""
        ledger: Ledger = args[4]
        found: dict = args[6]
        p = len(ledger.entries)

        def child():
            stats, timing = Counter(self.ctx.stats), Counter(self.ctx.timing)
            o, mine, target, conv = self._run_twice(*args, lean=True)
            led = o.ledger  # (a TailLedger over ``ledger``: its own entries only, not the head's)
            tail = (led._n, led.own) if isinstance(led, TailLedger) else (p, led.entries[p:])
            light = replace(o, ledger=tail, plan=FaultPlan(count=o.plan.count), clock=None, scenario=None)
            light.plan.crashes = [None] * len(o.plan.crashes)
            return (
                (light, {k: (t.events_at, t.ledger_at) for k, t in mine.items()}, None if target is None else conv),
                {k: v - stats[k] for k, v in self.ctx.stats.items() if v != stats[k]},
                {k: v - timing[k] for k, v in self.ctx.timing.items() if v != timing[k]},
                self.ctx.pool.state() if self.ctx.pool is not None else None,
            )

        try:
            (light, points, conv), stats, timing, pool = in_child(child)
        except BaseException:
            if self.ctx.pool is not None:  # what the child left in the snapshot folder is unknown
                self.ctx.pool.drop()
            raise
        if self.ctx.pool is not None:
            self.ctx.pool.adopt(pool)
        self.ctx.stats.update(stats)
        self.ctx.timing.update(timing)
        led = Ledger()
        kept, own_entries = light.ledger
        led.entries = ledger.entries[:kept] + own_entries
        o = replace(light, scenario=self.ctx.scn, ledger=led)
        mine = {}
        for key, (ev, le) in points.items():
            found[key] = mine[key] = Target(None, ev, le)
        target = None
        if conv is not None:
            how, key, result = conv
            if how == "splice":  # made in the child from its own replayer: the same target, made here
                own = self.ctx.reference().events[: o.extra["copied_events"]] + o.events
                target = splice_target(own, self.ctx.near[without_history(key)], list(led.entries), result)
                found[key] = target
            else:
                target = self.ctx.targets.get(key) or found.get(key)
                if target is None or target.run is None:
                    raise RuntimeError("a forked recovery converged to a point the sweep does not know")
        return o, mine, target, conv

    def _recover_run(
        self,
        n: int,
        where: str,
        home,
        live: dict,
        ledger: Ledger,
        clock: VirtualClock,
        found: dict,
        history: HistoryDigest,
        prefix,
        *,
        live_splice: bool,
        lean: bool,
    ) -> tuple | None:
        """One recovery run, stopped at convergence: (its outcome so far, the convergence points it passed,
        the target it converged to or None where it ran to the end, how: ("key", key, None) or
        ("splice", key, result) where a checked splice made the target); None where a checked splice on
        the recovery's own replayer was refused (that replayer is spent: the recovery must be made again).
        ``lean`` (a forked child): a checked splice's target is left for the parent to make."""
        mine: dict[tuple, Target] = {}  # this recovery's convergence points, verified when it ends
        conv: list = [None]

        def watch(rlive: dict, rclock: VirtualClock, label: str) -> None:
            key = state_key(label, rlive["engine"], rclock, rlive["fakes"], history)
            if key is None:
                return
            target = self.ctx.targets.get(key) or found.get(key)
            if target is not None and target.run is not None:
                conv[0] = ("key", key, None)
                at = target.events_at
                if not lean and target is self.ctx.targets.get(key):  # at the uninterrupted run's own point
                    r = testing.cached_replayer(rlive["engine"], self.ctx.scn.workflow_id)
                    if r is not None:  # its code, fed the same visible history: a replay to share (``_admit``)
                        self._donations.append((at, r, history.digest.get(self.ctx.scn.workflow_id)))
                raise Converged(target)
            near = self.ctx.near.get(without_history(key))
            if near is not None and key not in found:  # the same state as the uninterrupted run's but for the history
                eng = rlive["engine"]
                with testing.store_lock(eng):
                    new = read_events(eng.store.conn, self.ctx.scn.workflow_id, rlive["copied_events"])
                # (the worker's cache: a hook, engine/_worker.py)
                mine_replayer = testing.cached_replayer(eng, self.ctx.scn.workflow_id) if live_splice else None
                own = JoinedEvents(self.ctx.reference().events, rlive["copied_events"], new)
                c0 = time.process_time()
                result, spent = splice_replay(
                    testing.registration(eng, WORKFLOW_TRAIN_RUN),
                    self.ctx.scn.workflow_id,
                    own,
                    near,
                    live=mine_replayer,
                )
                self.ctx.timing["cpu: checked splices' dry runs"] += time.process_time() - c0
                self.ctx.stats["checked splices" if result is not NO_SPLICE else "refused splices"] += 1
                self.ctx.stats["splices on the recovery's own replayer"] += spent
                if result is not NO_SPLICE:
                    entries = rlive["fakes"].ledger.entries
                    target = (
                        Target(None, len(own), len(entries))
                        if lean
                        else splice_target(list(own), near, list(entries), result)
                    )
                    found[key] = target  # the other states of its kind converge here at once
                    conv[0] = ("splice", key, result)
                    raise Converged(target)
                if spent:
                    raise Converged(_SPENT)
            if key not in found:
                found[key] = mine[key] = Target(
                    None, history.last_seq.get(self.ctx.scn.workflow_id, 0), len(rlive["fakes"].ledger.entries)
                )

        o = recover_from_snapshot(
            self.ctx.scn,
            home,
            n,
            where,
            live,
            ledger,
            clock,
            workflow_fn=self.ctx.workflow_fn,
            watch=watch,
            prefix=prefix,
            pool=self.ctx.pool,
            index=None if lean else self._index,
            timing=self.ctx.timing,
        )
        target = o.extra.pop("converged", None)
        if target is _SPENT:
            for key in mine:  # never verified: gone, as if this try had not been made
                del found[key]
            self.ctx.drop_home(o.home)
            return None
        return o, mine, target, conv[0]

    def _recover_finish(self, o: Outcome, mine: dict, target: Target | None, conv) -> Outcome:
        """A recovery run (``_recover_run``) made an outcome: spliced to its target's future where it
        converged, its passed points verified with it, its outcome checks made (``state_lines``)."""
        run: Verified | None
        if target is None:  # ran to the end
            files = final_files_lines(o) if o.state == "completed" else []
            state_lines = None if self.ctx.scn.fail_suites else self.ctx.state_lines(o, file_lines=files)
            run = Verified(o.state, o.result, o.error, o.events, o.ledger.entries, files)
        else:  # its past, then the target's future
            self.ctx.stats["converged"] += 1
            copied = o.extra.pop("copied_events")
            t = target.run
            assert t is not None  # (converged to a target whose run has ended)
            own = o.events
            o = replace(
                o,
                state=t.state,
                result=t.result,
                error=t.error,
                events=self.ctx.reference().events[:copied] + own + t.events[target.events_at :],
                ledger=splice_ledger(o.ledger, target),
            )
            o.extra["ledger_tail"] = (t.ledger, target.ledger_at)  # its ledger checks: piecewise
            state_lines = None if self.ctx.scn.fail_suites else self.ctx.spliced_state_lines(o, copied, own, target)
            run = Verified(o.state, o.result, o.error, o.events, o.ledger.entries, t.file_lines) if mine else None
            self.ctx.drop_home(o.home)  # its files are the target's from here: checked with the target's
        for point in mine.values():
            point.run = run
        o.extra["state_lines"] = state_lines
        return o
