"""Early stopping and best-k through ``ctl train`` (the TrainRun workflow on the engine): the stop
ends the run as a normal completion (exit 0), the later segments never run, and ``ctl status`` /
``ctl show`` say where it stopped and mark the best checkpoint; a bad selection field is one line,
exit 2, before any work."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bi_helpers import ctl, one_line_error

pytestmark = pytest.mark.slow

SPEC = {"name": "small", "steps": 12, "seed": 3, "eval_every": 4, "checkpoint_every": 4, "batch_size": 4, "lr": 0.003,
        "warmup_steps": 5, "lr_decay_steps": 40, "threads": 1, "log_every": 10,
        "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
        "validation": {"enabled": True, "every_steps": 2, "batch_size": 4, "max_samples": 4,
                       "data": {"path": "builtin:heldout.txt"}},
        "early_stopping": {"metric": "val/loss", "mode": "max", "patience": 2},
        "keep_checkpoints": {"last": 1, "best": {"metric": "val/loss", "mode": "max", "k": 1}}}


@pytest.fixture
def home(tmp_path: Path, built_corpus: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    shutil.copytree(built_corpus, h / "corpora")
    return h


@pytest.fixture(scope="session")
def built_corpus(tmp_path_factory) -> Path:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    h = tmp_path_factory.mktemp("corpus-home")
    build_corpus(CorpusSpec(), h)
    return h / "corpora"


def test_ctl_train_stops_early_as_a_completion_and_shows_it(home: Path) -> None:
    (home / "s.json").write_text(json.dumps(SPEC))
    p = ctl(home, "train", "--spec", str(home / "s.json"), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(p.stdout)["result"]
    assert result["steps"] == 6 and [s["until"] for s in result["segments"]] == [4, 8]  # segment 3 never ran
    assert result["stopped_early"]["best_checkpoint"] == "runs/small/ckpt/step-000002"
    assert result["best_checkpoints"][0]["step"] == 2
    st = ctl(home, "status", "train/small")
    assert "stopped early at step 6: val/loss (max)" in st.stdout and "best step 2" in st.stdout
    sh = ctl(home, "show", "train/small")
    assert "runs/small/ckpt/step-000002 (val/loss" in sh.stdout and "<- best" in sh.stdout
    assert "skipped" in sh.stdout
    again = ctl(home, "train", "--spec", str(home / "s.json"), "--json")  # complete: nothing more runs
    assert again.returncode == 0 and json.loads(again.stdout)["result"]["steps"] == 6


def test_ctl_train_refuses_an_unknown_selection_metric(home: Path) -> None:
    (home / "s.json").write_text(json.dumps({**SPEC, "early_stopping": {"metric": "val/acc", "mode": "min"}}))
    one_line_error(ctl(home, "train", "--spec", str(home / "s.json")), 2, "early_stopping.metric 'val/acc'")
    assert not (home / "runs").exists() and not (home / ".ctl").exists()
