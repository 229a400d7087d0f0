"""Simulator benchmark: kill positions per second, and how positions and time grow with segments.

    python bench/simulator.py [--jobs 2] [--sample 40] [--skip-full]

Prints figures measured in this one run (nothing is asserted):
1. the seed's hand example (1200 steps, eval_every 500, 30 s waits, ppl, checkpoints every 100)
   killed at every position: positions, wall time, positions per second and CPU time, in the
   literal mode (each run again from the start) and the snapshot mode, 1 process and ``--jobs``;
2. runs of 10, 100 and 1,000 segments (eval_every 10, checkpoint every 10, ppl, 30 s waits):
   positions of the uninterrupted run, distinct durable states among them, its time, the mean
   time of a killed run (``--sample`` evenly spread positions, half as many for 1,000
   segments), the full sweep measured (dedup mode, 10 segments) and extrapolated
   (positions or states x mean killed run). Ratios between successive sizes show the growth:
   positions grow linearly (x10), a full sweep at most quadratically (x100) when a run is
   linear in its history.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# this file is named simulator.py: keep its folder from shadowing the simulator package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from simulator.scenario import Scenario  # noqa: E402
from simulator.sweep import Simulator  # noqa: E402


def full_sweep(jobs: int, mode: str) -> tuple[int, float, float]:
    """Positions, wall seconds, CPU seconds (this process and its workers) of the hand example's sweep."""
    sim = Simulator(Scenario())
    t0, c0 = time.perf_counter(), _cpu()
    report = sim.kill_every_position(jobs=jobs, mode=mode)
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    if not report.ok:
        print(f"  (!) {len(report.mismatches)} mismatches: {report.mismatches[0]}")
    return report.tried, elapsed, cpu


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def segments_row(n: int, sample: int, full: bool) -> dict:
    scn = Scenario(steps=10 * n, eval_every=10, checkpoint_every=10)
    sim = Simulator(scn)
    t0 = time.perf_counter()
    sim.reference()
    ref_s = time.perf_counter() - t0
    positions = len(sim.trace)
    states = sim.count_states()
    picks = sorted({int((i + 0.5) * positions / sample) for i in range(sample)})  # evenly spread
    t0 = time.perf_counter()
    report = sim.kill_every_position(positions=picks, mode="snapshot")
    per_run = (time.perf_counter() - t0) / max(report.tried, 1)
    if not report.ok:
        print(f"  (!) {len(report.mismatches)} mismatches at {n} segments: {report.mismatches[0]}")
    row = {"segments": n, "positions": positions, "states": states, "ref_s": ref_s, "killed_s": per_run,
           "sampled": len(picks), "literal_s": positions * per_run, "dedup_est_s": states * per_run,
           "dedup_s": None}
    if full:
        t0 = time.perf_counter()
        report = sim.kill_every_position()
        row["dedup_s"] = time.perf_counter() - t0
        if not report.ok:
            print(f"  (!) {len(report.mismatches)} mismatches at {n} segments: {report.mismatches[0]}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="processes for the parallel full sweep")
    ap.add_argument("--sample", type=int, default=40, help="killed runs sampled per size (1,000 segments: a quarter)")
    ap.add_argument("--skip-full", action="store_true", help="skip the hand example's full sweeps")
    a = ap.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not a.skip_full:
        print("1. hand example (1200 steps, eval_every 500, 30 s, ppl, checkpoint every 100), every position:")
        for jobs, mode in [(1, "rerun"), (1, "snapshot"), (1, "dedup")] + ([(a.jobs, "rerun")] if a.jobs > 1 else []):
            n, s, cpu = full_sweep(jobs, mode)
            print(f"   {mode:8s} {jobs} process{'es' if jobs > 1 else '  '}: {n} positions in {s:5.1f} s = "
                  f"{n / s:4.0f} positions/s (CPU {cpu:.1f} s = {1000 * cpu / n:.1f} ms per position)")
    print("2. growth with segments (eval_every 10, checkpoint every 10, ppl, 30 s waits):")
    print("   states: distinct durable states among the positions (dedup's recoveries); killed run: mean of")
    print("   evenly spread sampled kills (snapshot mode); sweeps: measured (dedup) or extrapolated (est.)")
    print(f"   {'segments':>8} {'positions':>9} {'states':>7} {'uninterrupted':>13} {'killed run':>10} "
          f"{'literal sweep est.':>18} {'dedup sweep':>12} {'dedup est.':>10}")
    rows = []
    for n in (10, 100, 1000):
        row = segments_row(n, a.sample if n < 1000 else max(a.sample // 2, 3), full=n <= 10)
        rows.append(row)
        dedup = f"{row['dedup_s']:.1f}s" if row["dedup_s"] is not None else "-"
        print(f"   {row['segments']:>8} {row['positions']:>9} {row['states']:>7} {row['ref_s']:>12.3f}s "
              f"{row['killed_s']:>9.3f}s {row['literal_s']:>17.0f}s {dedup:>12} {row['dedup_est_s']:>9.0f}s")
    for a_row, b_row in zip(rows, rows[1:]):
        ratio = {k: b_row[k] / a_row[k] for k in ("positions", "states", "killed_s", "literal_s")}
        print(f"   x{b_row['segments'] // a_row['segments']} segments: positions x{ratio['positions']:.1f}, "
              f"states x{ratio['states']:.1f}, killed run x{ratio['killed_s']:.1f}, "
              f"sweep x{ratio['literal_s']:.0f} (quadratic: x100)")

if __name__ == "__main__":
    main()
