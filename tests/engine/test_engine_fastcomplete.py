"""The cached completion (``Worker._complete_cached``: the fencing check and the close in one DELETE, the
completed event in one INSERT with the next task's events) falls back to the plain path whenever its
assumptions fail: a row that is not this running attempt's, a late attempt, an event appended by
someone else since the replayer last saw the history."""
from __future__ import annotations

import pytest

from engine import Engine, RetryPolicy, StepOptions, VirtualClock, WorkflowCanceled
from engine import history as h

from eng_helpers import make_engine


async def two_steps(rt, n):
    out = []
    for i in range(n):
        out.append(await rt.execute_activity("step", i, StepOptions(id=f"s{i}", start_to_close_timeout_s=5,
                                                                    retry=RetryPolicy(initial_interval_s=0))))
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
