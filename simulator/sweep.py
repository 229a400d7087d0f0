"""Kill the worker at every position, at random sequences of positions, and during cancels.

``kill_every_position`` runs a scenario once uninterrupted (recording its positions), then for
each position k: the run killed at k (all in-memory state lost), a fresh engine on the same
files run to the end, and every check of ``checks`` against the oracle and the uninterrupted
run. Three modes make the same runs (a test compares them run for run): ``rerun`` runs from
the start in a fresh home and kills in-process; ``snapshot`` copies the files of a paused
uninterrupted run at k; ``dedup`` (default) also shares one recovery among positions that
leave the same durable state, checking each position's own ledger.
Every mismatch carries the seed/positions that reproduce it and a one-line command.

``Simulator`` is here (the sweeps' entry points) over its ``SweepContext`` (simulator/sweep_context.py:
single runs, the reference run, the checks); it owns the sweeps' parts as objects, each handed that
context: ``snapshot_sweep.SnapshotSweep`` (``snapshot_kills`` and its recoveries: convergence, shared
replays, forks) and ``random_sweeps.RandomSweeps`` (``random_kills``, ``cancels``); ``report`` has
``Mismatch``, ``Report``, ``rerun_command``.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Callable, Iterable

from engine import VirtualClock

from .faults import FaultPlan
from .random_sweeps import RandomSweeps
from .report import Mismatch, Report
from .scenario import START_TIME, Scenario, new_home, remove_home, run_scenario
from .snapshot_sweep import SnapshotSweep, position_key
from .sweep_context import SweepContext


_WORKER_FN: Callable | None = None


def _call(item):
    assert _WORKER_FN is not None  # (set in the pool's processes before any item)
    return _WORKER_FN(item)


def _map(fn: Callable, items: list, jobs: int):
    """``map(fn, items)`` in order; over ``jobs`` forked processes when jobs > 1 (Linux)."""
    if jobs <= 1 or len(items) < 2:
        yield from map(fn, items)
        return

    global _WORKER_FN
    _WORKER_FN = fn  # inherited by the forked workers: nothing of the simulator is pickled
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) as pool:
        yield from pool.imap(_call, items, chunksize=8)


class Simulator(SweepContext):
    """Runs one scenario (and one workflow function: the real one, or a mutant) many times: the sweeps.

    Its runs and checks are its ``SweepContext`` (simulator/sweep_context.py), which it hands down to the
    sweeps it owns: ``SnapshotSweep`` (snapshot_kills) and ``RandomSweeps`` (random_kills, cancels)."""

    def __init__(
        self,
        scn: Scenario,
        *,
        workflow_fn: Callable | dict[str, Callable] | None = None,
        mutant: str | None = None,
        keep_failed: bool = False,
    ):
        super().__init__(scn, workflow_fn=workflow_fn, mutant=mutant, keep_failed=keep_failed)
        self._snapshots = SnapshotSweep(self)  # snapshot_kills and its recoveries (simulator/snapshot_sweep.py)
        self._random = RandomSweeps(self)  # random_kills, cancels (simulator/random_sweeps.py)

    # ---- sweeps ----------------------------------------------------------------------------------

    def snapshot_kills(
        self, positions: list[int], *, stop_at_first: bool = False, dedup: bool = True
    ) -> list[Mismatch | None]:
        """Kills at ``positions`` (increasing), recovered from snapshots of one uninterrupted run
        (``SnapshotSweep.snapshot_kills``)."""
        return self._snapshots.snapshot_kills(positions, stop_at_first=stop_at_first, dedup=dedup)

    def random_kills(self, *, seed: int, runs: int, kills_per_run: int, stop_at_first: bool = False) -> Report:
        """``runs`` runs, each killed ``1..kills_per_run`` times at positions drawn by ``seed``."""
        return self._random.random_kills(seed=seed, runs=runs, kills_per_run=kills_per_run, stop_at_first=stop_at_first)

    def cancels(self, *, seed: int, runs: int, stop_at_first: bool = False) -> Report:
        """Cancel at a random position and kill at another (before or after it), then restart the spec."""
        return self._random.cancels(seed=seed, runs=runs, stop_at_first=stop_at_first)

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
            self.finish(o, m)
        return m

    def kill_every_position(
        self, *, positions: Iterable[int] | None = None, stop_at_first: bool = False, jobs: int = 1, mode: str = "dedup"
    ) -> Report:
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
        if self.scn.release and mode == "dedup":
            # convergence (simulator/convergence.py) is argued for one TrainRun's history and files: with
            # release workflows after it, every position gets its own recovery from its snapshot
            mode = "snapshot"
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
            results = _map(
                lambda part: self.snapshot_kills(part, stop_at_first=stop_at_first, dedup=dedup), parts, jobs
            )
        for part in results:
            for m in part:
                report.record(m)
            if stop_at_first and report.mismatches:
                break
        report.elapsed_s = time.perf_counter() - t0
        return report

    def count_states(self) -> int:
        """How many distinct durable states the positions of the uninterrupted run leave (dedup's runs)."""
        keys: set[tuple] = set()
        home, clock, live = new_home(), VirtualClock(START_TIME), dict[str, Any]()
        try:
            run_scenario(
                self.scn,
                home,
                FaultPlan(observer=lambda n, kind, label: keys.add(position_key(live, clock))),
                workflow_fn=self.workflow_fn,
                clock=clock,
                live=live,
            )
        finally:
            remove_home(home)
        return len(keys)

    def where(self, k: int) -> str:
        return " ".join(self.trace[k]) if 0 <= k < len(self.trace) else "(past the uninterrupted run's end)"
