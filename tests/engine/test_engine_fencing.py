"""Fencing: a stale attempt returns, or heartbeats, while the current attempt is still running.

Defect 4 of issue 9: the attempt number is the fencing token. Attempt 1 of an activity
lost its lease (its heartbeat timed out), worker B leased attempt 2 and is running it;
then attempt 1 wakes up on worker A. Its result must be dropped (the workflow ends with
attempt 2's result) and its heartbeat must raise ``LeaseLost`` without recording anything.
These are the two ``row[1] != lease.attempt`` checks of engine/worker.py (outcome path and
heartbeat path): with the activity row still ``running`` (attempt 2), nothing else tells
the attempts apart, so deleting either check turns one of these tests red.

Deterministic: one virtual clock, two Engines on one database (as two worker processes),
each running its attempt inline on its own thread; events order the steps.
"""

from __future__ import annotations

import threading

import pytest

from engine import LeaseLost, RetryPolicy, StepOptions
from engine._history import dumps

from eng_helpers import make_engine

WAIT_S = 60  # generous bound of each wait; never reached when the test passes
OPTS = StepOptions(id="train-000100", heartbeat_timeout_s=10, retry=RetryPolicy(max_attempts=3, initial_interval_s=0))


class Stage:
    """The two attempts' meeting points."""

    def __init__(self) -> None:
        self.a1_running, self.go_a1, self.a2_running, self.go_a2 = (threading.Event() for _ in range(4))

    @staticmethod
    def wait(ev: threading.Event, what: str) -> None:
        assert ev.wait(WAIT_S), f"timed out waiting for {what}"


def _wf():
    async def wf(rt, _):
        return await rt.execute_activity("train", None, OPTS)

    return wf


def _run_stale_attempt(db, clock, attempt1):
    """Attempt 1 on engine A, stale while attempt 2 runs on engine B; ``attempt1(ctx)`` is its stale act."""
    stage = Stage()
    outcome: dict = {}

    def train(ctx, _):
        if ctx.attempt == 1:
            ctx.heartbeat({"checkpoint": "step-000010"})
            stage.a1_running.set()
            stage.wait(stage.go_a1, "attempt 2 to be running")
            return attempt1(ctx, outcome)
        stage.a2_running.set()
        stage.wait(stage.go_a2, "attempt 1 to be done")
        return {"attempt": ctx.attempt, "resumed_from": ctx.last_heartbeat_details}

    a = make_engine(db, clock, workflows=[("w", _wf())], activities=[("train", train)])
    b = make_engine(db, clock, workflows=[("w", _wf())], activities=[("train", train)])
    a.start("w", "w", None)
    errors: list[BaseException] = []

    def in_thread(fn):
        def main():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        t = threading.Thread(target=main, daemon=True)
        t.start()
        return t

    ta = in_thread(a.run_until_idle)  # leases attempt 1 and runs it
    stage.wait(stage.a1_running, "attempt 1 to run")
    clock.advance(OPTS.heartbeat_timeout_s + 1)  # attempt 1 is silent past its heartbeat timeout
    tb = in_thread(b.run_until_idle)  # B times attempt 1 out and runs attempt 2
    stage.wait(stage.a2_running, "attempt 2 to run")
    stage.go_a1.set()  # attempt 1 wakes up while attempt 2 is running
    ta.join(WAIT_S)
    assert not ta.is_alive()
    stage.go_a2.set()
    tb.join(WAIT_S)
    assert not tb.is_alive() and not errors, errors
    b.run_until_complete("w")
    return a, b, outcome


def _activity_events(eng, attempt):
    return [e for e in eng.history("w") if e.attrs.get("attempt") == attempt and e.type.startswith("activity_")]


def test_a_stale_attempts_result_is_dropped_while_the_current_attempt_runs(db, clock):
    def attempt1(ctx, outcome):
        return {"attempt": 1, "resumed_from": None}  # the late result of the stale attempt

    a, b, _ = _run_stale_attempt(db, clock, attempt1)
    assert b.result("w") == {"attempt": 2, "resumed_from": {"checkpoint": "step-000010"}}
    completed = [e for e in b.history("w") if e.type == "activity_completed"]
    assert [e.attrs["attempt"] for e in completed] == [2]
    assert [e.type for e in _activity_events(b, 1)] == ["activity_started", "activity_heartbeat", "activity_timed_out"]


def test_a_stale_attempts_heartbeat_raises_lease_lost_and_records_nothing(db, clock):
    def attempt1(ctx, outcome):
        with pytest.raises(LeaseLost, match="no longer current"):
            ctx.heartbeat({"checkpoint": "step-000020"})
        outcome["lease_lost"] = True
        raise RuntimeError("stopped after LeaseLost")  # as the runner stops its child

    a, b, outcome = _run_stale_attempt(db, clock, attempt1)
    assert outcome.get("lease_lost")
    assert b.result("w") == {"attempt": 2, "resumed_from": {"checkpoint": "step-000010"}}
    assert [e.type for e in _activity_events(b, 1)] == [
        "activity_started",
        "activity_heartbeat",
        "activity_timed_out",
    ]  # no heartbeat, no failure of 1
    details = b.activities("w")[0].last_heartbeat_details
    assert details is not None and "step-000020" not in dumps(details)  # the stale heartbeat's details were not kept
