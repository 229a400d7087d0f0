"""Planted bugs: one per pitfall of the seed's section 5 (mutant ids as in the seed).

Each test that claims to catch a pitfall runs its own check against the mutant and
asserts that the check FAILS (raises AssertionError). Mutants are installed with
pytest's ``monkeypatch`` over the module globals the real workflow code calls, or are
short planted-bug copies of a workflow where the bug is in the control flow itself.
"""

from __future__ import annotations

import json
import time

from engine import ActivityError, Canceled, is_canceled
from engine import RetryPolicy, StepOptions
from tinyllm.spec import TrainSpec
from workflows import evaluation as eval_mod
from workflows.corpus import corpus_build as real_corpus_build
from workflows import options as opt_mod
from workflows import training as tr_mod
from workflows.models import (
    ACTIVITY_EVAL,
    ACTIVITY_TRAIN,
    EvalActivityInput,
    EvalSuiteInput,
    EvalSuiteResult,
    Segment,
    SuiteOutputs,
    TrainActivityInput,
    TrainActivityResult,
    TrainRunResult,
)

real_segments = tr_mod.segments
real_train_options = opt_mod.train_options
real_eval_options = opt_mod.eval_options


def s01_segments_drop_last(steps: int, every: int) -> list[int]:
    """s01: the last, shorter segment is dropped (stops at 1000 of 1200)."""
    if every == 0 or every >= steps:
        return [steps]
    return list(range(every, steps + 1, every))


def s04_segments_repeat_boundary(steps: int, every: int) -> list[int]:
    """s04: a boundary repeated (``min(i*e, N)`` one step too far: 1000 twice when e divides N)."""
    if every == 0 or every >= steps:
        return [steps]
    return [min(i * every, steps) for i in range(1, steps // every + 2)]


def s02_train_options_unnamed(until: int, **kw) -> StepOptions:
    """s02: train ids that do not name the segment."""
    o = real_train_options(until, **kw)
    return StepOptions(
        id="train",
        start_to_close_timeout_s=o.start_to_close_timeout_s,
        heartbeat_timeout_s=o.heartbeat_timeout_s,
        retry=o.retry,
    )


def s03_eval_options_unnamed(tag: str, suite: str, *heartbeat: float) -> StepOptions:
    """s03: eval ids that do not name the suite."""
    o = real_eval_options(tag, suite, *heartbeat)
    return StepOptions(
        id=f"eval-{tag}" if tag else "eval",
        start_to_close_timeout_s=o.start_to_close_timeout_s,
        heartbeat_timeout_s=o.heartbeat_timeout_s,
        retry=o.retry,
    )


def s05_segment_spec_to_the_end(run_spec: dict, until: int) -> dict:
    """s05: every segment trains to the end."""
    return dict(run_spec)


def s06_train_options_no_retries(until: int, **kw) -> StepOptions:
    """s06: no retries for train."""
    o = real_train_options(until, **kw)
    return StepOptions(
        id=o.id,
        start_to_close_timeout_s=o.start_to_close_timeout_s,
        heartbeat_timeout_s=o.heartbeat_timeout_s,
        retry=RetryPolicy(max_attempts=1),
    )


async def s08_corpus_build_ignored(rt, input):
    """s08: a failed corpus build ignored."""
    try:
        return await real_corpus_build(rt, input)
    except ActivityError:
        return None


def s09_no_validation(raw):
    """s09: no spec validation (the spec is taken as given)."""
    return TrainSpec.model_construct(
        **{
            **{
                "name": "",
                "steps": 0,
                "eval_every": 0,
                "eval_interval_seconds": 0.0,
                "corpus": raw.get("corpus", "default"),
            },
            **raw,
        }
    )


async def s10_all_suites_one_activity(rt, input: EvalSuiteInput) -> EvalSuiteResult:
    """s10: all suites in one activity."""
    spec = json.loads(eval_mod.marshal_spec(input, input.suites[0]))
    spec["suite"] = ",".join(input.suites)
    out = await rt.execute_activity(
        ACTIVITY_EVAL, EvalActivityInput(spec=spec), real_eval_options(input.tag, "all"), result_type=SuiteOutputs
    )
    one = SuiteOutputs.model_validate(out)
    return EvalSuiteResult(suites=[one.model_copy(update={"suite": s}) for s in input.suites])


async def s11_continue_after_failed_suite(rt, input: EvalSuiteInput) -> EvalSuiteResult:
    """s11: continuing after a failed suite (partial results look complete)."""
    outs = []
    for suite in input.suites:
        try:
            r = await rt.execute_activity(
                ACTIVITY_EVAL,
                EvalActivityInput(spec=json.loads(eval_mod.marshal_spec(input, suite))),
                real_eval_options(input.tag, suite),
                result_type=SuiteOutputs,
            )
            outs.append(SuiteOutputs.model_validate(r))
        except ActivityError:
            continue
    return EvalSuiteResult(suites=outs)


def s12_train_options_no_heartbeat(until: int, **kw) -> StepOptions:
    """s12: no heartbeat timeout on train."""
    o = real_train_options(until, **kw)
    return StepOptions(
        id=o.id, start_to_close_timeout_s=o.start_to_close_timeout_s, heartbeat_timeout_s=None, retry=o.retry
    )


async def s13_wall_clock_wait(rt, seconds: float) -> None:
    """s13: a wall-clock sleep (scaled to nothing here) instead of the durable timer."""
    time.sleep(0)  # noqa: ASYNC251 - the mutant's pitfall: a blocking wall-clock wait


async def s07_cancel_moves_on(rt, input):
    """s07: a planted-bug copy of train_run that treats a cancel as "move on"."""
    spec = tr_mod.validate_spec(input.spec)
    run_spec = input.spec
    done = []
    for until in tr_mod.segments(spec.steps, spec.eval_every):
        try:
            r = await rt.execute_activity(
                ACTIVITY_TRAIN,
                TrainActivityInput(spec=tr_mod.segment_spec(run_spec, until)),
                real_train_options(until),
                result_type=TrainActivityResult,
            )
        except (ActivityError, Canceled) as e:
            if is_canceled(e):
                continue  # the bug
            raise
        r = TrainActivityResult.model_validate(r)
        done.append(Segment(until=until, checkpoint=r.checkpoint, train=r))
    last = done[-1]
    return TrainRunResult(name=spec.name, steps=last.until, checkpoint=last.checkpoint, segments=done)
