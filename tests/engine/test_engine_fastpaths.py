"""The engine's fast paths record exactly what the plain paths record."""
from __future__ import annotations

from dataclasses import asdict, fields

import json

from engine import RetryPolicy, StepOptions, VirtualClock
from engine.history import dumps

from eng_helpers import make_engine


def test_step_options_json_is_the_dataclass_dump():
    """``to_json`` is written out by hand (speed): it must keep every field ``asdict`` has."""
    o = StepOptions(id="x", start_to_close_timeout_s=5.0, heartbeat_timeout_s=2,
                    retry=RetryPolicy(max_attempts=7, non_retryable=("A", "B")))
    want = asdict(o)
    want["retry"]["non_retryable"] = ["A", "B"]
    assert o.to_json() == want
    assert list(o.to_json()) == [f.name for f in fields(StepOptions)]
    assert list(o.to_json()["retry"]) == [f.name for f in fields(RetryPolicy)]
    assert StepOptions.from_json(o.to_json()) == o


def step(ctx, x):
    return {"x": x["i"] if isinstance(x, dict) else x, "t": (1, 2)}


async def flow(rt, n):
    out = []
    for i in range(n):
        opts = StepOptions(id=f"s{i}", heartbeat_timeout_s=30, retry=RetryPolicy(non_retryable=("X",)))
        out.append(await rt.execute_activity("step", {"i": i, "z": [1.5, None, "ü"]} if i else i, opts))
    await rt.sleep(5)
    return out


def _run(path, eager):
    eng = make_engine(path, VirtualClock(), workflows=[("flow", flow)], activities=[("step", step)])
    if eager:
        result = eng.execute_workflow("flow", "wf/1", 3)
    else:
        eng.start("flow", "wf/1", 3)
        eng.run_until_complete("wf/1")
        result = eng.result("wf/1")
    texts = [t for (t,) in eng.store.query("SELECT attrs FROM events WHERE workflow_id='wf/1' ORDER BY seq")]
    assert texts and all(t == dumps(json.loads(t)) for t in texts)  # the text built from pieces is dumps'
    return result, eng.history("wf/1"), eng.store.commits


def test_execute_workflow_records_the_same_history_in_one_commit_fewer(tmp_path):
    plain = _run(str(tmp_path / "plain.db"), eager=False)
    eager = _run(str(tmp_path / "eager.db"), eager=True)
    assert eager[0] == plain[0] == [{"x": i, "t": [1, 2]} for i in range(3)]
    assert eager[1] == plain[1]  # every event: seq, type, time, attrs
    assert eager[2] == plain[2] - 1
