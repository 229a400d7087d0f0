"""When validation runs: model steps 0..N, periodic, before training, final always, deduplicated.

The public step is the number of committed optimizer updates: step 0 is the fresh model, step k
the model after update k. Validation at step k runs after update k and before update k+1 (an
optimizer boundary: never between the micro-batches of gradient accumulation).

"Final" is the ``steps`` of the invocation's spec. A run resumed any number of times with the
same spec has one schedule. A TrainRun segment (a spec whose ``steps`` is the segment's end)
validates its own final step too: the durable run's schedule is the periodic steps, plus step 0
when ``before_training``, plus every segment end (see ``segmented_validation_steps``).
"""
from __future__ import annotations

from .config import ValidationConfig


def is_validation_step(step: int, total_steps: int, cfg: ValidationConfig | None) -> bool:
    """Whether validation is due at model step ``step`` of a run of ``total_steps`` updates."""
    if cfg is None or not cfg.enabled or step < 0 or step > total_steps:
        return False
    if step == total_steps:
        return True  # final validation is unconditional
    if step == 0:
        return cfg.before_training
    return cfg.every_steps > 0 and step % cfg.every_steps == 0


def validation_steps(total_steps: int, cfg: ValidationConfig | None, start_step: int = 0) -> list[int]:
    """The validation steps in ``[start_step, total_steps]``, ascending, each once."""
    return [s for s in range(max(0, start_step), total_steps + 1) if is_validation_step(s, total_steps, cfg)]


def segmented_validation_steps(segment_ends: list[int], cfg: ValidationConfig | None) -> list[int]:
    """Steps validated by a TrainRun whose invocations end at ``segment_ends`` (ascending).

    Each invocation validates its range (previous end, its end]; the first also step 0.
    """
    steps: list[int] = []
    start = 0
    for end in segment_ends:
        steps += [s for s in validation_steps(end, cfg, start) if not steps or s > steps[-1]]
        start = end + 1
    return steps
