"""Helpers of the post-training tests: a home with base/teacher checkpoints and data, small specs.

Everything is minuscule (1 layer, 16 wide, block 16, a few steps) with dropout and sampling on, so
the RNG and the sampler are part of every exactness check.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tinyllm.spec import parse_train_spec

MODEL = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1}
TEACHER_MODEL = {**MODEL, "n_embd": 32, "dropout": 0.0}
COMMON = {"seed": 3, "checkpoint_every": 100, "lr": 0.003, "warmup_steps": 2, "threads": 1, "log_every": 1000}
BASE = {"name": "base", "steps": 3, "batch_size": 4, "model": MODEL, **COMMON}
TEACHER = {**BASE, "name": "teacher", "model": TEACHER_MODEL}

RL = {
    "data": {"path": "prompts.jsonl", "prompt_column": "q", "response_column": "a"},
    "reward": ["exact_match", "numeric"],
    "n_generation": 3,
    "n_mini": 2,
    "sampling": {"max_tokens": 3},
}
GEN_VAL = {
    "enabled": True,
    "objective": "generation",
    "batch_size": 4,
    "every_steps": 2,
    "data": {"path": "val-prompts.jsonl", "prompt_column": "q", "response_column": "a"},
}
DPO_VAL = {"enabled": True, "objective": "dpo", "batch_size": 3, "every_steps": 2, "data": {"path": "val-pairs.jsonl"}}

DPO = {
    **COMMON,
    "name": "dpo",
    "steps": 4,
    "batch_size": 4,
    "model": MODEL,
    "objective": "dpo",
    "init_from": "base@3",
    "ref": {"build_ref": True},
    "dpo": {"beta": 0.1, "data": {"path": "pairs.jsonl"}},
}
GRPO = {
    **COMMON,
    "name": "grpo",
    "steps": 3,
    "batch_size": 2,
    "model": MODEL,
    "objective": "grpo",
    "init_from": "base@3",
    "rl": RL,
}
OPD = {**GRPO, "name": "opd", "objective": "opd", "teacher": "teacher@3"}
SPECS = {"dpo": DPO, "grpo": GRPO, "opd": OPD}
VALIDATION = {"dpo": DPO_VAL, "grpo": GEN_VAL, "opd": GEN_VAL}


def _problems(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(lo, hi) for b in range(10)]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def build_base_home(home: Path) -> Path:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    build_corpus(CorpusSpec(), home)
    for spec in (BASE, TEACHER):
        train_inprocess(home, spec)
    train, held = _problems(0, 4), _problems(4, 6)
    write_jsonl(
        home / "pairs.jsonl",
        [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a, b in train],
    )
    write_jsonl(
        home / "val-pairs.jsonl",
        [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a * b)} for a, b in held[:7]],
    )
    write_jsonl(home / "prompts.jsonl", [{"q": f"{a}+{b}=", "a": str(a + b)} for a, b in train])
    write_jsonl(home / "val-prompts.jsonl", [{"q": f"{a}+{b}=", "a": str(a + b)} for a, b in held[:5]])
    return home


def copy_home(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.name == "runs":
            for run in ("base", "teacher"):
                shutil.copytree(p / run / "ckpt", dst / "runs" / run / "ckpt")
        elif p.is_dir():
            shutil.copytree(p, dst / p.name)
        else:
            shutil.copy2(p, dst / p.name)
    return dst


def spec(kind: str, validation: dict | None = None, **kw) -> dict:
    d = {**SPECS[kind], **kw}
    if validation is not None:
        d["validation"] = validation
    return d


def train_inprocess(home: Path, spec: dict, hooks=None, log=None, resume=None) -> dict:
    from tinyllm.trainer import Trainer

    return Trainer(parse_train_spec(spec), home, hooks=hooks, log=log or io.StringIO(), resume=resume).run()


def write_spec(home: Path, spec: dict) -> Path:
    p = home / f"{spec['name']}.json"
    p.write_text(json.dumps(spec))
    return p


def tinyllm_popen(
    home: Path, spec: dict, progress: Path | None = None, env: dict | None = None, nice: int = 0
) -> subprocess.Popen:
    """``nice`` > 0: the trainer yields the CPUs to this test process (a poller that must see a step
    before the run ends); scheduling only, never the numbers."""
    args = [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(write_spec(home, spec)), "--home", str(home)]
    if progress is not None:
        args += ["--progress", str(progress)]
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )


def frames(home: Path, name: str) -> list[dict]:
    p = home / "runs" / name / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def train_losses(home: Path, name: str) -> list[tuple[int, str]]:
    return [(f["step"], float(f["train/loss"]).hex()) for f in frames(home, name) if "train/loss" in f]


def val_frames(home: Path, name: str) -> dict[int, dict]:
    return {f["step"]: f for f in frames(home, name) if any(k.startswith("val/") for k in f)}


def without_timers(frame: dict) -> dict:
    return {k: v for k, v in frame.items() if not k.startswith("timer/") and k != "time"}


def cli_train(home: Path, spec: dict):
    """``tinyllm train`` through click's runner in this process (exit code and stderr of the real CLI)."""
    import signal

    from click.testing import CliRunner

    from tinyllm.cli import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return CliRunner().invoke(main, ["train", "--spec", str(write_spec(home, spec)), "--home", str(home)])
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
