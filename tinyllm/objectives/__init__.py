"""Post-training objectives of tinyllm: ``dpo``, ``grpo`` (the GRPO family), ``opd``.

``lm`` (pre-training) stays in tinyllm.trainer; the others are ``Objective``s (common.py) the
trainer calls for its step, checkpoint components, resume checks and validation. Modules:
config.py (spec blocks and rules, no torch), init.py (init_from / teacher checkpoints),
data.py (pairs and prompts, cursor-addressed), rollout.py (the rollout module, weight versions),
dpo.py, grpo.py, opd.py.
"""
from __future__ import annotations

from pathlib import Path


def build_objective(spec, home: Path, log):
    """The spec's objective, its data and checkpoints loaded and checked (bad input: SpecError)."""
    # imported here, not at the top: tinyllm.spec imports this package (objectives.config) and must
    # stay free of torch, which every objective module imports
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
