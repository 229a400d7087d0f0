"""Activities: heartbeat timeout and redelivery, fencing, retries and their recorded due times."""

from __future__ import annotations

import threading
import time

import pytest

from engine import (
    ActivityError,
    LeaseLost,
    NonRetryableError,
    RetryPolicy,
    StepOptions,
    SystemClock,
    WorkflowFailed,
)

from eng_helpers import make_engine


def one_activity(name, options):
    async def wf(rt, inp):
        return await rt.execute_activity(name, inp, options)

    return wf


def test_heartbeat_timeout_redelivers_next_attempt_with_last_details(db, clock):
    seen = []

    def train(ctx, _):
        seen.append((ctx.attempt, ctx.last_heartbeat_details))
        if ctx.attempt == 1:
            ctx.heartbeat({"checkpoint": "step-000700"})
            ctx.clock.advance(61)  # silent past the heartbeat timeout
            ctx.heartbeat({"checkpoint": "step-000800"})  # too late: this attempt is stale
            raise AssertionError("a stale heartbeat must raise")
        return {"resumed_from": ctx.last_heartbeat_details["checkpoint"]}

    opts = StepOptions(
        id="train-001000", heartbeat_timeout_s=60, retry=RetryPolicy(max_attempts=3, initial_interval_s=1)
    )
    eng = make_engine(db, clock, workflows=[("w", one_activity("train", opts))], activities=[("train", train)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    assert eng.result("w") == {"resumed_from": "step-000700"}
    assert seen == [(1, None), (2, {"checkpoint": "step-000700"})]
    timed_out = [e for e in eng.history("w") if e.type == "activity_timed_out"]
    assert len(timed_out) == 1 and timed_out[0].attrs["kind"] == "heartbeat timeout"
    assert timed_out[0].attrs["final"] is False


def test_threaded_heartbeat_timeout_fences_the_stale_attempt(db):
    """Real threads and the system clock: attempt 1 hangs, attempt 2 takes over, 1's late result is dropped."""
    release = threading.Event()
    stale_errors = []

    def train(ctx, _):
        if ctx.attempt == 1:
            ctx.heartbeat({"step": 10})
            release.wait(30)
            try:
                ctx.heartbeat({"step": 20})
            except LeaseLost as e:
                stale_errors.append(str(e))
            return "from attempt 1"
        release.set()
        return f"from attempt {ctx.attempt} after {ctx.last_heartbeat_details}"

    opts = StepOptions(id="t", heartbeat_timeout_s=0.3, retry=RetryPolicy(max_attempts=5, initial_interval_s=0.01))
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one_activity("train", opts))],
        activities=[("train", train)],
        inline=False,
        poll_interval_s=0.02,
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    assert eng.result("w") == "from attempt 2 after {'step': 10}"
    deadline = time.monotonic() + 10
    while not stale_errors and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stale_errors and "no longer current" in stale_errors[0]
    completed = [e for e in eng.history("w") if e.type == "activity_completed"]
    assert [e.attrs["attempt"] for e in completed] == [2]


@pytest.mark.parametrize("error", [NonRetryableError("bad spec", type="BadSpec"), KeyError("missing")])
def test_non_retryable_fails_at_once(db, clock, error):
    calls = []

    def act(ctx, _):
        calls.append(ctx.attempt)
        raise error

    opts = StepOptions(id="a", retry=RetryPolicy(max_attempts=5, non_retryable=("KeyError",)))
    eng = make_engine(db, clock, workflows=[("w", one_activity("act", opts))], activities=[("act", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    assert calls == [1]
    with pytest.raises(WorkflowFailed) as ei:
        eng.result("w")
    assert ei.value.type == getattr(error, "type", type(error).__name__)  # the activity's error type
    assert eng.status("w").error["class"] == "ActivityError"
    failed = [e for e in eng.history("w") if e.type == "activity_failed"]
    assert len(failed) == 1 and failed[0].attrs["final"] and failed[0].attrs["error"]["non_retryable"]


def test_retryable_backs_off_per_policy_then_fails_for_good(db, clock):
    t0 = clock.now()

    def act(ctx, _):
        raise RuntimeError(f"attempt {ctx.attempt} broke")

    opts = StepOptions(id="a", retry=RetryPolicy(max_attempts=4, initial_interval_s=2, backoff=3, max_interval_s=10))
    caught = []

    async def wf(rt, _):
        try:
            await rt.execute_activity("act", None, opts)
        except ActivityError as e:
            caught.append((e.attempt, e.type, e.non_retryable))
            raise

    eng = make_engine(db, clock, workflows=[("w", wf)], activities=[("act", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    hist = eng.history("w")
    failed = [e for e in hist if e.type == "activity_failed"]
    started = [e for e in hist if e.type == "activity_started"]
    # waits 2, 2*3=6, min(2*9, 10)=10 after each failure
    assert [e.attrs["retry_at"] - e.time for e in failed[:-1]] == [2.0, 6.0, 10.0]
    assert [e.time - t0 for e in started] == [0.0, 2.0, 8.0, 18.0]
    assert [e.attrs["final"] for e in failed] == [False, False, False, True]
    assert caught == [(4, "RuntimeError", False)]
    assert eng.status("w").state == "failed"


def test_start_to_close_timeout_retries_and_late_result_is_dropped(db, clock):
    def slow(ctx, _):
        if ctx.attempt == 1:
            ctx.clock.advance(11)  # runs past start_to_close
            return "late"
        return "on time"

    opts = StepOptions(id="s", start_to_close_timeout_s=10, retry=RetryPolicy(max_attempts=2, initial_interval_s=1))
    eng = make_engine(db, clock, workflows=[("w", one_activity("slow", opts))], activities=[("slow", slow)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    assert eng.result("w") == "on time"
    kinds = [e.attrs.get("kind") for e in eng.history("w") if e.type == "activity_timed_out"]
    assert kinds == ["start-to-close timeout"]


def test_timeouts_exhaust_attempts(db, clock):
    def hang(ctx, _):
        ctx.clock.advance(100)
        return "never"

    opts = StepOptions(id="h", heartbeat_timeout_s=5, retry=RetryPolicy(max_attempts=2, initial_interval_s=1))
    eng = make_engine(db, clock, workflows=[("w", one_activity("hang", opts))], activities=[("hang", hang)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    with pytest.raises(WorkflowFailed, match="timed out"):
        eng.result("w")
    assert [e.attrs["final"] for e in eng.history("w") if e.type == "activity_timed_out"] == [False, True]


def test_a_lease_is_a_compare_and_set(db, clock):
    """Two workers that both saw the activity as due: only the first lease wins (white-box)."""

    async def wf(rt, _):
        return await rt.execute_activity("later", 1, StepOptions(id="x"))

    starter = make_engine(db, clock, workflows=[("w", wf)])  # knows no activity: nothing is leased eagerly
    starter.start("w", "w", None)
    starter.run_until_idle()
    a = make_engine(db, clock, workflows=[("w", wf)], activities=[("later", lambda ctx, x: x)])
    b = make_engine(db, clock, workflows=[("w", wf)], activities=[("later", lambda ctx, x: x)])
    with a._worker.tx("lease") as (tx, _):
        first = a._worker.lease(tx, "w", "x")
    with b._worker.tx("lease") as (tx, _):
        second = b._worker.lease(tx, "w", "x")
    assert first is not None and first.attempt == 1
    assert second is None
    assert [e.attrs["attempt"] for e in a.history("w") if e.type == "activity_started"] == [1]
