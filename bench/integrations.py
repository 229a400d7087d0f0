"""The per-step cost of the durable helper and the HF / Lightning integrations, before and after, in one run.

For each trainer (``helper``: ``tinyllm.durable`` on a plain PyTorch loop; ``hf``: ``DurableTrainer``;
``lightning``: ``DurableCallback``), each step size (``8ms``: a 2-layer GPT-2 of width 64; ``50ms``: 4 layers of
width 256; both built from ``GPT2Config``, nothing downloaded) and ``log_every`` 1 and 10, with no checkpoint
due (``checkpoint_every`` past the end: bookkeeping only), it measures

- ``ratio``: seconds per step with us / without us (the bare framework or loop, same model, data, seed),
  the mean step after a warm-up, the median over ``--rounds`` interleaved rounds;
- ``ours ms``: the training thread's time inside our code per step (our hooks, timed exclusive of the
  framework's calls they wrap; the helper's ``run.steps()`` and ``run.log``).

``--before REF`` (default ``main``; ``none`` to skip) measures the same in a checkout of that git ref (a
``git archive`` into a temporary folder) in a second process, so the table shows before and after
side by side. Each process prints nothing but its JSON; the durable runs' stderr goes to a pipe the parent
drains, as under ``ctl``.

``--profile``: instead, one run of each trainer (this checkout, the first size, ``log_every`` 1) under
cProfile; prints the training thread's time in each of our functions per step (cProfile's own overhead
included: read the shares, not the sums).

Usage: python bench/integrations.py [--steps 40] [--rounds 3] [--only helper,hf,lightning] [--before main] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5
SIZES = {
    "8ms": {"n_layer": 2, "n_embd": 64, "n_head": 2, "length": 32, "batch": 8},
    "50ms": {"n_layer": 4, "n_embd": 256, "n_head": 4, "length": 64, "batch": 8},
}
VOCAB = 256


# -- the measured process -------------------------------------------------------------------------


class Meter:
    """Exclusive time of wrapped functions by owner ("ours" / "theirs"), on the calling thread."""

    def __init__(self) -> None:
        self.ours = 0.0
        self._stack: list[list] = []  # [owner, start, paused time]
        self._wrapped: set = set()

    def wrap(self, owner_cls: Any, name: str, owner: str) -> None:
        inner = owner_cls.__dict__.get(name)
        if inner is None or (owner_cls, name) in self._wrapped:
            return
        self._wrapped.add((owner_cls, name))
        meter = self

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()  # CPU time of this thread: a loaded machine's preemptions do not count
            meter._stack.append([owner, t0, 0.0])
            try:
                return inner(*a, **kw)
            finally:
                who, start, paused = meter._stack.pop()
                spent = time.thread_time() - start
                if who == "ours":
                    meter.ours += spent - paused
                if meter._stack:
                    meter._stack[-1][2] += spent

        setattr(owner_cls, name, timed)


METER = Meter()


def _gpt2(size: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    s = SIZES[size]
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB, n_positions=s["length"], n_embd=s["n_embd"], n_layer=s["n_layer"], n_head=s["n_head"]
        )
    )


class Tokens(__import__("torch").utils.data.Dataset):
    """Random token windows (fixed seed): ``input_ids`` and ``labels``."""

    def __init__(self, n: int, length: int):
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _spec(name: str, steps: int, log_every: int) -> dict:
    return {
        "name": name,
        "steps": steps,
        "checkpoint_every": 10**6,
        "log_every": log_every,
        "config": {"schedule_steps": steps},
    }


def stamp(stamps: list, ours: float = 0.0) -> None:
    """At a step's end: wall clock, the process's CPU time (all threads), our thread's CPU time so far."""
    stamps.append((time.perf_counter(), time.process_time(), ours))


def per_step(stamps: list) -> tuple[float, float, float]:
    """Mean (wall s, process CPU s, our CPU s) per step, after the warm-up, the last step left out (the
    final checkpoint)."""
    s = stamps[WARMUP:-1]
    n = max(1, len(s) - 1)
    return tuple((s[-1][i] - s[0][i]) / n for i in range(3))  # type: ignore[return-value]


