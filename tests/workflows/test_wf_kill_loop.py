"""A crash at every position of a TrainRun: same result, exactly the same final loss.

Positions are every durable transaction of the engine (crashing before its COMMIT, so it is
lost, and after it, so it is kept) and every optimizer step of the fake trainer. After each
crash the Engine object is dropped and a new one recovers from the same SQLite file, as a
restarted worker does. The fakes stand in for tinyllm (tests/ctl kills real processes).
"""

from __future__ import annotations

import pytest

from engine import Store

from wf_world import World, small_spec
from wf_fakes import Crash, reference_loss

pytestmark = pytest.mark.slow  # a crash at every commit and every step (4-10 s each)

WID = "train/tiny"
INPUT = {"spec": small_spec(), "corpus": {"name": "default"}, "eval_suites": ["ppl", "zoo"]}
EVERY = small_spec()["checkpoint_every"]


class CrashStore(Store):
    """Raises ``Crash`` at the k-th commit, before or after it is durable."""

    def __init__(self, path, *, at: int, when: str):
        super().__init__(path)
        self.at, self.when, self.seen = at, when, 0

    def before_commit(self, label: str) -> None:
        if self.when == "before" and self.seen + 1 == self.at:
            raise Crash(f"before commit {self.at} ({label})")

    def after_commit(self, label: str) -> None:
        self.seen += 1
        if self.when == "after" and self.seen == self.at:
            raise Crash(f"after commit {self.at} ({label})")


def strip(result: dict) -> dict:
    """The result without ``resumed_from`` (where a resumed attempt started is allowed to differ)."""
    out = dict(result)
    out["segments"] = [
        {**s, "train": {k: v for k, v in s["train"].items() if k != "resumed_from"}} for s in result["segments"]
    ]
    return out


def baseline(tmp_path_factory) -> tuple[dict, int]:
    home = tmp_path_factory.mktemp("baseline")
    from engine import VirtualClock
    from wf_fakes import Fakes

    clock = VirtualClock()
    w = World(home=home, clock=clock, fakes=Fakes(home=home, clock=clock))
    eng = w.open()
    st = w.run("TrainRun", WID, INPUT)
    assert st.state == "completed"
    commits = eng.store.commits
    eng.close()
    return st.result, commits


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return baseline(tmp_path_factory)


def check_recovered(world: World, expected: dict, crash_label: str) -> None:
    world.engine = None
    eng = world.open()
    eng.start("TrainRun", WID, INPUT)  # the user runs the same command again
    st = eng.run_until_complete(WID)
    assert st.state == "completed", (crash_label, st.error)
    assert st.result["final_loss_hex"] == reference_loss(50, 7).hex(), crash_label
    assert strip(st.result) == strip(expected), crash_label
    completed = [e.attrs["activity_id"] for e in eng.history(WID) if e.type == "activity_completed"]
    assert len(completed) == len(set(completed)), (crash_label, "an activity completed twice")
    evals = [a for a in completed if a.startswith("eval-")]
    assert len(evals) == 3 * 2, crash_label  # each checkpoint evaluated once per suite
    timers = [e for e in eng.history(WID) if e.type == "timer_started"]
    assert len(timers) == 2, crash_label
    assert world.fakes.steps_taken <= 50 + EVERY, (crash_label, world.fakes.steps_taken)


class TestKillLoopResumesBitwise:
    @pytest.mark.parametrize("when", ["before", "after"])
    def test_crash_at_every_commit(self, tmp_path_factory, reference, when: str) -> None:
        expected, commits = reference
        assert commits > 20
        from engine import VirtualClock
        from wf_fakes import Fakes

        for k in range(1, commits + 1):
            home = tmp_path_factory.mktemp(f"{when}{k}")
            clock = VirtualClock()
            world = World(home=home, clock=clock, fakes=Fakes(home=home, clock=clock))
            eng = world.open(store=CrashStore(home / ".ctl" / "engine.db", at=k, when=when))
            with pytest.raises(Crash):
                eng.start("TrainRun", WID, INPUT)
                eng.run_until_complete(WID)
            check_recovered(world, expected, f"crash {when} commit {k}")
            world.engine.close()

    def test_crash_at_every_step(self, tmp_path_factory, reference) -> None:
        expected, _ = reference
        from engine import VirtualClock
        from wf_fakes import Fakes

        for crash_step in range(1, 51):
            home = tmp_path_factory.mktemp(f"step{crash_step}")
            clock = VirtualClock()
            world = World(home=home, clock=clock, fakes=Fakes(home=home, clock=clock))

            def hook(fakes, activity_id, attempt, step, at=crash_step):
                if attempt == 1 and step == at:
                    raise Crash(f"step {step}")

            world.fakes.on_step = hook
            eng = world.open()
            with pytest.raises(Crash):
                eng.start("TrainRun", WID, INPUT)
                eng.run_until_complete(WID)
            world.fakes.on_step = None
            check_recovered(world, expected, f"crash at step {crash_step}")
            last_ckpt = (crash_step - 1) // EVERY * EVERY
            assert world.fakes.steps_taken == 50 + (crash_step - last_ckpt), crash_step  # only since the checkpoint
            world.engine.close()
