"""Rule rewards for held-out generation: each maps (completion, reference) to a float in [0, 1].

Answer-checking rewards need the reference (``data.response_column``); for a prompt whose reference
is null they are *absent* (not scored, not zero), which ``val/<name>_count`` shows. A rollout's
reward is the sum of its present components. Text is compared after stripping surrounding whitespace.
"""

from __future__ import annotations

from collections.abc import Callable

from ..validation_config import ANSWER_REWARDS


def exact_match(completion: str, reference: str) -> float:
    return float(completion.strip() == reference.strip())


def prefix_match(completion: str, reference: str) -> float:
    ref = reference.strip()
    return float(bool(ref) and completion.strip().startswith(ref))


def contains(completion: str, reference: str) -> float:
    ref = reference.strip()
    return float(bool(ref) and ref in completion)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def numeric(completion: str, reference: str) -> float:
    """1 when the completion is a number within 1e-6 (relative, at least absolute) of the reference."""
    got, want = _number(completion), _number(reference)
    return float(got is not None and want is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want)))


def nonempty(completion: str, reference: str | None) -> float:
    return float(bool(completion.strip()))


REWARD_FUNCTIONS: dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "prefix_match": prefix_match,
    "contains": contains,
    "numeric": numeric,
    "nonempty": nonempty,
}


def score(names: list[str], completion: str, reference: str | None) -> dict[str, float]:
    """The present reward components of one rollout (answer rewards absent without a reference)."""
    return {
        n: REWARD_FUNCTIONS[n](completion, reference if reference is not None else "")  # (None: nonempty only)
        for n in names
        if reference is not None or n not in ANSWER_REWARDS
    }
