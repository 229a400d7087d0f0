"""Post-training objectives of tinyllm: ``dpo``, ``grpo`` (the GRPO family), ``opd``.

``lm`` (pre-training) stays in tinyllm.trainer; the others are ``Objective``s (common.py) the
trainer calls for its step, checkpoint components, resume checks and validation. Modules:
init.py (init_from / teacher checkpoints),
rollout.py (the rollout module, weight versions),
dpo.py, grpo.py, opd.py. Their spec blocks and rules (no torch) are ``tinyllm/objective_config.py``,
beside the spec, which imports nothing of this package; their data (pairs and prompts, cursor-addressed)
is ``tinyllm/posttrain_data.py``, which held-out validation reads too.
"""

from __future__ import annotations

from pathlib import Path


def build_objective(spec, home: Path, log):
    """The spec's objective, its data and checkpoints loaded and checked (bad input: SpecError)."""
    # imported here, not at the top: only a run with this objective pays for torch and its modules
    if spec.objective == "dpo":
        from .dpo import DPOObjective

        return DPOObjective(spec, home, log)
    if spec.objective == "grpo":
        from .grpo import GRPOObjective

        return GRPOObjective(spec, home, log)
    if spec.objective == "opd":
        from .opd import OPDObjective

        return OPDObjective(spec, home, log)
    raise AssertionError(spec.objective)
