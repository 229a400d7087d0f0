"""tinyllm/faults.py's hold point: it holds only at the named step, says it is alive meanwhile, and
lets go on a stop request (the cancel tests rely on it to be mid-segment without a race)."""
from __future__ import annotations

from tinyllm import faults


def test_hold_point_holds_at_its_step_only_and_lets_go_on_stop(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.delenv(faults.HOLD_ENV, raising=False)
    never = lambda: calls.append("asked") or False  # noqa: E731
    assert not faults.hold_point(6, never, lambda: calls.append("alive"))  # unset: no hold (would never end)
    monkeypatch.setenv(faults.HOLD_ENV, "6")
    assert not faults.hold_point(5, never, lambda: calls.append("alive"))  # another step: no hold
    assert calls == []  # nothing asked either (on distributed ranks a stop check is a collective)
    polls = iter([False, False, True])
    assert faults.hold_point(6, lambda: next(polls), lambda: calls.append("alive"))
    assert calls == ["alive", "alive"]  # held, alive, until the stop request
