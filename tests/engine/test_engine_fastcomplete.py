"""The cached completion (``Worker._complete_cached``: the fencing check and the close in one DELETE, the
completed event in one INSERT with the next task's events) falls back to the plain path whenever its
assumptions fail: a row that is not this running attempt's, a late attempt, an event appended by
someone else since the replayer last saw the history."""

from __future__ import annotations

import pytest

from engine import Engine, RetryPolicy, StepOptions, VirtualClock, WorkflowCanceled
from engine import _history as h

from eng_helpers import make_engine


async def two_steps(rt, n):
    out = []
    for i in range(n):
        out.append(
            await rt.execute_activity(
                "step", i, StepOptions(id=f"s{i}", start_to_close_timeout_s=5, retry=RetryPolicy(initial_interval_s=0))
            )
        )
    return out


def _types(eng, wid):
    return [(e.type, e.attrs.get("activity_id"), e.attrs.get("attempt")) for e in eng.history(wid)]


def test_a_cancel_recorded_by_another_engine_while_the_attempt_runs(tmp_path):
    """The cancel's event takes the seq the cached replayer expected: the fast path's INSERT fails, its
    transaction rolls back, and the plain path records the completion after the cancel and ends the
    workflow canceled (no IntegrityError, nothing lost)."""
    path = str(tmp_path / "e.db")
    clock = VirtualClock()
    other = Engine(path, clock=clock)

    def step(ctx, x):
        if x == 1:
            assert other.cancel(ctx.workflow_id)
        return x * 10

    eng = make_engine(path, clock, workflows=[("two", two_steps)], activities=[("step", step)])
    with pytest.raises(WorkflowCanceled):
        eng.execute_workflow("two", "w", 3)
    types = _types(eng, "w")
    assert (h.CANCEL_REQUESTED, None, None) in types
    i = types.index((h.CANCEL_REQUESTED, None, None))
    assert types[i + 1] == (h.ACTIVITY_COMPLETED, "s1", 1)  # recorded by the plain path, after the cancel
    assert types[-1][0] == h.WORKFLOW_CANCELED
    assert not any(t[1] == "s2" for t in types)  # the code saw the cancel: no next activity
    assert eng.store.query("SELECT COUNT(*) FROM activities") == [(0,)]
    other.close()
    eng.close()


def test_a_late_attempt_is_timed_out_not_completed(tmp_path):
    """An attempt that returns past its start-to-close deadline: the DELETE's deadline check refuses it,
    the plain path records the time-out and the retry completes."""
    clock = VirtualClock()
    late = {"s0": True}

    def step(ctx, x):
        if late.pop(ctx.activity_id, False):
            clock.advance(6)  # past start_to_close_timeout_s=5
        return x

    eng = make_engine(str(tmp_path / "e.db"), clock, workflows=[("two", two_steps)], activities=[("step", step)])
    assert eng.execute_workflow("two", "w", 2) == [0, 1]
    types = _types(eng, "w")
    assert (h.ACTIVITY_TIMED_OUT, "s0", 1) in types
    assert (h.ACTIVITY_COMPLETED, "s0", 1) not in types
    assert (h.ACTIVITY_COMPLETED, "s0", 2) in types
    eng.close()


def test_a_stale_attempt_changes_nothing(tmp_path):
    """Another worker redelivered the activity (attempt 2) while attempt 1 ran here: the DELETE finds no
    row of attempt 1, the plain path drops its outcome; attempt 2's own completion is recorded."""
    path = str(tmp_path / "e.db")
    clock = VirtualClock()
    eng = make_engine(path, clock, workflows=[("two", two_steps)], activities=[("step", lambda ctx, x: x)])

    def step(ctx, x):
        if ctx.attempt == 1 and ctx.activity_id == "s0":  # as if attempt 1's lease had been redelivered
            with eng.store.transaction("redeliver") as db:
                db.execute("UPDATE activities SET attempt=2 WHERE workflow_id='w' AND activity_id='s0'")
        return x

    eng.register_activity("step", step)
    eng.start("two", "w", 1)
    eng.run_until_idle()
    types = _types(eng, "w")
    assert (h.ACTIVITY_COMPLETED, "s0", 1) not in types
    assert eng.store.query("SELECT attempt, state FROM activities") == [(2, "running")]
    eng.close()


def test_a_redone_completion_inside_a_group_commit_rolls_back_only_itself(tmp_path):
    """Two outcomes recorded by one group commit (as the threaded worker's ``Runners.drain`` does), the
    first meeting a cancel recorded since by another engine: its member is rolled back to its savepoint
    and redone by the plain path as another member; the second member's fast completion is kept; one
    COMMIT makes all durable, and both workflows end as they should."""
    path = str(tmp_path / "e.db")
    clock = VirtualClock()
    eng = make_engine(path, clock, workflows=[("two", two_steps)], activities=[("step", lambda ctx, x: x * 10)])
    for wid in ("w1", "w2"):
        eng.start("two", wid, 2)
    w = eng._worker  # (this test drives the engine's worker step by step)
    w.run_pending_tasks()  # both first tasks: each schedules s0, leased to this engine
    leases = list(w.ready)
    w.ready.clear()
    assert sorted(le.workflow_id for le in leases) == ["w1", "w2"] and all(le.workflow_id in w.cache for le in leases)
    outcomes = [(le, *w.execute(le)) for le in leases]
    other = Engine(path, clock=clock)
    assert other.cancel("w1")
    other.close()
    commits, members = eng.store.commits, eng.store.members
    with w.tx("group", group=True):
        for le, ok, value in sorted(outcomes, key=lambda o: o[0].workflow_id):
            w.record_outcome(le, ok, value)
    assert eng.store.commits == commits + 1
    assert eng.store.members - members == 2  # w1's redo and w2's (w1's fast member was rolled back)
    t1, t2 = _types(eng, "w1"), _types(eng, "w2")
    assert t1[t1.index((h.CANCEL_REQUESTED, None, None)) + 1] == (h.ACTIVITY_COMPLETED, "s0", 1)
    assert (h.ACTIVITY_COMPLETED, "s0", 1) in t2 and (h.ACTIVITY_STARTED, "s1", 1) in t2  # fast: next leased
    eng.run_until_idle()
    with pytest.raises(WorkflowCanceled):
        eng.result("w1")
    assert eng.result("w2") == [0, 10]
    eng.close()
