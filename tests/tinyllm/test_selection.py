"""Model selection (tinyllm/selection.py): best-k retention by a validation figure and early
stopping, decided from recorded figures, so a run SIGKILLed anywhere (mid-validation, between an
evaluation and the stop decision, mid-prune) and resumed stops at the uninterrupted run's step
with the same best checkpoint and the same bits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tinyllm.retention import KeepCheckpoints, plan
from tinyllm.selection import BestK, EarlyStopping, Tracker, best_k, decide
from tinyllm.spec import SpecError, parse_train_spec
from tl_helpers import cli_in_process, last_json, run_tinyllm, write_spec

TINY = dict(
    steps=12,
    checkpoint_every=4,
    batch_size=4,
    model={"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
    validation={
        "enabled": True,
        "every_steps": 2,
        "batch_size": 4,
        "max_samples": 4,
        "data": {"path": "builtin:heldout.txt"},
    },
)
# val/loss falls every check, so under mode "max" only the first check (step 2) is an improvement:
# patience 2 stops at the check of step 6, and the best (k=1) is step 2, older than "last 1"
SELECT = dict(
    early_stopping={"metric": "val/loss", "mode": "max", "patience": 2, "min_delta": 0.0},
    keep_checkpoints={"last": 1, "best": {"metric": "val/loss", "mode": "max", "k": 1}},
)


def test_decide_follows_lightning_patience_counts_checks() -> None:
    es = EarlyStopping(metric="val/loss", mode="min", patience=2, min_delta=0.1)
    # 5.0 best; 4.95 is not better by min_delta (wait 1); 4.5 improves (wait 0); then two flat checks stop
    scores = {0: 9.0, 10: 5.0, 20: 4.95, 30: 4.5, 40: 4.45, 50: 4.6, 60: 1.0}
    d = decide(scores, es)
    assert (d.stopped, d.step, d.best_step, d.checks) == (True, 50, 30, 5)  # step 0 is no check; 60 never seen
    assert not decide({10: 5.0, 20: 4.0}, es).stopped
    assert decide({10: 5.0, 20: 5.0}, es.model_copy(update={"patience": 0})).step == 20
    assert decide({10: 1.0, 20: 2.0, 30: 3.0}, es.model_copy(update={"mode": "max"})).stopped is False


def test_best_k_ties_go_to_the_earlier_step() -> None:
    assert best_k({4: 1.0, 2: 1.0, 6: 0.5, 0: 0.1}, "min", 2) == [6, 2]
    assert best_k({4: 1.0, 2: 1.0, 6: 0.5}, "max", 1) == [2]


def test_retention_plan_never_prunes_a_selected_checkpoint() -> None:
    names = [f"step-{s:06d}" for s in (2, 4, 6, 8)]
    keep = KeepCheckpoints(last=1, best=BestK(metric="val/loss", mode="min", k=1))
    prune, why = plan(
        names=names,
        keep=keep,
        step=8,
        eval_every=0,
        final_step=8,
        latest="step-000008",
        resumed_from=None,
        protected=set(),
        selected={"step-000002": "best 1 by val/loss"},
    )
    assert prune == ["step-000004", "step-000006"] and why["step-000002"] == "best 1 by val/loss"
    t = Tracker(keep.best, EarlyStopping(metric="val/loss", mode="min", patience=5))
    for s, v in ((2, 3.0), (4, 2.0), (6, 2.5)):
        t.record(s, {"val/loss": v})
    t2 = Tracker(keep.best, t.early)
    t2.restore(t.component())  # the checkpoint component round-trips bit for bit
    assert t2.history == t.history and t2.kept_steps() == {4: "best 1 by val/loss"}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"early_stopping": {"metric": "val/lost", "mode": "min"}}, "early_stopping.metric 'val/lost' is not a figure"),
        ({"early_stopping": {"metric": "val/loss", "mode": "mni"}}, "early_stopping.mode"),
        ({"early_stopping": {"metric": "val/loss", "mode": "min", "patience": -1}}, "early_stopping.patience"),
        ({"keep_checkpoints": {"last": 1, "best": {"metric": "val/loss", "mode": "min", "k": 0}}}, "best.k"),
        ({"keep_checkpoints": {"last": 1, "best": {"metric": "ppl/ppl", "mode": "min"}}}, "'ppl/ppl' is not a figure"),
        ({"validation": None, "early_stopping": {"metric": "val/loss", "mode": "min"}}, "needs held-out validation"),
    ],
)
def test_bad_selection_fields_are_one_line_exit_2(home: Path, change: dict, words: str) -> None:
    spec = write_spec(home / "s.json", **{**TINY, **change})
    with pytest.raises(SpecError, match=words.replace(".", r"\.").replace("(", r"\(")):
        parse_train_spec(json.loads(spec.read_text()))
    r = cli_in_process(home, "train", "--spec", str(spec))
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1
    assert not (home / "runs").exists()


def _ckpts(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "runs/small/ckpt").iterdir() if p.name.startswith("step-"))


def _essence(result: dict) -> tuple:
    return (
        result["steps"],
        result["final_loss_hex"],
        result["digest"],
        result["stopped_early"],
        [(b["step"], b["value_hex"]) for b in result["best_checkpoints"]],
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, built_corpus) -> dict:
    other = tmp_path_factory.mktemp("uninterrupted")
    os.symlink(built_corpus, other / "corpora")
    p = run_tinyllm(other, "train", "--spec", str(write_spec(other / "s.json", **TINY, **SELECT)))
    assert p.returncode == 0, p.stderr
    assert "early stopping at step 6" in p.stderr
    return last_json(p.stdout)


@pytest.mark.slow
def test_an_uninterrupted_run_stops_early_and_keeps_the_best(uninterrupted: dict) -> None:
    r = uninterrupted
    assert r["steps"] == 6 and r["canceled"] is False
    stop = r["stopped_early"]
    assert (stop["step"], stop["best_step"], stop["best_checkpoint"]) == (6, 2, "runs/small/ckpt/step-000002")
    assert [h["step"] for h in stop["history"]] == [2, 4, 6]
    assert r["best_checkpoints"][0]["checkpoint"] == "runs/small/ckpt/step-000002"


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, at",
    [
        (
            "TINYLLM_FAULT",
            "validation.after_evaluation@6",
        ),  # the stop check's figure recorded, the decision not yet taken
        ("TINYLLM_FAULT", "validation.during_evaluation@4"),
        ("TINYLLM_FAULT", "retention.after_rename@6#0"),  # mid-prune (step 4 renamed away; the best, step 2, stays)
    ],
)
def test_killed_anywhere_the_resumed_run_stops_at_the_same_step(
    home: Path, env: str, at: str, monkeypatch, uninterrupted: dict
) -> None:
    spec = write_spec(home / "s.json", **TINY, **SELECT)
    monkeypatch.setenv(env, at)
    p = run_tinyllm(home, "train", "--spec", str(spec))
    monkeypatch.delenv(env)
    assert p.returncode == -9, p.stderr
    assert "step-000002" in _ckpts(home)  # the best is never pruned, not even by a kill mid-prune
    p = run_tinyllm(home, "train", "--spec", str(spec))
    assert p.returncode == 0, p.stderr
    resumed = last_json(p.stdout)
    assert "resumed small from" in p.stderr
    assert _essence(resumed) == _essence(uninterrupted)
    assert "step-000002" in _ckpts(home)  # (the checkpoint an attempt resumed from stays while it runs, as today)
    again = run_tinyllm(home, "train", "--spec", str(spec))  # a finished, stopped run: no further update
    assert again.returncode == 0 and _essence(last_json(again.stdout)) == _essence(uninterrupted)
