"""The cost of durability: ``ctl train`` against bare ``tinyllm train`` segments, in one run.

1. wall time of ``ctl train --spec SPEC`` in a fresh home (corpus, segments, durable waits), with
   warm segment starts (the default: a fork server with torch imported forks each segment's
   trainer, workflows/activities.py) and cold ones (``CTL_WARM_START=0``: a fresh interpreter each);
2. wall time of the same work as bare commands one after another in another fresh home:
   ``tinyllm corpus`` then ``tinyllm train`` with the spec's steps set to each segment's end,
   and of one bare ``tinyllm train`` of all the steps (corpus before it, outside the timing);
3. the ratios (and the ratio without the spec's configured eval_interval waits);
4. each segment boundary: from the end of a segment's last step to the end of the next one's first
   step (runs/<name>/metrics.jsonl's frame times), less that first step's own time (its
   ``timer/step_s``): the time that is not training at a boundary (the median over boundaries);
5. the time from a worker restart (``ctl train`` run again after a SIGKILL in the second
   segment) to the first resumed training step appearing in runs/<name>/metrics.jsonl, with warm
   starts on and off (the redelivered segment itself starts cold either way).
The machine's load average is printed before and after (other work shares it).

Usage: python bench/durable.py [--spec specs/tiny.json] [--suite ppl ...] [--repeat N]
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


COLD = {**os.environ, "CTL_WARM_START": "0"}


def timed(argv: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-2000:]}")
    return dt, p


def ctl_argv(spec: Path, home: Path, suites: list[str]) -> list[str]:
    """ctl train with the given suites; without any, --no-eval (the bare commands evaluate nothing)."""
    return [
        sys.executable,
        "-m",
        "ctl.cli",
        "train",
        "--spec",
        str(spec),
        "--home",
        str(home),
        "--json",
        *([a for s in suites for a in ("--suite", s)] or ["--no-eval"]),
    ]


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


def bare_single(spec: dict, home: Path) -> tuple[float, str]:
    """Corpus (not timed), then one ``tinyllm train`` of all the steps; returns (seconds, final_loss_hex)."""
    timed([sys.executable, "-m", "tinyllm.cli", "corpus", "--home", str(home)])
    whole = home / "whole.json"
    whole.write_text(json.dumps(spec))
    t, p = timed([sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(whole), "--home", str(home)])
    return t, json.loads(p.stdout.strip().splitlines()[-1])["final_loss_hex"]


def boundaries(home: Path, name: str, ends: list[int]) -> list[float]:
    """Seconds not training at each segment boundary (see the module docstring, 4)."""
    frames = {}
    for line in (home / "runs" / name / "metrics.jsonl").read_text().splitlines():
        frame = json.loads(line)
        frames[frame["step"]] = frame  # the last frame of a step (a resumed run writes it again)
    return [frames[e + 1]["time"] - frames[e]["time"] - frames[e + 1].get("timer/step_s", 0.0) for e in ends[:-1]]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def poll(cond, what: str, deadline_s: float = 600.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def restart_latency(
    spec_path: Path, spec: dict, home: Path, suites: list[str], env: dict | None = None
) -> tuple[float, int]:
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

    proc = subprocess.Popen(
        ctl_argv(spec_path, home, suites), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    poll(ckpt_in_segment_2, "a checkpoint in segment 2")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    poll(lambda: not runlock.is_locked(home / "runs" / name), "the trainer to die")
    latest = int((home / "runs" / name / "ckpt" / "LATEST").read_text().strip().split("-")[1])
    metrics = home / "runs" / name / "metrics.jsonl"
    t0_wall = time.time()
    t0 = time.perf_counter()
    again = subprocess.Popen(
        ctl_argv(spec_path, home, suites), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )

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
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="pairs of runs, order alternated (ctl first, then bare first); the best of each is compared",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes")
    args = ap.parse_args()
    spec_path = Path(args.spec).resolve()
    spec = json.loads(spec_path.read_text())
    ends = segments(spec["steps"], spec.get("eval_every", 0))
    waits_s = spec.get("eval_interval_seconds", 0) * (len(ends) - 1)
    root = Path(tempfile.mkdtemp(prefix="bench-durable-"))
    load_before = load()
    try:
        times: dict[str, list[float]] = {"ctl": [], "ctl cold": [], "bare": [], "single": []}
        gaps: dict[str, list[float]] = {"ctl": [], "ctl cold": []}
        losses: dict[str, str] = {}
        kinds = list(times)
        for i in range(args.repeat):
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                home = root / f"{kind.replace(' ', '-')}-{i}"
                home.mkdir()
                if kind.startswith("ctl"):
                    t, p = timed(
                        ctl_argv(spec_path, home, args.suite), cwd=ROOT, env=COLD if kind == "ctl cold" else None
                    )
                    losses[kind] = json.loads(p.stdout)["result"]["final_loss_hex"]
                    gaps[kind] += boundaries(home, spec["name"], ends)
                else:
                    t, losses[kind] = (bare_run if kind == "bare" else bare_single)(spec, home)
                times[kind].append(t)
        restart: dict[str, tuple[float, int]] = {}
        for kind, env in (("warm", None), ("cold", COLD)):
            (root / f"restart-{kind}").mkdir()
            restart[kind] = restart_latency(spec_path, spec, root / f"restart-{kind}", args.suite, env)
        best = {k: min(v) for k, v in times.items()}
        ref = losses["ctl cold"]
        print(
            f"spec {spec_path.name}: {spec['steps']} steps in {len(ends)} segments {ends}"
            f"{', suites ' + ','.join(args.suite) if args.suite else ''}; best of {args.repeat}"
        )
        print(f"load average (1, 5, 15 min) before {load_before}, after {load()}; {os.cpu_count()} CPUs")
        if args.repeat > 1:
            for k, v in times.items():
                print(f"runs (s) {k:9s} {', '.join(f'{t:.1f}' for t in v)}")
        what = {
            "ctl": "ctl train, warm segments",
            "ctl cold": "ctl train, cold (CTL_WARM_START=0)",
            "bare": "bare tinyllm segments",
            "single": "one bare tinyllm train (all steps)",
        }
        for k in kinds:
            same = "(equal)" if losses[k] == ref else "(DIFFERENT)"
            print(f"{what[k]:36s} {best[k]:8.2f} s   final_loss_hex {losses[k]} {same}")
        print(f"ratio ctl warm / bare segments       {best['ctl'] / best['bare']:8.3f}")
        print(f"ratio ctl warm / one bare train      {best['ctl'] / best['single']:8.3f}   (aim <= 1.05)")
        print(f"ratio ctl cold / one bare train      {best['ctl cold'] / best['single']:8.3f}")
        if waits_s:
            print(
                f"ratio without the spec's {waits_s:g} s of eval_interval waits  "
                f"{(best['ctl'] - waits_s) / best['bare']:8.3f}"
            )
        for k in ("ctl", "ctl cold"):
            if gaps[k]:
                print(
                    f"segment boundary, {'warm' if k == 'ctl' else 'cold'}: median {median(gaps[k]):6.2f} s, "
                    f"max {max(gaps[k]):6.2f} s over {len(gaps[k])}   (aim <= 0.3 s)"
                )
        for kind, (
            t,
            at,
        ) in restart.items():  # the redelivered segment starts cold either way (workflows/activities.py)
            print(
                f"restart -> first resumed step, {kind} server: {t:6.2f} s   (resumed from step {at}; aim <= 1 s idle)"
            )
    finally:
        if args.keep:
            print(f"homes kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
