"""TrainRun, EvalSuite and CorpusBuild as durable workflow functions over the engine's seam.

Register the real workflow functions with any activity implementations::

    import workflows
    workflows.register(engine, activities=workflows.tinyllm_activities(home))  # real tinyllm
    workflows.register(engine, activities={"train": fake_train, "eval": fake_eval, "corpus": fake_corpus})
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from contracts.activity_ids import step_tag  # (the grammar of activity ids is the contract's)
from .activities import TinyllmActivities, tinyllm_activities
from .continuation import collect_prior
from .corpus import corpus_build
from .evaluation import eval_suite, marshal_spec
from .models import (
    ACTIVITY_CORPUS,
    ACTIVITY_EVAL,
    ACTIVITY_TRAIN,
    WORKFLOW_CORPUS_BUILD,
    WORKFLOW_EVAL_SUITE,
    WORKFLOW_TRAIN_RUN,
    CorpusBuildInput,
    CorpusBuildResult,
    EvalActivityInput,
    EvalSubject,
    EvalSuiteInput,
    EvalSuiteResult,
    PriorWork,
    Segment,
    SuiteOutputs,
    TrainActivityInput,
    TrainActivityResult,
    TrainRunInput,
    TrainRunResult,
)
from .options import corpus_options, eval_options, train_options
from .release import (
    ACTIVITY_PUBLISH,
    WORKFLOW_MODEL_RELEASE,
    ModelReleaseInput,
    ModelReleaseResult,
    list_releases,
    model_release,
    parse_gate,
    pick_candidate,
    publish_activity,
    release_workflow_id,
)
from .training import MAX_SEGMENTS, check_run_spec, segment_spec, segments, train_run, validate_spec

WORKFLOWS = {
    WORKFLOW_TRAIN_RUN: (train_run, TrainRunInput),
    WORKFLOW_EVAL_SUITE: (eval_suite, EvalSuiteInput),
    WORKFLOW_CORPUS_BUILD: (corpus_build, CorpusBuildInput),
    WORKFLOW_MODEL_RELEASE: (model_release, ModelReleaseInput),  # workflows/release.py
}


def register(engine: Any, *, activities: Mapping[str, Callable[[Any, Any], Any]]) -> None:
    """Register the three workflows and the given activities (by name) on ``engine``.

    ``activities`` is explicit on purpose: ``tinyllm_activities(home)`` for real runs, fakes
    in tests and in the simulator. Names other than train/eval/corpus are refused.
    """
    unknown = set(activities) - {ACTIVITY_TRAIN, ACTIVITY_EVAL, ACTIVITY_CORPUS, ACTIVITY_PUBLISH}
    if unknown:
        raise ValueError(f"unknown activity names: {sorted(unknown)}")
    for name, (fn, input_type) in WORKFLOWS.items():
        engine.register_workflow(name, fn, input_type=input_type)
    for name, fn in activities.items():
        engine.register_activity(name, fn)


__all__ = [
    "ACTIVITY_CORPUS", "ACTIVITY_EVAL", "ACTIVITY_TRAIN", "WORKFLOWS",
    "WORKFLOW_CORPUS_BUILD", "WORKFLOW_EVAL_SUITE", "WORKFLOW_TRAIN_RUN",
    "CorpusBuildInput", "CorpusBuildResult", "EvalActivityInput", "EvalSubject", "EvalSuiteInput",
    "EvalSuiteResult", "PriorWork", "Segment", "SuiteOutputs", "TinyllmActivities", "TrainActivityInput",
    "TrainActivityResult", "TrainRunInput", "TrainRunResult", "collect_prior", "corpus_build", "corpus_options",
    "MAX_SEGMENTS", "eval_options", "eval_suite", "marshal_spec", "register", "segment_spec", "segments", "step_tag",
    "tinyllm_activities", "train_options", "train_run", "validate_spec", "check_run_spec",
    "ACTIVITY_PUBLISH", "WORKFLOW_MODEL_RELEASE", "ModelReleaseInput", "ModelReleaseResult", "list_releases",
    "model_release", "parse_gate", "pick_candidate", "publish_activity", "release_workflow_id",
]
