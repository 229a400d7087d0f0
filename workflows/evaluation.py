"""EvalSuite: one ``eval`` activity per suite, in order; the first suite failing for good stops it.

Each suite is its own activity (pitfall 8) with id ``eval-<tag>-<suite>``, so a crash in
the middle of the zoo suite does not rerun the finished ppl suite, and its spec names that
one suite only. A failed suite fails the step: the later suites are not run (pitfall 9).
"""

from __future__ import annotations

import json

from engine import ActivityError, Canceled, Runtime, is_canceled

from .models import ACTIVITY_EVAL, EvalActivityInput, EvalSuiteInput, EvalSuiteResult, SuiteOutputs
from .options import eval_options


def marshal_spec(input: EvalSuiteInput, suite: str) -> str:
    """The eval spec (JSON text) of one ``suite`` of ``input``, as ``tinyllm eval --spec`` reads it."""
    if suite not in input.suites:
        raise ValueError(f"suite {suite!r} is not one of {input.suites}")
    spec: dict = {
        "name": input.name,
        "suite": suite,
        "subjects": [s.model_dump() for s in input.subjects],
        "seed": input.seed,
        "corpus": input.corpus,
    }
    if input.tag:
        spec["tag"] = input.tag
    if input.max_items is not None:
        spec["max_items"] = input.max_items
    if input.trainer is not None:
        spec["trainer"] = input.trainer
    return json.dumps(spec, sort_keys=True)


async def eval_suite(rt: Runtime, input: EvalSuiteInput) -> EvalSuiteResult:
    """The EvalSuite workflow (also run inline, as a step of TrainRun)."""
    outputs: list[SuiteOutputs] = []
    for suite in input.suites:
        try:
            result = await rt.execute_activity(
                ACTIVITY_EVAL,
                EvalActivityInput(spec=json.loads(marshal_spec(input, suite))),
                eval_options(input.tag, suite, input.heartbeat_timeout_s),
                result_type=SuiteOutputs,
            )
        except ActivityError as e:
            if is_canceled(e):
                raise Canceled(f"{rt.workflow_id} canceled during {e.activity_id}") from e
            raise  # the first suite failing for good stops the rest
        outputs.append(SuiteOutputs.model_validate(result))
    return EvalSuiteResult(suites=outputs)
