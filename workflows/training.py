"""TrainRun: corpus, then train in segments up to each evaluation point, evaluate, wait, go on.

Segment i is one ``train`` activity (id ``train-NNNNNN``, its end step) whose spec is the
run's spec with only ``steps`` changed, plus the run's ``total_steps`` (so held-out validation
keeps the run's schedule: a segment end is not a final step); it resumes from the run's LATEST
checkpoint. The segments of a run equal one uninterrupted ``tinyllm train``, bit for bit. When
suites are given, EvalSuite evaluates each boundary's checkpoint once per suite, then the
workflow durably sleeps ``eval_interval_seconds`` before the next segment (never after the
last). A kill replays finished work from history; a cancel stops after the activity in
flight checkpointed and deletes nothing.
"""

from __future__ import annotations

from typing import Any

from engine import ActivityError, Canceled, NonRetryableError, Runtime, is_canceled
from tinyllm.spec import SpecError
from tinyllm.trainer_spec import RunSpec, parse_run_spec, trainer_of

from contracts.activity_ids import step_tag, train_id
from .corpus import corpus_build
from .evaluation import eval_suite
from .models import (
    ACTIVITY_TRAIN,
    CorpusBuildInput,
    EvalSubject,
    EvalSuiteInput,
    EvalSuiteResult,
    Segment,
    SuiteOutputs,
    TrainActivityInput,
    TrainActivityResult,
    TrainRunInput,
    TrainRunResult,
)
from .options import eval_options, train_options
from .plan import MAX_SEGMENTS, check_segment_count, segments  # noqa: F401 (re-exported)


def bad_input(message: str) -> NonRetryableError:
    return NonRetryableError(message, type="BadInput")


def validate_spec(raw: Any) -> RunSpec:
    """Parse and check a train spec (tinyllm's, or one naming its own ``trainer``); any problem is a
    non-retryable ``BadInput`` (one line). The workflow's own check of what it receives: ``parse_run_spec``
    parses a spec once per process (ctl's request parsed it already when the workflow runs in ctl's process),
    then ``check_run_spec``."""
    if not isinstance(raw, dict):
        raise bad_input("invalid train spec: expected a JSON object")
    if not raw.get("name"):
        raise bad_input("invalid train spec: name: missing")
    if "steps" not in raw:
        raise bad_input("invalid train spec: steps: missing")
    for key in ("eval_every", "eval_interval_seconds"):
        value = raw.get(key, 0)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise bad_input(f"invalid train spec: {key}: must be >= 0, got {value}")
    try:
        spec = parse_run_spec(raw)
    except SpecError as e:
        raise bad_input(str(e)) from None
    return check_run_spec(spec)


def check_run_spec(spec: RunSpec) -> RunSpec:
    """The workflow's checks of a parsed spec, beyond its model's (cheap: no parse): the segment count is
    bounded. ``BadInput`` (non-retryable) otherwise; ctl asks it before anything starts (app/requests.py)."""
    try:
        check_segment_count(spec.steps, spec.eval_every)
    except ValueError as e:
        raise bad_input(f"invalid train spec: {e}") from None
    return spec


def segment_spec(run_spec: dict[str, Any], until: int) -> dict[str, Any]:
    """The run's spec with only ``steps`` changed (pitfall 3: not every segment to the end)."""
    out = dict(run_spec)
    out["steps"] = until
    return out


async def cadence_wait(rt: Runtime, seconds: float) -> None:
    """The wait between an evaluation and the next segment: a durable timer (pitfall 11)."""
    await rt.sleep(seconds)  # its fire time is recorded: a restart waits only the remainder


