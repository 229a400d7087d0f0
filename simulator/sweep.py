"""Kill the worker at every position, at random sequences of positions, and during cancels.

``kill_every_position`` runs a scenario once uninterrupted (recording its positions), then for
each position k: the run killed at k (all in-memory state lost), a fresh engine on the same
files run to the end, and every check of ``checks`` against the oracle and the uninterrupted
run. Three modes make the same runs (a test compares them run for run): ``rerun`` runs from
the start in a fresh home and kills in-process; ``snapshot`` copies the files of a paused
uninterrupted run at k; ``dedup`` (default) also shares one recovery among positions that
leave the same durable state, checking each position's own ledger.
Every mismatch carries the seed/positions that reproduce it and a one-line command.
"""
from __future__ import annotations

import bisect
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from engine.clock import VirtualClock
from engine.history import read_events
from workflows.models import WORKFLOW_TRAIN_RUN

from .checks import (
    CHECKED_EVENTS,
    check_canceled,
    check_completed_ledger,
    check_completed_state,
    check_result,
    check_continued,
    check_failed_suite,
    compare_with,
    final_files_lines,
    kept_events,
)
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
from .fakes import FakeActivities
from .faults import FaultPlan, random_kills
from .ledger import Ledger, SplicedLedger, TailLedger
from .ledger_folds import PrefixFold, TailCache, position_lines
from .prefix import adopt_donor, advance_prefix, build_prefix, in_child
from .scenario import (
    START_TIME, Outcome, Scenario, SnapshotHome, new_home, recover_from_snapshot, remove_home, run_scenario,
)


@dataclass
class Mismatch:
    what: str  # "kill", "kills", "cancel", "reference", "oom", "failed-suite"
    kills: list[int]
    lines: list[str]
    command: str
    cancel_at: int | None = None
    seed: int | None = None
    home: str | None = None

    def __str__(self) -> str:
        where = f"kills at {self.kills}" if self.kills else "no kill"
        if self.cancel_at is not None:
            where += f", cancel at {self.cancel_at}"
        if self.seed is not None:
            where += f", seed {self.seed}"
        head = f"MISMATCH ({self.what}; {where}):"
        body = "\n".join(f"  - {line}" for line in self.lines[:8])
        more = f"\n  ... {len(self.lines) - 8} more" if len(self.lines) > 8 else ""
        home = f"\n  files kept in {self.home}" if self.home else ""
        return f"{head}\n{body}{more}{home}\n  rerun: {self.command}"


@dataclass
class Report:
    name: str
    tried: int = 0
    matched: int = 0
    positions: int = 0
    elapsed_s: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.tried == self.matched

    def record(self, mismatch: Mismatch | None) -> bool:
        """Count one run; True when it mismatched."""
        self.tried += 1
        if mismatch is None:
            self.matched += 1
            return False
        self.mismatches.append(mismatch)
        return True

    def summary(self) -> str:
        rate = self.tried / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (f"{self.name}: {self.tried} tried, {self.matched} matched, {len(self.mismatches)} mismatched "
                f"({self.positions} positions in the uninterrupted run; {self.elapsed_s:.1f}s, {rate:.0f}/s)")


def quiet_engine_logs() -> None:
    """The engine logs every redelivery at WARNING; a sweep makes thousands on purpose."""
    logging.getLogger("engine").setLevel(logging.CRITICAL)


def _state_key(live: dict, clock: VirtualClock) -> tuple:
    """What a kill here leaves, within one uninterrupted run: its committed transactions, the
    files written, the time, the faults still to come (the same key: byte-identical files)."""
    fakes = live["fakes"]
    return live["engine"].store.commits, fakes.writes, clock.now(), tuple(sorted(fakes.oom_left.items()))


_DIGITS = re.compile(r"\d+")
_WORKER_FN: Callable | None = None
_SPENT = Target(None, 0, 0)  # a checked splice refused after it spent the recovery's replayer


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (forked recoveries)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _call(item):
    return _WORKER_FN(item)


def _map(fn: Callable, items: list, jobs: int):
    """``map(fn, items)`` in order; over ``jobs`` forked processes when jobs > 1 (Linux)."""
    if jobs <= 1 or len(items) < 2:
        yield from map(fn, items)
        return
    import multiprocessing

    global _WORKER_FN
    _WORKER_FN = fn  # inherited by the forked workers: nothing of the simulator is pickled
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) as pool:
        yield from pool.imap(_call, items, chunksize=8)


def rerun_command(scn: Scenario, kills: Iterable[int], *, cancel_at: int | None = None,
                  mutant: str | None = None) -> str:
    cmd = f"python -m simulator kill-at {scn.flags()} --kills {','.join(map(str, kills)) or 'none'}"
    if cancel_at is not None:
        cmd += f" --cancel-at {cancel_at}"
    if mutant:
        cmd += f" --mutant {mutant}"
    return cmd


