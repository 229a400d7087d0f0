"""The cost of tinyllm.durable in a user's loop: the example model, plain loop vs DurableRun, in one run.

1. steps/s of the plain loop (examples/plain_train.py's model, data and schedule);
2. steps/s of the same loop under DurableRun with no checkpoint due (per-step bookkeeping only:
   the metrics frame, the batch digest, timed progress lines) and with a checkpoint every 10 steps;
3. the ratios to the plain loop, and the mean time of one checkpoint (model, AdamW, LambdaLR,
   sampler, every RNG; atomic, fsynced, then LATEST).

Usage: python bench/durable_helper.py [--steps 400] [--hidden 256]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from plain_train import build, spirals  # noqa: E402
from tinyllm.durable import DurableRun, DurableSampler  # noqa: E402


def step(model, opt, sched, x, y, noise) -> torch.Tensor:
    x = x + 0.05 * torch.randn(x.shape, generator=noise)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss


def plain(cfg: dict, steps: int) -> float:
    torch.manual_seed(0)
    model, opt, sched = build(cfg)
    noise = torch.Generator().manual_seed(1)
    batches = itertools.chain.from_iterable(itertools.repeat(DataLoader(spirals(240, 0), batch_size=16, shuffle=True)))
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        step(model, opt, sched, x, y, noise)
    return time.perf_counter() - t0


def durable(cfg: dict, steps: int, every: int, home: Path) -> tuple[float, int]:
    spec = {"name": f"bench-{every}", "steps": steps, "checkpoint_every": every, "log_every": 10**9, "config": cfg}
    with contextlib.redirect_stdout(io.StringIO()):
        run = DurableRun(spec, home=home, progress=home / f"progress-{every}.jsonl")
        model, opt, sched = build(cfg)
        noise = torch.Generator().manual_seed(1)
        data = spirals(240, 0)
        sampler = DurableSampler(len(data), seed=0)
        run.track(model=model, optimizer=opt, scheduler=sched, data=sampler, generators={"noise": noise})
        batches = run.batches(DataLoader(data, batch_size=16, sampler=sampler))
        t0 = time.perf_counter()
        for _ in run.steps():
            x, y = batch = next(batches)
            run.log(step(model, opt, sched, x, y, noise), batch=batch)
        return time.perf_counter() - t0, run._saves


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = {"hidden": args.hidden, "dropout": 0.1, "lr": 0.01}
    base = plain(cfg, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        none_due, _ = durable(cfg, args.steps, 10**9, Path(tmp))
        with_ckpt, saves = durable(cfg, args.steps, 10, Path(tmp))
    per_ckpt = (with_ckpt - none_due) / saves
    print(f"model: MLP hidden {args.hidden}, {args.steps} steps, batch 16, 1 thread")
    print(f"plain loop                     {args.steps / base:8.1f} steps/s")
    print(f"DurableRun, no checkpoint due  {args.steps / none_due:8.1f} steps/s   ratio {none_due / base:.3f}")
    print(
        f"DurableRun, checkpoint every 10 {args.steps / with_ckpt:7.1f} steps/s   ratio {with_ckpt / base:.3f}"
        f"   ({saves} checkpoints, {per_ckpt * 1000:.1f} ms each)"
    )


if __name__ == "__main__":
    main()
