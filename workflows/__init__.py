"""TrainRun, EvalSuite and CorpusBuild as durable workflow functions over the engine's seam.

Register the real workflow functions with any activity implementations::

    import workflows
    workflows.register(engine, activities=workflows.tinyllm_activities(home))  # real tinyllm
    workflows.register(engine, activities={"train": fake_train, "eval": fake_eval, "corpus": fake_corpus})
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Mapping

from contracts.activity_ids import step_tag  # (the grammar of activity ids is the contract's)

from .plan import (
    ACTIVITY_CORPUS,
    ACTIVITY_EVAL,
    ACTIVITY_PUBLISH,
    ACTIVITY_TRAIN,
    MAX_SEGMENTS,
    WORKFLOW_CORPUS_BUILD,
    WORKFLOW_EVAL_SUITE,
    WORKFLOW_MODEL_RELEASE,
    WORKFLOW_TRAIN_RUN,
    activity_dir,
    check_segment_count,
    checkpoint_step,
    list_releases,
    progress_path,
    segments,
)

if TYPE_CHECKING:  # loaded on first use (``__getattr__`` below); the names as they are, for type checkers
    from .activities import TinyllmActivities, tinyllm_activities, warm_fits
    from .continuation import collect_prior
    from .corpus import corpus_build
    from .evaluation import eval_suite, marshal_spec
    from .models import (
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
        ModelReleaseInput,
        ModelReleaseResult,
        model_release,
        parse_gate,
        pick_candidate,
        publish_activity,
        release_workflow_id,
    )
    from .training import check_run_spec, segment_spec, train_run, validate_spec

# The workflows' models are pydantic classes (~0.1 s to build at import) and the activities pull in the
# engine's running side: a reader of a home (``ctl status``, ``ctl show``) needs neither, only ``.plan``.
# So every other name is imported from its module on first use (PEP 562). name -> module.
_LAZY = {
    **dict.fromkeys(("TinyllmActivities", "tinyllm_activities", "warm_fits"), "activities"),
    "collect_prior": "continuation",
    "corpus_build": "corpus",
    **dict.fromkeys(("eval_suite", "marshal_spec"), "evaluation"),
    **dict.fromkeys(
        (
            "CorpusBuildInput",
            "CorpusBuildResult",
            "EvalActivityInput",
            "EvalSubject",
            "EvalSuiteInput",
            "EvalSuiteResult",
            "PriorWork",
            "Segment",
            "SuiteOutputs",
            "TrainActivityInput",
            "TrainActivityResult",
            "TrainRunInput",
            "TrainRunResult",
        ),
        "models",
    ),
    **dict.fromkeys(("corpus_options", "eval_options", "train_options"), "options"),
    **dict.fromkeys(
        (
            "ModelReleaseInput",
            "ModelReleaseResult",
            "model_release",
            "parse_gate",
            "pick_candidate",
            "publish_activity",
            "release_workflow_id",
        ),
        "release",
    ),
    **dict.fromkeys(("check_run_spec", "segment_spec", "train_run", "validate_spec"), "training"),
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY`` imported from its module on first use; ``WORKFLOWS`` built then too."""
    if name == "WORKFLOWS":
        value: Any = _workflows()
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module 'workflows' has no attribute {name!r}")
    globals()[name] = value
    return value


def _workflows() -> dict[str, tuple[Any, Any]]:
    """name -> (workflow function, its input model): ``WORKFLOWS``."""
    from .corpus import corpus_build
    from .evaluation import eval_suite
    from .models import CorpusBuildInput, EvalSuiteInput, TrainRunInput
    from .release import ModelReleaseInput, model_release
    from .training import train_run

    return {
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
    for name, (fn, input_type) in __getattr__("WORKFLOWS").items():
        engine.register_workflow(name, fn, input_type=input_type)
    for name, fn in activities.items():
        engine.register_activity(name, fn)


__all__ = [
    "ACTIVITY_CORPUS",
    "ACTIVITY_EVAL",
    "ACTIVITY_TRAIN",
    "WORKFLOWS",
    "WORKFLOW_CORPUS_BUILD",
    "WORKFLOW_EVAL_SUITE",
    "WORKFLOW_TRAIN_RUN",
    "CorpusBuildInput",
    "CorpusBuildResult",
    "EvalActivityInput",
    "EvalSubject",
    "EvalSuiteInput",
    "EvalSuiteResult",
    "PriorWork",
    "Segment",
    "SuiteOutputs",
    "TinyllmActivities",
    "TrainActivityInput",
    "TrainActivityResult",
    "TrainRunInput",
    "TrainRunResult",
    "collect_prior",
    "corpus_build",
    "corpus_options",
    "MAX_SEGMENTS",
    "activity_dir",
    "check_segment_count",
    "checkpoint_step",
    "progress_path",
    "eval_options",
    "eval_suite",
    "marshal_spec",
    "register",
    "segment_spec",
    "segments",
    "step_tag",
    "tinyllm_activities",
    "train_options",
    "train_run",
    "warm_fits",
    "validate_spec",
    "check_run_spec",
    "ACTIVITY_PUBLISH",
    "WORKFLOW_MODEL_RELEASE",
    "ModelReleaseInput",
    "ModelReleaseResult",
    "list_releases",
    "model_release",
    "parse_gate",
    "pick_candidate",
    "publish_activity",
    "release_workflow_id",
]
