"""The engine's fast paths record exactly what the plain paths record."""

from __future__ import annotations

from dataclasses import asdict, fields

import json

import pytest

from engine import RetryPolicy, StepOptions, VirtualClock, WorkflowFailed
from engine._history import dumps

from eng_helpers import make_engine


def test_step_options_json_is_the_dataclass_dump():
    """``to_json`` is written out by hand (speed): it must keep every field ``asdict`` has."""
    o = StepOptions(
        id="x",
        start_to_close_timeout_s=5.0,
        heartbeat_timeout_s=2,
        retry=RetryPolicy(max_attempts=7, non_retryable=("A", "B")),
    )
    want = asdict(o)
    want["retry"]["non_retryable"] = ["A", "B"]
    assert o.to_json() == want
    assert list(o.to_json()) == [f.name for f in fields(StepOptions)]
    assert list(o.to_json()["retry"]) == [f.name for f in fields(RetryPolicy)]
    assert StepOptions.from_json(o.to_json()) == o


def test_json_texts_built_by_hand_are_dumps():
    """``dumps``' scalar and container paths and ``StepOptions.to_text`` (its retry text kept per policy,
    so the same policy with 1 and with 1.0 must not share a text) give json's text."""
    ref = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False).encode
    for v in (0, -7, 2**70, 1.5, -0.0, 1e300, 1.0, True, False, None, "ü\n", [1, (2, 3.0)], {"b": [None], "a": {}}):
        assert dumps(v) == ref(v)
    for bad in (float("nan"), float("inf"), {"x": float("-inf")}, {1j}):
        with pytest.raises((TypeError, ValueError)):
            dumps(bad)
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(ValueError):
        dumps(cyc)
    for retry in (
        RetryPolicy(),
        RetryPolicy(initial_interval_s=1),
        RetryPolicy(initial_interval_s=1.0),
        RetryPolicy(max_attempts=True),
        RetryPolicy(non_retryable=("A",)),
        RetryPolicy(non_retryable=("A",)),
    ):
        for o in (
            StepOptions(id="a", retry=retry),
            StepOptions(id="ü", heartbeat_timeout_s=2, retry=retry),
            StepOptions(id="b", start_to_close_timeout_s=2.5, heartbeat_timeout_s=2.0, retry=retry),
        ):
            assert o.to_text() == ref(o.to_json())


def step(ctx, x):
    return {"x": x["i"] if isinstance(x, dict) else x, "t": (1, 2)}


async def flow(rt, inp):
    n, nap = inp
    out = []
    for i in range(n):
        opts = StepOptions(id=f"s{i}", heartbeat_timeout_s=30, retry=RetryPolicy(non_retryable=("X",)))
        out.append(await rt.execute_activity("step", {"i": i, "z": [1.5, None, "ü"]} if i else i, opts))
    if nap:
        await rt.sleep(5)
    if n == 0:
        raise ValueError("nothing to do")
    return out


def _run(path, eager, inp):
    eng = make_engine(path, VirtualClock(), workflows=[("flow", flow)], activities=[("step", step)])
    if eager:
        try:
            result = eng.execute_workflow("flow", "wf/1", inp)
        except WorkflowFailed as e:
            result = str(e)
    else:
        eng.start("flow", "wf/1", inp)
        eng.run_until_complete("wf/1")
        try:
            result = eng.result("wf/1")
        except WorkflowFailed as e:
            result = str(e)
    texts = [t for (t,) in eng.store.query("SELECT attrs FROM events WHERE workflow_id='wf/1' ORDER BY seq")]
    assert texts and all(t == dumps(json.loads(t)) for t in texts)  # the text built from pieces is dumps'
    row = eng.store.query("SELECT name, input, state, result, error IS NULL, task_pending FROM workflows")
    return result, eng.history("wf/1"), eng.store.commits, row


@pytest.mark.parametrize("inp", [[3, True], [3, False], [0, False]], ids=["timer", "activities", "failing"])
def test_execute_workflow_records_the_same_history_in_one_commit_fewer(tmp_path, inp):
    """The eager start and the end read from the replayer (no read-back) give what start + run gives:
    the result (or failure), every event, the workflow row; one commit fewer."""
    plain = _run(str(tmp_path / "plain.db"), False, inp)
    eager = _run(str(tmp_path / "eager.db"), True, inp)
    assert eager[0] == plain[0]
    if inp[0]:
        assert plain[0] == [{"x": i, "t": [1, 2]} for i in range(3)]
    else:
        assert "nothing to do" in plain[0]
    assert eager[1] == plain[1]  # every event: seq, type, time, attrs
    assert eager[2] == plain[2] - 1
    assert eager[3] == plain[3]
