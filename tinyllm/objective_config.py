"""The train spec's post-training fields (importable without torch): ``objective``, ``init_from``,
``ref``, ``teacher``, and the ``dpo`` and ``rl`` blocks; ``check_train_spec`` holds every rule that
needs more than one block (run from ``TrainSpec``'s validator, so a bad spec fails at load, exit 2).

- ``dpo``: preference pairs (JSONL objects with ``prompt``, ``chosen``, ``rejected``) and beta.
- ``rl``: the GRPO family and OPD share it: prompts (``prompt_column``, ``response_column``),
  rule rewards, the training rollout sampling, ``n_generation`` samples per prompt, ``n_mini``
  optimizer updates per collected batch, the clip range and the KL weight.
  ``steps`` counts collected batches; each commits ``n_mini`` model steps (optimizer updates).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .validation_config import ANSWER_REWARDS, REWARDS, reward_list

OBJECTIVES = ("lm", "dpo", "grpo", "opd")
ROLLOUT_OBJECTIVES = frozenset({"grpo", "opd"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RefConfig(_Strict):
    build_ref: bool = False  # a frozen reference model built from init_from


class PairsData(_Strict):
    """Training preference pairs: JSONL objects ``{"prompt", "chosen", "rejected"}`` (home-relative path)."""

    path: str = Field(min_length=1)
    shuffle: bool = True  # per-epoch permutation seeded by (seed, epoch); false: file order


class DPOConfig(_Strict):
    beta: float = Field(0.1, gt=0.0)
    data: PairsData


class PromptData(_Strict):
    """Training prompts: JSONL objects; the answer column is needed by answer-checking rewards."""

    path: str = Field(min_length=1)
    prompt_column: str = Field("prompt", min_length=1)
    response_column: str | None = Field(None, min_length=1)
    shuffle: bool = True


class RolloutSampling(_Strict):
    """Training rollout sampling (validation has its own block, validation.sampling)."""

    temperature: float = Field(1.0, gt=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)  # None resolves to 1.0
    top_k: int | None = Field(None, ge=1)  # None: disabled
    repetition_penalty: float = Field(1.0, gt=0.0)
    max_tokens: int = Field(8, ge=1)  # completion limit (a rollout also stops at a newline)

    def resolved(self, n_generation: int) -> dict:
        return {
            "temperature": self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k,
            "repetition_penalty": self.repetition_penalty,
            "n_generation": n_generation,
            "max_tokens": self.max_tokens,
        }


class RLConfig(_Strict):
    data: PromptData
    reward: list[str] = []  # rule rewards summed per rollout (grpo: required; opd: for reporting/validation)
    n_generation: int = Field(4, ge=1)  # samples per prompt (the group)
    n_mini: int = Field(1, ge=1)  # optimizer updates per collected batch
    sampling: RolloutSampling = RolloutSampling()
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)  # PPO clip range of the ratio
    kl_beta: float = Field(0.0, ge=0.0)  # weight of the k3 KL to the reference
    scale_rewards: Literal["group", "none"] = "group"  # group: divide by the group's std
    adv_eps: float = Field(1e-4, gt=0.0)  # the epsilon of (r - mean) / (std + eps)

    _reward_list = field_validator("reward", mode="before")(reward_list)

    @field_validator("reward")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = [r for r in v if r not in REWARDS]
        if unknown:
            raise ValueError(f"unknown reward(s) {unknown}; choose from " + ", ".join(REWARDS))
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate reward(s) in {v}")
        return v


def check_train_spec(spec) -> None:
    """Cross-field rules of a train spec (raise ValueError; pydantic turns it into one line)."""
    obj, val = spec.objective, spec.validation
    blocks = {"dpo": spec.dpo, "rl": spec.rl}
    wanted = {"lm": None, "dpo": "dpo", "grpo": "rl", "opd": "rl"}[obj]
    for name, block in blocks.items():
        if block is not None and name != wanted:
            raise ValueError(
                f"the {name} block applies to objective {'dpo' if name == 'dpo' else 'grpo or opd'}, not {obj!r}"
            )
    if wanted is not None and blocks[wanted] is None:
        raise ValueError(f"objective {obj!r} requires the {wanted} block")
    if obj != "opd" and spec.teacher is not None:
        raise ValueError(f"teacher applies to objective 'opd' only, not {obj!r}")
    if obj in ("dpo", "grpo") and spec.init_from is None:
        raise ValueError(f"objective {obj!r} requires init_from (a pretrained checkpoint: <run>@<step> or a path)")
    if obj == "dpo" and not (spec.ref and spec.ref.build_ref):
        raise ValueError("objective 'dpo' requires ref.build_ref: true (the frozen reference model)")
    if obj == "opd" and spec.teacher is None:
        raise ValueError("objective 'opd' requires teacher (a checkpoint: <run>@<step> or a path)")
    if obj in ROLLOUT_OBJECTIVES:
        rl = spec.rl
        if spec.grad_accum_steps != 1:
            raise ValueError(f"objective {obj!r} takes n_mini updates per batch, not grad_accum_steps")
        if obj == "grpo" and not rl.reward:
            raise ValueError("objective 'grpo' requires rl.reward (one or more of " + ", ".join(REWARDS) + ")")
        needs = sorted(set(rl.reward) & ANSWER_REWARDS)
        if needs and not rl.data.response_column:
            raise ValueError(f"reward(s) {needs} check answers and require rl.data.response_column")
    if val is None or not val.enabled:
        return
    vobj = val.objective
    if vobj == "dpo" and obj != "dpo":
        raise ValueError(f"validation.objective 'dpo' needs training objective 'dpo', not {obj!r}")
    if obj == "dpo" and spec.grad_accum_steps > 1:
        raise ValueError("objective 'dpo' rejects validation with gradient accumulation (grad_accum_steps > 1)")
    if obj in ROLLOUT_OBJECTIVES and val.every_steps % spec.rl.n_mini:
        raise ValueError(
            f"validation.every_steps ({val.every_steps}) must be divisible by rl.n_mini "
            f"({spec.rl.n_mini}): validation runs at collected-batch boundaries"
        )
    if vobj == "generation" and not val.reward:  # inherits the training reward (explicit ones: ValidationConfig)
        inherited = spec.rl.reward if obj in ROLLOUT_OBJECTIVES else []
        if not inherited:
            raise ValueError(
                "validation.reward is empty and the training objective has no reward to inherit; "
                "name one of " + ", ".join(REWARDS)
            )
        needs = sorted(set(inherited) & ANSWER_REWARDS)
        if needs and not val.data.response_column:
            raise ValueError(
                f"reward(s) {needs} (inherited from rl.reward) check answers and require "
                "validation.data.response_column"
            )
    if vobj == "generation" and obj in ROLLOUT_OBJECTIVES and val.data.path == spec.rl.data.path:
        raise ValueError(
            f"validation.data.path {val.data.path!r} is the training prompts file; "
            "held-out prompts must be a separate source"
        )
    if vobj == "dpo" and val.data.path == spec.dpo.data.path:
        raise ValueError(
            f"validation.data.path {val.data.path!r} is the training pairs file; "
            "held-out pairs must be a separate source"
        )


def effective_validation_reward(spec) -> list[str]:
    """validation.reward, or (empty) the training reward it inherits."""
    if spec.validation is not None and spec.validation.reward:
        return list(spec.validation.reward)
    return list(spec.rl.reward) if spec.rl is not None else []


def effective_validation_sampling(spec) -> dict:
    """validation.sampling resolved; a null max_tokens inherits the training rollout limit (rl)."""
    sampling = spec.validation.sampling.resolved()
    if spec.validation.sampling.max_tokens is None and spec.rl is not None:
        sampling["max_tokens"] = spec.rl.sampling.max_tokens
    return sampling
