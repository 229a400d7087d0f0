"""Typed specs of tinyllm's commands: the train spec, the corpus spec, the eval spec, eval results.

Importable without torch: workflows and ctl validate specs with these models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .validation.config import ValidationConfig

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=128)]


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """A small decoder-only transformer (nanoGPT shape)."""

    vocab_size: int = Field(256, ge=256)  # byte-level tokens (ids 0..255) need at least 256
    block_size: int = Field(64, ge=2)  # context length in tokens
    n_layer: int = Field(2, ge=1)  # transformer blocks
    n_head: int = Field(2, ge=1)  # attention heads per block
    n_embd: int = Field(64, ge=1)  # width; a multiple of n_head
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # >0 makes the RNG state part of exact resume
    bias: bool = False  # biases in Linear and LayerNorm

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        return self


class TrainSpec(_Strict):
    """What ``tinyllm train --spec`` trains; TrainRun's segments change only ``steps``."""

    name: Identifier  # names runs/<name>/ and workflow train/<name>
    steps: int = Field(ge=1)  # optimizer steps in all
    corpus: Identifier = "default"  # trains on corpora/<corpus>/ (built by tinyllm corpus)
    seed: int = 0  # model init, data order, dropout
    eval_every: int = Field(0, ge=0)  # TrainRun: evaluate every this many steps (0: only at the end)
    eval_interval_seconds: float = Field(0.0, ge=0.0)  # TrainRun: durable wait after each evaluation but the last
    checkpoint_every: int = Field(100, ge=1)  # also one at the end of every invocation
    batch_size: int = Field(16, ge=1)
    grad_accum_steps: int = Field(1, ge=1)  # micro-batches per optimizer step
    lr: float = Field(1e-3, gt=0.0)  # peak learning rate
    min_lr: float = Field(1e-4, ge=0.0)  # floor of the cosine decay
    warmup_steps: int = Field(10, ge=0)
    # The LR schedule never depends on ``steps`` (segments change only ``steps``, yet must follow
    # one trajectory): linear warmup to ``lr``, then cosine decay to ``min_lr`` at ``lr_decay_steps``
    # and ``min_lr`` after it; when ``lr_decay_steps`` is None, ``lr`` stays constant after warmup.
    lr_decay_steps: int | None = Field(None, ge=1)
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, ge=0.0)  # 0 disables clipping
    threads: int = Field(2, ge=1)  # torch intra-op threads; fixed for bitwise repeatability
    log_every: int = Field(10, ge=1)  # console progress line every this many steps
    model: ModelConfig = ModelConfig()
    validation: ValidationConfig | None = None  # held-out validation during training (opt-in)


class CorpusSpec(_Strict):
    """What ``tinyllm corpus --spec`` builds into ``corpora/<name>/``.

    Without ``sources`` the built-in text is used (shipped and generated in the package, offline).
    The held-out part is explicit: the files of ``heldout``, or else the tail ``heldout_fraction``
    of the source text; it goes to ``heldout.bin`` and training (which reads only ``tokens.bin``)
    never sees it.
    """

    name: Identifier = "default"
    sources: list[str] = []  # text files or globs, relative to the home or absolute; [] = built-in
    heldout: list[str] = []  # held-out files or globs (disjoint from sources); [] = the tail range
    heldout_fraction: float = Field(0.1, gt=0.0, lt=1.0)  # tail share held out when heldout == []
    tokenizer: Literal["byte"] = "byte"  # byte-level: any text, vocab 256


class EvalSubject(_Strict):
    """One model under evaluation: an id and a checkpoint directory."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]*$", max_length=128)  # e.g. "tiny@500"; not a path
    model: str = Field(min_length=1)  # checkpoint dir (runs/<name>/ckpt/step-NNNNNN), relative to home or absolute


class EvalSpec(_Strict):
    """What ``tinyllm eval --spec`` runs: one suite over its subjects."""

    name: Identifier
    tag: Identifier | None = None  # results go to evals/<suite>/<name>-<tag> (or <name>)
    suite: Literal["ppl", "zoo"]
    subjects: list[EvalSubject] = Field(min_length=1)
    seed: int = 0  # item sampling when max_items is set
    corpus: Identifier = "default"  # ppl reads corpora/<corpus>/heldout.bin
    max_items: int | None = Field(None, ge=1)  # ppl: windows; zoo: items per task
    threads: int = Field(1, ge=1)  # torch threads; evals run many tiny forwards, where 1 is fastest

    @model_validator(mode="after")
    def _unique_subjects(self) -> "EvalSpec":
        ids = [s.id for s in self.subjects]
        if len(set(ids)) != len(ids):
            raise ValueError(f"subject ids must be unique, got {ids}")
        return self

    @property
    def run(self) -> str:
        return f"{self.name}-{self.tag}" if self.tag else self.name


class EvalResult(_Strict):
    """One line of ``results.jsonl``: one metric of one task for one subject."""

    suite: Literal["ppl", "zoo"]
    run: str
    subject: str
    model: str  # the checkpoint evaluated, as given in the spec
    step: int  # the checkpoint's training step
    task: str  # "heldout" for ppl; the zoo task's name
    metric: str  # ppl: "ppl", "loss"; zoo: "acc", "acc_norm", "exact_match"
    value: float
    value_hex: str  # float.hex(value): exactness across runs
    n: int  # tokens (ppl) or items (zoo) behind the value


class EvalSummary(_Strict):
    """``summary.json``: every result of one suite run, and metrics by subject."""

    suite: Literal["ppl", "zoo"]
    run: str
    name: str
    tag: str | None
    seed: int
    results: list[EvalResult]
    metrics: dict[str, dict[str, float]]  # subject -> "task/metric" -> value


def format_validation_error(err: ValidationError, what: str) -> str:
    """One line naming the first problem of a pydantic ValidationError."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "(top level)"
    return f"invalid {what}: {where}: {first.get('msg', 'invalid')}"


def load_json_file(path: str | Path, what: str) -> object:
    """Read a JSON file, turning every failure into one ``SpecError`` line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{what} file not found: {p}") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} file {p}: {e.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} file {p} is not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None


_M = TypeVar("_M", bound=BaseModel)


def _parse(model: type[_M], data: object, what: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, what)) from None


def parse_train_spec(data: object) -> TrainSpec:
    return _parse(TrainSpec, data, "train spec")


def load_train_spec(path: str | Path) -> TrainSpec:
    return parse_train_spec(load_json_file(path, "train spec"))


def parse_corpus_spec(data: object) -> CorpusSpec:
    return _parse(CorpusSpec, data, "corpus spec")


def load_corpus_spec(path: str | Path) -> CorpusSpec:
    return parse_corpus_spec(load_json_file(path, "corpus spec"))


def parse_eval_spec(data: object) -> EvalSpec:
    return _parse(EvalSpec, data, "eval spec")


def load_eval_spec(path: str | Path) -> EvalSpec:
    return parse_eval_spec(load_json_file(path, "eval spec"))
