"""The workflow behind the golden history (tests/engine/golden/); keep it unchanged.

Regenerate the file with ``python tests/engine/golden/make_golden.py`` only when the
history format changes on purpose; the replay test then proves old histories still replay.
"""

from __future__ import annotations

from pydantic import BaseModel

from engine import ActivityError, NonRetryableError, RetryPolicy, StepOptions, VirtualClock

START = 1_750_000_000.0


class GoldenInput(BaseModel):
    name: str
    steps: int
    every: int


class Segment(BaseModel):
    until: int
    checkpoint: str


def train(ctx, inp):
    if ctx.attempt == 1 and inp["until"] == 2 * inp["every"]:
        ctx.heartbeat({"checkpoint": f"step-{inp['until'] - 1:06d}"})
        raise RuntimeError("worker OOM")
    return {"until": inp["until"], "checkpoint": f"step-{inp['until']:06d}"}


def evaluate(ctx, inp):
    if inp["suite"] == "zoo":
        raise NonRetryableError("suite zoo is not installed", type="BadSuite")
    return {"ppl": 10.0 / inp["until"]}


async def golden(rt, inp: GoldenInput):
    segments, evals, errors = [], [], []
    until = 0
    while until < inp.steps:
        until = min(until + inp.every, inp.steps)
        seg = await rt.execute_activity(
            "train",
            {"until": until, "every": inp.every},
            StepOptions(
                id=f"train-{until:06d}", heartbeat_timeout_s=60, retry=RetryPolicy(max_attempts=3, initial_interval_s=2)
            ),
            result_type=Segment,
        )
        segments.append(seg.model_dump())
        for suite in ("ppl", "zoo"):
            try:
                evals.append(
                    await rt.execute_activity(
                        "evaluate", {"until": until, "suite": suite}, StepOptions(id=f"eval-{until:06d}-{suite}")
                    )
                )
            except ActivityError as e:
                errors.append([e.activity_id, e.type])
        if until < inp.steps:
            await rt.sleep(30)
    return {"segments": segments, "evals": evals, "errors": errors, "finished_at": rt.now()}


INPUT = {"name": "tiny", "steps": 25, "every": 10}


def register(eng):
    eng.register_workflow("golden", golden, input_type=GoldenInput)
    eng.register_activity("train", train)
    eng.register_activity("evaluate", evaluate)


def clock():
    return VirtualClock(start=START)
