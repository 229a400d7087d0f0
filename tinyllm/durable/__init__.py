"""The durable helper: make a PyTorch loop the user owns durable (``run.steps()``, checkpoints, exact resume).

``run.py`` is the helper (``DurableRun``, ``DurableSampler``); ``state.py`` captures and restores RNGs and
fingerprints. The framework integrations built on it are ``tinyllm.integrations`` (HF, Lightning).
"""

from .run import DurableError, DurableRun, DurableSampler

__all__ = ["DurableError", "DurableRun", "DurableSampler"]
