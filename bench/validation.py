"""Cost of train-time validation: fraction of training time at the default cadence, batch scaling.

Run: ``python bench/validation.py`` (CPU; about a minute). Prints, measured in this one run:
1. the same training run with validation off and on (objective lm, default every_steps=20 and
   batch_size=1, the shipped held-out text), alternating, best of REPEATS each: wall times and
   their ratio; validation's share of the validated run (sum of timer/validation_s / its wall)
   and one pass in training steps (both from one run, so robust to a shared machine's load);
   and whether every run's final loss and digest match bit for bit;
2. held-out lm throughput (target tokens/s) at validation batch sizes 1, 4, 16, and the
   generation objective's rollout throughput at the same batch sizes.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyllm import tokenizer  # noqa: E402
from tinyllm.corpus import build_corpus  # noqa: E402
from tinyllm.model import GPT  # noqa: E402
from tinyllm.spec import CorpusSpec, parse_train_spec  # noqa: E402
from tinyllm.trainer import Trainer  # noqa: E402
from tinyllm.validation_config import ValidationConfig  # noqa: E402
from tinyllm.validation.generation import evaluate_generation  # noqa: E402
from tinyllm.validation.isolation import isolated  # noqa: E402
from tinyllm.validation.lm import evaluate_lm  # noqa: E402
from tinyllm.validation.source import load_source  # noqa: E402

STEPS = 60
REPEATS = 2
MODEL = {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
SPEC = {
    "steps": STEPS,
    "seed": 7,
    "checkpoint_every": 1000,
    "batch_size": 16,
    "lr": 0.002,
    "warmup_steps": 10,
    "threads": 2,
    "log_every": 1000,
    "model": MODEL,
}
VAL = {"enabled": True, "data": {"path": "builtin:heldout.txt"}}  # defaults: every 20, batch 1


def train(home: Path, name: str, validation: dict | None) -> tuple[float, dict, list[dict]]:
    spec = parse_train_spec({**SPEC, "name": name, **({"validation": validation} if validation else {})})
    t0 = time.perf_counter()
    result = Trainer(spec, home, log=io.StringIO()).run()
    wall = time.perf_counter() - t0
    frames = [json.loads(line) for line in (home / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return wall, result, frames


def throughput(model, fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def training_cost() -> None:
    runs = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        build_corpus(CorpusSpec(), home)
        for i in range(REPEATS):  # alternate, so slow phases of a shared machine hit both alike
            runs["off"].append(train(home, f"off{i}", None))
            runs["on"].append(train(home, f"on{i}", VAL))
    off_s, off, _ = min(runs["off"], key=lambda r: r[0])
    on_s, on, frames = min(runs["on"], key=lambda r: r[0])
    val_s = sum(f.get("timer/validation_s", 0.0) for f in frames)
    step_s = statistics.median(f["timer/step_s"] for f in frames if "timer/step_s" in f)
    passes = sum("val/loss" in f for f in frames)
    same = all(
        (r[1]["final_loss_hex"], r[1]["digest"]) == (off["final_loss_hex"], off["digest"])
        for r in runs["off"] + runs["on"]
    )
    print(
        f"training {STEPS} steps (batch 16 x 64 tokens, 4x128 model), validation lm every 20 steps, batch 1 "
        f"(best of {REPEATS} alternating runs each):"
    )
    print(f"  wall, validation off: {off_s:7.2f} s   on: {on_s:7.2f} s   ratio on/off: {on_s / off_s:.3f}")
    print(f"  validation share of the validated run: {val_s:.2f} s / {on_s:.2f} s = {val_s / on_s:.1%}")
    print(
        f"  one validation pass ({passes} in all: steps 20, 40, 60): {val_s / passes:.3f} s"
        f" = {val_s / passes / step_s:.1f} training steps (median step {step_s * 1000:.1f} ms, same run)"
    )
    print(
        f"  final loss and digest bitwise equal in all {2 * REPEATS} runs, validation on or off: {same}"
        f" ({off['final_loss_hex']})"
    )


def batch_scaling() -> None:
    torch.manual_seed(0)
    model = GPT(parse_train_spec({**SPEC, "name": "x"}).model)
    home = Path(".")
    toks = tokenizer.encode(load_source(ValidationConfig(**VAL), home).text)
    gen_cfg = ValidationConfig(
        enabled=True,
        objective="generation",
        reward=["exact_match"],
        data={"path": "builtin:prompts.jsonl", "prompt_column": "question", "response_column": "answer"},
        sampling={"n_generation": 2, "max_tokens": 16},
    )
    prompts = load_source(gen_cfg, home).prompts
    print(
        "validation throughput by batch size (held-out lm: target tokens/s; generation: rollouts/s, up to 16 tokens;"
        " best of interleaved rounds):"
    )
    best_lm, best_gen = {}, {}
    with isolated(model):
        for rnd in range(5):  # round-robin over batch sizes: load spikes hit every size alike
            for b in (1, 4, 16):
                lm = throughput(
                    model, lambda: evaluate_lm(model, toks, block_size=64, batch_size=b)["val/token_count"], 1
                )
                best_lm[b] = max(best_lm.get(b, 0.0), lm)
                if rnd < 2:
                    gen = throughput(
                        model,
                        lambda: evaluate_generation(
                            model,
                            prompts,
                            block_size=64,
                            batch_size=b,
                            sampling=gen_cfg.sampling.resolved(),
                            rewards=["exact_match"],
                            seed=0,
                        )[0]["val/rollout_count"],
                        1,
                    )
                    best_gen[b] = max(best_gen.get(b, 0.0), gen)
    for b in (1, 4, 16):
        print(
            f"  batch {b:>2}: lm {best_lm[b]:9.0f} tok/s (x{best_lm[b] / best_lm[1]:.2f})"
            f"   generation {best_gen[b]:7.1f} rollouts/s (x{best_gen[b] / best_gen[1]:.2f})"
        )


def main() -> None:
    torch.set_num_threads(2)
    training_cost()
    batch_scaling()


if __name__ == "__main__":
    main()
