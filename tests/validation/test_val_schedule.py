"""The schedule: step 0 fresh model, step k after update k; periodic, before_training, final always, dedup."""

from hypothesis import given, strategies as st

from tinyllm.validation_config import ValidationConfig
from tinyllm.validation.schedule import is_validation_step

D = {"path": "h.txt"}


def validation_steps(total_steps: int, cfg: ValidationConfig | None, start_step: int = 0) -> list[int]:
    """The validation steps in ``[start_step, total_steps]``, ascending, each once."""
    return [s for s in range(max(0, start_step), total_steps + 1) if is_validation_step(s, total_steps, cfg)]


def cfg(**kw):
    return ValidationConfig(enabled=True, data=D, **kw)


def test_seed_examples():
    c = cfg(before_training=True, every_steps=2)
    assert validation_steps(4, c) == [0, 2, 4]
    assert validation_steps(3, c) == [0, 2, 3]


def test_every_zero_disables_only_periodic():
    assert validation_steps(10, cfg(every_steps=0)) == [10]
    assert validation_steps(10, cfg(every_steps=0, before_training=True)) == [0, 10]


def test_disabled_or_absent_never_validates():
    assert validation_steps(10, None) == []
    assert validation_steps(10, ValidationConfig(every_steps=2)) == []


def test_default_cadence():
    assert validation_steps(45, cfg()) == [20, 40, 45]


def test_resumed_process_sees_the_rest_of_the_same_schedule():
    c = cfg(before_training=True, every_steps=3)
    assert validation_steps(10, c, start_step=4) == [6, 9, 10]


@given(st.integers(0, 60), st.integers(0, 7), st.booleans())
def test_properties(n, every, before):
    c = cfg(every_steps=every, before_training=before)
    steps = validation_steps(n, c)
    assert steps == sorted(set(steps)) and steps[-1] == n
    assert (0 in steps) == (before or n == 0)
    for s in range(1, n):
        assert (s in steps) == (every > 0 and s % every == 0)
