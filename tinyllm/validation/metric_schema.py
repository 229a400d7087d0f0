"""A validation frame that differs from its objective's declared metric schema is fatal.

The schema itself (``SCHEMAS``, ``declared_schema``) is the validation block's, beside the spec in
``tinyllm/validation_config.py``: the spec checks it at load, without this package.

A pass whose metrics have a missing or unexpected key, a value of another type (int counts vs
float measures; bool is neither), or (generation) a rollout count other than prompts x
n_generation raises ``MetricSchemaError``: no frame is emitted, no further update runs. Reward
components are optional per name (absent when no rollout had a reference), but a component and
its count come together.
"""

from __future__ import annotations

from .errors import ValidationFailure


class MetricSchemaError(ValidationFailure):
    """Validation metrics differ from the objective's declared schema (exit 2)."""


def _type_ok(value, want: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, want) and (want is not int or not isinstance(value, float))


def check_schema(metrics: dict, schema: tuple[dict[str, type], dict[str, type]], step: int) -> None:
    required, optional = schema
    missing = sorted(set(required) - set(metrics))
    unexpected = sorted(set(metrics) - set(required) - set(optional))
    wrong = sorted(
        k for k, v in metrics.items() if k in required or k in optional if not _type_ok(v, {**required, **optional}[k])
    )
    unpaired = sorted(k for k in optional if not k.endswith("_count") and ((k in metrics) != (f"{k}_count" in metrics)))
    problems = [
        f"missing {missing}" if missing else "",
        f"unexpected {unexpected}" if unexpected else "",
        f"wrong type {[(k, type(metrics[k]).__name__) for k in wrong]}" if wrong else "",
        f"component without its count {unpaired}" if unpaired else "",
    ]
    problems = [p for p in problems if p]
    if problems:
        raise MetricSchemaError(
            f"validation at step {step}: metrics differ from the declared schema "
            f"({'; '.join(problems)}); training stops (no frame, no further update)"
        )


def check_rollout_count(metrics: dict, expected: int, step: int) -> None:
    if metrics.get("val/rollout_count") != expected:
        raise MetricSchemaError(
            f"validation at step {step}: val/rollout_count {metrics.get('val/rollout_count')} != "
            f"held-out prompts x n_generation = {expected}; training stops"
        )
