"""EvalSuite on the real engine over the fake eval activity (the real evaluator is not the
point: tests/ctl runs it). One activity per suite, in order, each with the spec of one suite;
a crash in one suite does not rerun the finished ones; the first failed suite stops the rest."""

from __future__ import annotations

import json

import pytest

from workflows import EvalSubject, EvalSuiteInput, EvalSuiteResult, marshal_spec

import wf_mutants as m
from wf_world import World
from wf_fakes import Crash

WID = "eval/release"
SUITES = ["ppl", "zoo", "arith"]


def suite_input(**over) -> dict:
    inp = {
        "name": "release",
        "tag": "",
        "suites": SUITES,
        "seed": 3,
        "subjects": [
            {"id": "cand", "model": "runs/tiny/ckpt/step-000500"},
            {"id": "base", "model": "runs/tiny/ckpt/step-000100"},
        ],
    }
    inp.update(over)
    return inp


def crash_once_at(what: str):
    fired = []

    def hook(fakes, event: str) -> None:
        if event == what and not fired:
            fired.append(event)
            raise Crash(event)

    return hook


class TestEvalSuiteOneActivityPerSuite:
    def check_order_and_specs(self, world: World) -> None:
        st = world.run("EvalSuite", WID, suite_input())
        assert st.state == "completed", st.error
        evals = [c for c in world.fakes.calls if c.name == "eval"]
        assert [c.activity_id for c in evals] == ["eval-ppl", "eval-zoo", "eval-arith"]
        for c, suite in zip(evals, SUITES):
            assert c.input["suite"] == suite  # the spec of that one suite
            assert c.input["subjects"] == suite_input()["subjects"]
        res = EvalSuiteResult.model_validate(st.result)
        assert [s.suite for s in res.suites] == SUITES

    def check_crash_replay(self, world: World) -> None:
        world.fakes.on_event = crash_once_at("start eval-arith#1")
        eng = world.open()
        eng.start("EvalSuite", WID, suite_input())
        with pytest.raises(Crash):
            eng.run_until_complete(WID)
        st = world.open().run_until_complete(WID)
        assert st.state == "completed", st.error
        ids = [c.activity_id for c in world.fakes.calls]
        assert ids.count("eval-ppl") == 1 and ids.count("eval-zoo") == 1, ids  # finished suites kept
        assert ids.count("eval-arith") == 2

    def check_failure_stops(self, world: World) -> None:
        world.fakes.fail_eval = {"zoo"}
        st = world.run("EvalSuite", WID, suite_input())
        assert st.state == "failed"
        assert [c.activity_id for c in world.fakes.calls] == ["eval-ppl", "eval-zoo"]

    def test_one_activity_per_suite(self, world: World) -> None:
        self.check_order_and_specs(world)

    def test_crash_replays_finished_suites(self, world: World) -> None:
        self.check_crash_replay(world)

    def test_failed_suite_stops_the_rest(self, world: World) -> None:
        self.check_failure_stops(world)

    def test_failed_suite_fails_the_train_run(self, world: World) -> None:
        from wf_world import hand_spec

        world.fakes.fail_eval = {"zoo"}
        st = world.run("TrainRun", "train/tiny", {"spec": hand_spec(), "eval_suites": ["ppl", "zoo", "arith"]})
        assert st.state == "failed"
        ids = [c.activity_id for c in world.fakes.calls]
        assert ids == ["train-000500", "eval-000500-ppl", "eval-000500-zoo"]

    def test_marshal_spec_names_one_suite(self) -> None:
        inp = EvalSuiteInput(
            name="tiny",
            tag="000500",
            suites=["ppl", "zoo"],
            seed=9,
            subjects=[EvalSubject(id="tiny-000500", model="runs/tiny/ckpt/step-000500")],
        )
        spec = json.loads(marshal_spec(inp, "zoo"))
        assert spec == {
            "name": "tiny",
            "tag": "000500",
            "suite": "zoo",
            "seed": 9,
            "corpus": "default",
            "subjects": [{"id": "tiny-000500", "model": "runs/tiny/ckpt/step-000500"}],
        }
        with pytest.raises(ValueError):
            marshal_spec(inp, "arith")
        untagged = json.loads(marshal_spec(inp.model_copy(update={"tag": ""}), "ppl"))
        assert "tag" not in untagged  # tinyllm's tag is an identifier or absent

    def test_marshal_spec_is_a_valid_tinyllm_eval_spec(self) -> None:
        from tinyllm.spec import EvalSpec

        inp = EvalSuiteInput(
            name="tiny",
            tag="000500",
            suites=["ppl", "zoo"],
            seed=9,
            subjects=[EvalSubject(id="tiny-000500", model="runs/tiny/ckpt/step-000500")],
        )
        for suite in inp.suites:
            spec = EvalSpec.model_validate_json(marshal_spec(inp, suite))
            assert spec.suite == suite and spec.run == "tiny-000500"

    def test_catches_s10_all_suites_in_one_activity(self, world: World) -> None:
        world.overrides["EvalSuite"] = m.s10_all_suites_one_activity
        with pytest.raises(AssertionError):
            self.check_order_and_specs(world)

    def test_catches_s10_crash_reruns_every_suite(self, world: World) -> None:
        world.overrides["EvalSuite"] = m.s10_all_suites_one_activity
        world.fakes.on_event = crash_once_at("start eval-all#1")
        eng = world.open()
        eng.start("EvalSuite", WID, suite_input())
        with pytest.raises(Crash):
            eng.run_until_complete(WID)
        world.open().run_until_complete(WID)
        with pytest.raises(AssertionError):  # the replay check: finished suites kept
            ids = [c.activity_id for c in world.fakes.calls]
            assert ids.count("eval-ppl") == 1 and ids.count("eval-zoo") == 1

    def test_catches_s11_continue_after_failed_suite(self, world: World) -> None:
        world.overrides["EvalSuite"] = m.s11_continue_after_failed_suite
        with pytest.raises(AssertionError):
            self.check_failure_stops(world)
