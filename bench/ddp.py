"""Benchmark data-parallel tinyllm (torchrun, gloo); prints figures and ratios measured in this one run.

Same model, global batch and steps (specs/tiny.json's model, batch 16 x 64 tokens) trained as:

- plain, 1 process x 1 thread, and plain, 1 process x 2 threads (all of this host's 2 cores);
- distributed, world_size 1 (1 rank x 1 thread) and world_size 2 (2 ranks x 1 thread, 8 rows each).

Figures: tokens/s (median step time over the steps after the first ``--warmup``), the scaling
efficiency of 2 ranks over 1 rank (tokens/s ratio / 2), the time of each step's all-reduce
(gradients in one flat float32 buffer, plus the float64 loss), and the checkpoint time at 2 ranks:
the gather of every rank's RNG state, rank 0's write (fsynced files, rename, LATEST) and the
barrier, measured as the time from a step's metrics frame to its checkpoint's progress line.

Usage: python bench/ddp.py [--steps 40] [--warmup 5] [--checkpoint-every 10] [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI_NODE = """what a real multi-node run would change:
- launch: one torchrun per node with --nnodes N --node-rank i and a rendezvous endpoint
  (--rdzv-backend c10d --rdzv-endpoint host:port) instead of --standalone; the train activity
  would start one launcher per node (or hand the job to a cluster scheduler) and own retries
  across nodes, since --max-restarts 0 stays;
- all-reduce: over the network instead of loopback; gloo's ring costs ~2x the gradient bytes per
  rank per step over the slowest link, so the all-reduce (here a small share of a step) grows
  with model size / bandwidth; overlapping it with backward (DDP's bucketed hooks) matters then,
  and nccl on GPUs replaces gloo;
- checkpoints: rank 0 writing everything needs storage every node can read at resume (shared FS
  or object store) -- or each node reads rank 0's copy broadcast at start; with sharded state
  (FSDP/TP) each rank would write its own shard (torch.distributed.checkpoint);
- faults: the process-tree rule (DURABLE_ATTEMPT, parent-death signals) is per host; a dead node
  is seen by the other nodes as a failed collective (gloo/nccl timeout) and by torchrun's
  rendezvous, so the attempt ends on every node and the engine redelivers it as a whole;
- exactness: unchanged in kind (fixed world size, fixed reduction order per topology), but the
  ring order depends on the node/rank layout, which must then be part of the trajectory."""


def run_one(home: Path, name: str, steps: int, ckpt_every: int, threads: int, world_size: int | None) -> dict:
    model = json.loads((REPO / "specs" / "tiny.json").read_text())["model"]
    spec = {
        "name": name,
        "steps": steps,
        "seed": 7,
        "checkpoint_every": ckpt_every,
        "batch_size": 16,
        "lr": 0.002,
        "warmup_steps": 5,
        "lr_decay_steps": steps,
        "threads": threads,
        "log_every": 10**6,
        "model": model,
    }
    if world_size is not None:
        spec["distributed"] = {"world_size": world_size}
    spec_path = home / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    progress = home / f"{name}.progress.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tinyllm.cli",
            "train",
            "--spec",
            str(spec_path),
            "--home",
            str(home),
            "--progress",
            str(progress),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    frames = [json.loads(x) for x in (home / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    marks = [json.loads(x) for x in progress.read_text().splitlines()]
    frame_time = {f["step"]: f["time"] for f in frames}
    ckpt_s = [
        m["time"] - frame_time[m["step"]]
        for m in marks
        if "checkpoint" in m and "event" not in m and m["step"] in frame_time
    ]
    return {
        "frames": frames,
        "ckpt_s": ckpt_s,
        "wall_s": wall,
        "result": result,
        "tokens_per_step": 16 * model["block_size"],
    }


def summarize(run: dict, warmup: int) -> dict:
    steady = [f for f in run["frames"] if f["step"] > warmup]
    step_s = statistics.median(f["timer/step_s"] for f in steady)
    out = {
        "step_s": step_s,
        "tokens_per_s": run["tokens_per_step"] / step_s,
        "wall_s": run["wall_s"],
        "ckpt_s": statistics.median(run["ckpt_s"]) if run["ckpt_s"] else float("nan"),
    }
    if "timer/allreduce_s" in steady[0]:
        out["allreduce_s"] = statistics.median(f["timer/allreduce_s"] for f in steady)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1, help="alternate the configurations this many times (medians)")
    args = ap.parse_args(argv)
    configs = {"plain-1t": (1, None), "plain-2t": (2, None), "ddp-w1": (1, 1), "ddp-w2": (1, 2)}
    got: dict[str, list[dict]] = {k: [] for k in configs}
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory(prefix="tinyllm-ddp-bench-") as tmp:
        home = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "tinyllm.cli", "corpus", "--home", str(home)],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for rep in range(args.reps):
            for label, (threads, ws) in configs.items():
                run = run_one(home, f"{label}-{rep}", args.steps, args.checkpoint_every, threads, ws)
                got[label].append(summarize(run, args.warmup))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in got.items()}
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"ddp bench: specs/tiny.json model, global batch 16 x 64 tokens, {args.steps} steps, "
        f"{os.cpu_count()} CPUs, load average {load_start:.1f} at start, {load_end:.1f} at end, reps {args.reps}"
    )
    for label, m in med.items():
        extra = f", all-reduce {m['allreduce_s'] * 1e3:.2f} ms/step" if "allreduce_s" in m else ""
        print(
            f"  {label:9s} {m['tokens_per_s']:9.0f} tokens/s  (step {m['step_s'] * 1e3:7.1f} ms{extra}; "
            f"checkpoint {m['ckpt_s'] * 1e3:6.1f} ms; process wall {m['wall_s']:.1f} s)"
        )
    w1, w2 = med["ddp-w1"], med["ddp-w2"]
    print(
        f"  scaling efficiency, 2 ranks vs 1 rank: {w2['tokens_per_s'] / (2 * w1['tokens_per_s']):.2f} "
        f"(tokens/s ratio {w2['tokens_per_s'] / w1['tokens_per_s']:.2f})"
    )
    print(f"  2 ranks x 1 thread vs 1 process x 2 threads: {w2['tokens_per_s'] / med['plain-2t']['tokens_per_s']:.2f}x")
    print(
        f"  1 rank vs plain 1 thread (the distributed machinery at W=1): "
        f"{w1['tokens_per_s'] / med['plain-1t']['tokens_per_s']:.2f}x"
    )
    print(
        f"  all-reduce share of a 2-rank step: {w2['allreduce_s'] / w2['step_s']:.1%}; "
        f"checkpoint at 2 ranks {w2['ckpt_s'] * 1e3:.1f} ms vs 1 rank {w1['ckpt_s'] * 1e3:.1f} ms"
    )
    print(MULTI_NODE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
