"""Simulator benchmark: kill positions per second, and how a full sweep grows with segments.

    python bench/simulator.py [--sizes 10,100,1000] [--full-up-to 100] [--sample-every 50] [--skip-hand] [--skip-aims]

Prints figures measured in this one run (nothing is asserted):
1. the seed's hand example (1200 steps, eval_every 500, 30 s waits, ppl, checkpoints every 100)
   killed at every position in the literal mode (each run again from the start), the snapshot
   mode (each recovery to the end) and the default dedup mode (convergence);
2. runs of 10, 100 and 1,000 segments (10 steps each, a checkpoint every 10, ppl, 5 s waits),
   each size in its own process (for its peak memory): positions, distinct durable states at
   the kills, the uninterrupted run's time, then the dedup sweep of every position (sizes up to
   ``--full-up-to``) or of every ``--sample-every``-th position: wall and CPU time (forked
   recoveries included), time per position, recoveries run, how many stopped at convergence,
   how many started from a donated replay or forked off the spine, peak RSS. A sampled sweep's
   full time is estimated as the
   sweep with no kill (measured apart) plus distinct states x its time per recovery ("est.");
   ratios between sizes show the growth (linear: x10 per x10 segments);
3. issue 15's own scenario (1000 steps, checkpoints every 50, ppl, 5 s waits) with 10 and 100
   segments, every position, each in its own process: whole-process wall and CPU time (as
   ``/usr/bin/time`` gives them), CPU per position and its ratio, peak RSS, and each sweep's recovery CPU
   split by how a recovery started (a donated replayer, from scratch on the spine's indexes, forked) and by
   part (snapshot, engine run, checked splices' dry runs, splicing and checks).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# this file is named simulator.py: keep its folder from shadowing the simulator package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from simulator.scenario import Scenario  # noqa: E402
from simulator.sweep import Simulator  # noqa: E402


def hand_example(mode: str) -> tuple[int, float, bool]:
    sim = Simulator(Scenario())
    t0 = time.perf_counter()
    report = sim.kill_every_position(mode=mode)
    return report.tried, time.perf_counter() - t0, report.ok


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (recoveries forked off a shared replay)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one_size(n: int, full: bool, every: int, scn: Scenario | None = None) -> dict:
    """One size, measured in this process (run by ``--one``); ``scn``: another scenario than n segments of 10."""
    scn = scn or Scenario(steps=10 * n, eval_every=10, checkpoint_every=10, eval_interval_s=5)
    sim = Simulator(scn)
    t0 = time.perf_counter()
    sim.reference()
    ref_s = time.perf_counter() - t0
    positions = len(sim.trace)
    states = sim.count_states()
    picks = None if full else list(range(0, positions, every))
    base_s = base_cpu_s = 0.0
    if not full:  # the sweep's part that is not its recoveries: the uninterrupted run it pauses, shared replays
        t0, c0 = time.perf_counter(), _cpu()
        Simulator(scn).kill_every_position(positions=[])
        base_s, base_cpu_s = time.perf_counter() - t0, _cpu() - c0
    t0, c0 = time.perf_counter(), _cpu()
    report = sim.kill_every_position(positions=picks)
    sweep_s, cpu_s = time.perf_counter() - t0, _cpu() - c0
    return {
        "segments": n,
        "positions": positions,
        "states": states,
        "ref_s": ref_s,
        "full": full,
        "tried": report.tried,
        "ok": report.ok,
        "mismatches": len(report.mismatches),
        "sweep_s": sweep_s,
        "cpu_s": cpu_s,
        "recoveries": sim.stats["recoveries"],
        "converged": sim.stats["converged"],
        "converged_s": sim.timing["converged"],
        "ran_on_s": sim.timing["ran on"],
        "peak_mb": max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        / 1024,
        "shared": sim.stats["shared replays"],
        "base_s": base_s,
        "base_cpu_s": base_cpu_s,
        "donated": sim.stats["recoveries from a donated replay"],
        "forked": sim.stats["forked recoveries"],
    }


def _child(args: list[str]) -> dict | str:
    """This file run again with ``args`` (one measurement in its own process): its JSON line, with the
    process's wall time from outside (interpreter start and imports included, as ``/usr/bin/time`` says)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if out.returncode != 0:
        return f"failed: {out.stderr.strip().splitlines()[-1:]}"
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": wall_s}


