"""Benchmark tinyllm's trainer; prints figures and ratios measured in this one run.

1. tokens/s of tinyllm's Trainer vs a plain PyTorch loop (same GPT, batch, threads), alternated
   ``--reps`` times, medians compared;
2. checkpoint save time as a fraction of training time, for specs/tiny.json at its cadence;
3. checkpoint size in bytes per parameter;
4. resume time: process start (Popen) to the first step's metrics frame, fresh and resumed.

Usage: python bench/train.py [--spec specs/tiny.json] [--steps 60] [--reps 3]
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

import tinyllm  # noqa: F401  (before torch: sets OMP_WAIT_POLICY=PASSIVE as the CLI does)
import numpy as np
import torch

from tinyllm.corpus import build_corpus, open_corpus
from tinyllm.metrics import default_reporter
from tinyllm.model import GPT
from tinyllm.spec import CorpusSpec, TrainSpec, load_train_spec
from tinyllm.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


class TimedTrainer(Trainer):
    """The real trainer; only adds a stopwatch around checkpoint saves."""

    save_s = 0.0

    def save(self):
        t0 = time.perf_counter()
        path = super().save()
        self.save_s += time.perf_counter() - t0
        return path


def plain_loop(spec: TrainSpec, tokens: np.ndarray, steps: int) -> float:
    """A plain PyTorch training loop of the same model and batch; returns tokens/s."""
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    cfg = spec.model
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(spec.beta1, spec.beta2),
                            weight_decay=spec.weight_decay, foreach=False)
    data = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    T, B = cfg.block_size, spec.batch_size
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    return steps * B * T / (time.perf_counter() - t0)


def tinyllm_loop(spec: TrainSpec, home: Path, steps: int, run_name: str) -> float:
    """tinyllm's Trainer (metrics sinks on, checkpoint only at the end, not timed); tokens/s."""
    s = spec.model_copy(update={"name": run_name, "steps": steps, "checkpoint_every": 10**6, "log_every": 10**6})
    trainer = TimedTrainer(s, home)
    t0 = time.perf_counter()
    trainer.run()
    elapsed = time.perf_counter() - t0 - trainer.save_s
    return steps * s.batch_size * s.model.block_size / elapsed


def first_step_latency(home: Path, spec_file: Path) -> tuple[float, int]:
    """Seconds from Popen to the first new metrics frame of a `tinyllm train` process; its step."""
    spec = load_train_spec(spec_file)
    metrics = home / "runs" / spec.name / "metrics.jsonl"
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec_file), "--home", str(home)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.communicate(timeout=600)
    frames = [json.loads(line) for line in metrics.read_text().splitlines()]
    new = [f for f in frames if f["time"] >= t0]
    return new[0]["time"] - t0, new[0]["step"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(REPO / "specs" / "tiny.json"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # figures appear as they are measured
    spec = load_train_spec(args.spec)
    home = Path(tempfile.mkdtemp(prefix="tinyllm-bench-"))
    build_corpus(CorpusSpec(name=spec.corpus), home)
    tokens, _ = open_corpus(home, spec.corpus)
    print(f"bench: OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, spec {args.spec}, threads {spec.threads}, batch {spec.batch_size}x{spec.model.block_size}, "
          f"home {home}, load {open('/proc/loadavg').read().split()[0]}")

    plain, ours = [], []
    for rep in range(args.reps):  # alternate, so machine load hits both alike
        plain.append(plain_loop(spec, tokens, args.steps))
        ours.append(tinyllm_loop(spec, home, args.steps, f"bench-{rep}"))
    p, o = statistics.median(plain), statistics.median(ours)
    print(f"throughput: plain loop {p:,.0f} tok/s, tinyllm {o:,.0f} tok/s, ratio {o / p:.3f} "
          f"(median of {args.reps}, {args.steps} steps each; aim >= 0.95)")

    trainer = TimedTrainer(spec, home)
    t0 = time.perf_counter()
    result = trainer.run(reporter=default_reporter(trainer.run_dir, 0, spec.steps, 10**6))
    total = time.perf_counter() - t0
    n_ckpt = len(list((home / "runs" / spec.name / "ckpt").glob("step-*")))
    print(f"checkpointing: {n_ckpt} checkpoints in {total:.1f} s of training ({spec.steps} steps, every "
          f"{spec.checkpoint_every}): {trainer.save_s:.2f} s = {100 * trainer.save_s / total:.2f}% (aim <= 3%)")

    ckpt_dir = home / result["checkpoint"]
    size = sum(f.stat().st_size for f in ckpt_dir.iterdir())
    n_params = GPT(spec.model).num_params()
    print(f"checkpoint size: {size:,} bytes for {n_params:,} parameters = {size / n_params:.2f} bytes/parameter "
          f"(fp32 weights + 2 AdamW moments = 12)")

    fresh_spec = home / "fresh.json"
    fresh_spec.write_text(spec.model_copy(update={"name": "bench-fresh", "steps": 5}).model_dump_json())
    fresh_s, _ = first_step_latency(home, fresh_spec)
    resume_spec = home / "resume.json"
    resume_spec.write_text(spec.model_copy(update={"steps": spec.steps + 5}).model_dump_json())
    resume_s, step = first_step_latency(home, resume_spec)
    print(f"start-up: process start to first step {fresh_s:.2f} s fresh, {resume_s:.2f} s resumed "
          f"(from step {step - 1}, verifying and loading the checkpoint)")


if __name__ == "__main__":
    main()
