"""Where a training step's CPU time goes, phase by phase, at 1 thread (``bench/train.py --only phases``).

tinyllm's step is taken apart into the calls ``Trainer.train_step`` makes (the same objects: the
trainer's model, optimizer, data stream, reporter and liveness), each phase timed by this process's
CPU time; beside it, with ``--nanogpt DIR``, nanoGPT's ``model.py`` GPT through nanoGPT's
``train.py`` loop body (its ``get_batch``, AdamW as its ``configure_optimizers`` builds it on CPU,
``clip_grad_norm_``), alternating step by step in one process so that machine load hits both alike.
The real ``Trainer.train_step`` (+ its report) is timed alternately too: the phases' sum should match it.
nanoGPT runs twice: at its data's vocabulary (meta.pkl's, 68 characters here, as its ``train.py``) and at
tinyllm's byte-level 256.
Figures are medians per step; 1 thread (no OpenMP worker to wait for) by CPU time; with
TINYLLM_THREADS=N (N > 1) by wall time, the policy from the environment or tinyllm's choice.

Usage: python bench/train_phases.py HOME [--steps 40] [--nanogpt DIR]   (HOME with corpora/default)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

THREADS = int(os.environ.get("TINYLLM_THREADS", "1"))  # bench/train.py --only phases: 1
os.environ["TINYLLM_THREADS"] = str(THREADS)
# CPU time at 1 thread; at more, wall time (a spinning OpenMP worker's CPU time is not the step's work)
CLOCK = time.process_time if THREADS == 1 else time.perf_counter
sys.dont_write_bytecode = True  # nothing written into a nanoGPT checkout
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tinyllm import runtime_env  # noqa: E402

runtime_env.prepare(THREADS)  # before torch, as the CLI

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import RECIPE, WARMUP_STEPS  # noqa: E402  (bench/train.py)
from tinyllm.sinks.metrics import default_reporter  # noqa: E402
from tinyllm.spec import parse_train_spec  # noqa: E402
from tinyllm.runtime_env import optimizer_step  # noqa: E402
from tinyllm.trainer import Trainer, lr_at  # noqa: E402


class Phases:
    def __init__(self):
        self.times: dict[str, list[float]] = {}
        self.t = 0.0

    def start(self) -> None:
        self.t = CLOCK()

    def lap(self, name: str) -> None:
        now = CLOCK()
        self.times.setdefault(name, []).append(now - self.t)
        self.t = now

    def medians_ms(self) -> dict[str, float]:
        return {k: 1000 * statistics.median(v[WARMUP_STEPS:]) for k, v in self.times.items()}


def tinyllm_parts(home: Path, steps: int):
    spec = parse_train_spec(dict(RECIPE, threads=THREADS, steps=10**6, name=f"phases-{os.getpid()}"))
    tr = Trainer(spec, home)
    tr._lock()
    tr._build()
    tr._resume()
    tr.last_saved, tr.last_path = 0, None
    tr.reporter = default_reporter(tr.run_dir, -1, 10**9, 10**6)
    tr.model.train()
    ph = Phases()

    def phased() -> None:  # Trainer.train_step's calls (one micro-batch, as the recipe), each timed
        ph.start()
        tr._liveness()
        ph.lap("liveness")
        lr = lr_at(tr.step, spec)
        for group in tr.optimizer.param_groups:
            group["lr"] = lr
        ph.lap("lr")
        x, y = tr.shard(*tr.data.batch(tr.cursor))
        tr.cursor += 1
        ph.lap("batch")
        _, loss = tr.model(x, y)
        ph.lap("forward+loss")
        (loss / 1).backward()
        ph.lap("backward")
        loss_f = loss.item()
        ph.lap("loss.item")
        grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), spec.grad_clip).item()
        ph.lap("clip_grad_norm_")
        optimizer_step(tr.optimizer)
        ph.lap("optimizer")
        tr.optimizer.zero_grad(set_to_none=True)
        ph.lap("zero_grad")
        tr.step += 1
        frame = {
            "train/loss": loss_f,
            "train/tokens": tr.cursor,
            "optim/lr": lr,
            "optim/grad_norm": grad_norm,
            "timer/step_s": 0.04,
            "timer/tokens_per_s": 1.0,
        }
        for sink in tr.reporter.sinks:  # what Reporter.report does, one sink at a time
            sink.write(tr.step, frame)
            ph.lap(f"report: {sink.name}")

    real_times: list[float] = []

    def real() -> None:
        t0 = CLOCK()
        tr._liveness()
        frame = tr.train_step()
        tr.reporter.report(tr.step, frame)
        real_times.append(CLOCK() - t0)

    return ph, phased, real, real_times, tr


def nanogpt_parts(nanogpt: Path, vocab_size: int):
    """nanoGPT's GPT as its train.py builds it for the recipe (bias False, its defaults), ``vocab_size`` tokens."""
    if str(nanogpt) not in sys.path:
        sys.path.insert(0, str(nanogpt))
    import model as ng  # nanoGPT's model.py

    m = RECIPE["model"]
    torch.manual_seed(1337)
    model = ng.GPT(
        ng.GPTConfig(
            block_size=m["block_size"],
            vocab_size=vocab_size,
            n_layer=m["n_layer"],
            n_head=m["n_head"],
            n_embd=m["n_embd"],
            dropout=0.0,
            bias=False,
        )
    )
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    model.train()
    data_dir = nanogpt / "data" / "shakespeare_char"
    B, T = RECIPE["batch_size"], m["block_size"]

    def get_batch():  # nanoGPT train.py's, for device cpu
        data = np.memmap(data_dir / "train.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([torch.from_numpy((data[i : i + T]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + T]).astype(np.int64)) for i in ix])
        return x, y

    ph = Phases()
    state = {"xy": get_batch(), "it": 0}

    def phased() -> None:
        ph.start()
        for group in opt.param_groups:
            group["lr"] = 1e-3
        ph.lap("lr")
        _, loss = model(*state["xy"])
        ph.lap("forward+loss")
        state["xy"] = get_batch()
        ph.lap("batch")
        loss.backward()
        ph.lap("backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ph.lap("clip_grad_norm_")
        opt.step()
        ph.lap("optimizer")
        opt.zero_grad(set_to_none=True)
        ph.lap("zero_grad")
        loss.item()
        ph.lap("loss.item")

    return ph, phased


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nanogpt", default=None)
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    ours, ours_step, real_step, real_times, tr = tinyllm_parts(Path(args.home), args.steps)
    runs = [ours_step, real_step]
    theirs = {}
    if args.nanogpt:
        import pickle

        meta = pickle.loads((Path(args.nanogpt) / "data" / "shakespeare_char" / "meta.pkl").read_bytes())
        # train.py's model has the character vocabulary of its data (68 here); tinyllm's is bytes (256), so
        # nanoGPT at 256 is the same work as tinyllm's step (larger embedding, head and softmax)
        for vocab in (int(meta["vocab_size"]), tinyllm_vocab(tr)):
            theirs[vocab], their_step = nanogpt_parts(Path(args.nanogpt), vocab)
            runs.append(their_step)
    for i in range(args.steps + WARMUP_STEPS):
        for run in runs if i % 2 == 0 else runs[::-1]:
            run()
    tr.lock_file.close()
    real_ms = 1000 * statistics.median(real_times[WARMUP_STEPS:])
    print(
        json.dumps(
            {
                "threads": THREADS,
                "clock": CLOCK.__name__,
                "tinyllm": ours.medians_ms(),
                "tinyllm_real_step_ms": real_ms,
                "nanogpt": {v: ph.medians_ms() for v, ph in theirs.items()},
            }
        )
    )


def tinyllm_vocab(tr) -> int:
    return int(tr.spec.model.vocab_size)


if __name__ == "__main__":
    main()
