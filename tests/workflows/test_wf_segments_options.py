"""segments() and the step options: pure functions, checked against independent arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows import eval_options, segments, train_options
from workflows import training as tr_mod
from workflows import options as opt_mod

import wf_mutants as m


def check_segments(fn, steps: int, every: int) -> None:
    ends = fn(steps, every)
    assert ends[-1] == steps, "the last boundary is N"
    assert all(a < b for a, b in zip(ends, ends[1:])), "strictly increasing: no boundary repeated"
    if every == 0 or every >= steps:
        assert ends == [steps]
    else:
        assert len(ends) == math.ceil(steps / every)
        assert ends == [min(i * every, steps) for i in range(1, len(ends) + 1)]


class TestSegmentsMath:
    """Boundaries end at N, never repeat; e = 0 and e >= N are one segment."""

    @pytest.mark.parametrize(
        "steps,every,expected",
        [
            (1200, 500, [500, 1000, 1200]),
            (1000, 500, [500, 1000]),
            (1000, 0, [1000]),
            (1000, 1000, [1000]),
            (1000, 5000, [1000]),
            (1, 1, [1]),
            (7, 3, [3, 6, 7]),
        ],
    )
    def test_table(self, steps: int, every: int, expected: list[int]) -> None:
        assert segments(steps, every) == expected

    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 5000), st.integers(0, 6000))
    def test_properties(self, steps: int, every: int) -> None:
        check_segments(segments, steps, every)

    @pytest.mark.parametrize("steps,every", [(0, 1), (-5, 1), (10, -1)])
    def test_rejects_nonsense(self, steps: int, every: int) -> None:
        with pytest.raises(ValueError):
            segments(steps, every)

    @pytest.mark.parametrize("mutant", [m.s01_segments_drop_last, m.s04_segments_repeat_boundary])
    def test_catches_s01_s04(self, mutant) -> None:
        with pytest.raises(AssertionError):
            for steps, every in [(1200, 500), (1000, 500)]:
                check_segments(mutant, steps, every)


def check_options(train_opts, eval_opts) -> None:
    t = train_opts(500)
    assert t.id == "train-000500" and train_opts(1200).id == "train-001200"
    assert train_opts(123456).id == "train-123456"
    assert t.heartbeat_timeout_s is not None and 0 < t.heartbeat_timeout_s <= 600
    assert t.start_to_close_timeout_s is None or t.start_to_close_timeout_s >= 24 * 3600
    assert t.retry.max_attempts == 0 or t.retry.max_attempts >= 3, "train is retried"
    assert "BadInput" in t.retry.non_retryable
    assert eval_opts("000500", "ppl").id == "eval-000500-ppl"
    assert eval_opts("", "zoo").id == "eval-zoo"
    assert eval_opts("000500", "zoo").id != eval_opts("000500", "ppl").id
    assert eval_opts("000500", "ppl").heartbeat_timeout_s is not None


class TestOptionsIDs:
    """train-000500, eval-000500-ppl, eval-zoo; heartbeat timeouts set; train retried."""

    def test_options(self) -> None:
        check_options(train_options, eval_options)

    def test_heartbeat_timeout_configurable(self) -> None:
        assert train_options(500, heartbeat_timeout_s=5.0).heartbeat_timeout_s == 5.0

    def test_run_input_sets_the_heartbeat_timeout(self, world) -> None:
        from wf_world import hand_spec

        world.run("TrainRun", "train/tiny", {"spec": hand_spec(steps=100), "train_heartbeat_timeout_s": 7})
        sched = [e for e in world.events("train/tiny") if e.type == "activity_scheduled"]
        assert sched[0].attrs["options"]["heartbeat_timeout_s"] == 7

    def test_workflow_uses_these_options(self) -> None:
        assert tr_mod.train_options is opt_mod.train_options

    @pytest.mark.parametrize(
        "mutant,which",
        [
            (m.s12_train_options_no_heartbeat, "train"),
            (m.s02_train_options_unnamed, "train"),
            (m.s03_eval_options_unnamed, "eval"),
        ],
    )
    def test_catches_s02_s03_s12(self, mutant, which: str) -> None:
        with pytest.raises(AssertionError):
            if which == "train":
                check_options(mutant, eval_options)
            else:
                check_options(train_options, mutant)
