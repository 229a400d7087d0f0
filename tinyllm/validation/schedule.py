"""When validation runs: model steps 0..N, periodic, before training, final always, deduplicated.

The public step is the number of committed optimizer updates: step 0 is the fresh model, step k
the model after update k. Validation at step k runs after update k and before update k+1 (an
optimizer boundary: never between the micro-batches of gradient accumulation).

"Final" is the run's last step (``total_steps``): the spec's ``steps``, or ``tinyllm train
--total-steps`` for a TrainRun segment, whose own end is not a final step. A run resumed any number
of times, in any segments, has one schedule: that of one uninterrupted run.
"""

from __future__ import annotations

from ..validation_config import ValidationConfig


def is_validation_step(step: int, total_steps: int, cfg: ValidationConfig | None) -> bool:
    """Whether validation is due at model step ``step`` of a run of ``total_steps`` updates."""
    if cfg is None or not cfg.enabled or step < 0 or step > total_steps:
        return False
    if step == total_steps:
        return True  # final validation is unconditional
    if step == 0:
        return cfg.before_training
    return cfg.every_steps > 0 and step % cfg.every_steps == 0
