"""The simulator's own parts: the fake trainer's bitwise sensitivity, the fault plan, the checks.

These use the fakes directly (no engine) where the engine is not the point.
"""

from __future__ import annotations

import json

import pytest

from simulator.checks import check_steps, expected_commands
from simulator.fakes import FakeActivities, FakeState, _schedule, reference_state
from simulator.faults import FaultPlan, SimulatedCrash, random_kills
from simulator.ledger import Ledger
from simulator.scenario import Scenario

SPEC = {"name": "t", "steps": 300, "seed": 3, "checkpoint_every": 100}


class Ctx:
    """A minimal ActivityContext (the engine is not the point of these tests)."""

    def __init__(self, activity_id="train-000300", attempt=1, details=None):
        self.workflow_id, self.activity_id, self.attempt = "train/t", activity_id, attempt
        self.last_heartbeat_details = details
        self.cancel_requested = False
        self.beats = []

    def heartbeat(self, details=None):
        self.beats.append(details)


def test_a_repeated_or_skipped_step_changes_the_final_loss_bits():
    a, b = _schedule(SPEC, 300)
    straight = reference_state(SPEC, 300).loss
    loss = FakeState.fresh(3).loss
    for k in list(range(1, 201)) + list(range(150, 301)):  # steps 150..200 taken twice
        loss = loss * a[k] + b[k]
    assert loss.hex() != straight.hex()
    loss = FakeState.fresh(3).loss
    for k in [k for k in range(1, 301) if k != 123]:
        loss = loss * a[k] + b[k]
    assert loss.hex() != straight.hex()


def test_the_fake_trainer_resumes_bit_for_bit_and_heartbeats_each_checkpoint(tmp_path):
    plan = FaultPlan(kills={150})
    fakes = FakeActivities(tmp_path, Ledger(), plan)
    ctx = Ctx()
    with pytest.raises(SimulatedCrash):
        fakes.train(ctx, {"spec": SPEC})
    assert [d["checkpoint"] for d in ctx.beats] == ["runs/t/ckpt/step-000100"]
    assert (tmp_path / "runs/t/ckpt/LATEST").read_text() == "step-000100"
    again = Ctx(attempt=2, details=ctx.beats[-1])
    out = fakes.train(again, {"spec": SPEC})
    assert out["final_loss_hex"] == reference_state(SPEC, 300).loss.hex()
    assert out["resumed_from"] == "runs/t/ckpt/step-000100"
    state = json.loads((tmp_path / "runs/t/ckpt/step-000300/state.json").read_text())
    assert state["loss_hex"] == out["final_loss_hex"]
    assert check_steps(fakes.ledger) == []


def test_resuming_from_scratch_after_a_checkpoint_is_reported_as_redone_steps(tmp_path):
    ledger = Ledger()
    fakes = FakeActivities(tmp_path, ledger, FaultPlan(kills={250}))
    with pytest.raises(SimulatedCrash):
        fakes.train(Ctx(), {"spec": SPEC})
    for p in (tmp_path / "runs/t/ckpt").iterdir():  # a trainer that ignores its checkpoints
        if p.is_dir():
            (p / "state.json").unlink()
            p.rmdir()
        else:
            p.unlink()
    fakes.train(Ctx(attempt=2), {"spec": SPEC})
    problems = check_steps(ledger)
    assert problems and "resumed from step 0" in problems[0]


def test_a_checkpoint_of_another_trajectory_is_refused(tmp_path):
    fakes = FakeActivities(tmp_path, Ledger())
    fakes.train(Ctx(), {"spec": {**SPEC, "steps": 100}})
    with pytest.raises(Exception, match="another spec"):
        fakes.train(Ctx(activity_id="x"), {"spec": {**SPEC, "lr": 0.5}})


def test_bulk_positions_are_numbered_as_single_ones():
    plan = FaultPlan(kills={7})
    assert plan.free(5) == 5 and plan.count == 5
    assert plan.free(5) == 2 and plan.count == 7
    with pytest.raises(SimulatedCrash) as crash:
        plan.point("step", "x")
    assert crash.value.position == 7
    assert FaultPlan(record=True).free(3) == 0


def test_random_kills_are_seeded_and_increasing():
    assert random_kills(4, 100, 5) == random_kills(4, 100, 5)
    ks = random_kills(4, 100, 5)
    assert ks == sorted(set(ks)) and len(ks) == 5


def test_expected_commands_are_the_seeds_hand_example():
    assert expected_commands(Scenario()) == [
        "train-000500",
        "eval-000500-ppl",
        "timer 30s",
        "train-001000",
        "eval-001000-ppl",
        "timer 30s",
        "train-001200",
        "eval-001200-ppl",
    ]
    assert Scenario(steps=1000, eval_every=500).ends() == [500, 1000]
    assert Scenario(steps=300, eval_every=0).ends() == [300]
    assert Scenario(steps=300, eval_every=301).ends() == [300]
