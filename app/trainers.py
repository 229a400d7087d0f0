"""``ctl train`` of a spec that names its own trainer (contracts/subprocess-activity.md).

The spec is checked before anything starts; the trainer's ``cwd`` is recorded absolute (relative to
the directory ctl runs in), so the worker that runs it, wherever it starts, finds the same script.
Suites are the trainer's own names and need its ``eval_command``; by default nothing is evaluated.
``ctl eval --spec FILE`` runs that ``eval_command`` on any checkpoints (EvalSuite, as in TrainRun).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

import workflows
from engine import NonRetryableError
from tinyllm.spec import IDENTIFIER_PATTERN, SpecError, load_json_file
from tinyllm.trainer_spec import CustomTrainSpec, has_trainer, parse_run_spec, remember_run_spec
from workflows.models import TrainRunInput

from .errors import BadRequest


def resolved_spec(raw: Mapping[str, Any], base: Path | None = None) -> tuple[dict, CustomTrainSpec]:
    """The spec with ``trainer.cwd`` absolute, and its parsed model; ``BadRequest`` when it is bad."""
    try:
        spec = parse_run_spec(raw)
    except SpecError as e:
        raise BadRequest(str(e)) from None
    assert isinstance(spec, CustomTrainSpec)
    cwd = Path(spec.trainer.cwd or ".")
    if not cwd.is_absolute():
        cwd = (base or Path(os.getcwd())) / cwd
    cwd = cwd.resolve()
    if not cwd.is_dir():
        raise BadRequest(f"the trainer's cwd {cwd} is not a directory")
    out = dict(raw)
    out["trainer"] = {**raw["trainer"], "cwd": str(cwd)}
    spec = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"cwd": str(cwd)})})
    remember_run_spec(out, spec)  # what the workflow of this process reads: parsed already
    return out, spec


def check_suite_names(suites: list[str]) -> None:
    """A trainer's own suite names: identifiers, each once."""
    for suite in suites:
        if not re.match(IDENTIFIER_PATTERN, suite):
            raise BadRequest(f"bad suite {suite!r}: use letters, digits and . _ - (starting with a letter or digit)")
    if len(set(suites)) != len(suites):
        raise BadRequest(f"suite given twice: {suites}")


def custom_train_request(
    raw: dict,
    suites: list[str] | None,
    *,
    eval_seed: int = 0,
    eval_max_items: int | None = None,
    corpus_file: str | None = None,
) -> tuple[CustomTrainSpec, TrainRunInput]:
    """The typed spec and TrainRun's input for a spec with its own trainer (no corpus; suites only with an
    eval_command)."""
    spec_raw, spec = resolved_spec(raw)
    if corpus_file is not None:
        raise BadRequest("--corpus-spec: a spec with its own trainer brings its own data")
    suites = list(suites or [])
    if suites and not spec.trainer.eval_command:
        raise BadRequest(f"--suite {suites[0]}: the spec's trainer has no eval_command")
    check_suite_names(suites)
    if eval_max_items is not None and eval_max_items < 1:
        raise BadRequest(f"--eval-max-items must be >= 1, got {eval_max_items}")
    try:
        workflows.check_run_spec(spec)
    except NonRetryableError as e:
        raise BadRequest(str(e)) from None
    return spec, TrainRunInput(
        spec=spec_raw, corpus=None, eval_suites=suites, eval_seed=eval_seed, eval_max_items=eval_max_items
    )


def load_run_spec(spec_file: str) -> dict:
    """A train spec file as loaded (tinyllm's or one naming its own trainer, then with ``trainer.cwd``
    absolute): what ``ctl verify-resume`` proves; ``BadRequest`` when it is unreadable or bad."""
    try:
        raw = load_json_file(spec_file, "train spec")
        parse_run_spec(raw)
    except SpecError as e:
        raise BadRequest(str(e)) from None
    assert isinstance(raw, dict)  # (parse_run_spec accepted it: a JSON object)
    return resolved_spec(raw)[0] if has_trainer(raw) else raw


def eval_trainer(spec_file: str) -> dict:
    """``ctl eval --spec FILE``: the spec's trainer (cwd made absolute), which must have an ``eval_command``."""
    try:
        raw = load_json_file(spec_file, "train spec")
    except SpecError as e:
        raise BadRequest(str(e)) from None
    if not has_trainer(raw):
        raise BadRequest(f"--spec {spec_file}: the spec names no trainer of its own (tinyllm's suites need no --spec)")
    spec_raw, spec = resolved_spec(raw)
    if not spec.trainer.eval_command:
        raise BadRequest(f"--spec {spec_file}: the spec's trainer has no eval_command")
    return spec_raw["trainer"]
