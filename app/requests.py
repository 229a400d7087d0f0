"""Requests: a spec (and the command's options) read, parsed and checked once, before anything starts.

``train_request`` builds a ``TrainRequest``: the typed spec (``TrainSpec``, or ``CustomTrainSpec`` for a
spec naming its own trainer) and TrainRun's input (``TrainRunInput``, whose ``spec`` is the user's JSON
object as recorded in the history). The spec is parsed once in this process (``parse_run_spec`` keeps the
frozen model: the workflow run here, on every replay, gets the same one); the workflow of another process
(a ``ctl worker``) parses the recorded input once there, and the trainer its own file once. Bad input is
``BadRequest`` (exit 2), nothing started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

import workflows
from contracts.layout import RunHome
from engine import NonRetryableError
from tinyllm.spec import (
    IDENTIFIER_PATTERN,
    EvalSpec,
    SpecError,
    TrainSpec,
    format_validation_error,
    load_json_file,
    parse_corpus_spec,
)
from tinyllm.trainer_spec import RunSpec, has_trainer, parse_run_spec
from workflows.models import EvalSubject, EvalSuiteInput, TrainRunInput

from .errors import BadRequest
from .trainers import check_suite_names, custom_train_request

DEFAULT_SUITES = ("ppl",)  # what `ctl train` evaluates each checkpoint with unless told otherwise


@dataclass(frozen=True)
class TrainRequest:
    """A train spec read and checked once: ``spec`` typed, ``input`` what TrainRun is started with."""

    spec: RunSpec
    input: TrainRunInput

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def workflow_id(self) -> str:
        """The run's base workflow id, ``train/<name>`` (its generations: app/runs.py)."""
        return f"train/{self.spec.name}"


def identifier(value: str, what: str) -> str:
    if not re.match(IDENTIFIER_PATTERN, value or ""):
        raise BadRequest(f"bad {what} {value!r}: use letters, digits and . _ - (starting with a letter or digit)")
    return value


def check_suites(suites: list[str], name: str) -> None:
    """Each suite must make a valid tinyllm eval spec (names the suite kinds tinyllm knows)."""
    probe = EvalSuiteInput(name=name, suites=suites, subjects=[EvalSubject(id="probe", model="probe")])
    for suite in suites:
        identifier(suite, "suite")
        try:
            EvalSpec.model_validate_json(workflows.marshal_spec(probe, suite))
        except Exception as e:
            known = getattr(EvalSpec.model_fields["suite"].annotation, "__args__", ())
            raise BadRequest(f"unknown suite {suite!r} (known: {', '.join(known)})") from e
    if len(set(suites)) != len(suites):
        raise BadRequest(f"suite given twice: {suites}")


BUILTIN_CORPORA = ("default",)
"""Corpora a train spec may name without ``--corpus-spec``: tinyllm's built-in text under that name."""


def known_corpora(home: Path) -> list[str]:
    """The corpora already built in ``home`` (``corpora/<name>/meta.json``), sorted."""
    root = RunHome(home).corpora
    return sorted(d.name for d in root.iterdir() if (d / "meta.json").is_file()) if root.is_dir() else []


def check_corpus_name(name: str, home: Path) -> None:
    """A train spec's corpus without ``--corpus-spec`` must be a built-in one or one already built in the home:
    any other name (a typo) would build the built-in text under it and train on data the user did not mean."""
    built = known_corpora(home)
    if name in BUILTIN_CORPORA or name in built:
        return
    raise BadRequest(
        f"unknown corpus {name!r} in the train spec: the built-in corpora are "
        f"{', '.join(BUILTIN_CORPORA)}; built in {home}: {', '.join(built) or 'none'}; to build "
        f"{name!r} from your own text give --corpus-spec FILE"
    )