def helper_run(size: str, steps: int, log_every: int | None, home: Path) -> tuple[float, float, float]:
    """(seconds per step, our seconds per step) of the plain loop (``log_every`` None) or under DurableRun."""
    import torch
    from torch.utils.data import DataLoader

    from tinyllm.durable import DurableRun, DurableSampler

    torch.manual_seed(0)
    model = _gpt2(size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (steps + 1))
    data = Tokens(512, SIZES[size]["length"])
    stamps: list = []

    def step(batch: dict) -> Any:
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        return loss

    if log_every is None:
        loader = DataLoader(data, batch_size=SIZES[size]["batch"], shuffle=True)
        it = iter(loader)
        for _ in range(steps):
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
            step(batch)
            stamp(stamps)
        return per_step(stamps)
    run = DurableRun(
        _spec(f"helper-{size}-{log_every}", steps, log_every),
        home=home,
        progress=home / f"helper-{size}-{log_every}.jsonl",
    )
    sampler = DurableSampler(len(data), seed=0)
    run.track(model=model, optimizer=opt, scheduler=sched, data=sampler)
    batches = run.batches(DataLoader(data, batch_size=SIZES[size]["batch"], sampler=sampler))
    ours = 0.0
    it = run.steps()
    with contextlib.redirect_stdout(io.StringIO()):
        while True:
            t0 = time.thread_time()
            try:
                next(it)  # the previous step's bookkeeping (the first call: the set-up)
            except StopIteration:
                break
            ours += time.thread_time() - t0
            stamp(stamps, ours)
            batch = next(batches)
            loss = step(batch)
            t0 = time.thread_time()
            run.log(loss, batch=batch)
            ours += time.thread_time() - t0
    return per_step(stamps)


