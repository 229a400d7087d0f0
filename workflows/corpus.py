"""CorpusBuild: one ``corpus`` activity that builds corpora/<name>/ (idempotent in tinyllm).

TrainRun runs it first, so training never starts on a missing corpus; its failure fails the run.
"""

from __future__ import annotations

from engine import ActivityError, Canceled, NonRetryableError, Runtime, is_canceled

from .models import ACTIVITY_CORPUS, CorpusBuildInput, CorpusBuildResult
from .options import corpus_options


async def corpus_build(rt: Runtime, input: CorpusBuildInput) -> CorpusBuildResult:
    """The CorpusBuild workflow (also run inline, as TrainRun's first step)."""
    name = input.spec.get("name")
    if not isinstance(name, str) or not name:
        raise NonRetryableError("invalid corpus spec: name: missing", type="BadInput")
    try:
        result = await rt.execute_activity(ACTIVITY_CORPUS, input, corpus_options(name), result_type=CorpusBuildResult)
    except ActivityError as e:
        if is_canceled(e):
            raise Canceled(f"{rt.workflow_id} canceled during {e.activity_id}") from e
        raise
    return CorpusBuildResult.model_validate(result)
