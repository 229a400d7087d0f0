"""Typed specs of tinyllm's commands: the train spec, the corpus spec, the eval spec.

Importable without torch: workflows and ctl validate specs with these models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from .validation.config import ValidationConfig

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=128)]


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """A small decoder-only transformer (nanoGPT shape)."""

    vocab_size: int = Field(256, ge=2)  # byte-level tokenizer by default
    block_size: int = Field(64, ge=2)  # context length in tokens
    n_layer: int = Field(2, ge=1)  # transformer blocks
    n_head: int = Field(2, ge=1)  # attention heads per block
    n_embd: int = Field(64, ge=1)  # width; a multiple of n_head
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # >0 makes the RNG state part of exact resume
    bias: bool = False  # biases in Linear and LayerNorm


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
    lr_decay_steps: int | None = Field(None, ge=1)  # cosine decays to min_lr at this step (default: steps)
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, ge=0.0)  # 0 disables clipping
    threads: int = Field(2, ge=1)  # torch intra-op threads; fixed for bitwise repeatability
    model: ModelConfig = ModelConfig()
    validation: ValidationConfig | None = None  # held-out validation during training (opt-in)


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


def parse_train_spec(data: object) -> TrainSpec:
    try:
        return TrainSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, "train spec")) from None


def load_train_spec(path: str | Path) -> TrainSpec:
    return parse_train_spec(load_json_file(path, "train spec"))
