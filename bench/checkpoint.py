"""What a checkpoint costs the training thread: synchronous writes against asynchronous ones, in one run.

For GPT models (tinyllm's GPT, AdamW with its moments, as ``Trainer.components()`` saves them) of
about 1M and 25M parameters (85M, about 1 GB with AdamW, with ``--big``), each case prints:

- ``copy``: the in-memory snapshot alone (tinyllm/checkpoint_writer.py ``snapshot``: every tensor
  copied, storage sharing kept) -- the floor of what an asynchronous checkpoint can stall;
- ``sync stall``: ``checkpoint.save_checkpoint`` on the training thread (serialize, write, fsync,
  rename, ``LATEST``): training stops for all of it, as before issue 42;
- ``async stall``: what the training thread waits for with the writer (snapshot + hand-off to the
  writer thread); the persist runs beside training (``persist``: its wall time there);
- ``overlap``: the extra time of the training steps that ran while the persist was in flight (their
  time minus as many steps without a checkpoint): the writer's share of 2 cores, not a stall;
- the ratios ``async/copy`` (aim <= 1.5) and ``sync/async``.

Every figure is the median of ``--repeats`` checkpoints (three times as many for 1M); the files land in a temporary folder on the
disk of ``--dir`` (default: the system's temporary folder). With ``--dcp`` it also times
``torch.distributed.checkpoint.async_save`` of the same state (its stall and its total).

Usage: python bench/checkpoint.py [--big] [--repeats 3] [--dir PATH] [--dcp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from tinyllm import checkpoint as ckpt
from tinyllm.checkpoint_writer import CheckpointWriter, snapshot
from tinyllm.model import GPT
from tinyllm.runtime_env import defer_dynamo_in_optimizers, optimizer_step
from tinyllm.spec import ModelConfig

# name -> (n_layer, n_embd); vocabulary 256 (bytes), block 64: parameters ~ 12 * n_layer * n_embd^2
SIZES = {"1M": (5, 128), "25M": (8, 512), "85M": (12, 768)}


def build(n_layer: int, n_embd: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    cfg = ModelConfig(
        block_size=64, n_layer=n_layer, n_head=max(1, n_embd // 64), n_embd=n_embd, vocab_size=256, dropout=0.0
    )
    model = GPT(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-3, foreach=True
    )
    return model, opt


def train_step(model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    _, loss = model(x, x)
    loss.backward()
    optimizer_step(opt)
    opt.zero_grad(set_to_none=True)


def components(model: GPT, opt: torch.optim.Optimizer, step: int) -> dict:
    state = {"step": step, "cursor": step, "torch_rng": torch.get_rng_state(), "loss": 1.0, "loss_hex": (1.0).hex()}
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "training_state": state}


def nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def case(name: str, repeats: int, folder: Path, dcp: bool) -> dict:
    n_layer, n_embd = SIZES[name]
    model, opt = build(n_layer, n_embd)
    x = torch.randint(0, 256, (1, 64))
    for _ in range(2):  # AdamW's moments exist, as in any checkpoint after step 1
        train_step(model, opt, x)
    t0 = time.perf_counter()
    for _ in range(3):
        train_step(model, opt, x)
    step_s = (time.perf_counter() - t0) / 3
    run_dir = folder / f"run-{name}"
    meta = {"name": name}
    copies, syncs, stalls, persists, overlaps = [], [], [], [], []
    size = nbytes(components(model, opt, 0))
    if name == "1M":
        repeats *= 3  # milliseconds: more of them against the noise
    for i in range(repeats):  # each timer includes building the components (the trainer pays it either way)
        t0 = time.perf_counter()
        snap = snapshot(components(model, opt, i))
        copies.append(time.perf_counter() - t0)
        del snap
        t0 = time.perf_counter()
        ckpt.save_checkpoint(run_dir, 2 * i + 1, components(model, opt, i), meta)
        syncs.append(time.perf_counter() - t0)
        writer = CheckpointWriter(asynchronous=True)
        t0 = time.perf_counter()
        comps = snapshot(components(model, opt, i))
        step = 2 * i + 2

        def persist(c: dict = comps, s: int = step) -> Path:
            return ckpt.save_checkpoint(run_dir, s, c, meta)

        writer.submit(persist, step)
        stalls.append(time.perf_counter() - t0)
        steps, t1 = 0, time.perf_counter()
        while writer.poll() is None:  # training goes on while the persist runs
            train_step(model, opt, x)
            steps += 1
        persists.append(time.perf_counter() - t0)
        overlaps.append(max(0.0, (time.perf_counter() - t1) - steps * step_s))
        del comps
        for old in ckpt.list_step_dirs(run_dir / "ckpt")[1:]:
            shutil.rmtree(old)
    out = {
        "name": name,
        "params": sum(p.numel() for p in model.parameters()),
        "bytes": size,
        "step_s": step_s,
        "copy": median(copies),
        "sync": median(syncs),
        "async": median(stalls),
        "persist": median(persists),
        "overlap": median(overlaps),
    }
    if dcp:
        out.update(dcp_case(model, opt, folder / f"dcp-{name}", repeats))
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def dcp_case(model: GPT, opt: torch.optim.Optimizer, folder: Path, repeats: int) -> dict:
    """``torch.distributed.checkpoint.async_save`` of the same state (one process, no process group):
    its stall (until it returns a future) and its total (until the future is done)."""
    import torch.distributed.checkpoint as dcp

    stalls, totals = [], []
    for i in range(repeats):
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        t0 = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=str(folder / f"step-{i}"))
        stalls.append(time.perf_counter() - t0)
        assert isinstance(future, Future)  # (the thread checkpointer's answer)
        future.result()
        totals.append(time.perf_counter() - t0)
    shutil.rmtree(folder, ignore_errors=True)
    return {"dcp_stall": median(stalls), "dcp_total": median(totals)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", action="store_true", help="also the 85M model (about 1 GB with AdamW; minutes)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="folder on the disk to write to (default: the temporary folder)")
    p.add_argument("--dcp", action="store_true", help="also torch.distributed.checkpoint.async_save")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training thread")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    defer_dynamo_in_optimizers()
    names = ["1M", "25M"] + (["85M"] if args.big else [])
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start, "
        f"torch threads {args.threads}, repeats {args.repeats} (medians)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-ckpt-") as tmp:
        for name in names:
            r = case(name, args.repeats, Path(tmp), args.dcp)
            line = (
                f"{r['name']:>4}: {r['params'] / 1e6:6.1f}M params, {r['bytes'] / 2**20:7.1f} MiB  step {r['step_s'] * 1e3:7.1f} ms | "
                f"copy {r['copy']:.3f} s | sync stall {r['sync']:.3f} s | async stall {r['async']:.3f} s "
                f"(persist {r['persist']:.3f} s beside training, overlap {r['overlap']:.3f} s) | "
                f"async/copy {r['async'] / r['copy']:.2f}x, sync/async {r['sync'] / r['async']:.1f}x"
            )
            if "dcp_stall" in r:
                line += f" | dcp.async_save stall {r['dcp_stall']:.3f} s, total {r['dcp_total']:.3f} s"
            print(line, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at end", flush=True)


if __name__ == "__main__":
    main()
