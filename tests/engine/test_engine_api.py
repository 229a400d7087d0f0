"""The public surface end to end: start, run, status, result, history, idempotent start, bad input."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from engine import (
    BadInput,
    NotFound,
    StepOptions,
    WorkflowFailed,
    WorkflowRunning,
)

from eng_helpers import make_engine


class AddIn(BaseModel):
    start: int
    count: int


class Total(BaseModel):
    value: int


def add_one(ctx, x):
    return Total(value=x["value"] + 1)


async def counter(rt, inp: AddIn):
    total = Total(value=inp.start)
    for i in range(inp.count):
        total = await rt.execute_activity("add_one", total, StepOptions(id=f"add-{i:03d}"), result_type=Total)
    return total


async def broken(rt, inp):
    raise ValueError("boom in workflow code")


def engine(db, clock, **kw):
    return make_engine(
        db,
        clock,
        workflows=[("counter", counter, AddIn), ("broken", broken)],
        activities=[("add_one", add_one)],
        **kw,
    )


def test_counter_runs_to_completion_with_typed_io(db, clock):
    eng = engine(db, clock)
    assert eng.start("counter", "count/a", {"start": 5, "count": 3}) == "count/a"
    st = eng.run_until_complete("count/a")
    assert st.state == "completed"
    assert eng.result("count/a") == {"value": 8}
    types = [e.type for e in eng.history("count/a")]
    assert types[0] == "workflow_started" and types[-1] == "workflow_completed"
    assert types.count("activity_completed") == 3
    assert [e.seq for e in eng.history("count/a")] == list(range(1, len(types) + 1))
    assert [w.workflow_id for w in eng.list_workflows()] == ["count/a"]
    assert [a.state for a in eng.activities("count/a")] == ["completed"] * 3


def test_same_id_started_twice_is_one_workflow(db, clock):
    eng = engine(db, clock)
    eng.start("counter", "train/tiny", {"start": 0, "count": 2})
    eng.start("counter", "train/tiny", {"start": 100, "count": 9})  # ignored: the id exists
    other = engine(db, clock)  # another Engine on the same file (as another process would)
    other.start("counter", "train/tiny", {"start": 7, "count": 1})
    eng.run_until_complete("train/tiny")
    assert eng.result("train/tiny") == {"value": 2}
    assert len(eng.list_workflows()) == 1
    assert sum(e.type == "workflow_started" for e in eng.history("train/tiny")) == 1


def test_result_while_running_and_failed_workflow(db, clock):
    eng = engine(db, clock)
    eng.start("counter", "c1", {"start": 0, "count": 1})
    with pytest.raises(WorkflowRunning, match="still running"):
        eng.result("c1")
    eng.start("broken", "b1", None)
    eng.run_until_idle()
    assert eng.status("b1").state == "failed"
    with pytest.raises(WorkflowFailed, match="boom in workflow code") as ei:
        eng.result("b1")
    assert ei.value.type == "ValueError"


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/../b", "x" * 300, "é", None, 5])
def test_malformed_ids_are_refused(db, clock, bad):
    eng = engine(db, clock)
    with pytest.raises(BadInput, match="malformed workflow id"):
        eng.start("counter", bad, {"start": 0, "count": 1})
    assert eng.list_workflows() == []


def test_unknown_names_and_ids_and_bad_input(db, clock):
    eng = engine(db, clock)
    with pytest.raises(NotFound, match="no workflow registered as 'nope'"):
        eng.start("nope", "w1", None)
    with pytest.raises(NotFound, match="no workflow with id 'missing'"):
        eng.status("missing")
    with pytest.raises(BadInput, match="input of workflow 'counter' is invalid"):
        eng.start("counter", "w2", {"start": "not a number", "count": 1})
    with pytest.raises(BadInput, match="must be an `async def"):
        eng.register_workflow("sync", lambda rt, x: x)
    assert eng.list_workflows() == []


def test_unknown_activity_name_leaves_workflow_waiting_for_a_worker(db, clock):
    """An activity no worker has registered stays scheduled; a worker that knows it finishes it."""

    async def uses_unknown(rt, _):
        return await rt.execute_activity("later", 1, StepOptions(id="x"))

    eng = make_engine(db, clock, workflows=[("u", uses_unknown)])
    eng.start("u", "u1", None)
    eng.run_until_idle()
    assert eng.status("u1").waiting_on.startswith("activity x (scheduled")
    eng2 = make_engine(db, clock, workflows=[("u", uses_unknown)], activities=[("later", lambda ctx, x: x * 2)])
    eng2.run_until_complete("u1")
    assert eng2.result("u1") == 2


def test_activity_id_used_twice_fails_the_workflow(db, clock):
    async def dup(rt, _):
        await rt.execute_activity("add_one", {"value": 0}, StepOptions(id="same"))
        await rt.execute_activity("add_one", {"value": 0}, StepOptions(id="same"))

    eng = make_engine(db, clock, workflows=[("dup", dup)], activities=[("add_one", add_one)])
    eng.start("dup", "d", None)
    eng.run_until_complete("d")
    with pytest.raises(WorkflowFailed, match="used twice"):
        eng.result("d")


def test_non_json_activity_input_fails_the_workflow_clearly(db, clock):
    async def wf(rt, _):
        return await rt.execute_activity("add_one", {"value": object()}, StepOptions(id="a"))

    eng = make_engine(db, clock, workflows=[("w", wf)], activities=[("add_one", add_one)])
    eng.start("w", "w", None)
    eng.run_until_complete("w")
    with pytest.raises(WorkflowFailed, match="input of activity 'a' is not JSON-able"):
        eng.result("w")
    assert not any(e.type == "activity_scheduled" for e in eng.history("w"))


def test_activities_of_every_end_from_open_rows_and_history(db, clock):
    """Closed activities have no row (engine schema 3): their state, attempt and last details come from the
    history; an open one's from its row. Failed for good, retried then completed, canceled by the end."""
    from engine import RetryPolicy, StepOptions

    calls = {"flaky": 0}

    def flaky(ctx, x):
        calls["flaky"] += 1
        ctx.heartbeat({"try": calls["flaky"]})
        if calls["flaky"] == 1:
            raise RuntimeError("once")
        return x

    def doomed(ctx, x):
        raise ValueError("never")

    async def wf(rt, x):
        await rt.execute_activity("flaky", x, StepOptions(id="f", retry=RetryPolicy(initial_interval_s=1)))
        try:
            await rt.execute_activity("doomed", x, StepOptions(id="d", retry=RetryPolicy(max_attempts=1)))
        except Exception:  # noqa: BLE001
            pass
        await rt.execute_activity("never-run", x, StepOptions(id="n"))  # no worker knows it: still scheduled

    eng = make_engine(db, clock, workflows=[("wf", wf)], activities=[("flaky", flaky), ("doomed", doomed)])
    eng.start("wf", "w", 1)
    eng.run_until_idle()
    clock.advance(2)
    eng.run_until_idle()
    got = [(a.activity_id, a.name, a.state, a.attempt, a.last_heartbeat_details) for a in eng.activities("w")]
    assert got == [
        ("f", "flaky", "completed", 2, {"try": 2}),
        ("d", "doomed", "failed", 1, None),
        ("n", "never-run", "scheduled", 0, None),
    ]
    assert eng.store.query("SELECT activity_id FROM activities") == [("n",)]
    eng.cancel("w")
    eng.run_until_idle()
    assert [a.state for a in eng.activities("w")] == ["completed", "failed", "canceled"]
    assert eng.store.query("SELECT COUNT(*) FROM activities") == [(0,)]