def train_request(
    spec_file: str,
    suites: list[str] | None,
    *,
    eval_seed: int = 0,
    eval_max_items: int | None = None,
    corpus_file: str | None = None,
    home: Path | None = None,
) -> TrainRequest:
    """Read and validate a train spec (and optional corpus spec) into a ``TrainRequest``: the spec parsed here,
    once (``parse_run_spec``), and checked as the workflow will check it (``workflows.check_run_spec``).

    ``suites`` None: the default (ppl for tinyllm; none for a spec naming its own trainer). ``home``: where
    a corpus named without ``--corpus-spec`` must already be built unless it is a built-in one
    (``check_corpus_name``); None skips that check.
    """
    try:
        raw = load_json_file(spec_file, "train spec")
    except SpecError as e:
        raise BadRequest(str(e)) from None
    if has_trainer(raw):  # a user's trainer (app/trainers.py)
        assert isinstance(raw, dict)  # has_trainer: a JSON object
        custom, inp = custom_train_request(
            raw, suites, eval_seed=eval_seed, eval_max_items=eval_max_items, corpus_file=corpus_file
        )
        return TrainRequest(custom, inp)
    if suites is None:
        suites = list(DEFAULT_SUITES)
    try:
        spec = parse_run_spec(raw)
    except SpecError as e:
        raise BadRequest(str(e)) from None
    assert isinstance(spec, TrainSpec) and isinstance(raw, dict)  # parsed: a JSON object, no trainer
    try:
        workflows.check_run_spec(spec)  # the workflow's own checks, before anything is started
    except NonRetryableError as e:
        raise BadRequest(str(e)) from None
    if corpus_file is not None:
        try:
            corpus = load_json_file(corpus_file, "corpus spec")
        except SpecError as e:
            raise BadRequest(str(e)) from None
        if not isinstance(corpus, dict) or corpus.get("name", "default") != spec.corpus:
            raise BadRequest(f"corpus spec {corpus_file} must build {spec.corpus!r}, the train spec's corpus")
        corpus = {"name": spec.corpus, **corpus}
        try:
            parse_corpus_spec(corpus)  # strict types, unknown fields: refused before anything starts
        except SpecError as e:
            raise BadRequest(str(e)) from None
    else:
        if home is not None:
            check_corpus_name(spec.corpus, home)
        corpus = {"name": spec.corpus}  # the built-in text, or the corpus built in the home (idempotent)
    check_suites(list(suites), spec.name)
    if eval_max_items is not None and eval_max_items < 1:
        raise BadRequest(f"--eval-max-items must be >= 1, got {eval_max_items}")
    return TrainRequest(
        spec,
        TrainRunInput(
            spec=raw, corpus=corpus, eval_suites=list(suites), eval_seed=eval_seed, eval_max_items=eval_max_items
        ),
    )


def eval_request(
    name: str,
    suites: list[str],
    subjects: list[str],
    *,
    tag: str = "",
    seed: int = 0,
    corpus: str = "default",
    max_items: int | None = None,
    trainer: dict | None = None,
) -> EvalSuiteInput:
    """``--subject ID=CHECKPOINT`` pairs and suites into EvalSuite's input.

    ``trainer``: a spec's own trainer (app/trainers.py ``eval_trainer``), whose ``eval_command`` runs
    each suite; the suites are then its own names, not tinyllm's.
    """
    if not suites:
        raise BadRequest("give at least one --suite")
    if not subjects:
        raise BadRequest("give at least one --subject ID=CHECKPOINT")
    parsed = []
    for raw in subjects:
        sid, sep, model = raw.partition("=")
        if not sep or not model:
            raise BadRequest(f"bad --subject {raw!r}: expected ID=CHECKPOINT")
        parsed.append(EvalSubject(id=identifier(sid, "subject id"), model=model))
    name = identifier(name or parsed[0].id, "eval name")
    if tag:
        identifier(tag, "tag")
    identifier(corpus, "corpus")
    inp = EvalSuiteInput(
        name=name,
        tag=tag,
        suites=list(suites),
        subjects=parsed,
        seed=seed,
        corpus=corpus,
        max_items=max_items,
        trainer=trainer,
    )
    if trainer is not None:
        check_suite_names(list(suites))
        return inp
    check_suites(list(suites), name)
    try:
        EvalSpec.model_validate_json(workflows.marshal_spec(inp, suites[0]))
    except ValidationError as e:  # in words, naming the option (never pydantic's "1 validation error for ...")
        text = format_validation_error(e, "eval request", EvalSpec).replace("max_items:", "--max-items:")
        raise BadRequest(text) from None
    except Exception as e:
        raise BadRequest(f"invalid eval request: {str(e).splitlines()[0]}") from None
    return inp
