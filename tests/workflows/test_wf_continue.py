"""Continuing a canceled or failed run: the next workflow (``train/tiny/2``, what ``ctl train``
starts) gets the work of the earlier ones in its input (``TrainRunInput.prior``, built by
``workflows.collect_prior`` from their histories) and runs only what is missing, so that
every checkpoint is evaluated exactly once across the workflows and the final result lists
every segment with its evaluations, as an uninterrupted run does.

Real engine on the VirtualClock, fake activities (wf_fakes.py): the trainer is not the point.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import workflows
from engine import VirtualClock
from workflows.models import PriorWork, TrainRunInput, TrainRunResult

from wf_fakes import Fakes, reference_loss
from wf_world import World, commands, hand_spec

WID = "train/tiny"


def request(suites=("ppl",)) -> dict:
    return {"spec": hand_spec(), "corpus": {"name": "default"}, "eval_suites": list(suites)}


def completed(world: World, *wids: str) -> Counter:
    """How many times each activity id completed, over the given workflows."""
    return Counter(e.attrs["activity_id"] for w in wids for e in world.events(w) if e.type == "activity_completed")


def continue_run(world: World, earlier: list[str], wid: str, suites=("ppl",), with_prior: bool = True):
    """What ``ctl train`` does after a cancel/failure: collect the earlier work, start the next workflow."""
    prior = workflows.collect_prior([world.events(w) for w in earlier]) if with_prior else PriorWork()
    inp = TrainRunInput(**request(suites), prior=prior)
    assert TrainRunInput.model_validate_json(inp.model_dump_json()) == inp  # it is recorded as JSON
    return world.run("TrainRun", wid, inp)


def uninterrupted(tmp_path: Path, suites=("ppl",)) -> TrainRunResult:
    clock = VirtualClock()
    home = tmp_path / "reference"
    home.mkdir()
    ref = World(home=home, clock=clock, fakes=Fakes(home=home, clock=clock))
    try:
        st = ref.run("TrainRun", WID, request(suites))
        assert st.state == "completed", st.error
        return TrainRunResult.model_validate(st.result)
    finally:
        ref.engine.close()


def same_run(got: TrainRunResult, want: TrainRunResult) -> None:
    """Every segment, its checkpoint, its loss bits, its digest and its evaluations, as uninterrupted."""
    assert [s.until for s in got.segments] == [s.until for s in want.segments]
    for g, w in zip(got.segments, want.segments):
        assert (g.checkpoint, g.train.final_loss_hex, g.train.digest) == (
            w.checkpoint,
            w.train.final_loss_hex,
            w.train.digest,
        )
        assert g.evals == w.evals
    assert got.final_loss_hex == want.final_loss_hex == reference_loss(1200, 7).hex()


def cancel_at_step(step_wanted: int, activity: str):
    def hook(fakes, activity_id, attempt, step):
        if activity_id == activity and step == step_wanted:
            fakes.engine.cancel(WID)

    return hook


class TestContinueAfterCancel:
    def check(self, world: World, tmp_path: Path, with_prior: bool = True) -> None:
        world.fakes.on_step = cancel_at_step(740, "train-001000")
        assert world.run("TrainRun", WID, request()).state == "canceled"
        world.fakes.on_step = None
        st = continue_run(world, [WID], WID + "/2", with_prior=with_prior)
        assert st.state == "completed", st.error
        # the wait after 500 had ended (train-001000 was scheduled): not waited again
        assert commands(world, WID + "/2") == [
            "corpus-default",
            "train-001000",
            "eval-001000-ppl",
            "sleep 30s",
            "train-001200",
            "eval-001200-ppl",
        ]
        done = completed(world, WID, WID + "/2")
        assert {a: n for a, n in done.items() if a.startswith(("eval-", "train-"))} == {
            "train-000500": 1,
            "eval-000500-ppl": 1,
            "train-001000": 1,
            "eval-001000-ppl": 1,
            "train-001200": 1,
            "eval-001200-ppl": 1,
        }
        assert world.fakes.steps_taken == 1200
        same_run(TrainRunResult.model_validate(st.result), uninterrupted(tmp_path))

    def test_finished_segments_and_evaluations_are_not_rerun(self, world: World, tmp_path: Path) -> None:
        self.check(world, tmp_path)

    def test_catches_continuing_without_prior(self, world: World, tmp_path: Path) -> None:
        with pytest.raises(AssertionError):
            self.check(world, tmp_path, with_prior=False)

    def test_third_workflow_sees_both_earlier_ones(self, world: World, tmp_path: Path) -> None:
        world.fakes.on_step = cancel_at_step(740, "train-001000")
        assert world.run("TrainRun", WID, request()).state == "canceled"
        world.fakes.on_step = lambda f, a, att, step: (
            f.engine.cancel(WID + "/2") if (a, step) == ("train-001200", 1100) else None
        )
        assert continue_run(world, [WID], WID + "/2").state == "canceled"
        world.fakes.on_step = None
        st = continue_run(world, [WID, WID + "/2"], WID + "/3")
        assert st.state == "completed", st.error
        assert commands(world, WID + "/3") == ["corpus-default", "train-001200", "eval-001200-ppl"]
        done = completed(world, WID, WID + "/2", WID + "/3")
        assert sorted(a for a, n in done.items() if a.startswith("eval-") for _ in range(n)) == [
            "eval-000500-ppl",
            "eval-001000-ppl",
            "eval-001200-ppl",
        ]
        same_run(TrainRunResult.model_validate(st.result), uninterrupted(tmp_path))


def test_partially_evaluated_boundary_runs_only_the_missing_suite(world: World, tmp_path: Path) -> None:
    """ppl finished at 500, zoo failed for good: the next workflow runs zoo at 500 only, then goes on."""
    world.fakes.fail_eval = {"zoo"}
    assert world.run("TrainRun", WID, request(("ppl", "zoo"))).state == "failed"
    world.fakes.fail_eval = set()
    st = continue_run(world, [WID], WID + "/2", suites=("ppl", "zoo"))
    assert st.state == "completed", st.error
    assert commands(world, WID + "/2")[:3] == ["corpus-default", "eval-000500-zoo", "sleep 30s"]
    done = completed(world, WID, WID + "/2")
    assert done["eval-000500-ppl"] == 1 and done["eval-000500-zoo"] == 1 and done["train-000500"] == 1
    res = TrainRunResult.model_validate(st.result)
    assert [s.suite for s in res.segments[0].evals.suites] == ["ppl", "zoo"]  # in the requested order
    same_run(res, uninterrupted(tmp_path, ("ppl", "zoo")))


def test_cancel_during_the_wait_rewaits_without_reevaluating(world: World, tmp_path: Path) -> None:
    """Canceled in the durable wait after eval-000500-ppl: the next workflow does not evaluate
    500 again; it waits the full interval again (documented in workflows/continuation.py)."""

    def on_event(fakes, what):
        if what == "done eval-000500-ppl#1":
            fakes.engine.cancel(WID)

    world.fakes.on_event = on_event
    assert world.run("TrainRun", WID, request()).state == "canceled"
    assert "train-001000" not in commands(world, WID)
    world.fakes.on_event = None
    start = world.clock.now()
    st = continue_run(world, [WID], WID + "/2")
    assert st.state == "completed", st.error
    assert commands(world, WID + "/2")[:3] == ["corpus-default", "sleep 30s", "train-001000"]
    assert completed(world, WID, WID + "/2")["eval-000500-ppl"] == 1
    fired = [e for e in world.events(WID + "/2") if e.type == "timer_fired"]
    assert fired and fired[0].time - start >= 30  # the virtual clock: the whole interval
    same_run(TrainRunResult.model_validate(st.result), uninterrupted(tmp_path))


def test_prior_round_trips_and_first_run_has_none(world: World) -> None:
    st = world.run("TrainRun", WID, request())
    prior = workflows.collect_prior([world.events(WID)])
    assert sorted(prior.train) == ["train-000500", "train-001000", "train-001200"]
    assert sorted(prior.evals) == ["eval-000500-ppl", "eval-001000-ppl", "eval-001200-ppl"]
    assert PriorWork.model_validate_json(prior.model_dump_json()) == prior
    assert world.events(WID)[0].attrs["input"]["prior"] == PriorWork().model_dump(mode="json")
    assert st.state == "completed"
