"""The cost of the HF Trainer and Lightning integrations, against the bare framework, in one run.

For each framework, the example's model and data (examples/hf_trainer_plain.py, examples/lightning_train_plain.py):

1. seconds per optimizer step of the bare framework (no checkpoints) and of the same training under
   the integration with no checkpoint due (per-step bookkeeping: the metrics frame, the batch digest,
   timed progress lines), measured between step ends after a warm-up, and their ratio;
2. the time of one checkpoint: the framework's own save, and the integration's mirror of it into the
   contract's layout (read back, written atomically with checksums and fsyncs, then LATEST).

Usage: python bench/integrations.py [--steps 60] [--only hf|lightning]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tinyllm.durable import DurableRun, DurableSampler  # noqa: E402

WARMUP = 5


def per_step(stamps: list[float]) -> float:
    s = stamps[WARMUP:]
    return (s[-1] - s[0]) / max(1, len(s) - 1)


def quiet():
    return contextlib.redirect_stdout(io.StringIO())


def hf(steps: int, every: int, home: Path) -> dict:
    import hf_trainer_plain as ex
    from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

    from tinyllm.integrations.hf import DurableTrainer

    cfg = {"n": 96, "length": 24, "vocab": 48, "batch_size": 8, "grad_accum": 2, "lr": 3e-3, "schedule_steps": steps}
    stamps: dict[str, list[float]] = {}

    class Clock(TrainerCallback):
        def __init__(self, key: str):
            self.key = key
            stamps[key] = []

        def on_step_end(self, args, state, control, **kw):
            stamps[self.key].append(time.perf_counter())

    def args_for(out: str, save: bool) -> TrainingArguments:
        return TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, learning_rate=3e-3, lr_scheduler_type="cosine",
                                 warmup_steps=3, save_strategy="steps" if save else "no", save_steps=every,
                                 logging_steps=10**6, seed=0, use_cpu=True, report_to="none", disable_tqdm=True)

    def data_model():
        set_seed(0)
        return ex.Counting(96, 24, 48, 0), ex.build(cfg)

    data, model = data_model()
    bare = Trainer(model=model, args=args_for(str(home / "bare"), False), train_dataset=data, callbacks=[Clock("bare")])
    with quiet():
        bare.train()
    # the framework's own save, timed around its checkpoint writer
    data, model = data_model()
    saver = Trainer(model=model, args=args_for(str(home / "own"), True), train_dataset=data)
    own: list[float] = []
    inner = saver._save_checkpoint

    def timed(*a, **kw):
        t0 = time.perf_counter()
        inner(*a, **kw)
        own.append(time.perf_counter() - t0)

    saver._save_checkpoint = timed
    with quiet():
        saver.train()
    out = {}
    for key, ckpt_every in (("durable", 10**6), ("durable+ckpt", every)):
        data, model = data_model()
        run = DurableRun({"name": f"hf-{key.replace('+', '-')}", "steps": steps, "checkpoint_every": ckpt_every,
                          "log_every": 10**6, "config": cfg}, home=home, progress=home / f"{key}.jsonl")
        t = DurableTrainer(run, model=model, args=args_for("ignored", False), train_dataset=data, callbacks=[Clock(key)])
        inner_d = t._save_checkpoint
        d_own: list[float] = []

        def timed_d(*a, _inner=inner_d, _acc=d_own, **kw):
            t0 = time.perf_counter()
            _inner(*a, **kw)
            _acc.append(time.perf_counter() - t0)

        t._save_checkpoint = timed_d
        with quiet():
            t.train()
        out[key] = (t.durable.save_seconds, d_own)
    return {"bare_s": per_step(stamps["bare"]), "durable_s": per_step(stamps["durable"]),
            "with_ckpt_s": per_step(stamps["durable+ckpt"]), "own_save_s": statistics.mean(own),
            "mirror_s": statistics.mean(out["durable+ckpt"][0])}


def lightning(steps: int, every: int, home: Path) -> dict:
    import lightning as L
    import lightning_train_plain as ex
    from torch.utils.data import DataLoader

    from tinyllm.integrations.lightning import DurableCallback, fit

    cfg = {"n": 240, "batch_size": 16, "hidden": 256, "dropout": 0.1, "lr": 0.01, "schedule_steps": steps}
    stamps: dict[str, list[float]] = {}

    class Clock(L.Callback):
        def __init__(self, key: str):
            self.key = key
            stamps[key] = []

        def on_train_batch_end(self, *a, **kw):
            stamps[self.key].append(time.perf_counter())

    def trainer(key: str, extra: list) -> L.Trainer:
        return L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock(key), *extra],
                         default_root_dir=str(home))

    L.seed_everything(0, verbose=False)
    data = ex.spirals(240, 0)
    t = trainer("bare", [])
    model = ex.Classifier(cfg)
    with quiet():
        t.fit(model, DataLoader(data, batch_size=16, shuffle=True))
    own = []
    for i in range(5):
        t0 = time.perf_counter()
        t.save_checkpoint(home / f"own-{i}.ckpt")
        own.append(time.perf_counter() - t0)
    mirrors = []
    for key, ckpt_every in (("durable", 10**6), ("durable+ckpt", every)):
        run = DurableRun({"name": f"l-{key.replace('+', '-')}", "steps": steps, "checkpoint_every": ckpt_every,
                          "log_every": 10**6, "config": cfg}, home=home, progress=home / f"l-{key}.jsonl")
        cb = DurableCallback(run)
        t = trainer(key, [cb])
        model = ex.Classifier(cfg)
        with quiet():
            fit(t, model, DataLoader(data, batch_size=16, sampler=DurableSampler(len(data), seed=0)))
        mirrors = cb.durable.save_seconds
    return {"bare_s": per_step(stamps["bare"]), "durable_s": per_step(stamps["durable"]),
            "with_ckpt_s": per_step(stamps["durable+ckpt"]), "own_save_s": statistics.mean(own),
            "mirror_s": statistics.mean(mirrors)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps in the checkpointing runs")
    p.add_argument("--only", choices=("hf", "lightning"), default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    out = sys.stdout
    rows = {}
    for name, fn in (("hf", hf), ("lightning", lightning)):
        if args.only in (None, name):
            with tempfile.TemporaryDirectory() as tmp:
                rows[name] = fn(args.steps, args.every, Path(tmp))
    print(f"{'framework':<10} {'bare ms/step':>13} {'durable ms/step':>16} {'ratio':>6} {'+ckpt every %d' % args.every:>16}"
          f" {'own save ms':>12} {'mirror ms':>10}", file=out)
    for name, r in rows.items():
        print(f"{name:<10} {r['bare_s'] * 1e3:>13.2f} {r['durable_s'] * 1e3:>16.2f} {r['durable_s'] / r['bare_s']:>6.2f}"
              f" {r['with_ckpt_s'] * 1e3:>16.2f} {r['own_save_s'] * 1e3:>12.1f} {r['mirror_s'] * 1e3:>10.1f}", file=out)


if __name__ == "__main__":
    main()
