"""The train spec's ``validation`` block: held-out validation during training.

Importable without torch (``tinyllm/spec.py`` and the workflows load it). Every rule that can be
checked from the block alone is checked here, at load, with one clear message; the rules that
need the corpus (no overlap with the training data) or the held-out file's contents are checked
by ``tinyllm.validation.source`` when the trainer starts, before any work.

Decisions (documented in tinyllm/validation/README.md):
- ``objective`` is ``lm`` (held-out loss/perplexity over a text file) or ``generation`` (held-out
  prompts -> rollout -> rule rewards), or ``dpo`` (held-out preference pairs, training objective dpo).
- ``reward`` empty inherits the training reward (grpo/opd: ``rl.reward``); ``lm`` training has
  none, so there a ``generation`` validation with no reward is rejected at load (nothing to
  inherit; tinyllm.objective_config.check_train_spec). ``sampling.max_tokens`` null inherits
  ``rl.sampling.max_tokens`` for grpo/opd, else DEFAULT_MAX_TOKENS.
- ``checkpoint.archive_dir`` lives in this block (the train spec has no checkpoint block): the
  directory a validation-step checkpoint is copied to (strict for full plans, best-effort for
  partial artifacts).
- Gradient accumulation is supported: validation runs only at optimizer boundaries (after the
  last micro-batch of update k), never between micro-batches, so no accumulation is in flight.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

COMPONENTS: tuple[str, ...] = ("model", "optimizer", "training_state")  # all three = exact resume
REWARDS: tuple[str, ...] = ("exact_match", "prefix_match", "contains", "numeric", "nonempty")
ANSWER_REWARDS: frozenset[str] = frozenset({"exact_match", "prefix_match", "contains", "numeric"})


def reward_list(v):
    """A ``reward`` field as given (one name, a list, or null) made a list (the validation and rl blocks')."""
    if v is None:
        return []
    return [v] if isinstance(v, str) else v


DEFAULT_MAX_TOKENS = 32  # tinyllm has no training rollout limit to inherit; this is its default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ValidationData(_Strict):
    """The explicit held-out source; never a split of the training data.

    ``path``: relative to the home, absolute, or ``builtin:<file>`` (shipped in
    ``tinyllm/data/validation/``). A text file for ``lm``; a JSONL of objects for ``generation``.
    """

    path: str = Field(min_length=1)
    prompt_column: str | None = Field(None, min_length=1)  # generation: the prompt field
    response_column: str | None = Field(None, min_length=1)  # generation: the reference answer
    shuffle: bool = False  # must stay false: validation order is fixed

    @field_validator("shuffle")
    @classmethod
    def _no_shuffle(cls, v: bool) -> bool:
        if v:
            raise ValueError("validation.data.shuffle must be false (held-out order is deterministic)")
        return v


class SamplingConfig(_Strict):
    """Validation sampling, independent of any training sampling; part of the resume identity."""

    temperature: float = Field(0.0, ge=0.0)  # 0: greedy
    top_p: float | None = Field(None, gt=0.0, le=1.0)  # None resolves to 1.0
    top_k: int | None = Field(1, ge=1)  # None disables top-k
    repetition_penalty: float = Field(1.0, gt=0.0)  # 1.0: no penalty
    n_generation: int = Field(1, ge=1)  # generations per held-out prompt
    max_tokens: int | None = Field(None, ge=1)  # None inherits DEFAULT_MAX_TOKENS

    def resolved(self) -> dict:
        """The effective sampling parameters (what actually runs, recorded in identities)."""
        return {
            "temperature": self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k,  # None = disabled
            "repetition_penalty": self.repetition_penalty,
            "n_generation": self.n_generation,
            "max_tokens": DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens,
        }


class ValidationCheckpointConfig(_Strict):
    archive_dir: str | None = Field(None, min_length=1)  # relative to the home or absolute


class ValidationConfig(_Strict):
    enabled: bool = False
    before_training: bool = False  # validate the fresh model at step 0 (never checkpointed)
    every_steps: int = Field(20, ge=0)  # periodic cadence; 0 disables only periodic runs
    save_checkpoint: bool = False  # ask validation steps to save checkpoint_components
    checkpoint_components: tuple[str, ...] = COMPONENTS
    batch_size: int = Field(1, ge=1)  # physical validation batch size
    max_samples: int | None = Field(None, ge=1)  # cap: lm windows / generation prompts
    seed: int = 0  # validation-only seed (per-sample sampling randomness)
    objective: Literal["lm", "generation", "dpo"] = "lm"  # dpo: held-out pairs (training objective dpo)
    data: ValidationData | None = None
    reward: list[str] = []  # generation: rule rewards, summed per rollout; [] inherits the training (rl) reward
    sampling: SamplingConfig = SamplingConfig()
    checkpoint: ValidationCheckpointConfig = ValidationCheckpointConfig()

    _reward_list = field_validator("reward", mode="before")(reward_list)

    @field_validator("checkpoint_components")
    @classmethod
    def _components(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("checkpoint_components must not be empty; choose from " + ", ".join(COMPONENTS))
        unknown = [c for c in v if c not in COMPONENTS]
        if unknown:
            raise ValueError(f"unknown checkpoint component(s) {unknown}; choose from " + ", ".join(COMPONENTS))
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate checkpoint component(s) in {list(v)}")
        return v

    @model_validator(mode="after")
    def _combinations(self) -> "ValidationConfig":
        if self.enabled and self.data is None:
            raise ValueError(
                "validation.enabled requires an explicit held-out source validation.data.path "
                "(validation never splits the training data)"
            )
        unknown = [r for r in self.reward if r not in REWARDS]
        if unknown:
            raise ValueError(f"unknown reward(s) {unknown}; choose from " + ", ".join(REWARDS))
        if len(set(self.reward)) != len(self.reward):
            raise ValueError(f"duplicate reward(s) in {self.reward}")
        if self.objective in ("lm", "dpo"):
            if self.reward:
                raise ValueError(f"validation.reward applies to objective 'generation' only, not {self.objective!r}")
            if "sampling" in self.model_fields_set:
                raise ValueError(f"validation.sampling applies to objective 'generation' only, not {self.objective!r}")
            if self.data is not None and (self.data.prompt_column or self.data.response_column):
                raise ValueError("validation.data.prompt_column/response_column apply to objective 'generation' only")
        elif self.enabled or self.data is not None:
            if self.data is None or not self.data.prompt_column:
                raise ValueError("objective 'generation' requires validation.data.prompt_column")
            # an empty reward inherits the training reward: checked with the whole train spec
            # (tinyllm.objective_config.check_train_spec), since only it knows the training objective
            needs_answer = sorted(set(self.reward) & ANSWER_REWARDS)
            if needs_answer and not self.data.response_column:
                raise ValueError(f"reward(s) {needs_answer} check answers and require validation.data.response_column")
        return self

    @property
    def requested_components(self) -> frozenset[str]:
        """Components validation asks to save at its steps (empty unless save_checkpoint)."""
        return frozenset(self.checkpoint_components) if self.save_checkpoint else frozenset()

    def identity(self) -> dict:
        """What a pending validation must match on resume: every field that changes its numbers."""
        d = self.model_dump(
            mode="json",
            exclude={
                "enabled",
                "before_training",
                "every_steps",
                "save_checkpoint",
                "checkpoint_components",
                "checkpoint",
            },
        )
        d["sampling"] = self.sampling.resolved()
        return d


# --- the metric schema each objective declares (checked by tinyllm/validation/metric_schema.py) ---

_F, _I = float, int  # measures, counts
SCHEMAS: dict[str, dict[str, type]] = {
    "lm": {"val/loss": _F, "val/ppl": _F, "val/token_count": _I, "val/batch_count": _I},
    "generation": {
        "val/reward_avg": _F,
        "val/reward_std": _F,
        "val/reward_min": _F,
        "val/reward_max": _F,
        "val/rollout_count": _I,
        "val/step": _I,
        "val/train_total_steps": _I,
    },
    "dpo": {
        "val/loss": _F,
        "val/reward_margin": _F,
        "val/reward_chosen": _F,
        "val/reward_rejected": _F,
        "val/accuracy": _F,
        "val/policy_err_chosen": _F,
        "val/policy_err_rejected": _F,
        "val/ref_err_chosen": _F,
        "val/ref_err_rejected": _F,
        "val/policy_raw_loss": _F,
        "val/ref_raw_loss": _F,
        "val/pair_count": _I,
        "val/batch_count": _I,
    },
}
ALWAYS = {"timer/validation_s": _F}


def declared_schema(cfg: ValidationConfig, rewards: list[str]) -> tuple[dict[str, type], dict[str, type]]:
    """(required keys -> type, optional keys -> type) of ``cfg.objective``'s frame."""
    optional: dict[str, type] = {}
    if cfg.objective == "generation":
        for name in rewards:
            optional[f"val/{name}"] = _F
            optional[f"val/{name}_count"] = _I
    return {**SCHEMAS[cfg.objective], **ALWAYS}, optional