def aims() -> None:
    """Issue 15's aims on its own scenario, each sweep in its own process (CPU, whole process: imports too)."""
    print(
        "3. issue 15's scenario: python -m simulator kill-every-position --steps 1000 --eval-interval 5 "
        "--suites ppl --checkpoint-every 50 --eval-every E (every position), in one process each:"
    )
    rows = {}
    for e in (100, 10):
        r = _child(["--aim", str(e)])
        if isinstance(r, str):
            print(f"   E={e}: {r}")
            return
        rows[e] = r
        print(
            f"   E={e:<3} segments {r['segments']:>4}: {r['positions']} positions, {r['recoveries']} recoveries "
            f"({r['donated']} from a donated replay, {r['forked']} forked), {r['tried']} tried, "
            f"{'all matched' if r['ok'] else 'MISMATCHES'}; wall {r['wall_s']:.2f} s, CPU {r['proc_cpu_s']:.2f} s "
            f"= {1000 * r['proc_cpu_s'] / r['positions']:.2f} ms per position; peak RSS {r['peak_mb']:.0f} MB"
        )
        print(_parts(r))
    a, b = rows[100], rows[10]
    ratio = (b["proc_cpu_s"] / b["positions"]) / (a["proc_cpu_s"] / a["positions"])
    print(
        f"   CPU per position, 100 segments / 10 segments: x{ratio:.2f} (aim: at most x3); "
        f"the 100-segment sweep: {b['wall_s']:.1f} s wall (aim: under 10 s), {b['peak_mb']:.0f} MB (aim: under 300 MB)"
    )


def one_aim(e: int) -> dict:
    """The issue's scenario with ``--eval-every e``, the whole process measured (as ``/usr/bin/time`` would)."""
    scn = Scenario(steps=1000, eval_every=e, eval_interval_s=5, suites=("ppl",), checkpoint_every=50)
    sim = Simulator(scn)
    report = sim.kill_every_position()
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "segments": len(scn.ends()),
        "positions": report.positions,
        "tried": report.tried,
        "ok": report.ok,
        "recoveries": sim.stats["recoveries"],
        "donated": sim.stats["recoveries from a donated replay"],
        "forked": sim.stats["forked recoveries"],
        "proc_cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "peak_mb": max(me.ru_maxrss, kids.ru_maxrss) / 1024,
        "starts": {
            k[len("recoveries started ") :]: v for k, v in sim.stats.items() if k.startswith("recoveries started ")
        },
        "cpu": {k[len("cpu: ") :]: v for k, v in sim.timing.items() if k.startswith("cpu: ")},
        "splices": sim.stats["checked splices"] + sim.stats["refused splices"],
    }


