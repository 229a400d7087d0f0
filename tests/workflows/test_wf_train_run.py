"""TrainRun on the real engine (VirtualClock, inline activities) over fake activities.

The real trainer is not the point here (tests/ctl runs it): the fakes (wf_fakes.py) keep
the resume contract and a deterministic loss whose reference value ``reference_loss`` is
computed independently of the workflow. Each class is one row of the seed's test table;
``test_catches_*`` plant the pitfall of section 5 and assert the same check fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import workflows
from workflows import evaluation as eval_mod
from workflows import training as tr_mod
from workflows.models import TrainRunInput, TrainRunResult

import wf_mutants as m
from wf_world import World, commands, hand_spec, small_spec
from wf_fakes import reference_loss

WID = "train/tiny"


def hand_input(**over) -> dict:
    return {"spec": hand_spec(**over), "corpus": {"name": "default"}, "eval_suites": ["ppl"]}


class TestHandExampleSegmentsAndEvals:
    """Section 3 by hand: ids, checkpoints, 1200 steps, one evaluation per checkpoint."""

    EXPECTED = [
        "corpus-default",
        "train-000500",
        "eval-000500-ppl",
        "sleep 30s",
        "train-001000",
        "eval-001000-ppl",
        "sleep 30s",
        "train-001200",
        "eval-001200-ppl",
    ]

    def check(self, world: World) -> None:
        st = world.run("TrainRun", WID, hand_input())
        assert st.state == "completed", st.error
        assert commands(world) == self.EXPECTED
        res = TrainRunResult.model_validate(st.result)
        assert [s.until for s in res.segments] == [500, 1000, 1200]
        assert [s.checkpoint for s in res.segments] == [
            "runs/tiny/ckpt/step-000500",
            "runs/tiny/ckpt/step-001000",
            "runs/tiny/ckpt/step-001200",
        ]
        assert world.fakes.steps_taken == 1200  # each optimizer step once
        evals = [(c.activity_id, c.input["subjects"][0]["model"]) for c in world.fakes.calls if c.name == "eval"]
        assert evals == [
            ("eval-000500-ppl", "runs/tiny/ckpt/step-000500"),
            ("eval-001000-ppl", "runs/tiny/ckpt/step-001000"),
            ("eval-001200-ppl", "runs/tiny/ckpt/step-001200"),
        ]
        assert [s.evals.suites[0].suite for s in res.segments] == ["ppl"] * 3
        assert res.steps == 1200 and res.final_loss_hex == reference_loss(1200, 7).hex()
        assert res.segments[1].train.resumed_from == "runs/tiny/ckpt/step-000500"

    def test_hand_example(self, world: World) -> None:
        self.check(world)

    def test_result_round_trips_through_json(self, world: World) -> None:
        st = world.run("TrainRun", WID, hand_input())
        res = TrainRunResult.model_validate(st.result)
        assert TrainRunResult.model_validate_json(res.model_dump_json()) == res
        assert TrainRunInput.model_validate_json(TrainRunInput(**hand_input()).model_dump_json()) == TrainRunInput(
            **hand_input()
        )

    def test_catches_s01_last_segment_dropped(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "segments", m.s01_segments_drop_last)
        with pytest.raises(AssertionError):
            self.check(world)

    def test_catches_s02_unnamed_train_ids(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "train_options", m.s02_train_options_unnamed)
        with pytest.raises(AssertionError):
            self.check(world)

    def test_catches_s03_unnamed_eval_ids(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(eval_mod, "eval_options", m.s03_eval_options_unnamed)
        with pytest.raises(AssertionError):
            self.check(world)


class TestEvalIntervalUsesDurableSleepAndReplaysOnce:
    """The gap is a recorded timer between evaluations (not after the last); a worker that
    dies during the wait resumes the same timer and does not repeat the evaluation."""

    def check(self, world: World) -> None:
        eng = world.open()
        eng.start("TrainRun", WID, hand_input())
        eng.run_until_idle()  # runs until the first timer: nothing else is due on the virtual clock
        timers = [e for e in world.events(WID) if e.type == "timer_started"]
        assert len(timers) == 1 and timers[0].attrs["seconds"] == 30
        fire_at = timers[0].attrs["fire_at"]
        assert "eval-000500-ppl" in [e.attrs.get("activity_id") for e in world.events(WID)]
        world.engine.close()  # the worker dies during the wait
        world.engine = None
        world.clock.advance(10)
        eng = world.open()
        eng.run_until_idle()  # 20 s left: nothing may happen yet
        assert [e.type for e in world.events(WID)].count("timer_fired") == 0
        assert [c.activity_id for c in world.fakes.calls].count("eval-000500-ppl") == 1
        st = eng.run_until_complete(WID)
        assert st.state == "completed", st.error
        evs = world.events(WID)
        fired = [e for e in evs if e.type == "timer_fired"]
        assert fired and fired[0].time == fire_at  # the same timer, waited only the remainder
        assert commands(world).count("sleep 30s") == 2  # between evaluations, never after the last
        assert commands(world)[-1] == "eval-001200-ppl"
        assert [c.activity_id for c in world.fakes.calls].count("eval-000500-ppl") == 1

    def test_durable_wait(self, world: World) -> None:
        self.check(world)

    def test_no_wait_without_interval(self, world: World) -> None:
        st = world.run("TrainRun", WID, hand_input(eval_interval_seconds=0))
        assert st.state == "completed"
        assert not [e for e in world.events(WID) if e.type.startswith("timer")]

    def test_catches_s13_wall_clock_wait(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "cadence_wait", m.s13_wall_clock_wait)
        with pytest.raises(AssertionError):
            self.check(world)


class TestEachSegmentGetsTheSpecWithItsEnd:
    """Only ``steps`` changes between segments."""

    def check(self, world: World) -> None:
        spec = hand_spec(lr=3e-4, batch_size=8)
        st = world.run("TrainRun", WID, {"spec": spec, "eval_suites": ["ppl"]})
        assert st.state == "completed", st.error
        trains = [c for c in world.fakes.calls if c.name == "train"]
        assert [c.input["steps"] for c in trains] == [500, 1000, 1200]
        for c in trains:
            assert {k: v for k, v in c.input.items() if k != "steps"} == {k: v for k, v in spec.items() if k != "steps"}
        assert world.fakes.steps_taken == 1200

    def test_only_steps_changes(self, world: World) -> None:
        self.check(world)

    def test_catches_s05_every_segment_to_the_end(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "segment_spec", m.s05_segment_spec_to_the_end)
        with pytest.raises(AssertionError):
            self.check(world)


class TestRetryResumesFromLatest:
    """A segment that dies at step 740 (last checkpoint 700) is retried from step-000700:
    only steps 701..740 are redone, and the final loss is the uninterrupted one."""

    def check(self, world: World) -> None:
        world.fakes.fail_train[("train-001000", 1)] = 740
        st = world.run("TrainRun", WID, hand_input())
        assert st.state == "completed", st.error
        attempts = [(c.activity_id, c.attempt) for c in world.fakes.calls if c.name == "train"]
        assert attempts == [("train-000500", 1), ("train-001000", 1), ("train-001000", 2), ("train-001200", 1)]
        assert world.fakes.resumed_from[2] == "runs/tiny/ckpt/step-000700"
        assert world.fakes.steps_taken == 1200 + 40
        res = TrainRunResult.model_validate(st.result)
        assert res.final_loss_hex == reference_loss(1200, 7).hex()
        assert [c.activity_id for c in world.fakes.calls].count("eval-000500-ppl") == 1

    def test_retry_resumes(self, world: World) -> None:
        self.check(world)

    def test_catches_s06_no_retries(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "train_options", m.s06_train_options_no_retries)
        with pytest.raises(AssertionError):
            self.check(world)


class TestCancelStopsTheRun:
    """A cancel during train-001000 ends the run canceled after that activity checkpointed;
    no further segment or evaluation; every checkpoint stays; the same spec continues later."""

    @staticmethod
    def cancel_at(step_wanted: int, activity: str):
        def hook(fakes, activity_id, attempt, step):
            if activity_id == activity and step == step_wanted:
                fakes.engine.cancel(WID)  # as `ctl cancel` does, from the database

        return hook

    def check(self, world: World) -> None:
        world.fakes.on_step = self.cancel_at(740, "train-001000")
        st = world.run("TrainRun", WID, hand_input())
        assert st.state == "canceled", (st.state, st.error)
        ids = commands(world)
        assert "train-001200" not in ids and "eval-001000-ppl" not in ids
        ckpts = Path(world.home, "runs/tiny/ckpt")
        assert (ckpts / "LATEST").read_text() == "step-000740"
        for step in (500, 700, 740):
            assert (ckpts / f"step-{step:06d}").is_dir()
        assert st.error["type"] == "Canceled", st.error  # the run's error wraps Canceled

    def test_cancel(self, world: World) -> None:
        self.check(world)

    def test_same_spec_continues_later(self, world: World) -> None:
        self.check(world)
        world.fakes.on_step = None
        prior = workflows.collect_prior([world.events(WID)])  # what `ctl train` starts after a cancel
        st = world.run("TrainRun", WID + "/2", {**hand_input(), "prior": prior.model_dump(mode="json")})
        assert st.state == "completed", st.error
        res = TrainRunResult.model_validate(st.result)
        assert res.final_loss_hex == reference_loss(1200, 7).hex()
        assert world.fakes.steps_taken == 1200  # nothing redone: segment 1 resumes at its end

    def test_catches_s07_cancel_moves_on(self, world: World) -> None:
        world.overrides["TrainRun"] = m.s07_cancel_moves_on
        with pytest.raises(AssertionError):
            self.check(world)


class TestCorpusFirst:
    """CorpusBuild runs first; its failure stops the run before any training."""

    def check(self, world: World, fail: bool) -> None:
        world.fakes.fail_corpus = fail
        st = world.run("TrainRun", WID, hand_input())
        assert world.fakes.calls[0].name == "corpus"
        if fail:
            assert st.state == "failed"
            assert [c.name for c in world.fakes.calls] == ["corpus"]
            assert not Path(world.home, "runs/tiny").exists()
        else:
            assert st.state == "completed"
            assert TrainRunResult.model_validate(st.result).corpus.name == "default"

    def test_corpus_first(self, world: World) -> None:
        self.check(world, fail=False)

    def test_failed_corpus_stops_the_run(self, world: World) -> None:
        self.check(world, fail=True)

    def test_catches_s08_failed_corpus_ignored(self, world: World, monkeypatch) -> None:
        monkeypatch.setattr(tr_mod, "corpus_build", m.s08_corpus_build_ignored)
        with pytest.raises(AssertionError):
            self.check(world, fail=True)


BAD_SPECS = {
    "no name": {"steps": 100},
    "empty name": {"name": "", "steps": 100},
    "path name": {"name": "../x", "steps": 100},
    "no steps": {"name": "tiny"},
    "zero steps": {"name": "tiny", "steps": 0},
    "negative eval_every": {"name": "tiny", "steps": 100, "eval_every": -1},
    "negative eval_interval_seconds": {"name": "tiny", "steps": 100, "eval_interval_seconds": -1},
    "unknown field": {"name": "tiny", "steps": 100, "stepz": 5},
    "corpus mismatch": {"name": "tiny", "steps": 100, "corpus": "other"},
}


class TestBadSpecFailsFast:
    """A bad spec fails the workflow at once: non-retryable BadInput, before any activity."""

    def check(self, world: World, spec: dict) -> None:
        st = world.run("TrainRun", WID, {"spec": spec, "corpus": {"name": "default"}, "eval_suites": ["ppl"]})
        assert st.state == "failed"
        assert st.error["type"] == "BadInput", st.error
        assert world.fakes.calls == []
        assert "activity_scheduled" not in world.types(WID)

    @pytest.mark.parametrize("case", sorted(BAD_SPECS))
    def test_bad_spec(self, world: World, case: str) -> None:
        self.check(world, BAD_SPECS[case])

    @pytest.mark.parametrize("case", ["no name", "negative eval_every", "negative eval_interval_seconds"])
    def test_catches_s09_no_validation(self, world: World, monkeypatch, case: str) -> None:
        monkeypatch.setattr(tr_mod, "validate_spec", m.s09_no_validation)
        with pytest.raises(AssertionError):
            self.check(world, BAD_SPECS[case])

    def test_small_spec_is_good(self, world: World) -> None:
        st = world.run("TrainRun", WID, {"spec": small_spec()})
        assert st.state == "completed", st.error
