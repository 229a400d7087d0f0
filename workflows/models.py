"""Typed inputs and results of the workflows and their activities.

Every model round-trips through JSON (``Model.model_validate_json(m.model_dump_json()) == m``):
the engine records them in the history as JSON, and ``ctl ... --json`` prints them.
Results produced by tinyllm keep any extra fields it adds (``extra="allow"``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from .plan import (  # noqa: F401 (re-exported): the names, pydantic-free in .plan
    ACTIVITY_CORPUS,
    ACTIVITY_EVAL,
    ACTIVITY_TRAIN,
    WORKFLOW_CORPUS_BUILD,
    WORKFLOW_EVAL_SUITE,
    WORKFLOW_TRAIN_RUN,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Result(BaseModel):
    """A result printed by tinyllm: the known fields typed, extra ones kept."""

    model_config = ConfigDict(extra="allow")


# --- activities -------------------------------------------------------------------------


class CorpusBuildInput(_Model):
    """CorpusBuild's input: a tinyllm corpus spec (``{"name": ..., ...}``), passed as is."""

    spec: dict[str, Any]


class CorpusBuildResult(_Result):
    """What ``tinyllm corpus`` prints."""

    name: str
    path: str = ""
    tokens: int = 0
    heldout_tokens: int = 0
    checksum: str = ""


class TrainActivityInput(_Model):
    """One segment: the run's train spec with ``steps`` set to the segment's end, and the run's
    own last step (``tinyllm train --total-steps``), so validation's schedule is the run's, not
    the segment's (None: the segment is the whole run)."""

    spec: dict[str, Any]
    total_steps: int | None = Field(None, ge=1)


class RefusedCheckpoint(_Result):
    """A checkpoint the trainer refused (corrupt, torn, missing, not resumable), and why."""

    checkpoint: str  # relative to the home
    reason: str


class TrainActivityResult(_Result):
    """What ``tinyllm train`` prints as its last line."""

    name: str
    steps: int
    checkpoint: str  # relative to the home, e.g. runs/tiny/ckpt/step-000500
    final_loss: float
    final_loss_hex: str  # float.hex of final_loss: the bitwise check
    digest: str  # sha256 of the model state
    resumed_from: str | None = None
    refused_checkpoints: list[RefusedCheckpoint] = Field(default_factory=list)  # refused before resuming


class EvalActivityInput(_Model):
    """One suite: the eval spec ``marshal_spec`` built for it."""

    spec: dict[str, Any]


class SuiteOutputs(_Result):
    """What ``tinyllm eval`` prints: one suite's results over its subjects."""

    suite: str
    run: str = ""  # <name> or <name>-<tag>
    results: str = ""  # evals/<suite>/<run>/results.jsonl, relative to the home
    summary_path: str = ""  # evals/<suite>/<run>/summary.json
    summary: dict[str, Any] = Field(default_factory=dict)  # summary.json's content (metrics per subject, rows)

    def metrics(self) -> dict[str, dict[str, float]]:
        """``{subject: {"task/metric": value}}`` from the summary."""
        m = self.summary.get("metrics")
        return m if isinstance(m, dict) else {}


# --- workflows ----------------------------------------------------------------------------


class EvalSubject(_Model):
    """A model to evaluate: ``id`` names it in the results, ``model`` is its checkpoint path."""

    id: str
    model: str


class EvalSuiteInput(_Model):
    """EvalSuite: each suite in order over the subjects; ``tag`` names the evaluation point."""

    name: str
    tag: str = ""
    suites: list[str]
    subjects: list[EvalSubject]
    seed: int = 0
    corpus: str = "default"  # the ppl suite reads this corpus's held-out tokens
    max_items: int | None = None  # per suite: ppl windows, zoo items per task (None: all)
    trainer: dict[str, Any] | None = None  # a spec's own trainer: its eval_command runs each suite
    heartbeat_timeout_s: float = Field(120.0, gt=0)  # a silent evaluation is stopped and retried after this


class EvalSuiteResult(_Model):
    suites: list[SuiteOutputs] = Field(default_factory=list)


class PriorWork(_Model):
    """What earlier workflows of the same run finished (see workflows/continuation.py).

    ``train``: segment results by id (``train-000500``); ``evals``: suite outputs by id
    (``eval-000500-ppl``); ``scheduled``: every activity id an earlier workflow scheduled.
    TrainRun reuses these instead of running them again; empty for a first run.
    """

    train: dict[str, TrainActivityResult] = Field(default_factory=dict)
    evals: dict[str, SuiteOutputs] = Field(default_factory=dict)
    scheduled: list[str] = Field(default_factory=list)


class TraceContext(_Model):
    """The OpenTelemetry trace of a run, recorded in its history so that every resume continues it:
    ``trace_id`` (32 hex digits) and the caller's span the run's root span is a child of (``$TRACEPARENT``
    of the ``ctl train`` that started it), if any. The workflow itself never reads it."""

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    parent_span_id: str | None = Field(None, pattern=r"^[0-9a-f]{16}$")


class TrainRunInput(_Model):
    """TrainRun: a train spec and optional corpus spec (raw JSON, validated by the workflow)."""

    spec: dict[str, Any]
    corpus: dict[str, Any] | None = None  # a tinyllm corpus spec; None: no CorpusBuild step
    eval_suites: list[str] = Field(default_factory=list)
    eval_seed: int = 0
    eval_max_items: int | None = Field(None, ge=1)  # per suite (None: all items)
    train_heartbeat_timeout_s: float = Field(60.0, gt=0)  # a silent trainer is redelivered after this
    eval_heartbeat_timeout_s: float = Field(120.0, gt=0)  # a silent evaluation is stopped and retried after this
    train_max_attempts: int = Field(5, ge=1)
    prior: PriorWork = Field(default_factory=PriorWork)  # a continued run: work already done
    trace: TraceContext | None = None  # the run's trace, when it started traced (app/traces.py)
    # how many times the run was started over (`ctl train --restart`, ctl/restart.py): a continuation reuses only
    # the work of the workflows with its own count
    restart: int = Field(0, ge=0)

    @model_serializer(mode="wrap")
    def _untraced_as_before(self, handler):
        """A run without a trace (or never restarted) records no ``trace`` (``restart``) key: its history is
        what it was before traces (restarts)."""
        out = handler(self)
        if isinstance(out, dict) and out.get("trace") is None:
            out.pop("trace", None)
        if isinstance(out, dict) and out.get("restart") == 0:
            out.pop("restart", None)
        return out


class Segment(_Model):
    """One finished segment: its end step, its checkpoint, the trainer's result, its evaluation."""

    until: int
    checkpoint: str
    train: TrainActivityResult
    evals: EvalSuiteResult | None = None


class TrainRunResult(_Model):
    name: str
    steps: int
    checkpoint: str
    segments: list[Segment]
    corpus: CorpusBuildResult | None = None
    final_loss_hex: str = ""  # the last segment's, for convenience
    digest: str = ""
    stopped_early: dict[str, Any] | None = None  # early stopping ended the run (tinyllm/selection.py)
    best_checkpoints: list[dict[str, Any]] | None = None  # keep_checkpoints.best: the best k, best first