async def train_run(rt: Runtime, input: TrainRunInput) -> TrainRunResult:
    """The TrainRun workflow (see the module docstring)."""
    spec = validate_spec(input.spec)  # fail fast: before the corpus, before any activity
    run_spec = input.spec  # the LR schedule never depends on `steps`; validation's gets total_steps
    if input.corpus is not None and spec.corpus is None:
        raise bad_input("a spec with its own trainer brings its own data: give no corpus spec")
    if input.corpus is not None and input.corpus.get("name") != spec.corpus:
        raise bad_input(f"corpus spec builds {input.corpus.get('name')!r} but the train spec trains on {spec.corpus!r}")
    try:
        corpus = None
        if input.corpus is not None:
            corpus = await corpus_build(rt, CorpusBuildInput(spec=input.corpus))
        done: list[Segment] = []
        ends = segments(spec.steps, spec.eval_every)
        prior = input.prior
        for i, until in enumerate(ends):
            options = train_options(
                until, heartbeat_timeout_s=input.train_heartbeat_timeout_s, max_attempts=input.train_max_attempts
            )
            if options.id in prior.train:  # finished by an earlier workflow of this run: not again
                trained = prior.train[options.id]
            else:
                trained = await rt.execute_activity(
                    ACTIVITY_TRAIN,
                    TrainActivityInput(spec=segment_spec(run_spec, until), total_steps=spec.steps),
                    options,
                    result_type=TrainActivityResult,
                )
            trained = TrainActivityResult.model_validate(trained)
            stopped = stopped_early(trained)  # early stopping (tinyllm/selection.py): the run ends here
            # evaluations must see the checkpoint of their boundary (an early stop's checkpoint is the run's last)
            if trained.steps != until and stopped is None:
                raise NonRetryableError(
                    f"segment {train_id(until)} ended at step {trained.steps}, not {until}", type="BadResult"
                )
            evals = None
            if input.eval_suites:
                request = EvalSuiteInput(
                    name=spec.name,
                    tag=step_tag(until),
                    suites=list(input.eval_suites),
                    subjects=[EvalSubject(id=f"{spec.name}-{step_tag(until)}", model=trained.checkpoint)],
                    seed=input.eval_seed,
                    corpus=spec.corpus or "default",
                    max_items=input.eval_max_items,
                    trainer=trainer_of(input.spec),  # its eval_command evaluates (None: tinyllm eval)
                    heartbeat_timeout_s=input.eval_heartbeat_timeout_s,
                )
                done_before = {s: prior.evals.get(eval_options(request.tag, s).id) for s in request.suites}
                missing = [s for s in request.suites if done_before[s] is None]
                if len(missing) == len(request.suites):
                    evals = await eval_suite(rt, request)
                else:  # an earlier workflow finished some suites: run only the others, keep the order
                    fresh: dict[str, SuiteOutputs] = {}
                    if missing:
                        ran = await eval_suite(rt, request.model_copy(update={"suites": missing}))
                        fresh = {o.suite: o for o in ran.suites}
                    evals = EvalSuiteResult(suites=[done_before[s] or fresh[s] for s in request.suites])
            done.append(Segment(until=until, checkpoint=trained.checkpoint, train=trained, evals=evals))
            if stopped is not None:
                break  # a normal completion: no further segment
            if spec.eval_interval_seconds > 0 and i < len(ends) - 1:
                next_id = train_options(ends[i + 1]).id
                if next_id not in prior.train and next_id not in prior.scheduled:  # else it was waited already
                    await cadence_wait(rt, spec.eval_interval_seconds)
    except ActivityError as e:
        if is_canceled(e):  # pitfall 5: a cancel ends the run, it is not "move on"
            raise Canceled(f"{rt.workflow_id} canceled during {e.activity_id}") from e
        raise
    last = done[-1]
    return TrainRunResult(
        name=spec.name,
        steps=last.train.steps if stopped_early(last.train) else last.until,
        checkpoint=last.checkpoint,
        segments=done,
        corpus=corpus,
        final_loss_hex=last.train.final_loss_hex,
        digest=last.train.digest,
        stopped_early=stopped_early(last.train),
        best_checkpoints=getattr(last.train, "best_checkpoints", None),
    )


def stopped_early(trained: TrainActivityResult) -> dict[str, Any] | None:
    """The trainer's ``stopped_early`` (step, best step and checkpoint, the metric's history), if it stopped."""
    value = getattr(trained, "stopped_early", None)
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("step") != trained.steps:
        raise NonRetryableError(
            f"segment result says stopped_early {value!r} at step {trained.steps}", type="BadResult"
        )
    return value
