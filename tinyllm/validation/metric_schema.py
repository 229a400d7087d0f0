"""Each validation objective declares its metric schema; a frame that differs is fatal.

A pass whose metrics have a missing or unexpected key, a value of another type (int counts vs
float measures; bool is neither), or (generation) a rollout count other than prompts x
n_generation raises ``MetricSchemaError``: no frame is emitted, no further update runs. Reward
components are optional per name (absent when no rollout had a reference), but a component and
its count come together.
"""
from __future__ import annotations

from .config import ValidationConfig
from .errors import ValidationFailure


class MetricSchemaError(ValidationFailure):
    """Validation metrics differ from the objective's declared schema (exit 2)."""


_F, _I = float, int
SCHEMAS: dict[str, dict[str, type]] = {
    "lm": {"val/loss": _F, "val/ppl": _F, "val/token_count": _I, "val/batch_count": _I},
    "generation": {"val/reward_avg": _F, "val/reward_std": _F, "val/reward_min": _F, "val/reward_max": _F,
                   "val/rollout_count": _I, "val/step": _I, "val/train_total_steps": _I},
    "dpo": {"val/loss": _F, "val/reward_margin": _F, "val/reward_chosen": _F, "val/reward_rejected": _F,
            "val/accuracy": _F, "val/policy_err_chosen": _F, "val/policy_err_rejected": _F,
            "val/ref_err_chosen": _F, "val/ref_err_rejected": _F, "val/policy_raw_loss": _F,
            "val/ref_raw_loss": _F, "val/pair_count": _I, "val/batch_count": _I},
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


def _type_ok(value, want: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, want) and (want is not int or not isinstance(value, float))


def check_schema(metrics: dict, schema: tuple[dict[str, type], dict[str, type]], step: int) -> None:
    required, optional = schema
    missing = sorted(set(required) - set(metrics))
    unexpected = sorted(set(metrics) - set(required) - set(optional))
    wrong = sorted(k for k, v in metrics.items() if k in required or k in optional
                   if not _type_ok(v, {**required, **optional}[k]))
    unpaired = sorted(k for k in optional if not k.endswith("_count") and ((k in metrics) != (f"{k}_count" in metrics)))
    problems = [f"missing {missing}" if missing else "", f"unexpected {unexpected}" if unexpected else "",
                f"wrong type {[(k, type(metrics[k]).__name__) for k in wrong]}" if wrong else "",
                f"component without its count {unpaired}" if unpaired else ""]
    problems = [p for p in problems if p]
    if problems:
        raise MetricSchemaError(f"validation at step {step}: metrics differ from the declared schema "
                                f"({'; '.join(problems)}); training stops (no frame, no further update)")


def check_rollout_count(metrics: dict, expected: int, step: int) -> None:
    if metrics.get("val/rollout_count") != expected:
        raise MetricSchemaError(f"validation at step {step}: val/rollout_count {metrics.get('val/rollout_count')} != "
                                f"held-out prompts x n_generation = {expected}; training stops")
