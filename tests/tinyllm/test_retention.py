"""Checkpoint retention (keep_checkpoints): what is pruned and what never is, the log, and real
SIGKILLs in the middle of pruning (after the rename, after the delete) followed by a resume
that ends bit for bit where an uninterrupted run without retention ends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tinyllm.checkpoint import verify_checkpoint
from tinyllm.faults import ENV as FAULT_ENV
from tinyllm.retention import KeepCheckpoints, plan
from tl_helpers import last_json, run_tinyllm, write_spec

NAMES = [f"step-{s:06d}" for s in (10, 20, 30, 40, 50, 60)]
TINY = dict(batch_size=4, model={"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1})


LAST_ONE = KeepCheckpoints(last=1)


def _plan(
    keep=LAST_ONE, step=60, eval_every=0, final_step=60, latest="step-000060", resumed=None, protected=frozenset()
):
    return plan(
        names=NAMES,
        keep=keep,
        step=step,
        eval_every=eval_every,
        final_step=final_step,
        latest=latest,
        resumed_from=resumed,
        protected=set(protected),
    )


def test_plan_keeps_the_last_n_and_prunes_the_rest_oldest_first() -> None:
    prune, why = _plan(keep=KeepCheckpoints(last=2))
    assert prune == NAMES[:4] and why == {"step-000060": "last 2", "step-000050": "last 2"}


@pytest.mark.parametrize("case", ["latest", "resumed", "protected", "boundary", "beyond"])
def test_each_protection_keeps_its_checkpoint(case: str) -> None:
    """Each reason alone keeps step-000020; without it, the same plan prunes it."""
    name = "step-000020"
    kwargs = {
        "latest": dict(latest=name),
        "resumed": dict(resumed=name),
        "protected": dict(protected={name}),
        "boundary": dict(eval_every=20, keep=KeepCheckpoints(last=1)),
        "beyond": dict(step=15),
    }[case]
    prune, why = _plan(**kwargs)
    assert name not in prune and name in why
    assert name in _plan()[0]


def test_boundaries_can_be_given_up() -> None:
    prune, _ = _plan(eval_every=20, keep=KeepCheckpoints(last=1, boundaries=False))
    assert prune == NAMES[:5]


@pytest.mark.slow
def test_keep_checkpoints_is_validated_and_not_part_of_the_trajectory(home: Path) -> None:
    spec = write_spec(home / "s.json", keep_checkpoints={"last": 0})
    p = run_tinyllm(home, "train", "--spec", str(spec))
    assert p.returncode == 2 and "keep_checkpoints" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (home / "runs").exists()


def _ckpts(home: Path, name: str = "small") -> list[str]:
    return sorted(p.name for p in (home / "runs" / name / "ckpt").iterdir() if p.name != "LATEST")


@pytest.mark.slow
def test_a_run_prunes_keeps_boundaries_and_evaluated_checkpoints_and_logs(home: Path) -> None:
    # an evaluation names step 10: it is kept although neither last nor a boundary
    ev = home / "evals/ppl/small-000002"
    ev.mkdir(parents=True)
    (ev / "summary.json").write_text(json.dumps({"results": [{"model": "runs/small/ckpt/step-000002"}]}))
    spec = write_spec(home / "s.json", steps=12, checkpoint_every=2, eval_every=6, keep_checkpoints={"last": 1}, **TINY)
    p = run_tinyllm(home, "train", "--spec", str(spec))
    assert p.returncode == 0, p.stderr
    assert _ckpts(home) == ["retention.log", "step-000002", "step-000006", "step-000012"]
    log = [json.loads(x) for x in (home / "runs/small/ckpt/retention.log").read_text().splitlines()]
    assert sorted(n for e in log for n in e["pruned"]) == ["step-000004", "step-000008", "step-000010"]
    assert log[-1]["kept"]["step-000006"] == "segment boundary" and log[-1]["kept"]["step-000002"] == "protected"
    assert "tinyllm: pruned 1 checkpoint(s) (step-000004)" in p.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, built_corpus) -> dict:
    """The same 10 steps without retention and without a kill."""
    other = tmp_path_factory.mktemp("reference")
    os.symlink(built_corpus, other / "corpora")
    ref = run_tinyllm(other, "train", "--spec", str(write_spec(other / "s.json", steps=10, checkpoint_every=5, **TINY)))
    assert ref.returncode == 0, ref.stderr
    return last_json(ref.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["after_rename", "during_delete"])
def test_kill_during_pruning_then_resume_is_exact(home: Path, phase: str, monkeypatch, uninterrupted) -> None:
    base = dict(steps=10, checkpoint_every=2, keep_checkpoints={"last": 1, "boundaries": False}, **TINY)
    spec = write_spec(home / "s.json", **base)
    monkeypatch.setenv(FAULT_ENV, f"retention.{phase}@6#0")  # the prune after step 6's checkpoint: step 4 goes
    p = run_tinyllm(home, "train", "--spec", str(spec))
    monkeypatch.delenv(FAULT_ENV)
    assert p.returncode == -9, p.stderr
    hidden = [n for n in _ckpts(home) if n.startswith(".pruned-")]
    assert len(hidden) == 1 and all(n.startswith(".pruned-step-000004-") for n in hidden)
    assert "step-000004" not in _ckpts(home)
    for name in _ckpts(home):  # nothing torn is left where a reader (ctl eval, resume) would look
        if name.startswith("step-"):
            verify_checkpoint(home / "runs/small/ckpt" / name)
    assert "step-000006" in _ckpts(home) and (home / "runs/small/ckpt/LATEST").read_text().strip() == "step-000006"
    p = run_tinyllm(home, "train", "--spec", str(spec))
    assert p.returncode == 0, p.stderr
    resumed = last_json(p.stdout)
    assert "resumed small from runs/small/ckpt/step-000006 at step 6" in p.stderr
    # the leftover is gone; the checkpoint this attempt resumed from stays while it runs
    assert _ckpts(home) == ["retention.log", "step-000006", "step-000010"]
    assert resumed["final_loss_hex"] == uninterrupted["final_loss_hex"] and resumed["digest"] == uninterrupted["digest"]


def test_checkpoints_named_by_init_from_teacher_or_an_evaluation_are_found(tmp_path: Path) -> None:
    from tinyllm.retention import evaluated, init_from_named

    root = tmp_path / "runs/base/ckpt"
    for s in (2, 4, 6, 8):
        (root / f"step-{s:06d}").mkdir(parents=True)
    act = tmp_path / "runs/dpo/activity/train-000010"
    act.mkdir(parents=True)
    (act / "spec.json").write_text(json.dumps({"init_from": "base@4", "teacher": "runs/base/ckpt/step-000006"}))
    assert init_from_named(tmp_path, root) == {"step-000004", "step-000006"}
    ev = tmp_path / "evals/zoo/base-000008"
    ev.mkdir(parents=True)
    (ev / "results.jsonl").write_text(json.dumps({"model": str(root / "step-000008")}) + "\n")
    assert evaluated(tmp_path, root) == {"step-000008"}
