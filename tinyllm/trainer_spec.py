"""A train spec that names its own trainer (importable without torch; contracts/subprocess-activity.md).

``{"name", "steps", "trainer": {"command": [...], "cwd", "env", "eval_command"}, "config": {...}, ...}``:
any command that follows the trainer contract trains the run instead of tinyllm. The workflows
read only the fields below; ``config`` is the trainer's own (its hyperparameters), passed as is.
A spec without ``trainer`` is a tinyllm ``TrainSpec``.
"""
from __future__ import annotations

from typing import Any, TypeGuard

from pydantic import Field, field_validator

from .spec import Identifier, SpecError, TrainSpec, _parse, _Strict, parse_train_spec


class TrainerCommand(_Strict):
    """How to start a trainer: ``command`` + the contract's arguments, in ``cwd``, with ``env`` added."""

    command: list[str] = Field(min_length=1)  # e.g. ["python", "my_train.py"]; "python" = the worker's interpreter
    cwd: str | None = None  # working directory; relative: to where ctl runs (ctl records it absolute)
    env: dict[str, str] = {}  # added to the worker's environment
    eval_command: list[str] | None = Field(None, min_length=1)  # EvalSuite's `eval` activity for this trainer

    @field_validator("command", "eval_command")
    @classmethod
    def _no_empty_words(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not w for w in value):
            raise ValueError("words must be non-empty strings")
        if value is not None and any("\0" in w for w in value):
            raise ValueError("a word holds a NUL byte, which no command can receive")
        return value

    @field_validator("cwd")
    @classmethod
    def _no_nul_in_cwd(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("holds a NUL byte")
        return value

    @field_validator("env")
    @classmethod
    def _exec_able_env(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if not k or "=" in k or "\0" in k or "\0" in v:
                raise ValueError(f"variable {k!r}: a name must be non-empty without '=' or NUL, a value without NUL")
        return value


class CustomTrainSpec(_Strict):
    """A run trained by a user's command (``trainer``); the fields TrainRun reads, and ``config``."""

    name: Identifier
    steps: int = Field(ge=1)
    trainer: TrainerCommand
    seed: int = 0
    checkpoint_every: int = Field(100, ge=1)
    log_every: int = Field(10, ge=1)
    eval_every: int = Field(0, ge=0)
    eval_interval_seconds: float = Field(0.0, ge=0.0)
    config: dict[str, Any] = {}  # the trainer's own settings, passed through untouched
    corpus: None = None  # user trainers bring their own data (TrainRun builds no corpus)


RunSpec = TrainSpec | CustomTrainSpec


def has_trainer(raw: object) -> TypeGuard[dict]:
    return isinstance(raw, dict) and "trainer" in raw


def parse_run_spec(raw: object) -> RunSpec:
    """A tinyllm ``TrainSpec``, or a ``CustomTrainSpec`` when the spec names its ``trainer``."""
    if has_trainer(raw):
        return _parse(CustomTrainSpec, raw, "train spec")
    return parse_train_spec(raw)


__all__ = ["CustomTrainSpec", "RunSpec", "SpecError", "TrainerCommand", "has_trainer", "parse_run_spec"]
