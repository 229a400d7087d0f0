"""Post-training demo and throughput: base -> teacher -> DPO, GRPO, OPD, measured in one run.

In a fresh home (``--home``, default a temporary directory) holding a copy of ``specs/``, runs
``tinyllm corpus`` of specs/posttrain-corpus.json, then ``tinyllm train`` (in process, the same
Trainer as the CLI) of specs/posttrain-base.json, posttrain-teacher.json, dpo.json, grpo.json and
opd.json, and prints from each run's metrics.jsonl:

- the held-out figures before (model step 0 = the init_from model) and after (the final step):
  DPO val/accuracy and val/reward_margin, GRPO/OPD val/reward_avg (exact match);
- throughput: DPO tokens/s, GRPO/OPD rollouts/s and updates/s (over training-step time);
- the share of wall time in rollout, reference scoring, teacher scoring and validation.

Usage: python bench/posttrain.py [--home DIR] [--steps-scale 0.25]   (scale < 1: a quicker smoke run)
"""
from __future__ import annotations

import argparse
import io
import json
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

RUNS = ["posttrain-base", "posttrain-teacher", "dpo", "grpo", "opd"]


def frames(home: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (home / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def train(home: Path, name: str, scale: float) -> tuple[float, str]:
    raw = json.loads((home / "specs" / f"{name}.json").read_text())
    if scale != 1.0:
        raw["steps"] = max(1, int(raw["steps"] * scale))
        if raw.get("validation"):
            raw["validation"]["every_steps"] = 0  # before and after only
    log = io.StringIO()
    t0 = time.perf_counter()
    Trainer(parse_train_spec(raw), home, log=log).run()
    return time.perf_counter() - t0, log.getvalue()


def summary(home: Path, name: str, wall_s: float) -> dict:
    fs = frames(home, name)
    val = [f for f in fs if any(k.startswith("val/") for k in f)]
    train_fs = [f for f in fs if "timer/step_s" in f]
    step_s = sum(f["timer/step_s"] for f in train_fs)
    out = {"run": name, "wall_s": wall_s, "steps": len(train_fs), "step_s": step_s,
           "before": val[0] if val else {}, "after": val[-1] if val else {}}
    for t in ("rollout", "ref", "teacher"):
        out[f"{t}_s"] = sum(f.get(f"timer/{t}_s", 0.0) for f in fs)
    out["validation_s"] = sum(f.get("timer/validation_s", 0.0) for f in val)
    if name == "dpo":
        out["tokens_per_s"] = sum(f["timer/tokens_per_s"] * f["timer/step_s"] for f in train_fs) / step_s
    if name in ("grpo", "opd"):
        out["rollouts_per_s"] = sum(f["rollout/count"] for f in train_fs) / step_s
        out["updates_per_s"] = (train_fs[-1]["train/model_step"] if train_fs else 0) / step_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--steps-scale", type=float, default=1.0)
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="posttrain-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "specs").exists():
        shutil.copytree(ROOT / "specs", home / "specs")
    build_corpus(load_corpus_spec(home / "specs" / "posttrain-corpus.json"), home)
    results = []
    for name in RUNS:
        if (home / "runs" / name).exists():
            shutil.rmtree(home / "runs" / name)
        wall, _ = train(home, name, args.steps_scale)
        results.append(summary(home, name, wall))
        print(f"{name}: {results[-1]['steps']} steps in {wall:.1f}s", file=sys.stderr, flush=True)
    print(f"home: {home}")
    print("\nheld-out validation, before (step 0, the init_from model) -> after (final step)")
    for r in results:
        b, a = r["before"], r["after"]
        if r["run"] == "dpo":
            print(f"  dpo   val/accuracy {b['val/accuracy']:.3f} -> {a['val/accuracy']:.3f}   "
                  f"val/reward_margin {b['val/reward_margin']:+.4f} -> {a['val/reward_margin']:+.4f}   "
                  f"val/loss {b['val/loss']:.4f} -> {a['val/loss']:.4f}  ({a['val/pair_count']} pairs)")
        elif r["run"] in ("grpo", "opd"):
            print(f"  {r['run']:<5} val/reward_avg {b['val/reward_avg']:.3f} -> {a['val/reward_avg']:.3f}   "
                  f"val/exact_match {b.get('val/exact_match', 0):.3f} -> {a.get('val/exact_match', 0):.3f}  "
                  f"({a['val/rollout_count']} rollouts)")
    print("\nthroughput and time shares (of each run's wall time)")
    for r in results:
        if r["run"] not in ("dpo", "grpo", "opd"):
            continue
        rate = (f"{r['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in r else
                f"{r['rollouts_per_s']:.1f} rollouts/s, {r['updates_per_s']:.2f} updates/s")
        shares = "  ".join(f"{k} {100 * r[f'{k}_s'] / r['wall_s']:.0f}%" for k in ("rollout", "ref", "teacher", "validation"))
        print(f"  {r['run']:<5} {r['wall_s']:6.1f}s wall  {rate:<36} {shares}")


if __name__ == "__main__":
    main()
