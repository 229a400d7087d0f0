"""Checkpoint component planning at one model step: validation's request unioned with a regular save.

tinyllm's regular checkpoints (every ``checkpoint_every`` and at the end of an invocation) are always
the full set. Validation asks for ``checkpoint_components`` when ``save_checkpoint`` is true. At one
step both requests are unioned and written once:

- full union   -> one resumable checkpoint ``ckpt/step-NNNNNN`` (moves LATEST); a validation due at
                  that step is *durable*: its journal (pending marker) is in that checkpoint.
- proper subset (only validation asked) -> a UserWarning, validation runs first, then a
                  non-resumable artifact ``checkpoint_artifacts/iter_NNNNNN`` (never moves LATEST).
- nothing      -> no checkpoint; validation (if due) is ephemeral.

Exceptions: the pure before-training pass (step 0 of a fresh run with training steps left) writes
nothing even with save_checkpoint; a termination request at a post-update validation boundary
forces a full checkpoint with a pending validation and the process exits without evaluating.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from ..validation_config import COMPONENTS, ValidationConfig

FULL = frozenset(COMPONENTS)


class PartialCheckpointWarning(UserWarning):
    """A proper subset of checkpoint components is saved: a non-resumable artifact."""


@dataclass(frozen=True)
class StepPlan:
    step: int
    validate: bool  # run validation at this step (now, before the next update)
    components: frozenset[str]  # what is written at this step (empty: nothing)
    durable: bool  # validation journaled in a full checkpoint (pending marker before evaluating)
    exit_before_validation: bool = False  # termination: stop (after the checkpoint, if any)

    @property
    def kind(self) -> Literal["none", "full", "partial"]:
        if not self.components:
            return "none"
        return "full" if self.components == FULL else "partial"


def plan_step(
    step: int,
    total_steps: int,
    *,
    validation_due: bool,
    regular_due: bool,
    cfg: ValidationConfig | None,
    fresh: bool,
    termination_requested: bool = False,
) -> StepPlan:
    """What to write and whether/how to validate at model ``step`` (see the module docstring).

    ``fresh``: the process started without a checkpoint (so step 0 is the pure initial model).
    """
    regular = FULL if regular_due else frozenset()
    if not validation_due:
        return StepPlan(step, False, regular, False, exit_before_validation=termination_requested)
    assert cfg is not None
    if step == 0 and fresh and total_steps > 0:
        # Pure before-training pass: ephemeral even with save_checkpoint; a pending termination
        # exits without evaluating or saving, so the next fresh start retries it.
        return StepPlan(0, not termination_requested, frozenset(), False, exit_before_validation=termination_requested)
    if termination_requested and step > 0:
        # Post-update validation boundary: a full pending checkpoint, evaluated on resume.
        return StepPlan(step, False, FULL, True, exit_before_validation=True)
    union = regular | cfg.requested_components
    if union and union != FULL:
        warnings.warn(
            f"validation at step {step} saves only {sorted(union)} of {list(COMPONENTS)}: a "
            "non-resumable artifact under checkpoint_artifacts/, never a resume source",
            PartialCheckpointWarning,
            stacklevel=2,
        )
    return StepPlan(step, True, union, union == FULL)
