"""What a sweep is handed: the scenario, its single runs, the uninterrupted reference and the checks.

``SweepContext`` is the part of the simulator that every sweep uses and none owns: one run from a
fresh home (``run``), the uninterrupted run with its positions and convergence points (``reference``,
``targets``, ``near``), every check of a finished run (``check``, ``state_lines``,
``spliced_state_lines``), what becomes of a checked run's home (``finish``, ``drop_home``), the
settings of the shared replays (``share_*``) and the counters (``stats``, ``timing``).
``simulator.sweep.Simulator`` is one, with the sweeps' entry points on top; it hands itself down to
its parts (``snapshot_sweep.SnapshotSweep``, ``random_sweeps.RandomSweeps``) as this
context, so they import this module and never the simulator (no circle, no reach into its privates).
The snapshot sweep that runs sets ``pool`` (its snapshot folder), which ``check`` and ``drop_home``
leave in place.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Iterable

from engine import VirtualClock

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
    HistoryDigest,
    Target,
    Verified,
    state_key,
    without_history,
)
from .fakes import FakeActivities
from .faults import FaultPlan
from .ledger import Ledger
from .release_checks import check_releases, compare_releases
from .report import Mismatch, rerun_command
from .scenario import START_TIME, Outcome, Scenario, new_home, remove_home, run_scenario
from .snapshot_home import SnapshotHome


def quiet_engine_logs() -> None:
    """The engine logs every redelivery at WARNING; a sweep makes thousands on purpose."""
    logging.getLogger("engine").setLevel(logging.CRITICAL)


class SweepContext:
    """One scenario (and one workflow function: the real one, or a mutant): its runs and their checks."""

    def __init__(
        self,
        scn: Scenario,
        *,
        workflow_fn: Callable | dict[str, Callable] | None = None,
        mutant: str | None = None,
        keep_failed: bool = False,
    ):
        self.scn = scn
        self.workflow_fn = workflow_fn
        self.mutant = mutant
        self.keep_failed = keep_failed
        self._ref: Outcome | None = None
        self._ref_mismatch: Mismatch | None = None
        self.targets: dict[tuple, Target] = {}  # the uninterrupted run's convergence points (after reference())
        self.near: dict[tuple, Target] = {}  # the same, by their keys less the history digest
        self.trace: list[tuple[str, str]] = []
        self.release_from: int | None = None  # the reference's first position after its TrainRun (``--release``)
        self.stats: Counter[str] = Counter()  # how runs ended, and how many kills they took
        # seconds spent in recoveries: a Counter for its adding update(); typeshed's Counter holds ints only
        self.timing: Any = Counter()
        self.on_outcome: Callable[[str, list[int], Outcome], None] | None = None  # sees every checked run
        self._checked_results: dict[int, tuple[Any, list[str]]] = {}  # see result_lines
        self._kept_index: dict[int, tuple[list, list[int], list]] = {}  # see _kept
        self._target_lines: dict[int, tuple[Any, list[str]]] = {}  # see spliced_state_lines
        self._shared: dict[int, tuple[list, int]] = {}  # see _shared_with_ref
        # dedup: recoveries after a long enough history share one fresh replay of it, by fork (simulator/prefix.py)
        self.share_replay = True
        self.share_min_events = 1000  # below this, a fresh replay costs about what a fork does (measured): no fork
        self.share_every = 1  # a new cut once the history grew by this many events
        self.share_spine = True  # later cuts: the same replayer fed on (prefix.advance_prefix), not replayed fresh
        self.share_donors = True  # a recovery stopped at a cut hands its replayer to one after it (_admit)
        self.share_ready_max = 16  # donated replays kept at most
        self.share_indexes = True  # an in-process replay from scratch copies the spine's indexes (prefix.py, 6.)
        self.reuse_snapshot_home = True  # recoveries share one folder, synced per snapshot (forked ones too)
        self.verify_snapshots = False  # tests: each synced folder compared with its source, file for file
        self.pool: SnapshotHome | None = None  # the running snapshot sweep's folder (snapshot_home.SnapshotHome)
        quiet_engine_logs()

    # ---- single runs -------------------------------------------------------------------------

    def run(
        self,
        kills: Iterable[int] = (),
        *,
        cancel_at: int | None = None,
        record: bool = False,
        stop_at: int | None = None,
    ) -> Outcome:
        """One run from a fresh home, killed at ``kills``; ``cancel_at``: a cancel there (then the spec
        again); ``stop_at``: a polite stop there (simulator/stops.py)."""
        home = new_home()
        plan = FaultPlan(kills=set(kills), record=record)
        o = run_scenario(self.scn, home, plan, workflow_fn=self.workflow_fn, cancel_at=cancel_at, stop_at=stop_at)
        if cancel_at is not None and o.cancel_done and o.state == "canceled":
            o.extra["ledger_start"] = len(o.ledger.entries)
            o.continued = run_scenario(
                self.scn,
                home,
                FaultPlan(),
                workflow_fn=self.workflow_fn,
                workflow_id=f"{self.scn.workflow_id}/2",
                ledger=o.ledger,
                clock=o.clock,
            )
        return o

    def reference(self) -> Outcome:
        """The uninterrupted run (once), with its positions and its convergence points recorded (``trace``,
        ``targets``, ``near``)."""
        if self._ref is None:
            home, ledger, clock, live, history = (
                new_home(),
                Ledger(),
                VirtualClock(START_TIME),
                dict[str, Any](),
                HistoryDigest(),
            )
            points: list[tuple[tuple, int, int]] = []

            def watch(n: int, kind: str, label: str) -> None:
                key = state_key(label, live["engine"], clock, live["fakes"], history)
                if key is not None:
                    points.append((key, history.last_seq.get(self.scn.workflow_id, 0), len(ledger.entries)))

            plan = FaultPlan(record=True, observer=watch, observe_only=(CONVERGENCE_KIND,))
            ref = run_scenario(
                self.scn, home, plan, workflow_fn=self.workflow_fn, ledger=ledger, clock=clock, live=live
            )
            self._ref = ref
            self.trace = list(ref.plan.trace)
            self.release_from = live.get("release_from")  # where its release requests begin (None: none)
            files = final_files_lines(ref) if ref.state == "completed" else []
            verified = Verified(ref.state, ref.result, ref.error, ref.events, ref.ledger.entries, files)
            self.targets = {key: Target(verified, ev, led) for key, ev, led in points}
            self.near = {without_history(key): t for key, t in self.targets.items()}
            self._ref_mismatch = self.check(ref, what="reference", kills=[])
            self.finish(ref, self._ref_mismatch)
        return self._ref

    def check(
        self,
        o: Outcome,
        *,
        what: str,
        kills: list[int],
        cancel_at: int | None = None,
        seed: int | None = None,
        state_lines: list[str] | None = None,
        ledger_lines: list[str] | None = None,
    ) -> Mismatch | None:
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
            self.drop_home(o.home)
            return None
        pool = self.pool
        if self.keep_failed and pool is not None and o.home == pool.home:
            pool.release()  # kept for the user as it is
        return Mismatch(
            what,
            kills,
            lines,
            rerun_command(scn, kills, cancel_at=cancel_at, mutant=self.mutant),
            cancel_at=cancel_at,
            seed=seed,
            home=str(o.home) if self.keep_failed else None,
        )

    def state_lines(self, o: Outcome, *, what: str = "kill", file_lines: list[str] | None = None) -> list[str]:
        """The checks of a completed run's outcome and files (all but the ledger's); ``file_lines``:
        the files' checks, already made (a spliced run's final files are its target's)."""
        lines = check_completed_state(o, file_lines=file_lines, result_lines=self.result_lines(o))
        if what != "reference":
            lines += compare_with(o, self.reference())
        if self.scn.release:  # the release requests after the run (simulator/release.py)
            lines += check_releases(o) + ([] if what == "reference" else compare_releases(o, self.reference()))
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
        return kept[bisect.bisect_left(where, start) : bisect.bisect_left(where, stop)]

    def spliced_state_lines(self, o: Outcome, copied: int, own: list, target: Target) -> list[str]:
        """``state_lines`` of a spliced recovery ``o``: its events are the reference's first ``copied``, then
        ``own``, then the target's after its point. Where the events the checks read (checks.CHECKED_EVENTS)
        equal the target's own (compared from the first event where either differs from the reference's:
        O(what differs)), its lines are the target's, made once; else they are made on those events."""
        t = target.run
        assert t is not None and self._ref is not None  # (a target splices once its run has ended; after the reference)
        m = min(copied, self._shared_with_ref(t.events))
        mine = self._kept(self._ref.events, m, copied) + (
            kept_events(own) if copied == 0 else [e for e in own if e.type in CHECKED_EVENTS]
        )
        theirs = self._kept(t.events, m, target.events_at)
        if len(mine) == len(theirs) and all(a[1:] == b[1:] for a, b in zip(mine, theirs)):  # (type, time, attrs)
            hit = self._target_lines.get(id(t))
            if hit is None or hit[0] is not t:
                if len(self._target_lines) >= 8:
                    self._target_lines.clear()
                hit = self._target_lines[id(t)] = (
                    t,
                    self.state_lines(replace(o, events=self._kept(t.events, 0)), file_lines=t.file_lines),
                )
            self.stats["outcome checks as the target's"] += 1
            return list(hit[1])
        short = (
            kept_events(o.events)
            if copied == 0
            else (
                self._kept(self._ref.events, 0, copied)
                + [e for e in own if e.type in CHECKED_EVENTS]
                + self._kept(t.events, target.events_at)
            )
        )
        return self.state_lines(replace(o, events=short), file_lines=t.file_lines)

    def _shared_with_ref(self, events: list) -> int:
        """How many first events of ``events`` are the reference's very objects (made once per list)."""
        assert self._ref is not None  # (made by reference() first)
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

    def result_lines(self, o: Outcome) -> list[str] | None:
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

    def finish(self, o: Outcome, m: Mismatch | None) -> None:
        """A checked run ``o`` is done with: its home goes unless the mismatch ``m`` is kept for the user."""
        if m is not None and not self.keep_failed:
            self.drop_home(o.home)

    def drop_home(self, home) -> None:
        """A run's home is done with: removed, but for the reused snapshot folder (snapshot_home.SnapshotHome)."""
        pool = self.pool
        if pool is None or home != pool.home:
            remove_home(home)

    # ---- sweeps ----------------------------------------------------------------------------------
