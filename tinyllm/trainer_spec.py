"""A train spec that names its own trainer (importable without torch; contracts/subprocess-activity.md).

``{"name", "steps", "trainer": {"command": [...], "cwd", "env", "eval_command"}, "config": {...}, ...}``:
any command that follows the trainer contract trains the run instead of tinyllm. The workflows
read only the fields below; ``config`` is the trainer's own (its hyperparameters), passed as is.
A spec without ``trainer`` is a tinyllm ``TrainSpec``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, TypeGuard

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


def has_trainer(raw: object) -> TypeGuard[Mapping[str, Any]]:
    """Does this spec name its own trainer? The one answer (a ``trainer`` key: ``CustomTrainSpec``), which
    ctl, the workflows and the simulator ask; ``trainer_of`` gives the trainer itself."""
    return isinstance(raw, Mapping) and "trainer" in raw


def trainer_of(raw: object) -> dict[str, Any] | None:
    """The spec's own trainer (its ``trainer`` object: command, cwd, env, eval_command), or None for a tinyllm
    spec (``has_trainer`` False) or one whose ``trainer`` is not an object (which ``parse_run_spec`` refuses)."""
    if not has_trainer(raw):
        return None
    trainer = raw["trainer"]
    return dict(trainer) if isinstance(trainer, Mapping) else None


_PARSED: dict[str, RunSpec] = {}
_PARSED_MAX = 64  # distinct specs kept per process (a worker serving many runs); the oldest goes first


def _key(raw: object) -> str | None:
    try:
        return json.dumps(raw, sort_keys=True)
    except (TypeError, ValueError):
        return None


def remember_run_spec(raw: object, spec: RunSpec) -> None:
    """``parse_run_spec(raw)`` is ``spec`` from now on in this process (the caller derived ``raw`` from a spec it
    parsed: ctl makes a trainer's ``cwd`` absolute, app/trainers.py). The models are frozen: shared safely."""
    key = _key(raw)
    if key is None:
        return
    if len(_PARSED) >= _PARSED_MAX and key not in _PARSED:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[key] = spec


def parse_run_spec(raw: object) -> RunSpec:
    """A tinyllm ``TrainSpec``, or a ``CustomTrainSpec`` when the spec names its ``trainer``.

    Parsed once per process: the same spec (equal JSON) gives the same frozen model again, so ctl's request,
    the workflow run in ctl's process and each of its replays parse it once in all. A bad spec raises
    ``SpecError`` every time (nothing is kept of it)."""
    key = _key(raw)
    if key is not None and key in _PARSED:
        return _PARSED[key]
    spec: RunSpec = _parse(CustomTrainSpec, raw, "train spec") if has_trainer(raw) else parse_train_spec(raw)
    remember_run_spec(raw, spec)
    return spec


__all__ = [
    "CustomTrainSpec",
    "RunSpec",
    "SpecError",
    "TrainerCommand",
    "has_trainer",
    "parse_run_spec",
    "remember_run_spec",
    "trainer_of",
]
