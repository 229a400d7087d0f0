"""Model selection during training: best-k checkpoints by a metric, and early stopping.

Spec fields (train spec, not part of the trajectory; importable without torch)::

    "keep_checkpoints": {"last": 2, "best": {"metric": "val/loss", "mode": "min", "k": 1}}
    "early_stopping": {"metric": "val/loss", "mode": "min", "patience": 3, "min_delta": 0.0}

Valid metric names are those the run's held-out validation reports (``validation.objective``'s
``val/*`` figures, e.g. ``val/loss``, ``val/ppl`` for lm); anything else is bad input (exit 2,
before any work). Evaluation-suite figures (``ppl/ppl``) are not selection metrics here: they are
computed by the workflow after a segment, outside the trainer that prunes and stops.

Checks are the validations after update k >= 1 (the before-training pass at step 0 is not a
checkpoint and is not a check). With either field set, every validation step is also a
checkpoint step, so each check has a checkpoint to select.

The figures are durable: every checkpoint carries the history of the selection metrics up to its
step (component ``selection``), and the validation journal of the checkpoint's own step
(tinyllm/validation/transaction.py) holds that step's figure. A resumed run therefore decides from
the same recorded figures as an uninterrupted one: the same stop step, the same best checkpoint.

Early stopping follows Lightning's ``EarlyStopping``: a check improves when ``current <
best - min_delta`` (``mode: min``; ``> best + min_delta`` for max); otherwise ``wait`` grows by
one, and the run stops at the check where ``wait`` reaches ``patience`` (patience counts checks,
not steps). Best k: the k best figures, ties broken by the earlier step.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["min", "max"]
COMPONENT = "selection"  # the checkpoint component holding the metric history


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BestK(_Strict):
    """``keep_checkpoints.best``: the ``k`` best checkpoints by ``metric`` are never pruned."""

    metric: str = Field(min_length=1)
    mode: Mode
    k: int = Field(1, ge=1)


class EarlyStopping(_Strict):
    """``early_stopping``: stop when ``metric`` has not improved by ``min_delta`` for ``patience`` checks."""

    metric: str = Field(min_length=1)
    mode: Mode
    patience: int = Field(3, ge=0)
    min_delta: float = Field(0.0, ge=0.0, allow_inf_nan=False)


def check_metric(field: str, metric: str, valid: list[str]) -> None:
    """ValueError (one phrase) unless ``metric`` is one of ``valid`` (the run's val/* figures)."""
    if not valid:
        raise ValueError(f"{field}.metric {metric!r} needs held-out validation (validation.enabled) to report it")
    if metric not in valid:
        raise ValueError(f"{field}.metric {metric!r} is not a figure this run reports; choose from {', '.join(valid)}")


def selection_metrics(valid_schema: dict[str, type]) -> list[str]:
    """The selectable names of a validation schema: its float ``val/*`` figures (not counts, not timers)."""
    return sorted(k for k, t in valid_schema.items() if k.startswith("val/") and t is float)


def _key(value: float, step: int, mode: str) -> tuple[float, int]:
    return (value if mode == "min" else -value, step)


def best_k(scores: dict[int, float], mode: str, k: int) -> list[int]:
    """The ``k`` best steps of ``{step: figure}`` (checks only: step >= 1), ties -> the earlier step."""
    return sorted((s for s in scores if s >= 1), key=lambda s: _key(scores[s], s, mode))[:k]


class StopDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stopped: bool  # the run stops at ``step``
    step: int | None = None  # the check that stopped it
    best_step: int | None = None
    best_value: float | None = None
    wait: int = 0  # checks without improvement since the best
    checks: int = 0


def decide(scores: dict[int, float], cfg: EarlyStopping) -> StopDecision:
    """Lightning's EarlyStopping over the checks of ``scores`` in step order; the first stop wins."""
    best: float | None = None
    best_step, wait, checks = None, 0, 0
    for step in sorted(s for s in scores if s >= 1):
        value = scores[step]
        if not math.isfinite(value):
            raise ValueError(f"early_stopping: {cfg.metric} at step {step} is {value}")
        checks += 1
        improved = best is None or (value < best - cfg.min_delta if cfg.mode == "min" else value > best + cfg.min_delta)
        if improved:
            best, best_step, wait = value, step, 0
        else:
            wait += 1
        if wait >= cfg.patience and not improved:
            return StopDecision(stopped=True, step=step, best_step=best_step, best_value=best, wait=wait, checks=checks)
    return StopDecision(stopped=False, best_step=best_step, best_value=best, wait=wait, checks=checks)


class Tracker:
    """The selection figures of one trainer process: ``{metric: {step: value}}``, exact (float.hex in
    the checkpoint component), restored at a resume, extended by each validation."""

    def __init__(self, best: BestK | None, early: EarlyStopping | None):
        self.best, self.early = best, early
        self.metrics = sorted({c.metric for c in (best, early) if c is not None})
        self.history: dict[str, dict[int, float]] = {m: {} for m in self.metrics}

    def component(self) -> dict:
        return {"history": {m: [[s, float(v).hex()] for s, v in sorted(h.items())] for m, h in self.history.items()}}

    def restore(self, component: dict | None) -> None:
        for m, rows in ((component or {}).get("history") or {}).items():
            if m in self.history:
                self.history[m].update({int(s): float.fromhex(v) for s, v in rows})

    def record(self, step: int, metrics: dict | None) -> None:
        """A validation's figures at ``step`` (a replayed step keeps its first record: the same bits)."""
        if step < 1 or not metrics:
            return
        for m in self.metrics:
            if m in metrics:
                self.history[m].setdefault(step, float(metrics[m]))

    def decision(self) -> StopDecision | None:
        return decide(self.history[self.early.metric], self.early) if self.early is not None else None

    def best_steps(self) -> list[int]:
        return best_k(self.history[self.best.metric], self.best.mode, self.best.k) if self.best is not None else []

    def kept_steps(self) -> dict[int, str]:
        """Steps retention never prunes for selection, and why: the best k, and early stopping's best."""
        best = self.best
        out = {s: f"best {best.k} by {best.metric}" for s in self.best_steps()} if best is not None else {}
        d = self.decision()
        if d is not None and d.best_step is not None and self.early is not None:  # (a decision: early stopping's)
            out.setdefault(d.best_step, f"early stopping best by {self.early.metric}")
        return out

    def summary(self, checkpoint_of) -> dict:
        """The result's fields: ``best_checkpoints`` and, when the run stopped, ``stopped_early``."""
        out: dict = {}
        if self.best is not None:
            h = self.history[self.best.metric]
            out["best_checkpoints"] = [
                {
                    "step": s,
                    "checkpoint": checkpoint_of(s),
                    "metric": self.best.metric,
                    "value": h[s],
                    "value_hex": float(h[s]).hex(),
                }
                for s in self.best_steps()
            ]
        d = self.decision()
        if d is not None and d.stopped and self.early is not None:  # (a decision: early stopping's)
            h = self.history[self.early.metric]
            out["stopped_early"] = {
                "step": d.step,
                "best_step": d.best_step,
                "best_checkpoint": checkpoint_of(d.best_step),
                "metric": self.early.metric,
                "mode": self.early.mode,
                "patience": self.early.patience,
                "min_delta": self.early.min_delta,
                "best_value": d.best_value,
                "history": [{"step": s, "value": v, "value_hex": float(v).hex()} for s, v in sorted(h.items())],
            }
        return out
