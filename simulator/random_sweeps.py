"""Runs killed several times at seeded random positions, and kills during a cancel
(``Simulator.random_kills``, ``Simulator.cancels``)."""

from __future__ import annotations

import random
import time

from .faults import random_kills
from .report import Report
from .sweep_context import SweepContext


class RandomSweeps:
    """Seeded random kills and cancels. A ``Simulator`` (simulator/sweep.py) owns one and hands it its
    ``SweepContext``: the sweeps use its single runs and checks (``reference``, ``trace``, ``run``,
    ``check``, ``finish``)."""

    def __init__(self, ctx: SweepContext):
        self.ctx = ctx

    def random_kills(self, *, seed: int, runs: int, kills_per_run: int, stop_at_first: bool = False) -> Report:
        """``runs`` runs, each killed ``1..kills_per_run`` times at positions drawn by ``seed``."""
        t0 = time.perf_counter()
        report = Report("random-kills")
        self.ctx.reference()
        report.positions = len(self.ctx.trace)
        rng = random.Random(seed)
        for _ in range(runs):
            run_seed = rng.randrange(2**31)
            n = random.Random(run_seed).randint(1, kills_per_run)
            kills = random_kills(run_seed, len(self.ctx.trace), n)
            o = self.ctx.run(kills)
            m = self.ctx.check(o, what="kills", kills=kills, seed=run_seed)
            if report.record(m):
                self.ctx.finish(o, m)
                if stop_at_first:
                    break
        report.elapsed_s = time.perf_counter() - t0
        return report

    def cancels(self, *, seed: int, runs: int, stop_at_first: bool = False) -> Report:
        """Cancel at a random position and kill at another (before or after it), then restart the spec."""
        t0 = time.perf_counter()
        report = Report("kills-during-cancel")
        self.ctx.reference()
        n = len(self.ctx.trace)
        report.positions = n
        rng = random.Random(seed)
        for _ in range(runs):
            cancel_at = rng.randrange(n)
            kills = sorted({rng.randrange(n) for _ in range(rng.randint(1, 2))})
            o = self.ctx.run(kills, cancel_at=cancel_at)
            m = self.ctx.check(o, what="cancel", kills=kills, cancel_at=cancel_at, seed=seed)
            if report.record(m):
                self.ctx.finish(o, m)
                if stop_at_first:
                    break
        report.elapsed_s = time.perf_counter() - t0
        return report
