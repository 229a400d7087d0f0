"""Post-training demo and throughput: base -> teacher -> DPO, GRPO, OPD, measured in one run.

In a fresh home (``--home``, default a temporary directory) holding a copy of ``specs/``, runs
``tinyllm corpus`` of specs/posttrain-corpus.json and posttrain-teacher-corpus.json, then
``tinyllm train`` (in process, the same Trainer as the CLI) of specs/posttrain-base.json and
posttrain-teacher.json, then dpo.json,
grpo.json and opd.json once per ``--seeds`` seed (the spec's seed replaced; runs ``<name>-s<seed>``),
and prints from each run's metrics.jsonl:

- the held-out figures before (model step 0 = the init_from model) and after (the final step):
  DPO val/accuracy and val/reward_margin, GRPO/OPD val/reward_avg (exact match), with the paired
  standard error of the GRPO/OPD gain over the held-out prompts (the validation's own rollouts,
  recomputed from the step-0 and final checkpoints: each prompt's mean reward after minus before);
- the teacher's and the base's held-out exact match under the same validation sampling;
- throughput: DPO tokens/s, GRPO/OPD rollouts/s and updates/s (over training-step time);
- the share of wall time in rollout, reference scoring, teacher scoring and validation.

It first prints the CPU code paths the run takes (torch's ATen capability, ``ATEN_CPU_CAPABILITY``,
MKL's ``MKL_CBWR`` branch and strict mode): the base's trajectory, so every figure, depends on them.

Usage: python bench/posttrain.py [--home DIR] [--seeds 1,2] [--base-seed N] [--reuse] [--steps-scale 0.25]
(--reuse keeps a finished base/teacher in --home; --base-seed replaces posttrain-base's seed, another
base trajectory; scale < 1: a quicker smoke run). Other code paths on one machine, e.g.
``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE,STRICT python bench/posttrain.py`` (docs/posttrain.md).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyllm.corpus import build_corpus  # noqa: E402
from tinyllm.spec import load_corpus_spec, parse_train_spec  # noqa: E402
from tinyllm.trainer import Trainer  # noqa: E402
from tinyllm.posttrain_data import load_prompts  # noqa: E402
from tinyllm.objectives.init import load_frozen  # noqa: E402
from tinyllm.validation.generation import evaluate_generation  # noqa: E402

CORPORA = ["posttrain-corpus.json", "posttrain-teacher-corpus.json"]  # noisy (base), clean (teacher)
PRETRAIN = ["posttrain-base", "posttrain-teacher"]
POSTTRAIN = ["dpo", "grpo", "opd"]


def frames(home: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (home / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def load_raw(home: Path, name: str) -> dict:
    return json.loads((home / "specs" / f"{name}.json").read_text())


def train(home: Path, raw: dict, scale: float) -> float:
    raw = json.loads(json.dumps(raw))
    if scale != 1.0:
        raw["steps"] = max(1, int(raw["steps"] * scale))
        if raw.get("validation"):
            raw["validation"]["every_steps"] = 0  # before and after only
    t0 = time.perf_counter()
    Trainer(parse_train_spec(raw), home, log=io.StringIO()).run()
    return time.perf_counter() - t0


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summary(home: Path, name: str, kind: str, wall_s: float) -> dict:
    fs = frames(home, name)
    val = [f for f in fs if any(k.startswith("val/") for k in f)]
    train_fs = [f for f in fs if "timer/step_s" in f]
    step_s = sum(f["timer/step_s"] for f in train_fs)
    out = {
        "run": name,
        "kind": kind,
        "wall_s": wall_s,
        "steps": len(train_fs),
        "step_s": step_s,
        "before": val[0] if val else {},
        "after": val[-1] if val else {},
    }
    for t in ("rollout", "ref", "teacher"):
        out[f"{t}_s"] = sum(f.get(f"timer/{t}_s", 0.0) for f in fs)
    out["validation_s"] = sum(f.get("timer/validation_s", 0.0) for f in val)
    key = {"dpo": "train/accuracy", "grpo": "train/reward_mean", "opd": "train/teacher_kl"}.get(kind)
    if key:
        xs = [f[key] for f in train_fs if key in f]
        out["train_key"], out["train_first"], out["train_last"] = key, mean(xs[:10]), mean(xs[-10:])
    if kind == "dpo":
        out["tokens_per_s"] = sum(f["timer/tokens_per_s"] * f["timer/step_s"] for f in train_fs) / step_s
    if kind in ("grpo", "opd"):
        out["rollouts_per_s"] = sum(f["rollout/count"] for f in train_fs) / step_s
        out["updates_per_s"] = (train_fs[-1]["train/model_step"] if train_fs else 0) / step_s
    return out


def heldout_rewards(home: Path, raw: dict, checkpoint: str) -> list[float]:
    """Each held-out prompt's mean reward for ``checkpoint`` under ``raw``'s validation (same seeds)."""
    spec = parse_train_spec(raw)
    v = spec.validation
    sampling = v.sampling.resolved()
    if v.sampling.max_tokens is None:  # inherits the training rollouts' limit, as in the trainer
        sampling["max_tokens"] = spec.rl.sampling.max_tokens
    prompts = load_prompts(
        v.data.path,
        home,
        v.data.prompt_column,
        v.data.response_column,
        spec.model.block_size,
        sampling["max_tokens"],
        "validation.data",
    ).rows  # [{"prompt", "response"}]
    frozen = load_frozen(checkpoint, home, "checkpoint")
    _, rollouts = evaluate_generation(
        frozen.frozen_model(),
        prompts,
        block_size=frozen.config.block_size,
        batch_size=v.batch_size,
        sampling=sampling,
        rewards=list(v.reward) or list(spec.rl.reward),
        seed=v.seed,
    )
    per = [[] for _ in prompts]
    for r in rollouts:
        per[r["prompt_index"]].append(r["reward"])
    return [mean(x) for x in per]


def paired_gain(home: Path, raw: dict, name: str, steps: int) -> tuple[float, float]:
    """(mean gain, its standard error) over the held-out prompts: final checkpoint minus init_from."""
    before = heldout_rewards(home, raw, raw["init_from"])
    after = heldout_rewards(home, raw, f"{name}@{steps}")
    d = [a - b for a, b in zip(after, before)]
    m = mean(d)
    return m, math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))


MKL_BRANCHES = {
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    12: "AVX512",
    13: "AVX512_E1",
}  # mkl_cbwr_get's codes (mkl_service.h); 0x10000: strict


def code_paths() -> str:
    """The CPU code paths this process runs (after a run started: MKL has read MKL_CBWR)."""
    import ctypes

    import torch

    try:
        get = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).mkl_serv_cbwr_get
        get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
        mode = get(-1)
        mkl = f"MKL branch {MKL_BRANCHES.get(mode & 0xFFFF, hex(mode & 0xFFFF))}{' strict' if mode & 0x10000 else ''}"
    except (OSError, AttributeError):
        mkl = "MKL not found"
    return (
        f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()} "
        f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}), {mkl} "
        f"(MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--seeds", default="1,2", help="post-training seeds, comma-separated (default 1,2)")
    ap.add_argument("--reuse", action="store_true", help="keep a finished base/teacher run found in --home")
    ap.add_argument("--base-seed", type=int, default=None, help="posttrain-base's seed instead of the spec's")
    ap.add_argument("--steps-scale", type=float, default=1.0)
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    home = args.home or Path(tempfile.mkdtemp(prefix="posttrain-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "specs").exists():
        shutil.copytree(ROOT / "specs", home / "specs")
    for corpus in CORPORA:
        build_corpus(load_corpus_spec(home / "specs" / corpus), home)
    results = []
    for name in PRETRAIN:
        raw = load_raw(home, name)
        if name == "posttrain-base" and args.base_seed is not None:
            raw["seed"] = args.base_seed
        done = home / "runs" / name / "ckpt" / f"step-{raw['steps']:06d}"
        if args.reuse and done.is_dir() and args.steps_scale == 1.0:
            print(f"{name}: reusing {done}", file=sys.stderr, flush=True)
            continue
        shutil.rmtree(home / "runs" / name, ignore_errors=True)
        wall = train(home, raw, args.steps_scale)
        print(f"{name}: {raw['steps']} steps in {wall:.1f}s", file=sys.stderr, flush=True)
    for kind in POSTTRAIN:
        for seed in seeds:
            raw = load_raw(home, kind)
            raw["name"], raw["seed"] = f"{kind}-s{seed}", seed
            if args.steps_scale != 1.0:
                base_steps = max(1, int(load_raw(home, "posttrain-base")["steps"] * args.steps_scale))
                raw["init_from"] = f"posttrain-base@{base_steps}"
                if "teacher" in raw:
                    raw["teacher"] = (
                        f"posttrain-teacher@{max(1, int(load_raw(home, 'posttrain-teacher')['steps'] * args.steps_scale))}"
                    )
            shutil.rmtree(home / "runs" / raw["name"], ignore_errors=True)
            wall = train(home, raw, args.steps_scale)
            r = summary(home, raw["name"], kind, wall)
            if kind in ("grpo", "opd"):
                r["gain"], r["gain_se"] = paired_gain(home, raw, raw["name"], r["steps"])
            results.append(r)
            print(f"{raw['name']}: {r['steps']} steps in {wall:.1f}s", file=sys.stderr, flush=True)
    raw = load_raw(home, "grpo")
    refs = {"base": raw["init_from"], "teacher": load_raw(home, "opd")["teacher"]} if args.steps_scale == 1.0 else {}
    print(f"home: {home}")
    print(
        f"code paths: {code_paths()}"
        + (f"; posttrain-base seed {args.base_seed}" if args.base_seed is not None else "")
    )
    print("\nheld-out validation, before (step 0, the init_from model) -> after (final step)")
    for r in results:
        b, a = r["before"], r["after"]
        if r["kind"] == "dpo":
            print(
                f"  {r['run']:<8} val/accuracy {b['val/accuracy']:.3f} -> {a['val/accuracy']:.3f}   "
                f"val/reward_margin {b['val/reward_margin']:+.4f} -> {a['val/reward_margin']:+.4f}   "
                f"val/loss {b['val/loss']:.4f} -> {a['val/loss']:.4f}  ({a['val/pair_count']} pairs)   "
                f"{r['train_key']} {r['train_first']:.3f} -> {r['train_last']:.3f} (first/last 10 steps)"
            )
        else:
            print(
                f"  {r['run']:<8} val/reward_avg {b['val/reward_avg']:.3f} -> {a['val/reward_avg']:.3f}   "
                f"gain {r['gain']:+.3f} +- {r['gain_se']:.3f} (paired s.e. over prompts)  "
                f"({a['val/rollout_count']} rollouts)   "
                f"{r['train_key']} {r['train_first']:.3f} -> {r['train_last']:.3f} (first/last 10 steps)"
            )
    for who, ck in refs.items():
        rs = heldout_rewards(home, raw, ck)
        print(f"  {who:<8} ({ck}) held-out exact match under the validation sampling: {mean(rs):.3f}")
    print("\nthroughput and time shares (of each run's wall time)")
    for r in results:
        rate = (
            f"{r['tokens_per_s']:.0f} tokens/s"
            if "tokens_per_s" in r
            else f"{r['rollouts_per_s']:.1f} rollouts/s, {r['updates_per_s']:.2f} updates/s"
        )
        shares = "  ".join(
            f"{k} {100 * r[f'{k}_s'] / r['wall_s']:.0f}%" for k in ("rollout", "ref", "teacher", "validation")
        )
        print(f"  {r['run']:<8} {r['wall_s']:6.1f}s wall  {rate:<36} {shares}")


if __name__ == "__main__":
    main()
