"""The real activities' pure parts: which checkpoint a segment resumes from, atomic writes,
and that the registration helper takes pluggable activities (real files, no trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest

import workflows
from workflows.activities import atomic_write_text, choose_resume


def make_ckpts(home: Path, steps: list[int], latest: int) -> None:
    d = home / "runs/tiny/ckpt"
    for s in steps:
        (d / f"step-{s:06d}").mkdir(parents=True)
    (d / "LATEST").write_text(f"step-{latest:06d}\n")


class TestChooseResume:
    def test_fresh_run_and_first_attempt_use_latest(self, tmp_path: Path) -> None:
        assert choose_resume(tmp_path, "tiny", 500, 1, None) is None
        make_ckpts(tmp_path, [100, 200], 200)
        assert choose_resume(tmp_path, "tiny", 500, 1, {"checkpoint": "runs/tiny/ckpt/step-000100"}) is None

    def test_redelivery_resumes_from_heartbeated_checkpoint(self, tmp_path: Path) -> None:
        make_ckpts(tmp_path, [500, 600, 700], 700)
        got = choose_resume(tmp_path, "tiny", 1000, 2, {"step": 700, "checkpoint": "runs/tiny/ckpt/step-000700"})
        assert got == "runs/tiny/ckpt/step-000700"

    def test_redelivery_prefers_a_newer_latest_than_the_heartbeat(self, tmp_path: Path) -> None:
        """A kill between writing step 740 and heartbeating it: the redelivered attempt resumes from
        LATEST (740, tinyllm's default), not the heartbeated 700, so steps 701..740 are not redone."""
        make_ckpts(tmp_path, [500, 700, 740], 740)
        assert choose_resume(tmp_path, "tiny", 1000, 2, {"checkpoint": "runs/tiny/ckpt/step-000700"}) is None

    def test_redelivery_with_missing_checkpoint_falls_back(self, tmp_path: Path) -> None:
        make_ckpts(tmp_path, [500], 500)
        assert choose_resume(tmp_path, "tiny", 1000, 2, {"checkpoint": "runs/tiny/ckpt/step-000700"}) is None

    def test_latest_beyond_the_segment(self, tmp_path: Path) -> None:
        """After a cancel at 740 a new run's first segment (to 500) resumes from step 500."""
        make_ckpts(tmp_path, [100, 500, 600, 700, 740], 740)
        assert choose_resume(tmp_path, "tiny", 500, 1, None) == "runs/tiny/ckpt/step-000500"
        assert choose_resume(tmp_path, "tiny", 1000, 1, None) is None
        assert choose_resume(tmp_path, "tiny", 650, 1, None) == "runs/tiny/ckpt/step-000600"


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "a" / "spec.json"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in p.parent.iterdir()] == ["spec.json"]  # no temporary left behind


def test_register_takes_explicit_activities() -> None:
    seen: dict = {}

    class Recorder:
        def register_workflow(self, name, fn, *, input_type=None):
            seen[name] = (fn, input_type)

        def register_activity(self, name, fn):
            seen[name] = fn

    fake = lambda ctx, x: x  # noqa: E731
    workflows.register(Recorder(), activities={"train": fake})
    assert seen["train"] is fake and seen["TrainRun"][0] is workflows.train_run
    assert seen["EvalSuite"][1] is workflows.EvalSuiteInput
    with pytest.raises(ValueError):
        workflows.register(Recorder(), activities={"trian": fake})


def test_real_activities_are_named() -> None:
    acts = workflows.tinyllm_activities("/nonexistent-home")
    assert set(acts) == {"train", "eval", "corpus", "publish"}  # publish: ModelRelease (workflows/release.py)


def test_which_attempts_go_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an activity's first attempt of tinyllm's own single-process command is offered the fork server; a
    redelivered attempt, a spec's own trainer and ranks start cold; CTL_WARM_START=0 turns it off. The server is
    a stand-in: which attempt is offered one is the point, not the fork (tests/engine/test_engine_forkserver.py)."""
    from types import SimpleNamespace

    from workflows.activities import TinyllmActivities, warm_fits

    server = object()
    monkeypatch.setattr(TinyllmActivities, "warm_server", lambda self: server)
    acts = TinyllmActivities(tmp_path, warm="lazy")

    def ctx(activity: str, attempt: int) -> SimpleNamespace:
        return SimpleNamespace(workflow_id="train/x", activity_id=activity, attempt=attempt)

    assert acts._launcher(ctx("train-000010", 1), True) is server
    assert acts._launcher(ctx("train-000010", 2), True) is None  # a redelivery: cold
    assert acts._launcher(ctx("train-000030", 1), False) is None
    assert not warm_fits({"trainer": {"command": ["python", "t.py"]}})
    assert not warm_fits({"distributed": {"world_size": 2}}) and not warm_fits({"distributed": {"world_size": 1}})
    assert warm_fits({"name": "x"})
    monkeypatch.setenv("CTL_WARM_START", "0")
    assert TinyllmActivities(tmp_path, warm="eager").warm == "off"
