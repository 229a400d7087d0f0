"""Durable timers, cancel (during an activity, a timer, between commands) and nondeterminism."""

from __future__ import annotations

import threading
import time

import pytest

from engine import Canceled, NondeterminismError, StepOptions, SystemClock, WorkflowCanceled, WorkflowFailed

from eng_helpers import make_engine


def counting(calls):
    def act(ctx, x):
        calls.append(ctx.activity_id)
        return x

    return act


async def eval_then_wait(rt, _):
    await rt.execute_activity("act", 1, StepOptions(id="eval-000500-ppl"))
    await rt.sleep(100)
    await rt.execute_activity("act", 2, StepOptions(id="train-001000"))
    return rt.now()


def test_timer_fires_once_and_restart_waits_only_the_remainder(db, clock):
    calls = []
    t0 = clock.now()
    eng = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", counting(calls))])
    eng.start("w", "w", None)
    eng.run_until_idle()
    assert calls == ["eval-000500-ppl"]
    clock.advance(40)
    eng.run_until_idle()  # not due yet
    del eng  # the worker goes away mid-wait
    eng2 = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", counting(calls))])
    eng2.run_until_complete("w")
    assert eng2.result("w") == t0 + 100  # the timer fired at its recorded time: 60 s more, not 100
    assert calls == ["eval-000500-ppl", "train-001000"]  # the evaluation before the wait is not repeated
    fired = [e for e in eng2.history("w") if e.type == "timer_fired"]
    assert len(fired) == 1 and fired[0].time == t0 + 100


def test_cancel_during_timer_cancels_it_at_once(db, clock):
    calls = []
    eng = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", counting(calls))])
    eng.start("w", "w", None)
    eng.run_until_idle()
    clock.advance(10)
    other = make_engine(db, clock, workflows=[("w", eval_then_wait)])  # e.g. `ctl cancel` in another process
    assert other.cancel("w") is True
    assert other.cancel("w") is False  # already requested
    t_cancel = clock.now()
    eng.run_until_idle()
    st = eng.status("w")
    assert st.state == "canceled" and st.cancel_requested
    hist = eng.history("w")
    assert [e.type for e in hist][-3:] == ["cancel_requested", "timer_canceled", "workflow_canceled"]
    assert hist[-1].time == t_cancel  # no waiting for the timer
    with pytest.raises(WorkflowCanceled):
        eng.result("w")
    clock.advance(1000)
    eng.run_until_idle()
    assert calls == ["eval-000500-ppl"]
    assert not any(e.type == "timer_fired" for e in eng.history("w"))


def test_cancel_during_activity_reaches_it(db, clock):
    other = make_engine(db, clock, workflows=[("w", eval_then_wait)])

    def act(ctx, x):
        assert not ctx.cancel_requested
        other.cancel(ctx.workflow_id)  # arrives while the activity runs
        assert ctx.cancel_requested
        raise Canceled("stopped after a checkpoint")

    eng = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    st = eng.status("w")
    assert st.state == "canceled"
    assert st.error["class"] == "ActivityError" and st.error["cause"]["type"] == "Canceled"
    assert [e.type for e in eng.history("w")][-2:] == ["activity_canceled", "workflow_canceled"]


def test_cancel_reaches_the_next_command_when_the_activity_finishes(db, clock):
    calls = []
    other = make_engine(db, clock, workflows=[("w", eval_then_wait)])

    def act(ctx, x):
        calls.append(ctx.activity_id)
        other.cancel(ctx.workflow_id)
        return x  # finishes its work anyway

    eng = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    assert eng.status("w").state == "canceled"
    types = [e.type for e in eng.history("w")]
    assert "activity_completed" in types and "timer_started" not in types
    assert calls == ["eval-000500-ppl"]


def test_cancel_before_the_first_command_and_code_that_catches_it(db, clock):
    calls = []

    async def catches(rt, _):
        try:
            await rt.execute_activity("act", 1, StepOptions(id="a"))
        except Canceled as e:
            raise RuntimeError("wrapped") from e  # still canceled: the error wraps Canceled

    eng = make_engine(
        db, clock, workflows=[("w", eval_then_wait), ("c", catches)], activities=[("act", counting(calls))]
    )
    for wf, wid in (("w", "w1"), ("c", "c1")):
        eng.start(wf, wid, None)
        eng.cancel(wid)
        eng.run_until_complete(wid)
        assert eng.status(wid).state == "canceled"
    assert calls == []
    assert eng.status("c1").error["type"] == "RuntimeError"