def hf_run(size: str, steps: int, log_every: int | None, home: Path) -> tuple[float, float, float]:
    from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

    stamps: list = []

    class Clock(TrainerCallback):  # called before our callback's on_step_end
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stamp(stamps, METER.ours)

    set_seed(0)
    model, data = _gpt2(size), Tokens(512, SIZES[size]["length"])
    args = TrainingArguments(
        output_dir=str(home / "hf-bare"),
        max_steps=steps,
        per_device_train_batch_size=SIZES[size]["batch"],
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="no",
        logging_steps=10**6,
        seed=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    meter = METER
    meter.ours = 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        if log_every is None:
            Trainer(model=model, args=args, train_dataset=data, callbacks=[Clock()]).train()
            return per_step(stamps)
        from tinyllm.durable import DurableRun
        from tinyllm.integrations import hf as integ

        meter.wrap(integ._ContractCallback, "on_step_begin", "ours")
        meter.wrap(integ._ContractCallback, "on_step_end", "ours")
        meter.wrap(integ.DurableTrainer, "training_step", "ours")
        meter.wrap(Trainer, "training_step", "theirs")
        run = DurableRun(
            _spec(f"hf-{size}-{log_every}", steps, log_every), home=home, progress=home / f"hf-{size}-{log_every}.jsonl"
        )
        t = integ.DurableTrainer(run, model=model, args=args, train_dataset=data, callbacks=[Clock()])
        t.train()
    return per_step(stamps)


def lightning_run(size: str, steps: int, log_every: int | None, home: Path) -> tuple[float, float, float]:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    stamps: list = []

    class Clock(L.Callback):  # called before our callback's on_train_batch_end
        def on_train_batch_end(self, *a: Any, **kw: Any) -> None:
            stamp(stamps, METER.ours)

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2(size)

        def training_step(self, batch: dict, batch_idx: int) -> Any:
            return self.model(**batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.seed_everything(0, verbose=False)
    data = Tokens(512, SIZES[size]["length"])
    module = LM()
    meter = METER
    meter.ours = 0.0
    kw = {
        "max_steps": steps,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(home),
    }
    with contextlib.redirect_stdout(io.StringIO()):
        if log_every is None:
            L.Trainer(callbacks=[Clock()], **kw).fit(
                module, DataLoader(data, batch_size=SIZES[size]["batch"], shuffle=True)
            )
            return per_step(stamps)
        from tinyllm.durable import DurableRun, DurableSampler
        from tinyllm.integrations import lightning as integ

        for hook in (
            "on_train_batch_start",
            "on_train_batch_end",
            "on_train_epoch_start",
            "on_before_backward",
            "on_before_optimizer_step",
        ):
            meter.wrap(integ.DurableCallback, hook, "ours")
        run = DurableRun(
            _spec(f"l-{size}-{log_every}", steps, log_every), home=home, progress=home / f"l-{size}-{log_every}.jsonl"
        )
        with contextlib.suppress(SystemExit):
            integ.fit(
                L.Trainer(callbacks=[Clock(), integ.DurableCallback(run)], **kw),
                module,
                DataLoader(data, batch_size=SIZES[size]["batch"], sampler=DurableSampler(len(data), seed=0)),
            )
        sys.stdout = sys.__stdout__  # finish() points stdout at stderr after the result line
    return per_step(stamps)


RUNS: dict[str, Callable[..., tuple[float, float, float]]] = {
    "helper": helper_run,
    "hf": hf_run,
    "lightning": lightning_run,
}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for name in args.only.split(","):
                for size in args.sizes.split(","):
                    for log_every in (None, 1, 10):
                        home = Path(tmp) / f"r{rnd}-{name}-{size}-{log_every}"
                        home.mkdir()
                        step_s, cpu_s, ours_s = RUNS[name](size, args.steps, log_every, home)
                        row = out.setdefault(f"{name}|{size}|{log_every}", {"step_s": [], "cpu_s": [], "ours_s": []})
                        row["step_s"].append(step_s)
                        row["cpu_s"].append(cpu_s)
                        row["ours_s"].append(ours_s)
    print(json.dumps(out), file=sys.__stdout__)


def profile(args: argparse.Namespace) -> None:
    import cProfile
    import pstats

    import torch

    torch.set_num_threads(1)
    size = args.sizes.split(",")[0]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            RUNS[name](size, 8, 1, Path(tmp) / f"warm-{name}")  # imports and first-time costs out of the profile
            prof = cProfile.Profile(
                time.thread_time
            )  # this thread's CPU time: preemptions by a loaded machine do not count
            prof.enable()
            RUNS[name](size, args.steps, 1, Path(tmp) / name)
            prof.disable()
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            rows = sorted(
                (
                    (tt, cc, f"{Path(fn).name}:{line}({func})")
                    for (fn, line, func), (cc, _, tt, _, _) in stats.items()
                    if "/tinyllm/" in fn
                ),
                reverse=True,
            )  # cc: calls, not recursions
            steady = [r for r in rows if r[1] >= args.steps]  # called every step (or more)
            once = sum(r[0] for r in rows if r[1] < args.steps)  # start line, resume, the final checkpoint
            print(
                f"{name} ({size}, log_every 1, {args.steps} steps): our functions called every step, own time "
                f"per step (us); the rest (set-up, start line, final checkpoint): {once * 1e3:.1f} ms in all"
            )
            for tt, nc, where in steady[:10]:
                print(f"  {tt / args.steps * 1e6:>8.1f}  {nc:>6} calls  {where}")
            print(f"  {sum(r[0] for r in steady) / args.steps * 1e6:>8.1f}  in all", flush=True)


# -- the parent: before and after, one table --------------------------------------------------------


def measure(tree: Path, args: argparse.Namespace) -> dict:
    """One round of every configuration in a process whose ``tinyllm`` is ``tree``'s."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--steps",
        str(args.steps),
        "--rounds",
        "1",
        "--only",
        args.only,
        "--sizes",
        args.sizes,
    ]
    proc = subprocess.run(cmd, check=False, env=env, cwd=str(tree), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench worker for {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkout(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="helper,hf,lightning")
    p.add_argument("--sizes", default="8ms,50ms")
    p.add_argument("--before", default="main", help="git ref measured as 'before' (none: skip)")
    p.add_argument("--profile", action="store_true", help="cProfile our functions (this checkout) instead")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.profile:
        profile(args)
        return
    trees = {"after": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before != "none":
            trees = {"before": checkout(args.before, Path(tmp)), "after": ROOT}
        results: dict[str, dict] = {label: {} for label in trees}
        for _ in range(args.rounds):  # before and after alternate, round by round: a load that comes and goes hits both
            for label, tree in trees.items():
                for key, row in measure(tree, args).items():
                    got = results[label].setdefault(key, {"step_s": [], "cpu_s": [], "ours_s": []})
                    for k in got:
                        got[k].extend(row[k])
    print(
        f"steps {args.steps} a run (warm-up {WARMUP}), rounds {args.rounds} (before and after alternating), torch "
        "threads 1; median over rounds.\n"
        "ratio: with us / without us per step, wall clock (cpu: the process's CPU time, all threads: steadier on\n"
        "a loaded machine); ours: the training thread's CPU time in our code per step, in microseconds"
    )
    head = f"{'trainer':<9} {'step':>4} {'log':>3}"
    for label in trees:
        head += f" | {label:<6} {'bare ms':>7} {'ms':>7} {'ratio':>6} {'cpu':>6} {'ours us':>8}"
    print(head)
    first = results[next(iter(trees))]
    for key in first:
        name, size, log_every = key.split("|")
        if log_every == "None":
            continue
        line = f"{name:<9} {size:>4} {log_every:>3}"
        for label in trees:
            r, base = results[label], results[label][f"{name}|{size}|None"]
            ratio = statistics.median(d / b for d, b in zip(r[key]["step_s"], base["step_s"]))
            cpu = statistics.median(d / b for d, b in zip(r[key]["cpu_s"], base["cpu_s"]))
            line += (
                f" | {'':<6} {statistics.median(base['step_s']) * 1e3:>7.2f}"
                f" {statistics.median(r[key]['step_s']) * 1e3:>7.2f} {ratio:>6.3f} {cpu:>6.3f}"
                f" {statistics.median(r[key]['ours_s']) * 1e6:>8.1f}"
            )
        print(line)


if __name__ == "__main__":
    main()
