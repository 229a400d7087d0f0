"""Shared helpers of the validation integration tests: a corpus, small specs, running trainers."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tinyllm.spec import parse_train_spec

MODEL = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1}  # dropout: RNG in play
BASE = {
    "name": "v",
    "steps": 6,
    "seed": 3,
    "checkpoint_every": 100,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 2,
    "threads": 1,
    "log_every": 1000,
    "model": MODEL,
}
LM = {"enabled": True, "data": {"path": "builtin:heldout.txt"}, "batch_size": 4, "max_samples": 6}
GEN = {
    "enabled": True,
    "objective": "generation",
    "reward": ["exact_match", "contains", "nonempty"],
    "data": {"path": "builtin:prompts.jsonl", "prompt_column": "question", "response_column": "answer"},
    "batch_size": 4,
    "sampling": {"temperature": 1.0, "top_k": None, "n_generation": 2, "max_tokens": 4},
}


def make_home(corpus_home: Path, tmp: Path) -> Path:
    home = tmp / "home"
    shutil.copytree(corpus_home / "corpora", home / "corpora")
    return home


def spec_dict(validation: dict | None = None, **kw) -> dict:
    d = {**BASE, **kw}
    if validation is not None:
        d["validation"] = validation
    return d


def train_inprocess(home: Path, spec: dict, reporter=None, hooks=None, log=None) -> dict:
    from tinyllm.trainer import Trainer

    return Trainer(parse_train_spec(spec), home, hooks=hooks, log=log or io.StringIO()).run(reporter)


def write_spec(home: Path, spec: dict) -> Path:
    p = home / f"{spec['name']}.json"
    p.write_text(json.dumps(spec))
    return p


def tinyllm_cli(home: Path, spec: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    """``tinyllm train`` in a real process (``python -m tinyllm.cli``: the console script's target)."""
    path = write_spec(home, spec)
    return subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(path), "--home", str(home)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def tinyllm_popen(home: Path, spec: dict, env: dict | None = None) -> subprocess.Popen:
    path = write_spec(home, spec)
    return subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(path), "--home", str(home)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def frames(home: Path, name: str = "v") -> list[dict]:
    p = home / "runs" / name / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def val_frames(home: Path, name: str = "v") -> dict[int, dict]:
    out: dict[int, dict] = {}
    for f in frames(home, name):
        if any(k.startswith("val/") for k in f):
            assert f["step"] not in out, f"two validation frames at step {f['step']}"
            out[f["step"]] = f
    return out


def journal(home: Path, step: int, name: str = "v") -> dict | None:
    d = home / "runs" / name / "ckpt" / f"step-{step:06d}"
    phase = d / "validation_phase.json"
    if phase.exists():
        return json.loads(phase.read_text())["body"]  # a sealed sidecar: {"sha256", "body"}
    if (d / "validation.pt").exists():
        import torch

        return json.loads(torch.load(d / "validation.pt", weights_only=True)["json"])
    return None


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])
