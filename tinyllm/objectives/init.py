"""Checkpoints named by a post-training spec: ``init_from`` (the weights of step 0) and ``teacher``.

A reference is ``<run>@<step>`` (``runs/<run>/ckpt/step-NNNNNN`` under the home) or a checkpoint
directory (relative to the home, or absolute). It is verified (checksums) and loaded before any
work; a missing or corrupt one is bad input (``SpecError``, exit 2). Its identity is the state
digest of its model weights, recorded in every checkpoint of the new run and checked on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import CheckpointError, load_checkpoint
from ..model import GPT, state_digest
from ..names import resolve_checkpoint
from ..errors import SpecError
from ..spec import ModelConfig

TOKENIZER = "byte"  # the only tokenizer post-training takes (load_frozen refuses char checkpoints)


@dataclass
class FrozenCheckpoint:
    path: Path
    config: ModelConfig  # the architecture it was trained with
    state: dict  # model state dict
    digest: str  # state_digest of the weights
    step: int

    @property
    def tokenizer(self) -> dict:
        return {"kind": TOKENIZER, "vocab_size": self.config.vocab_size}

    def frozen_model(self, dropout: float = 0.0) -> GPT:
        """A copy in eval mode with no gradients (reference / teacher)."""
        model = GPT(self.config.model_copy(update={"dropout": dropout}))
        model.load_state_dict(self.state)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model


def load_frozen(ref: str, home: Path, what: str) -> FrozenCheckpoint:
    """Verify and load the checkpoint ``ref`` (``what``: 'init_from' or 'teacher'); bad input raises SpecError."""
    path = resolve_checkpoint(ref, home)
    if not path.is_dir():
        raise SpecError(f"{what} checkpoint {ref!r} not found (looked for {path})")
    try:
        components, manifest = load_checkpoint(path)
    except CheckpointError as e:
        raise SpecError(f"{what} checkpoint {ref!r} cannot be used: {e}") from None
    if "model" not in components:
        raise SpecError(f"{what} checkpoint {ref!r} has no model component (components {manifest.get('components')})")
    kind = (manifest.get("meta", {}).get("tokenizer") or {}).get("kind", "byte")
    if kind != "byte":  # rollouts, prompts, pairs and rewards are byte-level (tinyllm/posttrain_data.py)
        raise SpecError(
            f"{what} checkpoint {ref!r} was trained with the {kind} tokenizer; post-training "
            "objectives (dpo, grpo, opd) take byte-level checkpoints only"
        )
    raw_cfg = (manifest.get("meta", {}).get("trajectory") or {}).get("model")
    try:
        config = ModelConfig.model_validate(raw_cfg)
    except Exception:
        raise SpecError(
            f"{what} checkpoint {ref!r} does not record its model config (not a tinyllm checkpoint?)"
        ) from None
    state = components["model"]
    try:
        GPT(config).load_state_dict(state)
    except RuntimeError as e:
        raise SpecError(
            f"{what} checkpoint {ref!r}: its weights do not fit its model config: {str(e).splitlines()[0]}"
        ) from None
    return FrozenCheckpoint(path, config, state, state_digest(state), int(manifest.get("step", -1)))


def check_same_architecture(init: FrozenCheckpoint, cfg: ModelConfig, ref: str) -> None:
    """init_from must have the spec's architecture (dropout may differ: it changes no weight)."""
    a = init.config.model_dump(exclude={"dropout"})
    b = cfg.model_dump(exclude={"dropout"})
    diff = sorted(k for k in a if a[k] != b[k])
    if diff:
        shown = ", ".join(f"{k} {a[k]} != {b[k]}" for k in diff)
        raise SpecError(f"init_from checkpoint {ref!r} has another architecture than the spec's model ({shown})")


def load_weights(model: torch.nn.Module, init: FrozenCheckpoint) -> None:
    model.load_state_dict(init.state)
