"""``ctl verify-resume``'s third run: the trainer run the way ``ctl train`` runs it, in segments.

TrainRun trains a run as segments: the run's spec with only ``steps`` changed to each segment's end
(the spec's ``eval_every`` places them), each invocation resuming from the previous one's final
checkpoint, with the run's full length passed alongside (tinyllm ``--total-steps``, a spec's own
trainer ``CTL_RUN_STEPS``). A trainer whose trajectory depends on ``steps`` (an LR schedule built over
``steps``, as Hugging Face's linear schedule over ``max_steps``) is exact under kills yet ends
elsewhere under ``ctl train``: the run in segments is compared bit for bit with the uninterrupted one
and a difference is diagnosed as segment dependence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from workflows.training import segments as train_segments

from .core import BadInput


def segment_ends(steps: int, eval_every: int, count: int | None) -> list[int]:
    """The segments' end steps: ``count`` equal parts when given (1: no segment run), else the spec's
    ``eval_every`` as ctl train would cut it, else two halves."""
    if count is not None:
        if count < 1:
            raise BadInput(f"--segments must be >= 1, got {count}")
        count = min(count, steps)
        return sorted({round(steps * k / count) for k in range(1, count + 1)})
    if eval_every and 0 < eval_every < steps:
        return train_segments(steps, eval_every)
    return [steps // 2, steps] if steps >= 2 else [steps]


def horizon_hint(kind: str | None) -> str:
    """Where a schedule's horizon comes from, for the trainer kind in use (None: a loop of one's own)."""
    own = (
        "run.run_steps (tinyllm.durable), the environment's CTL_RUN_STEPS (the run's full length, the same in "
        "every segment), or a fixed length in the spec's config"
    )
    if kind == "tinyllm.integrations.lightning":
        return (
            "trainer.estimated_stepping_batches or trainer.max_steps (under DurableCallback's fit() both are the "
            "run's full length, the same in every segment), run.run_steps, or a fixed length in the spec's config"
        )
    if kind == "tinyllm.integrations.hf":
        return "config.schedule_steps (DurableTrainer's schedules span it: the run's total steps), or " + own
    return own


def diagnose_segments(step: int, what: list[str], ends: list[int], kind: str | None = None) -> str:
    """The diagnosis of a run in segments that differs at ``step`` while the resumes were exact."""
    boundary = max((e for e in ends if e < step), default=0)
    if boundary == 0:
        where = f"step {step} is the first that differs, inside the first segment (its spec says steps {ends[0]})"
    elif step == boundary + 1:
        where = f"step {step} is the first after the segment boundary at step {boundary}"
    else:
        where = (
            f"step {step} is the first that differs, {step - boundary} step(s) after the segment boundary at "
            f"step {boundary}"
        )
    lr = " (the learning rate differs)" if "lr" in what else ""
    return (
        f"{where} of the run in segments {ends} (as ctl train runs it: each segment's spec has steps = its "
        f"end){lr}: the trajectory depends on the spec's steps; {SCHEDULE} {horizon_hint(kind)}"
    )


SCHEDULE = (
    "most often the LR schedule is built over steps (e.g. a linear or cosine decay to max_steps = steps, a "
    "OneCycleLR whose total_steps is a segment's end): build it over a horizon that does not change with "
    "steps:"
)


def diagnose_failed_segment(index: int, ends: list[int], returncode: int, error: str, kind: str | None = None) -> str:
    """The diagnosis of a run in segments whose segment ``index`` (1-based) failed while the uninterrupted
    and the interrupted runs finished: a trainer that cannot run as ``ctl train`` runs it."""
    first = ends[index - 2] + 1 if index > 1 else 1
    return (
        f"segment {index} of the run in segments {ends} (steps {first}..{ends[index - 1]}, as ctl train runs "
        f"it: each segment's spec has steps = its end) failed (exit {returncode}) where the uninterrupted and "
        f"the interrupted runs finished: {error or '(no message on stderr)'} -- the trainer depends on the "
        f"spec's steps; {SCHEDULE} {horizon_hint(kind)}"
    )


def segment_lines(seg: dict, loss_hex: dict, digest: dict) -> list[str]:
    """The run in segments: equal, or what differs with its own figures beside the uninterrupted run's
    (the lines above compare the uninterrupted and the interrupted runs, which may well be equal)."""
    head = f"  segments {seg['ends']} (as ctl train runs it): "
    if seg["exact"]:
        return [head + "equal"]
    failed = seg.get("failed")
    if failed:
        return [head + f"differ: segment {failed['segment']} (to step {failed['end']}) failed (exit {failed['exit']})"]
    first = seg.get("first_differing_step")
    return [
        head + "differ" + (f" from step {first}" if first is not None else ""),
        f"    final_loss_hex {loss_hex.get('uninterrupted')} (uninterrupted) vs {seg.get('final_loss_hex')} "
        "(in segments)",
        f"    digest         {str(digest.get('uninterrupted'))[:16]} (uninterrupted) vs "
        f"{str(seg.get('digest'))[:16]} (in segments)",
    ]


def run_segments(
    make_trainer: Callable[[dict, Path], Any],
    spec_raw: dict,
    home: Path,
    ends: list[int],
    run_attempt: Callable[..., Any],
    check_attempt: Callable[..., None],
) -> list[Any]:
    """Run the trainer segment by segment in ``home`` (resuming from LATEST, as the train activity does)."""
    attempts = []
    for index, end in enumerate(ends, 1):
        seg = make_trainer({**spec_raw, "steps": end}, home.parent / f"segment-{index}")
        a = run_attempt(seg, home, index, "segment", None)
        attempts.append(a)
        if a.returncode != 0:
            return attempts
        check_attempt(seg, home, index, a, end)
    return attempts