def _parts(r: dict) -> str:
    """One sweep's recovery CPU, by how each recovery started and by part (Simulator.timing's "cpu: ...")."""
    cpu, n = r["cpu"], max(r["recoveries"], 1)
    starts = ", ".join(
        f"{k} {c} x {1000 * cpu.get('recoveries started ' + k, 0.0) / max(c, 1):.1f} ms"
        for k, c in sorted(r["starts"].items())
    )
    rec = sum(v for k, v in cpu.items() if k.startswith("recoveries started "))
    snap, dry = cpu.get("snapshots (files, database copy)", 0.0), cpu.get("checked splices' dry runs", 0.0)
    fin = cpu.get("splicing and outcome checks", 0.0)
    run = rec - snap - dry - fin
    return (
        f"      recoveries by start: {starts}\n"
        f"      per recovery {1000 * rec / n:.2f} ms CPU = snapshot {1000 * snap / n:.2f} + engine run to convergence "
        f"{1000 * run / n:.2f} + checked splices' dry runs {1000 * dry / n:.2f} ({r['splices']} splices, "
        f"{1000 * dry / max(r['splices'], 1):.1f} ms each) + splicing and checks {1000 * fin / n:.2f}; "
        f"outside recoveries (imports, the paused run, shared positions) {r['proc_cpu_s'] - rec:.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100,1000", help="segment counts, comma-separated")
    ap.add_argument("--full-up-to", type=int, default=100, help="sweep every position up to this many segments")
    ap.add_argument("--sample-every", type=int, default=50, help="above it: every this-many-th position")
    ap.add_argument("--skip-hand", action="store_true", help="skip the hand example's sweeps")
    ap.add_argument("--skip-aims", action="store_true", help="skip issue 15's scenario (section 3)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one size, JSON out (internal)
    ap.add_argument("--aim", type=int, default=None, help=argparse.SUPPRESS)  # one eval_every, JSON out (internal)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one_size(a.one, a.one <= a.full_up_to, a.sample_every)))
        return
    if a.aim is not None:
        print(json.dumps(one_aim(a.aim)))
        return
    print(f"cpus: {os.cpu_count()}, load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not a.skip_hand:
        print("1. hand example (1200 steps, eval_every 500, 30 s, ppl, checkpoint every 100), every position:")
        for mode in ("rerun", "snapshot", "dedup"):
            n, s, ok = hand_example(mode)
            print(
                f"   {mode:8s}: {n} positions in {s:6.1f} s = {1000 * s / n:6.2f} ms per position"
                + ("" if ok else "  (!) MISMATCHES")
            )
    print("2. growth with segments (10 steps each, checkpoint every 10, ppl, 5 s waits), dedup mode:")
    print("   swept: positions killed; recov.: recoveries run (the others share one, same durable state);")
    print("   conv.: of them, stopped at convergence (the others ran to the end), with the seconds in each kind;")
    print("   ms/pos: full sweep time per position (wall, CPU); CPU: the sweep's CPU seconds, forked recoveries")
    print("   included (the machine may be shared: wall time lies, CPU less); donat.: recoveries that started from")
    print(
        "   a replayer an earlier recovery stopped with (simulator/prefix.py); forked: recoveries forked off the spine;"
    )
    print("   a sampled size's full sweep is estimated (marked est.) as the same sweep with no position killed")
    print("   (measured apart) plus distinct states x the sample's time per recovery")
    print(
        f"   {'segments':>8} {'positions':>9} {'states':>6} {'uninterr.':>9} {'swept':>6} {'sweep':>9} "
        f"{'CPU':>8} {'ms/pos':>7} {'CPU/pos':>7} {'recov.':>6} {'conv.':>6} {'donat.':>6} {'forked':>6} {'conv. s':>8} "
        f"{'ran-on s':>8} {'full sweep':>11} {'full CPU':>11} {'peak RSS':>9}"
    )
    rows = []
    for n in (int(x) for x in a.sizes.split(",")):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--one",
            str(n),
            "--full-up-to",
            str(a.full_up_to),
            "--sample-every",
            str(a.sample_every),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"   {n:>8}: failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        # a full sweep's time; sampled: distinct states x time per recovery (sampled kills rarely share one)
        # sampled: the sweep without recoveries, plus distinct states x the sample's time per recovery
        scale = 1.0 if r["full"] else r["states"] / max(r["recoveries"], 1)
        r["full_s"] = r["base_s"] + (r["sweep_s"] - r["base_s"]) * scale
        r["full_cpu_s"] = r["base_cpu_s"] + (r["cpu_s"] - r["base_cpu_s"]) * scale
        r["per_pos_ms"] = 1000 * r["full_s"] / r["positions"]
        r["cpu_pos_ms"] = 1000 * r["full_cpu_s"] / r["positions"]
        rows.append(r)
        est = "" if r["full"] else " est."
        full, full_cpu = f"{r['full_s']:.1f}s{est}", f"{r['full_cpu_s']:.1f}s{est}"
        print(
            f"   {n:>8} {r['positions']:>9} {r['states']:>6} {r['ref_s']:>8.2f}s {r['tried']:>6} "
            f"{r['sweep_s']:>8.1f}s {r['cpu_s']:>7.1f}s {r['per_pos_ms']:>7.2f} {r['cpu_pos_ms']:>7.2f} "
            f"{r['recoveries']:>6} {r['converged']:>6} {r['donated']:>6} {r['forked']:>6} {r['converged_s']:>7.1f}s "
            f"{r['ran_on_s']:>7.1f}s {full:>11} {full_cpu:>11} "
            f"{r['peak_mb']:>7.0f}MB" + ("" if r["ok"] else f"  (!) {r['mismatches']} MISMATCHES")
        )
    for x, y in zip(rows, rows[1:]):
        print(
            f"   {x['segments']} -> {y['segments']} segments: positions x{y['positions'] / x['positions']:.1f}, "
            f"states x{y['states'] / x['states']:.1f}, time per position x{y['per_pos_ms'] / x['per_pos_ms']:.1f} "
            f"(CPU x{y['cpu_pos_ms'] / x['cpu_pos_ms']:.1f}), full sweep x{y['full_s'] / x['full_s']:.1f} "
            f"(CPU x{y['full_cpu_s'] / x['full_cpu_s']:.1f}; linear: x{y['segments'] // x['segments']})"
        )

    if not a.skip_aims:
        aims()


if __name__ == "__main__":
    main()
