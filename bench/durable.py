"""The cost of durability: ``ctl train`` against bare ``tinyllm train`` segments, in one run.

1. wall time of ``ctl train --spec SPEC`` in a fresh home (corpus, segments, durable waits);
2. wall time of the same work as bare commands one after another in another fresh home:
   ``tinyllm corpus`` then ``tinyllm train`` with the spec's steps set to each segment's end;
3. the ratio of the two (and the ratio without the spec's configured eval_interval waits);
4. the time from a worker restart (``ctl train`` run again after a SIGKILL in the second
   segment) to the first resumed training step appearing in runs/<name>/metrics.jsonl.

Usage: python bench/durable.py [--spec specs/tiny.json] [--suite ppl ...]
(without --suite, ctl train runs with --no-eval: the same work as the bare commands)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyllm import runlock  # noqa: E402
from workflows import segments  # noqa: E402


def timed(argv: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-2000:]}")
    return dt, p


def ctl_argv(spec: Path, home: Path, suites: list[str]) -> list[str]:
    """ctl train with the given suites; without any, --no-eval (the bare commands evaluate nothing)."""
    return [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec), "--home", str(home), "--json",
            *([a for s in suites for a in ("--suite", s)] or ["--no-eval"])]


def bare_run(spec: dict, home: Path) -> tuple[float, str]:
    """Corpus then each segment with plain tinyllm commands; returns (seconds, final_loss_hex)."""
    t0 = time.perf_counter()
    timed([sys.executable, "-m", "tinyllm.cli", "corpus", "--home", str(home)])
    last = None
    for until in segments(spec["steps"], spec.get("eval_every", 0)):
        seg = home / f"segment-{until}.json"
        seg.write_text(json.dumps({**spec, "steps": until}))
        _, p = timed([sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(seg), "--home", str(home)])
        last = json.loads(p.stdout.strip().splitlines()[-1])
    return time.perf_counter() - t0, last["final_loss_hex"]


def poll(cond, what: str, deadline_s: float = 600.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def restart_latency(spec_path: Path, spec: dict, home: Path, suites: list[str]) -> tuple[float, int]:
    """SIGKILL ctl in the second segment, run it again; seconds to the first resumed step."""
    name = spec["name"]
    ends = segments(spec["steps"], spec.get("eval_every", 0))
    if len(ends) < 2:
        raise SystemExit("the restart measure needs a spec with at least two segments")
    progress = home / "runs" / name / "activity" / f"train-{ends[1]:06d}" / "progress-1.jsonl"

    def ckpt_in_segment_2():
        try:
            lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
            steps = [x["step"] for x in lines if "checkpoint" in x]  # not the liveness lines
        except (OSError, ValueError):
            return None
        steps = [s for s in steps if ends[0] < s < ends[1]]
        return max(steps) if steps else None

    proc = subprocess.Popen(ctl_argv(spec_path, home, suites), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll(ckpt_in_segment_2, "a checkpoint in segment 2")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    poll(lambda: not runlock.is_locked(home / "runs" / name), "the trainer to die")
    latest = int((home / "runs" / name / "ckpt" / "LATEST").read_text().strip().split("-")[1])
    metrics = home / "runs" / name / "metrics.jsonl"
    t0_wall = time.time()
    t0 = time.perf_counter()
    again = subprocess.Popen(ctl_argv(spec_path, home, suites), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def resumed_step():
        try:
            for line in metrics.read_text().splitlines():
                frame = json.loads(line)
                if frame.get("step") == latest + 1 and frame.get("time", 0) >= t0_wall:
                    return True
        except (OSError, ValueError):
            return None
        return None

    poll(resumed_step, "the first resumed step")
    dt = time.perf_counter() - t0
    again.wait()
    return dt, latest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs" / "tiny.json"))
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs of runs, order alternated (ctl first, then bare first); the best of each is compared")
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes")
    args = ap.parse_args()
    spec_path = Path(args.spec).resolve()
    spec = json.loads(spec_path.read_text())
    ends = segments(spec["steps"], spec.get("eval_every", 0))
    waits_s = spec.get("eval_interval_seconds", 0) * (len(ends) - 1)
    root = Path(tempfile.mkdtemp(prefix="bench-durable-"))
    try:
        ctl_times, bare_times = [], []
        for i in range(args.repeat):
            for kind in (("ctl", "bare") if i % 2 == 0 else ("bare", "ctl")):
                home = root / f"{kind}-{i}"
                home.mkdir()
                if kind == "ctl":
                    t, p = timed(ctl_argv(spec_path, home, args.suite), cwd=ROOT)
                    ctl_times.append(t)
                    ctl_loss = json.loads(p.stdout)["result"]["final_loss_hex"]
                else:
                    t, bare_loss = bare_run(spec, home)
                    bare_times.append(t)
        (root / "restart").mkdir()
        t_restart, resumed_at = restart_latency(spec_path, spec, root / "restart", args.suite)
        t_ctl, t_bare = min(ctl_times), min(bare_times)
        print(f"spec {spec_path.name}: {spec['steps']} steps in {len(ends)} segments {ends}"
              f"{', suites ' + ','.join(args.suite) if args.suite else ''}")
        if args.repeat > 1:
            print(f"runs (s): ctl {', '.join(f'{t:.1f}' for t in ctl_times)}; bare {', '.join(f'{t:.1f}' for t in bare_times)}")
        print(f"ctl train (durable)          {t_ctl:8.2f} s   final_loss_hex {ctl_loss}")
        print(f"bare tinyllm segments        {t_bare:8.2f} s   final_loss_hex {bare_loss}"
              f"   {'(equal)' if bare_loss == ctl_loss else '(DIFFERENT)'}")
        print(f"ratio durable / bare         {t_ctl / t_bare:8.3f}")
        if waits_s:
            print(f"ratio without the spec's {waits_s:g} s of eval_interval waits  {(t_ctl - waits_s) / t_bare:8.3f}")
        print(f"restart -> first resumed step {t_restart:8.2f} s   (resumed from step {resumed_at})")
    finally:
        if args.keep:
            print(f"homes kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
