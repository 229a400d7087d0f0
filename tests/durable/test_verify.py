"""``ctl verify-resume``: exact for the durable example and for tinyllm; each broken example variant
(one piece of state not tracked) caught, with the right diagnosis; bad input exit 2.

The end-to-end tests run the real CLI, which runs the real trainers and kills them for real
(SIGKILL, SIGTERM, SIGKILL inside a checkpoint write). ``diagnose`` is also tested on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import EXAMPLES, ROOT, write_spec

from simulator.proving.verify import diagnose, plan_kills

pytestmark = pytest.mark.slow  # ctl verify-resume kills real trainers (~15-25 s each)


def verify(home, spec_path, *args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(spec_path),
            "--home",
            str(home),
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    try:
        report = json.loads(p.stdout)
    except ValueError:
        report = None
    return p.returncode, report, p.stderr


def test_the_durable_example_resumes_exactly_through_kill_term_and_a_kill_in_a_checkpoint_write(tmp_path) -> None:
    spec = json.loads((EXAMPLES / "specs/durable.json").read_text())
    spec["steps"] = 24
    rc, report, err = verify(tmp_path, write_spec(tmp_path, spec), "--kills", "3", "--seed", "4", "--signal", "both")
    assert rc == 0, err[-3000:]
    assert report["exact"] and report["steps_compared"] == 24 and report["diagnosis"] == ""
    modes = [a["mode"] for a in report["attempts"]]
    assert "checkpoint-write" in modes and report["kills_landed"] >= 2, report["attempts"]
    assert report["final_loss_hex"]["uninterrupted"] == report["final_loss_hex"]["resumed"]


@pytest.mark.parametrize(
    "piece, first_after, words",
    [
        # (data, generators: the soak lane; CI has those diagnoses with the toy trainer, test_verify_contract.py)
        pytest.param("data", 1, "the data position was not restored", marks=pytest.mark.soak),
        pytest.param("generators", 1, "an RNG the helper does not see was not restored", marks=pytest.mark.soak),
        ("scheduler", 1, "the LR scheduler was not restored"),
        ("optimizer", 2, "not restored: the optimizer state"),
    ],
)
def test_a_variant_missing_one_piece_of_state_is_caught_and_diagnosed(tmp_path, piece, first_after, words) -> None:
    spec_path = EXAMPLES / f"specs/forget-{piece}.json"
    rc, report, err = verify(tmp_path, spec_path, "--kills", "1", "--seed", "0", "--signal", "kill")
    assert rc == 1, err[-3000:]
    assert not report["exact"] and words in report["diagnosis"], report["diagnosis"]
    resumed = report["attempts"][-1]["resumed_step"]
    assert resumed > 0 and report["first_differing_step"] == resumed + first_after, report


def test_tinyllm_resumes_exactly(tmp_path) -> None:
    spec = {
        "name": "vt",
        "steps": 10,
        "seed": 2,
        "checkpoint_every": 3,
        "batch_size": 2,
        "threads": 1,
        "warmup_steps": 2,
        "lr_decay_steps": 10,
        "log_every": 5,
        "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1},
    }
    rc, report, err = verify(tmp_path, write_spec(tmp_path, spec), "--kills", "2", "--seed", "1", "--signal", "both")
    assert rc == 0, err[-3000:]
    assert report["exact"] and report["steps_compared"] == 10 and report["kills_landed"] >= 1, report


@pytest.mark.parametrize("seed", ["1", pytest.param("2", marks=pytest.mark.soak)])  # seed 2: the soak lane
def test_forget_generators_is_never_exact_now_that_every_kill_resumes_from_a_checkpoint(tmp_path, seed) -> None:
    rc, report, err = verify(tmp_path, EXAMPLES / "specs/forget-generators.json", "--kills", "2", "--seed", seed)
    assert rc == 1 and report["verdict"] == "not_exact", err[-3000:]
    assert report["interruptions"] and all(i["resumed_from"] > 0 for i in report["interruptions"]), report
    plan = plan_kills(2, 20, int(seed), "both", helper=True, checkpoint_every=5)  # forget-generators' cadence
    landed = [(i["mode"], i["step_killed"]) for i in report["interruptions"] if i["mode"] in ("kill", "term")]
    assert landed == [(m, t) for m, t in plan if m in ("kill", "term")], (landed, plan)  # held there: exact step


def test_a_plan_that_cannot_resume_from_a_checkpoint_is_not_proven_exit_3(tmp_path) -> None:
    spec = json.loads((EXAMPLES / "specs/durable.json").read_text())
    spec["steps"], spec["checkpoint_every"] = 6, 6
    rc, report, err = verify(tmp_path, write_spec(tmp_path, spec), "--kills", "2", "--seed", "1")
    assert rc == 3, err[-3000:]
    assert report["verdict"] == "not_proven" and not report["exact"], report
    assert "no interruption resumed from a mid-run checkpoint" in report["diagnosis"], report


def test_bad_input_exits_2(tmp_path) -> None:
    rc, _, err = verify(tmp_path, tmp_path / "missing.json")
    assert rc == 2 and "not found" in err
    (tmp_path / "bad.json").write_text(json.dumps({"name": "x", "steps": 3, "trainer": {"command": []}}))
    rc, _, err = verify(tmp_path, tmp_path / "bad.json")
    assert rc == 2 and "trainer.command" in err
    assert not (tmp_path / ".ctl").exists()


# --- diagnose on its own -------------------------------------------------------------------------


def rec(loss: str, lr: str = "a", batch: str = "b") -> dict:
    return {"loss": loss, "lr": [lr], "batch": batch}


STATE = {"model": "m", "optimizer": "o", "optimizer/entries": 4, "lr": ["a"], "rng/torch": "t", "data": "d"}


def test_diagnose_names_the_state_that_differs_right_after_the_resume() -> None:
    ref = {1: rec("1"), 2: rec("2"), 3: rec("3")}
    got = {1: rec("1"), 2: rec("2"), 3: rec("x")}
    step, text, suspects = diagnose(ref, got, [(2, {**STATE, "rng/torch": "T"})], {2: STATE}, ["model"])
    assert step == 3 and suspects == ["rng/torch"] and "the RNG torch" in text
    step, text, suspects = diagnose(ref, got, [(2, {**STATE, "model": "M"})], {2: STATE}, ["model"])
    assert suspects == ["model"] and "the model weights" in text


def test_diagnose_by_the_pattern_when_the_visible_state_is_equal() -> None:
    ref = {1: rec("1"), 2: rec("2"), 3: rec("3"), 4: rec("4")}
    resumes, states = [(2, STATE)], {2: STATE}
    assert diagnose(ref, {**ref, 3: rec("x", batch="B")}, resumes, states)[2] == ["rng/data"]  # its position equal
    no_data = {k: v for k, v in STATE.items() if k != "data"}
    assert diagnose(ref, {**ref, 3: rec("x", batch="B")}, [(2, no_data)], {2: no_data})[2] == ["data"]
    assert diagnose(ref, {**ref, 3: rec("x")}, resumes, states)[2] == ["rng"]
    assert diagnose(ref, {**ref, 3: rec("3", lr="z")}, resumes, states)[2] == ["scheduler"]
    assert diagnose(ref, {**ref, 4: rec("x")}, resumes, states)[2] == ["optimizer", "scheduler"]
    assert diagnose(ref, {**ref, 1: rec("x")}, resumes, states)[2] == ["determinism"]
    assert diagnose(ref, dict(ref), resumes, states) == (None, "", [])


def test_plan_kills_is_seeded_and_in_range() -> None:
    a = plan_kills(5, 30, 7, "both", helper=True, checkpoint_every=5)
    assert a == plan_kills(5, 30, 7, "both", helper=True, checkpoint_every=5) and len(a) == 5
    assert all(1 <= s < 30 for _, s in a) and [s for _, s in a] == sorted(s for _, s in a)
    assert {m for m, _ in plan_kills(6, 30, 1, "term", helper=True, checkpoint_every=4)} == {"term"}
    assert "checkpoint-write" in {m for m, _ in a}
    assert "checkpoint-write" not in {m for m, _ in plan_kills(6, 30, 1, "kill", helper=False, checkpoint_every=4)}


def test_plan_kills_lands_after_a_checkpoint() -> None:
    for seed in range(1, 11):  # forget-generators: 20 steps, checkpoint_every 5
        plan = plan_kills(2, 20, seed, "both", helper=True, checkpoint_every=5)
        assert plan == plan_kills(2, 20, seed, "both", helper=True, checkpoint_every=5)
        assert len(plan) == 2 and all(t % 5 and t > 5 and t < 20 for _, t in plan)
    assert plan_kills(3, 10, 1, "both", helper=True, checkpoint_every=10) == []
    every_step = plan_kills(3, 10, 1, "both", helper=True, checkpoint_every=1)  # a checkpoint each step:
    assert len(every_step) == 3 and all(2 <= t < 10 for _, t in every_step)  # one step after a checkpoint > 0


def test_diagnose_tells_the_data_mistakes_apart_by_the_batches_after_the_resume() -> None:
    ref = {s: rec(str(s), batch=f"b{s}") for s in range(1, 9)}
    resumes, states = [(4, STATE)], {4: STATE}
    ahead = {**ref, **{s: rec("x", batch=f"b{s + 1}") for s in range(5, 9)}}  # prefetched one batch before the loop
    step, text, suspects = diagnose(ref, {**ahead, 8: rec("x", batch="b?")}, resumes, states, ["model", "data"])
    assert step == 5 and suspects == ["data/read-ahead"] and "reads 1 batch(es) ahead" in text, text
    restart = {**ref, **{s: rec("x", batch=f"b{s - 4}") for s in range(5, 9)}}  # i = 0 again at the resume
    step, text, suspects = diagnose(ref, restart, resumes, states, ["model"])
    assert suspects == ["cursor", "rng/data"] and "keep it in run.cursor" in text and "generators={'data': g}" in text
    other = {**ref, **{s: rec("x", batch=f"z{s}") for s in range(5, 9)}}  # an unregistered shuffling generator
    no_data = {k: v for k, v in STATE.items() if k != "data"}
    step, text, suspects = diagnose(ref, other, [(4, no_data)], {4: no_data}, ["model"])
    assert suspects == ["data"] and "run.track(generators={'data': g})" in text, text
    assert "no data is tracked" in text and "data position was not restored" in text, text
    step, text, suspects = diagnose(ref, {**ref, 5: rec("x", batch="b5")}, resumes, states, ["model"])
    assert suspects == ["rng"] and "DataLoader.__iter__" in text and "an RNG the helper does not see" in text