def test_cancel_from_another_thread_reaches_a_threaded_activity(db):
    started = threading.Event()

    def long(ctx, x):
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.cancel_requested:
            assert time.monotonic() < deadline, "cancel never arrived"
            ctx.heartbeat({"alive": True})
            time.sleep(0.01)
        raise Canceled("saw the cancel")

    async def wf(rt, _):
        return await rt.execute_activity("long", 1, StepOptions(id="long", heartbeat_timeout_s=30))

    eng = make_engine(
        db, SystemClock(), workflows=[("w", wf)], activities=[("long", long)], inline=False, poll_interval_s=0.02
    )
    eng.start("w", "w", None)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("st", eng.run_until_complete("w", timeout_s=30)))
    t.start()
    assert started.wait(20)
    canceller = make_engine(db, SystemClock(), workflows=[("w", wf)])
    canceller.cancel("w")
    t.join(30)
    assert out["st"].state == "canceled"


@pytest.mark.parametrize("change", ["other_id", "other_name", "timer_instead"])
def test_changed_workflow_code_is_a_nondeterminism_error(db, clock, change):
    calls = []
    eng = make_engine(db, clock, workflows=[("w", eval_then_wait)], activities=[("act", counting(calls))])
    eng.start("w", "w", None)
    eng.run_until_idle()  # first activity done, waiting on the timer
    before = eng.history("w")

    async def v2(rt, _):
        if change == "other_id":
            await rt.execute_activity("act", 1, StepOptions(id="eval-000600-ppl"))
        elif change == "other_name":
            await rt.execute_activity("act2", 1, StepOptions(id="eval-000500-ppl"))
        else:
            await rt.sleep(5)
        return "v2"

    eng2 = make_engine(
        db, clock, workflows=[("w", v2)], activities=[("act", counting(calls)), ("act2", counting(calls))]
    )
    clock.advance(100)  # the timer fires: the new code runs a workflow task over the old history
    eng2.run_until_idle()
    st = eng2.status("w")
    assert st.state == "failed" and st.error["type"] == "NondeterminismError"
    assert "command #0" in st.error["message"]
    with pytest.raises(WorkflowFailed, match="recorded"):
        eng2.result("w")
    after = eng2.history("w")
    assert after[: len(before)] == before  # nothing recorded was rewritten
    assert calls == ["eval-000500-ppl"]  # and nothing re-ran
    assert NondeterminismError.__name__ == st.error["class"]


def test_nothing_is_recorded_after_the_end(db, clock):
    """An attempt still running when its workflow ends (here: by nondeterminism) is fenced off."""
    outcome = {}

    async def v1(rt, _):
        await rt.sleep(10)
        return await rt.execute_activity("slow", 1, StepOptions(id="slow"))

    async def v2(rt, _):
        await rt.execute_activity("slow", 1, StepOptions(id="other"))

    other = {}

    def slow(ctx, x):
        # while this attempt runs, a worker with changed code ends the workflow
        eng2 = make_engine(db, clock, workflows=[("w", v2)])
        eng2.cancel(ctx.workflow_id)
        eng2.run_until_idle()
        other["state"] = eng2.status(ctx.workflow_id).state
        outcome["cancel_seen"] = ctx.cancel_requested
        try:
            ctx.heartbeat({"late": True})
        except Exception as e:  # noqa: BLE001
            outcome["heartbeat"] = type(e).__name__
        return "late result"

    eng = make_engine(db, clock, workflows=[("w", v1)], activities=[("slow", slow)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    assert other["state"] == "failed"
    assert outcome == {"cancel_seen": True, "heartbeat": "LeaseLost"}
    hist = eng.history("w")
    assert hist[-1].type == "workflow_failed" and hist[-1].attrs["error"]["type"] == "NondeterminismError"