class Simulator:
    """Runs one scenario (and one workflow function: the real one, or a mutant) many times."""

    def __init__(self, scn: Scenario, *, workflow_fn: Callable | None = None, mutant: str | None = None,
                 keep_failed: bool = False):
        self.scn = scn
        self.workflow_fn = workflow_fn
        self.mutant = mutant
        self.keep_failed = keep_failed
        self._ref: Outcome | None = None
        self._ref_mismatch: Mismatch | None = None
        self._targets: dict[tuple, Target] = {}  # the uninterrupted run's convergence points
        self._near: dict[tuple, Target] = {}  # the same, by their keys less the history digest
        self.trace: list[tuple[str, str]] = []
        self.stats: Counter[str] = Counter()  # how runs ended, and how many kills they took
        self.timing: Counter[str] = Counter()  # seconds spent in recoveries
        self.on_outcome: Callable[[str, list[int], Outcome], None] | None = None  # sees every checked run
        self._checked_results: dict[int, tuple[Any, list[str]]] = {}  # see _result_lines
        self._kept_index: dict[int, tuple[list, list[int], list]] = {}  # see _kept
        self._target_lines: dict[int, tuple[Any, list[str]]] = {}  # see _spliced_state_lines
        self._shared: dict[int, tuple[list, int]] = {}  # see _shared_with_ref
        # dedup: recoveries after a long enough history share one fresh replay of it, by fork (simulator/prefix.py)
        self.share_replay = True
        self.share_min_events = 1000  # below this, a fresh replay costs about what a fork does (measured): no fork
        self.share_every = 1  # a new cut once the history grew by this many events
        self.share_spine = True  # later cuts: the same replayer fed on (prefix.advance_prefix), not replayed fresh
        self.share_donors = True  # a recovery stopped at a cut hands its replayer to one after it (_admit)
        self.share_ready_max = 16  # donated replays kept at most
        self.share_indexes = True  # an in-process replay from scratch copies the spine's indexes (prefix.py, 6.)
        self._index = None  # the spine, for the running in-process recovery's replays from scratch
        self._donations: list = []  # (cut, replayer, digest) handed over by the running recovery
        self.reuse_snapshot_home = True  # recoveries share one folder, synced per snapshot (forked ones too)
        self.verify_snapshots = False  # tests: each synced folder compared with its source, file for file
        self._pool: SnapshotHome | None = None  # the snapshot folder of the running sweep
        quiet_engine_logs()

    # ---- single runs -------------------------------------------------------------------------

    def run(self, kills: Iterable[int] = (), *, cancel_at: int | None = None, record: bool = False) -> Outcome:
        home = new_home()
        plan = FaultPlan(kills=set(kills), record=record)
        o = run_scenario(self.scn, home, plan, workflow_fn=self.workflow_fn, cancel_at=cancel_at)
        if cancel_at is not None and o.cancel_done and o.state == "canceled":
            o.extra["ledger_start"] = len(o.ledger.entries)
            o.continued = run_scenario(
                self.scn, home, FaultPlan(), workflow_fn=self.workflow_fn,
                workflow_id=f"{self.scn.workflow_id}/2", ledger=o.ledger, clock=o.clock,
            )
        return o

    def reference(self) -> Outcome:
        """The uninterrupted run (once), with its positions and its convergence points recorded."""
        if self._ref is None:
            home, ledger, clock, live, history = new_home(), Ledger(), VirtualClock(START_TIME), {}, HistoryDigest()
            points: list[tuple[tuple, int, int]] = []

            def watch(n: int, kind: str, label: str) -> None:
                key = state_key(label, live["engine"], clock, live["fakes"], history)
                if key is not None:
                    points.append((key, history.last_seq.get(self.scn.workflow_id, 0), len(ledger.entries)))

            plan = FaultPlan(record=True, observer=watch, observe_only=(CONVERGENCE_KIND,))
            ref = run_scenario(self.scn, home, plan, workflow_fn=self.workflow_fn, ledger=ledger, clock=clock,
                               live=live)
            self._ref = ref
            self.trace = list(ref.plan.trace)
            files = final_files_lines(ref) if ref.state == "completed" else []
            verified = Verified(ref.state, ref.result, ref.error, ref.events, ref.ledger.entries, files)
            self._targets = {key: Target(verified, ev, led) for key, ev, led in points}
            self._near = {without_history(key): t for key, t in self._targets.items()}
            self._ref_mismatch = self.check(ref, what="reference", kills=[])
            self._finish(ref, self._ref_mismatch)
        return self._ref

    def check(self, o: Outcome, *, what: str, kills: list[int], cancel_at: int | None = None,
              seed: int | None = None, state_lines: list[str] | None = None,
              ledger_lines: list[str] | None = None) -> Mismatch | None:
        """Every check of a finished run; ``state_lines``: its outcome/files checks, already made;
        ``ledger_lines``: ``check_completed_ledger``'s, made piecewise (simulator/ledger_folds.py)."""
        scn = self.scn
        if self.on_outcome is not None:
            self.on_outcome(what, kills, o)
        if what != "reference":
            self.stats[f"ended {o.state}"] += 1
            self.stats[f"{max(len(o.plan.crashes), int(what == 'kill'))} kills"] += 1
        if o.continued is not None:
            self.stats[f"restarted after cancel, ended {o.continued.state}"] += 1
        if cancel_at is not None:
            lines = check_canceled(o, poll_steps=FakeActivities.CANCEL_POLL_STEPS)
            if o.continued is not None:
                start = o.extra["ledger_start"]
                lines += [f"restart: {x}" for x in check_continued(o.continued, o, ledger_start=start)]
                lines += [f"restart: {x}" for x in compare_with(o.continued, self.reference())]
        elif scn.fail_suites:
            lines = check_failed_suite(o)
        else:
            if state_lines is None:
                state_lines = self.state_lines(o, what=what)
            lines = state_lines + (check_completed_ledger(o) if ledger_lines is None else ledger_lines)
        if not lines:
            self._drop_home(o.home)
            return None
        if self.keep_failed and self._pool is not None and o.home == self._pool.home:
            self._pool.release()  # kept for the user as it is
        return Mismatch(what, kills, lines, rerun_command(scn, kills, cancel_at=cancel_at, mutant=self.mutant),
                        cancel_at=cancel_at, seed=seed, home=str(o.home) if self.keep_failed else None)

    def state_lines(self, o: Outcome, *, what: str = "kill", file_lines: list[str] | None = None) -> list[str]:
        """The checks of a completed run's outcome and files (all but the ledger's); ``file_lines``:
        the files' checks, already made (a spliced run's final files are its target's)."""
        lines = check_completed_state(o, file_lines=file_lines, result_lines=self._result_lines(o))
        if what != "reference":
            lines += compare_with(o, self.reference())
        return lines

    def _kept(self, events: list, start: int, stop: int | None = None) -> list:
        """``kept_events(events[start:stop])`` (the first event kept too where ``start`` is 0), from an index
        of ``events`` made once per list (the verified runs' histories are spliced thousands of times)."""
        hit = self._kept_index.get(id(events))
        if hit is None or hit[0] is not events:
            if len(self._kept_index) >= 8:
                self._kept_index.clear()
            where = [i for i, e in enumerate(events) if i == 0 or e.type in CHECKED_EVENTS]
            hit = self._kept_index[id(events)] = (events, where, [events[i] for i in where])
        _, where, kept = hit
        stop = len(events) if stop is None else stop
        return kept[bisect.bisect_left(where, start):bisect.bisect_left(where, stop)]

    def _spliced_state_lines(self, o: Outcome, copied: int, own: list, target: Target) -> list[str]:
        """``state_lines`` of a spliced recovery ``o``: its events are the reference's first ``copied``, then
        ``own``, then the target's after its point. Where the events the checks read (checks.CHECKED_EVENTS)
        equal the target's own (compared from the first event where either differs from the reference's:
        O(what differs)), its lines are the target's, made once; else they are made on those events."""
        t = target.run
        m = min(copied, self._shared_with_ref(t.events))
        mine = self._kept(self._ref.events, m, copied) + (
            kept_events(own) if copied == 0 else [e for e in own if e.type in CHECKED_EVENTS])
        theirs = self._kept(t.events, m, target.events_at)
        if len(mine) == len(theirs) and all(a[1:] == b[1:] for a, b in zip(mine, theirs)):  # (type, time, attrs)
            hit = self._target_lines.get(id(t))
            if hit is None or hit[0] is not t:
                if len(self._target_lines) >= 8:
                    self._target_lines.clear()
                hit = self._target_lines[id(t)] = (t, self.state_lines(replace(o, events=self._kept(t.events, 0)),
                                                                       file_lines=t.file_lines))
            self.stats["outcome checks as the target's"] += 1
            return list(hit[1])
        short = kept_events(o.events) if copied == 0 else (
            self._kept(self._ref.events, 0, copied) + [e for e in own if e.type in CHECKED_EVENTS]
            + self._kept(t.events, target.events_at))
        return self.state_lines(replace(o, events=short), file_lines=t.file_lines)

    def _shared_with_ref(self, events: list) -> int:
        """How many first events of ``events`` are the reference's very objects (made once per list)."""
        ref = self._ref.events
        if events is ref:
            return len(ref)
        hit = self._shared.get(id(events))
        if hit is None or hit[0] is not events:
            if len(self._shared) >= 8:
                self._shared.clear()
            n, top = 0, min(len(events), len(ref))
            while n < top and events[n] is ref[n]:
                n += 1
            hit = self._shared[id(events)] = (events, n)
        return hit[1]

    def _result_lines(self, o: Outcome) -> list[str] | None:
        """``check_result`` of ``o.result``, made once per result object: the recoveries spliced to one
        verified run share its result object (immutable from there: nothing writes into a result)."""
        if o.state != "completed":
            return None
        hit = self._checked_results.get(id(o.result))
        if hit is not None and hit[0] is o.result:
            return hit[1]
        if len(self._checked_results) >= 8:  # recoveries that share a target come one after another
            self._checked_results.clear()
        lines = check_result(self.scn, o.result)
        self._checked_results[id(o.result)] = (o.result, lines)  # holds the object: its id is not reused
        return lines

    def _finish(self, o: Outcome, m: Mismatch | None) -> None:
        if m is not None and not self.keep_failed:
            self._drop_home(o.home)

    def _drop_home(self, home) -> None:
        """A run's home is done with: removed, but for the reused snapshot folder (scenario.SnapshotHome)."""
        if self._pool is None or home != self._pool.home:
            remove_home(home)

    # ---- sweeps ----------------------------------------------------------------------------------

    def check_reference(self) -> Mismatch | None:
        """The uninterrupted run against the oracle (checked once)."""
        self.reference()
        return self._ref_mismatch

    def kill_once(self, k: int) -> Mismatch | None:
        """One run killed at position ``k``, checked."""
        o = self.run([k])
        m = self.check(o, what="kill", kills=[k])
        if m is not None:
            m.lines.insert(0, f"killed at position {k}: {self.where(k)}")
            self._finish(o, m)
        return m

    def kill_every_position(self, *, positions: Iterable[int] | None = None, stop_at_first: bool = False,
                            jobs: int = 1, mode: str = "dedup") -> Report:
        """Kill once at each position of the uninterrupted run (or at ``positions``).

        ``mode="rerun"``: for each position, a fresh home, the run from the start killed
        in-process at that position (the Engine dropped), a fresh Engine on the same files.
        ``mode="snapshot"`` (faster, the same runs): one more uninterrupted run is paused at each
        position while its files are copied to a fresh home, where a fresh Engine recovers and
        runs to the end; what a kill leaves is exactly the files, so the runs are the same.
        ``mode="dedup"`` (the default, fastest): snapshots, where positions that leave the same
        durable state share one recovery (see ``snapshot_kills``); every position is still
        checked with its own ledger. ``tests/simulator`` checks that the modes agree run for run.
        ``jobs`` > 1 splits the positions over that many forked processes.
        """
        if mode not in ("dedup", "snapshot", "rerun"):
            raise ValueError(f"mode must be dedup, snapshot or rerun, got {mode!r}")
        t0 = time.perf_counter()
        report = Report(f"kill-every-position ({mode})")
        m = self.check_reference()
        report.positions = len(self.trace)
        if m is not None:
            report.mismatches.append(m)
            if stop_at_first:
                report.elapsed_s = time.perf_counter() - t0
                return report
        todo = list(range(len(self.trace)) if positions is None else positions)
        if mode == "rerun":
            results = ([m] for m in _map(self.kill_once, todo, jobs))
        else:
            jobs = max(1, min(jobs, len(todo)))
            parts = [todo[j::jobs] for j in range(jobs)]
            dedup = mode == "dedup"
            results = _map(lambda part: self.snapshot_kills(part, stop_at_first=stop_at_first, dedup=dedup),
                           parts, jobs)
        for part in results:
            for m in part:
                report.record(m)
            if stop_at_first and report.mismatches:
                break
        report.elapsed_s = time.perf_counter() - t0
        return report

    def snapshot_kills(self, positions: list[int], *, stop_at_first: bool = False,
                       dedup: bool = True) -> list[Mismatch | None]:
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
        self.reference()
        todo, out = set(positions), []
        home, ledger, clock, live = new_home(), Ledger(), VirtualClock(START_TIME), {}
        last: list = [None, None]  # the previous recovery: its start key, and (outcome, state_lines, ledger suffix)
        found: dict[tuple, Target] = {}  # convergence points of recoveries that ran on
        src_history = HistoryDigest()  # the uninterrupted run's, brought up to date at its convergence points
        wf = self.scn.workflow_id
        folds = PrefixFold(ledger, self.scn, wf)  # the ledger checks, piecewise
        tails = TailCache(self.scn, wf, ref=self._ref.ledger.entries)

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
        if dedup and self.share_replay:  # what children would each make again: made here once
            compare_with(self._ref, self._ref)
            self._result_lines(self._ref)
        for name in ("recoveries", "converged", "ran on", "checked splices", "refused splices", "shared replays"):
            self.stats.setdefault(name, 0)

        prefix: list = [None]  # the current shared fresh replay of the uninterrupted run (simulator/prefix.py)
        donors: dict[int, list] = {}  # cut -> replayers of recoveries that stopped there (``_admit``)
        ready: list = []  # shared replays made of them, each for one in-process recovery

        gives_back: dict[tuple, bool] = {}  # kind of position -> whether its last in-process recovery donated
        conv_at = [0]  # the uninterrupted run's last convergence point

        def observe(n: int, kind: str, label: str) -> None:
            if dedup and kind == CONVERGENCE_KIND:
                conv_at[0] = n
                found.clear()
                with live["engine"].store._lock:
                    src_history.catch_up(live["engine"].store.conn)
                if self.share_replay:
                    self._refresh_prefix(prefix, live["engine"], src_history.last_seq.get(self.scn.workflow_id, 0))
                    tails.get(self._ref.ledger.entries).warm(len(ledger.entries))  # (forked recoveries start from it)
                    self._admit(prefix[0], src_history.digest.get(wf), donors, ready)
            if n not in todo:
                return
            where = f"{kind} {label}"
            key = _state_key(live, clock)
            if dedup and last[0] == key:
                rep, state_lines, (own, tail) = last[1]
                if tail is not None and tail[0] is None:
                    tail = (self._ref.ledger.entries, tail[1])
                head = Ledger()
                head.entries = list(ledger.entries)
                head.record("crash", position=n, where=where)
                o = replace(rep, ledger=SplicedLedger(head.entries, own + ([] if tail is None else
                                                                            [(tail[0], tail[1], len(tail[0]))])))
                lines = ledger_lines(o.state, head.entries, own, tail)
                o.extra = {**o.extra, "ledger_lines": lines}
                m = self.check(o, what="kill", kills=[n], state_lines=state_lines, ledger_lines=lines)
                if m is not None:
                    m.lines.insert(0, f"killed at position {n}: {where}")
                    self._finish(o, m)
            else:
                last[0] = last[1] = None

                def recover_and_check():
                    try:
                        o = self._recover(n, where, home, live, ledger, clock, found if dedup else None,
                                          src_history.copy() if dedup else None, prefix=pre, fork=fork)
                    except Exception as e:  # noqa: BLE001 - an engine error is a finding, not a crash of the sweep
                        return Mismatch("kill", [n], [f"killed at position {n}: {where}",
                                                      f"recovery raised {str(e)[-2000:] if isinstance(e, RuntimeError) else repr(e)}"],
                                        rerun_command(self.scn, [n], mutant=self.mutant)), None
                    state_lines = o.extra.pop("state_lines", None)
                    if state_lines is None and not self.scn.fail_suites:
                        state_lines = self.state_lines(o)
                    crash = len(ledger.entries)
                    tail = o.extra.pop("ledger_tail", None)
                    head = o.ledger.head if isinstance(o.ledger, SplicedLedger) else o.ledger.entries
                    lines = o.extra["ledger_lines"] = ledger_lines(o.state, head, [], tail)
                    m = self.check(o, what="kill", kills=[n], state_lines=state_lines, ledger_lines=lines)
                    if m is not None:
                        m.lines.insert(0, f"killed at position {n}: {where}")
                        self._finish(o, m)
                    own = head[crash + 1:]
                    if tail is not None and tail[0] is self._ref.ledger.entries:
                        tail = (None, tail[1])  # (a forked recovery sends this back: not the reference's ledger)
                    return m, (replace(o, ledger=Ledger()), state_lines, ([(own, 0, len(own))], tail))

                # Where a recovery's replay starts (each way exact; only the cost differs): forked off the
                # spine where the history is long enough and this kind of position did not donate last time
                # (its donated replays are kept for those that give one back), else a donated replay
                # (in-process), else forked where long enough, else a fresh replay in-process. (A forked
                # recovery that dies or raises: a mismatch.)
                pre, fork = None, False
                kind_here = (kind, _DIGITS.sub("#", label), n - conv_at[0])
                long_enough = dedup and prefix[0] is not None and prefix[0].seq >= self.share_min_events
                if long_enough and not gives_back.get(kind_here, True):
                    pre, fork = prefix[0], True
                elif dedup and ready:
                    pre = ready.pop()
                    self.stats["recoveries from a donated replay"] += 1
                elif long_enough:
                    pre, fork = prefix[0], True
                self.stats["forked recoveries"] += fork
                self._donations = []
                self._index = prefix[0] if self.share_indexes and not fork else None
                indexed = 0 if self._index is None else self._index.indexed
                c0, k0 = time.process_time(), _children_cpu() if fork else 0.0
                try:
                    m, payload = recover_and_check()
                finally:
                    grew = 0 if self._index is None else self._index.indexed - indexed
                    self.stats["replays from scratch on the spine's indexes"] += grew
                    self._index = None
                    start = ("forked" if fork else "donated" if pre is not None
                             else "from scratch, indexes copied" if grew else "from scratch")
                    self.stats[f"recoveries started {start}"] += 1
                    self.timing[f"cpu: recoveries started {start}"] += (
                        time.process_time() - c0 + (_children_cpu() - k0 if fork else 0.0))
                if not fork:
                    gives_back[kind_here] = bool(self._donations)
                if self.share_donors:
                    for cut, r, digest in self._donations:
                        donors.setdefault(cut, []).append((r, digest))
                self._donations = []
                if dedup and payload is not None:
                    last[0], last[1] = key, payload
            out.append(m)
            if stop_at_first and m is not None:
                todo.clear()

        if self.reuse_snapshot_home:
            self._pool = SnapshotHome(home)
            self._pool.verify = self.verify_snapshots
        try:
            src = run_scenario(self.scn, home, FaultPlan(observer=observe), workflow_fn=self.workflow_fn,
                               ledger=ledger, clock=clock, live=live)
        finally:
            if self._pool is not None:
                self._pool.drop()
                self._pool = None
            remove_home(home)
        ref = self.reference()
        differs = compare_with(src, ref)
        if [(e.type, e.time) for e in src.events] != [(e.type, e.time) for e in ref.events]:
            differs.append("their histories differ")
        if differs:
            out.append(Mismatch("reference", [], ["two uninterrupted runs differ: the simulation is not "
                                                  "deterministic"] + differs,
                                rerun_command(self.scn, [], mutant=self.mutant)))
        return out

    def _refresh_prefix(self, prefix: list, eng, events: int) -> None:
        """At a convergence point of the uninterrupted run: the shared replay (simulator/prefix.py) moved to
        this cut, once the history grew by ``share_every`` events since the last cut. The first is a fresh
        replay (``build_prefix``); later ones feed the same replayer the events since (``advance_prefix``:
        the spine, O(new events)); one the spine refuses is made fresh again. Recoveries fork off it only
        where the history has ``share_min_events`` events; it also checks donated replays (``_admit``)."""
        cur = prefix[0]
        if cur is not None and events - cur.seq < self.share_every:
            return
        t0 = time.perf_counter()
        new = None
        try:
            if cur is not None and self.share_spine and advance_prefix(eng, cur, WORKFLOW_TRAIN_RUN):
                new = cur
                self.stats["spine cuts"] += 1
            else:
                prefix[0] = None  # (a refused spine is unusable)
                new = build_prefix(eng, self.scn.workflow_id, WORKFLOW_TRAIN_RUN)
                self.stats["fresh shared replays"] += new is not None
        except Exception:  # noqa: BLE001 - then each recovery replays from scratch, and meets it itself
            new = None
        self.timing["shared replays"] += time.perf_counter() - t0
        if new is not None:
            self.stats["shared replays"] += 1
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
            self.stats["donated replays" if p is not None else "refused donations"] += 1
            if p is not None:
                ready.append(p)
        for cut in [c for c in donors if c < spine.seq]:
            del donors[cut]
        del ready[:-self.share_ready_max]  # (older cuts are still good; the newest are used first)

    def _recover(self, n: int, where: str, home, live: dict, ledger: Ledger, clock: VirtualClock,
                 found: dict | None, history: HistoryDigest | None, prefix=None, fork: bool = False) -> Outcome:
        """The recovery of a kill at ``n``; with ``found``, stopped at convergence and spliced; ``fork``: in a
        forked child, off the shared replay ``prefix``."""
        self.stats["recoveries"] += 1
        t0, before = time.perf_counter(), self.stats["converged"]
        try:
            return self._recover_timed(n, where, home, live, ledger, clock, found, history, prefix, fork)
        finally:
            kind = "converged" if self.stats["converged"] > before else "ran on"
            self.stats[kind] += kind == "ran on"
            self.timing[kind] += time.perf_counter() - t0

    def _recover_timed(self, n: int, where: str, home, live: dict, ledger: Ledger, clock: VirtualClock,
                       found: dict | None, history: HistoryDigest | None, prefix, fork: bool) -> Outcome:
        if found is None:
            return recover_from_snapshot(self.scn, home, n, where, live, ledger, clock, workflow_fn=self.workflow_fn,
                                         pool=self._pool)
        args = (n, where, home, live, ledger, clock, found, history, prefix)
        raw = self._run_forked(args) if fork else self._run_twice(*args, lean=False)
        c0 = time.process_time()
        try:
            return self._recover_finish(*raw)
        finally:
            self.timing["cpu: splicing and outcome checks"] += time.process_time() - c0

    def _run_twice(self, n: int, where: str, home, live: dict, ledger: Ledger, clock: VirtualClock, found: dict,
                   history: HistoryDigest, prefix, *, lean: bool) -> tuple:
        """``_recover_run``, and again without the recovery's own replayer where a checked splice spent it."""
        raw = self._recover_run(n, where, home, live, ledger, clock, found, history.copy(), prefix,
                                live_splice=True, lean=lean)
        if raw is None:  # a checked splice was refused after it spent the recovery's replayer: again, without it
            self.stats["recoveries made again"] += 1
            raw = self._recover_run(n, where, home, live, ledger, clock, found, history, prefix,
                                    live_splice=False, lean=lean)
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
            stats, timing = Counter(self.stats), Counter(self.timing)
            o, mine, target, conv = self._run_twice(*args, lean=True)
            led = o.ledger  # (a TailLedger over ``ledger``: its own entries only, not the head's)
            tail = (led._n, led.own) if isinstance(led, TailLedger) else (p, led.entries[p:])
            light = replace(o, ledger=tail, plan=FaultPlan(count=o.plan.count), clock=None, scenario=None)
            light.plan.crashes = [None] * len(o.plan.crashes)
            return ((light, {k: (t.events_at, t.ledger_at) for k, t in mine.items()}, None if target is None
                     else conv), {k: v - stats[k] for k, v in self.stats.items() if v != stats[k]},
                    {k: v - timing[k] for k, v in self.timing.items() if v != timing[k]},
                    self._pool.state() if self._pool is not None else None)

        try:
            (light, points, conv), stats, timing, pool = in_child(child)
        except BaseException:
            if self._pool is not None:  # what the child left in the snapshot folder is unknown
                self._pool.drop()
            raise
        if self._pool is not None:
            self._pool.adopt(pool)
        self.stats.update(stats)
        self.timing.update(timing)
        led = Ledger()
        kept, own_entries = light.ledger
        led.entries = ledger.entries[:kept] + own_entries
        o = replace(light, scenario=self.scn, ledger=led)
        mine = {}
        for key, (ev, le) in points.items():
            found[key] = mine[key] = Target(None, ev, le)
        target = None
        if conv is not None:
            how, key, result = conv
            if how == "splice":  # made in the child from its own replayer: the same target, made here
                own = self._ref.events[:o.extra["copied_events"]] + o.events
                target = splice_target(own, self._near[without_history(key)], list(led.entries), result)
                found[key] = target
            else:
                target = self._targets.get(key) or found.get(key)
                if target is None or target.run is None:
                    raise RuntimeError("a forked recovery converged to a point the sweep does not know")
        return o, mine, target, conv

    def _recover_run(self, n: int, where: str, home, live: dict, ledger: Ledger, clock: VirtualClock,
                     found: dict, history: HistoryDigest, prefix, *, live_splice: bool, lean: bool) -> tuple | None:
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
            target = self._targets.get(key) or found.get(key)
            if target is not None and target.run is not None:
                conv[0] = ("key", key, None)
                if not lean and target is self._targets.get(key):  # at the uninterrupted run's own point
                    r = rlive["engine"]._cache.get(self.scn.workflow_id)
                    if r is not None:  # its code, fed the same visible history: a replay to share (``_admit``)
                        self._donations.append((target.events_at, r, history.digest.get(self.scn.workflow_id)))
                raise Converged(target)
            near = self._near.get(without_history(key))
            if near is not None and key not in found:  # the same state as the uninterrupted run's but for the history
                eng = rlive["engine"]
                with eng.store._lock:
                    new = read_events(eng.store.conn, self.scn.workflow_id, rlive["copied_events"])
                mine_replayer = eng._cache.get(self.scn.workflow_id) if live_splice else None
                own = JoinedEvents(self._ref.events, rlive["copied_events"], new)
                c0 = time.process_time()
                result, spent = splice_replay(eng._workflows[WORKFLOW_TRAIN_RUN], self.scn.workflow_id, own, near,
                                              live=mine_replayer)
                self.timing["cpu: checked splices' dry runs"] += time.process_time() - c0
                self.stats["checked splices" if result is not NO_SPLICE else "refused splices"] += 1
                self.stats["splices on the recovery's own replayer"] += spent
                if result is not NO_SPLICE:
                    entries = rlive["fakes"].ledger.entries
                    target = (Target(None, len(own), len(entries)) if lean
                              else splice_target(list(own), near, list(entries), result))
                    found[key] = target  # the other states of its kind converge here at once
                    conv[0] = ("splice", key, result)
                    raise Converged(target)
                if spent:
                    raise Converged(_SPENT)
            if key not in found:
                found[key] = mine[key] = Target(None, history.last_seq.get(self.scn.workflow_id, 0),
                                                len(rlive["fakes"].ledger.entries))

        o = recover_from_snapshot(self.scn, home, n, where, live, ledger, clock, workflow_fn=self.workflow_fn,
                                  watch=watch, prefix=prefix, pool=self._pool, index=None if lean else self._index,
                                  timing=self.timing)
        target = o.extra.pop("converged", None)
        if target is _SPENT:
            for key in mine:  # never verified: gone, as if this try had not been made
                del found[key]
            self._drop_home(o.home)
            return None
        return o, mine, target, conv[0]

    def _recover_finish(self, o: Outcome, mine: dict, target: Target | None, conv) -> Outcome:
        """A recovery run (``_recover_run``) made an outcome: spliced to its target's future where it
        converged, its passed points verified with it, its outcome checks made (``state_lines``)."""
        if target is None:  # ran to the end
            files = final_files_lines(o) if o.state == "completed" else []
            state_lines = None if self.scn.fail_suites else self.state_lines(o, file_lines=files)
            run = Verified(o.state, o.result, o.error, o.events, o.ledger.entries, files)
        else:  # its past, then the target's future
            self.stats["converged"] += 1
            copied = o.extra.pop("copied_events")
            t = target.run
            own = o.events
            o = replace(o, state=t.state, result=t.result, error=t.error,
                        events=self._ref.events[:copied] + own + t.events[target.events_at:],
                        ledger=splice_ledger(o.ledger, target))
            o.extra["ledger_tail"] = (t.ledger, target.ledger_at)  # its ledger checks: piecewise
            state_lines = None if self.scn.fail_suites else self._spliced_state_lines(o, copied, own, target)
            run = Verified(o.state, o.result, o.error, o.events, o.ledger.entries, t.file_lines) if mine else None
            self._drop_home(o.home)  # its files are the target's from here: checked with the target's
        for point in mine.values():
            point.run = run
        o.extra["state_lines"] = state_lines
        return o

    def count_states(self) -> int:
        """How many distinct durable states the positions of the uninterrupted run leave (dedup's runs)."""
        keys: set[tuple] = set()
        home, clock, live = new_home(), VirtualClock(START_TIME), {}
        try:
            run_scenario(self.scn, home, FaultPlan(observer=lambda n, kind, label: keys.add(_state_key(live, clock))),
                         workflow_fn=self.workflow_fn, clock=clock, live=live)
        finally:
            remove_home(home)
        return len(keys)

    def where(self, k: int) -> str:
        return " ".join(self.trace[k]) if 0 <= k < len(self.trace) else "(past the uninterrupted run's end)"

    def random_kills(self, *, seed: int, runs: int, kills_per_run: int, stop_at_first: bool = False) -> Report:
        """``runs`` runs, each killed ``1..kills_per_run`` times at positions drawn by ``seed``."""
        t0 = time.perf_counter()
        report = Report("random-kills")
        self.reference()
        report.positions = len(self.trace)
        rng = random.Random(seed)
        for _ in range(runs):
            run_seed = rng.randrange(2**31)
            n = random.Random(run_seed).randint(1, kills_per_run)
            kills = random_kills(run_seed, len(self.trace), n)
            o = self.run(kills)
            m = self.check(o, what="kills", kills=kills, seed=run_seed)
            if report.record(m):
                self._finish(o, m)
                if stop_at_first:
                    break
        report.elapsed_s = time.perf_counter() - t0
        return report

    def cancels(self, *, seed: int, runs: int, stop_at_first: bool = False) -> Report:
        """Cancel at a random position and kill at another (before or after it), then restart the spec."""
        t0 = time.perf_counter()
        report = Report("kills-during-cancel")
        self.reference()
        n = len(self.trace)
        report.positions = n
        rng = random.Random(seed)
        for _ in range(runs):
            cancel_at = rng.randrange(n)
            kills = sorted({rng.randrange(n) for _ in range(rng.randint(1, 2))})
            o = self.run(kills, cancel_at=cancel_at)
            m = self.check(o, what="cancel", kills=kills, cancel_at=cancel_at, seed=seed)
            if report.record(m):
                self._finish(o, m)
                if stop_at_first:
                    break
        report.elapsed_s = time.perf_counter() - t0
        return report
