"""Issue 9, defects 6 and 7, through ``ctl train`` (real processes: ctl, the engine, the
subprocess runner, tinyllm):

- a TrainRun in segments 4/6 with validation every 3 steps validates at [3, 6], with the same
  frames (every metric but timers, as float.hex) and the same final loss as one uninterrupted
  ``tinyllm train`` of the whole run (before: also at the segment end 4, val/train_total_steps 4);
- a corrupt checkpoint the trainer refuses is named, with why and what it used instead, in
  ctl's live output, its result and ``ctl history``.

The uninterrupted baselines run the real tinyllm CLI in this process (click's runner): one torch
import instead of one more process on a loaded machine.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real ctl train runs

DEADLINE_S = 300
MODEL = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1}  # dropout: RNG in play
GENERATION = {
    "enabled": True,
    "objective": "generation",
    "every_steps": 3,
    "reward": ["exact_match", "contains", "nonempty"],
    "data": {"path": "builtin:prompts.jsonl", "prompt_column": "question", "response_column": "answer"},
    "batch_size": 4,
    "max_samples": 4,
    "sampling": {"temperature": 1.0, "top_k": None, "n_generation": 2, "max_tokens": 4},
}
SPEC = {
    "name": "vseg",
    "steps": 6,
    "eval_every": 4,
    "seed": 3,
    "checkpoint_every": 100,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 6,
    "threads": 1,
    "log_every": 100,
    "model": MODEL,
    "validation": GENERATION,
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    home = tmp_path_factory.mktemp("corpus-home")
    build_corpus(CorpusSpec(), home)
    return home / "corpora"


def new_home(tmp_path: Path, corpora: Path, name: str) -> Path:
    home = tmp_path / name
    shutil.copytree(corpora, home / "corpora")
    return home


def ctl(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def tinyllm_here(home: Path, spec: dict, *args: str) -> dict:
    """``tinyllm train`` through the real CLI in this process; returns its result line."""
    from click.testing import CliRunner

    from tinyllm.cli import main

    path = home / f"{spec['name']}-{spec['steps']}.json"
    path.write_text(json.dumps(spec))
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        r = CliRunner().invoke(main, ["train", "--spec", str(path), "--home", str(home), *args])
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def frames(home: Path, name: str) -> dict[int, dict[str, str]]:
    """metrics.jsonl by step, every metric but timers (wall clock), as float.hex."""
    out: dict[int, dict[str, str]] = {}
    for line in (home / "runs" / name / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        assert step not in out, f"two frames at step {step}"
        out[step] = {k: float(v).hex() for k, v in row.items() if k != "time" and not k.startswith("timer/")}
    return out


def test_validation_through_ctl_segments_equals_one_run(tmp_path, corpora):
    one = new_home(tmp_path, corpora, "one")
    baseline = tinyllm_here(one, SPEC)
    seg = new_home(tmp_path, corpora, "seg")
    (seg / "vseg.json").write_text(json.dumps(SPEC))
    proc = ctl(seg, "train", "--spec", str(seg / "vseg.json"), "--no-eval", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert [s["until"] for s in result["segments"]] == [4, 6]  # two tinyllm processes

    want, got = frames(one, "vseg"), frames(seg, "vseg")
    val_steps = lambda f: sorted(s for s, row in f.items() if any(k.startswith("val/") for k in row))  # noqa: E731
    assert val_steps(want) == [3, 6] and val_steps(got) == [3, 6]
    assert {s: float.fromhex(got[s]["val/train_total_steps"]) for s in (3, 6)} == {3: 6.0, 6: 6.0}
    assert got == want  # every frame, train/* optim/* val/*, bit for bit
    assert (result["final_loss_hex"], result["digest"]) == (baseline["final_loss_hex"], baseline["digest"])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_ctl_names_the_refused_checkpoint_and_the_one_used(tmp_path, corpora):
    home = new_home(tmp_path, corpora, "home")
    spec = {**SPEC, "name": "refuse", "eval_every": 0, "checkpoint_every": 2}
    spec.pop("validation")
    tinyllm_here(home, {**spec, "steps": 4})  # checkpoints 2 and 4; LATEST = 4
    _flip(home / "runs/refuse/ckpt/step-000004/model.pt")
    (home / "refuse.json").write_text(json.dumps(spec))
    proc = ctl(home, "train", "--spec", str(home / "refuse.json"), "--no-eval")
    assert proc.returncode == 0, proc.stderr
    why = "model.pt fails its sha256 checksum (corrupt)"
    # the live display (stderr), from the trainer's resume progress line (a heartbeat)
    assert f"refused checkpoint runs/refuse/ckpt/step-000004: {why}" in proc.stderr
    assert "resumed from runs/refuse/ckpt/step-000002 at step 2 instead" in proc.stderr
    # the final summary (stdout)
    assert (
        f"refused checkpoint runs/refuse/ckpt/step-000004: {why}; resumed from runs/refuse/ckpt/step-000002"
        in proc.stdout
    )
    history = ctl(home, "history", "train/refuse")
    assert history.returncode == 0, history.stderr
    assert f"refused checkpoint runs/refuse/ckpt/step-000004: {why}" in history.stdout
    status = json.loads(ctl(home, "status", "train/refuse", "--json").stdout)
    [segment] = status["result"]["segments"]
    assert segment["train"]["resumed_from"] == "runs/refuse/ckpt/step-000002"
    assert segment["train"]["refused_checkpoints"] == [{"checkpoint": "runs/refuse/ckpt/step-000004", "reason": why}]
