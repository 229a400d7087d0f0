"""Replay: every recorded prefix reproduces the same commands; the golden history still replays."""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Event, RetryPolicy, StepOptions, VirtualClock, replay_history

import eng_golden
from eng_helpers import make_engine

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "history.json")

steps = st.lists(
    st.one_of(
        st.tuples(st.just("act"), st.integers(min_value=0, max_value=2)),  # fails that many times first
        st.tuples(st.just("sleep"), st.integers(min_value=0, max_value=50)),
    ),
    min_size=0,
    max_size=6,
)


def act(ctx, x):
    if ctx.attempt <= x["fail"]:
        raise RuntimeError(f"planned failure {ctx.attempt}")
    return {"i": x["i"], "attempt": ctx.attempt}


async def program(rt, plan):
    out = []
    for i, (kind, arg) in enumerate(plan):
        if kind == "act":
            out.append(
                await rt.execute_activity(
                    "act",
                    {"i": i, "fail": arg},
                    StepOptions(id=f"step-{i}", retry=RetryPolicy(max_attempts=3, initial_interval_s=1)),
                )
            )
        else:
            await rt.sleep(arg)
            out.append(rt.now())
    return out


def recorded_commands(events):
    return [
        ("activity", e.attrs["activity_id"], e.attrs["name"])
        if e.type == "activity_scheduled"
        else ("timer", None, None)
        for e in events
        if e.type in ("activity_scheduled", "timer_started")
    ]


def as_tuples(commands):
    return [(c.kind, c.activity_id, c.name) for c in commands]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps)
def test_replay_of_every_prefix_reproduces_the_same_commands(plan):
    plan = [list(p) for p in plan]
    with tempfile.TemporaryDirectory() as d:
        eng = make_engine(
            os.path.join(d, "e.db"), VirtualClock(), workflows=[("p", program)], activities=[("act", act)]
        )
        eng.start("p", "p", plan)
        eng.run_until_complete("p")
        result = eng.result("p")
        hist = eng.history("p")
        eng.close()
    full = recorded_commands(hist)
    for k in range(1, len(hist) + 1):
        prefix = hist[:k]
        rec = recorded_commands(prefix)
        res = replay_history(program, prefix)
        issued = as_tuples(res.commands)
        assert issued[: len(rec)] == rec  # the recorded commands, in order
        assert len(issued) <= len(rec) + 1  # at most one new command: the one the history blocks on
        if len(issued) == len(rec) + 1:
            assert issued[-1] == full[len(rec)]  # ... and it is the one recorded next
        if res.done:
            assert res.outcome == ("completed", result)
    assert replay_history(program, hist).outcome == ("completed", result)


def test_golden_history_replays_to_the_recorded_result():
    with open(GOLDEN) as f:
        golden = json.load(f)
    events = [Event.from_json(e) for e in golden["events"]]
    res = replay_history(
        eng_golden.golden, events, workflow_id=golden["workflow_id"], input_type=eng_golden.GoldenInput
    )
    assert as_tuples(res.commands) == recorded_commands(events)
    assert res.new_commands == []
    assert res.done and res.outcome == ("completed", golden["result"])
    # the history is the product's format: a workflow started / ended pair and commands by index
    assert events[0].type == "workflow_started" and events[-1].type == "workflow_completed"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_golden_workflow_still_records_the_same_history(tmp_path):
    """Running the golden workflow today records the same events (times, attrs) as the file."""
    with open(GOLDEN) as f:
        golden = json.load(f)
    eng = make_engine(str(tmp_path / "e.db"), eng_golden.clock())
    eng_golden.register(eng)
    eng.start("golden", golden["workflow_id"], eng_golden.INPUT)
    eng.run_until_complete(golden["workflow_id"])
    now = []
    for e in eng.history(golden["workflow_id"]):
        d = e.to_json()
        if isinstance(d["attrs"].get("error"), dict):
            d["attrs"]["error"].pop("traceback", None)
        d["attrs"].pop("worker", None)
        now.append(json.loads(json.dumps(d)))
    assert now == golden["events"]
