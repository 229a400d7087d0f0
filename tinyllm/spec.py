"""Typed specs of tinyllm's commands: the train spec, the corpus spec, the eval spec, eval results.

Importable without torch: workflows and ctl validate specs with these models.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from .names import (
    IDENTIFIER_PATTERN,
    DuplicateKeyError,
    refuse_duplicate_keys,
)  # shared with the torch-only helper (tinyllm.durable)
from .objective_config import DPOConfig, RefConfig, RLConfig, check_train_spec, effective_validation_reward
from .retention import KeepCheckpoints
from .selection import EarlyStopping, check_metric, selection_metrics
from .errors import SpecError
from .validation_config import ValidationConfig, declared_schema

Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=128)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(_Strict):
    """A small decoder-only transformer (nanoGPT shape)."""

    # None: the corpus's vocabulary (byte: 256; char: its characters), filled in by the trainer (a
    # model built without a corpus is byte-level); an explicit value at least that (wider: unused ids)
    vocab_size: int | None = Field(None, ge=2, le=1 << 20)
    block_size: int = Field(64, ge=2, le=1 << 16)  # context length in tokens
    n_layer: int = Field(2, ge=1, le=1024)  # transformer blocks
    n_head: int = Field(2, ge=1, le=1024)  # attention heads per block
    n_embd: int = Field(64, ge=1, le=1 << 16)  # width; a multiple of n_head
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # >0 makes the RNG state part of exact resume
    bias: bool = False  # biases in Linear and LayerNorm

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        return self


class DistributedConfig(_Strict):
    """Data-parallel training on torch.distributed, launched by ``torchrun`` (tinyllm/distributed/trainer.py).

    Each of ``world_size`` ranks reads a disjoint shard of every global batch (the single-process
    run's ``batch_size`` rows, split by rank); gradients are averaged by all-reduce; rank 0 writes
    checkpoints, progress lines and metrics. Resume is bitwise at the same ``world_size`` only.
    """

    world_size: int = Field(ge=1, le=1024)  # processes (ranks) on this host; divides batch_size
    backend: Literal["gloo", "nccl"] = "gloo"  # gloo: CPU; nccl is refused for now (tinyllm trains on CPU only)


class MlflowSinkConfig(_Strict):
    """``sinks.mlflow`` of a train spec (tinyllm/sinks/mlflow_sink.py; the ``[mlflow]`` extra)."""

    tracking_uri: str | None = Field(
        None, min_length=1
    )  # e.g. sqlite:///mlruns.db, http://127.0.0.1:5000; None: $MLFLOW_TRACKING_URI
    experiment: str | None = Field(None, min_length=1)  # None: the run's name
    flush_timeout_s: float = Field(
        60.0, gt=0.0
    )  # at an attempt's end, wait this long for queued frames (the rest: next attempt)


class SinksConfig(_Strict):
    """Metric sinks beyond metrics.jsonl and TensorBoard; operational (not part of the trajectory)."""

    mlflow: MlflowSinkConfig | None = None


class TrainSpec(_Strict):
    """What ``tinyllm train --spec`` trains; TrainRun's segments change only ``steps``."""

    name: Identifier  # names runs/<name>/ and workflow train/<name>
    steps: int = Field(ge=1, le=1 << 40)  # optimizer steps in all
    corpus: Identifier = "default"  # trains on corpora/<corpus>/ (built by tinyllm corpus)
    seed: int = Field(0, ge=-(1 << 63), lt=1 << 64)  # model init, data order, dropout (the range torch takes)
    eval_every: int = Field(0, ge=0)  # TrainRun: evaluate every this many steps (0: only at the end)
    eval_interval_seconds: float = Field(0.0, ge=0.0)  # TrainRun: durable wait after each evaluation but the last
    checkpoint_every: int = Field(100, ge=1)  # also one at the end of every invocation
    batch_size: int = Field(16, ge=1, le=1 << 20)
    grad_accum_steps: int = Field(1, ge=1, le=1 << 20)  # micro-batches per optimizer step
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
    threads: int = Field(
        2, ge=1, le=1024
    )  # the most torch threads training uses: fewer when the CPUs are busy, TINYLLM_THREADS=N pins (same bits)
    log_every: int = Field(10, ge=1)  # console progress line every this many steps
    model: ModelConfig = ModelConfig()
    validation: ValidationConfig | None = None  # held-out validation during training (opt-in)
    keep_checkpoints: KeepCheckpoints | None = None  # prune older checkpoints (tinyllm/retention.py); None: keep all
    early_stopping: EarlyStopping | None = None  # stop when a val/* figure stops improving (tinyllm/selection.py)
    sinks: SinksConfig | None = None  # extra metric sinks: {"mlflow": {...}} (tinyllm/sinks/mlflow_sink.py)
    # post-training (tinyllm/objectives): lm = pre-training; dpo, grpo, opd start from init_from
    objective: Literal["lm", "dpo", "grpo", "opd"] = "lm"
    init_from: str | None = Field(None, min_length=1)  # <run>@<step> or a checkpoint dir: weights of step 0
    ref: RefConfig | None = None  # dpo: build_ref (the frozen reference, from init_from)
    teacher: str | None = Field(None, min_length=1)  # opd: the frozen teacher checkpoint (<run>@<step> or a dir)
    dpo: DPOConfig | None = None
    rl: RLConfig | None = None  # grpo and opd: prompts, rewards, rollout sampling, n_mini
    distributed: DistributedConfig | None = (
        None  # data-parallel on torchrun (tinyllm/distributed/trainer.py); None: one process
    )

    @model_validator(mode="after")
    def _objective_fields(self) -> "TrainSpec":
        check_train_spec(self)
        return self

    @model_validator(mode="after")
    def _selection_metrics(self) -> "TrainSpec":
        v = self.validation
        required, optional = declared_schema(v, effective_validation_reward(self)) if v is not None else ({}, {})
        valid = selection_metrics({**required, **optional}) if v is not None and v.enabled else []
        if self.keep_checkpoints is not None and self.keep_checkpoints.best is not None:
            check_metric("keep_checkpoints.best", self.keep_checkpoints.best.metric, valid)
        if self.early_stopping is not None:
            check_metric("early_stopping", self.early_stopping.metric, valid)
        return self

    @model_validator(mode="after")
    def _distributed_fields(self) -> "TrainSpec":
        d = self.distributed
        if d is None:
            return self
        if self.objective != "lm":
            raise ValueError(f"distributed: objective {self.objective!r} is not supported distributed (only lm)")
        if self.early_stopping is not None or (self.keep_checkpoints is not None and self.keep_checkpoints.best):
            raise ValueError(
                "distributed: early_stopping and keep_checkpoints.best are not supported in a distributed "
                "run yet (every rank would have to take the same stop decision)"
            )
        if self.validation is not None and self.validation.enabled and self.validation.objective != "lm":
            raise ValueError(
                f"distributed: held-out validation objective {self.validation.objective!r} is not "
                "supported in a distributed run (only lm)"
            )
        if self.batch_size % d.world_size:
            raise ValueError(
                f"distributed: batch_size {self.batch_size} is not a multiple of world_size "
                f"{d.world_size} (each rank reads an equal shard of every batch)"
            )
        return self


class CorpusSpec(_Strict):
    """What ``tinyllm corpus --spec`` builds into ``corpora/<name>/``.

    Without ``sources`` the built-in text is used (shipped and generated in the package, offline).
    The held-out part is explicit: the files of ``heldout``, or else ``heldout_fraction`` of the
    source text (its tail, or every k-th block: ``heldout_split``); it goes to ``heldout.bin`` and training (which reads only ``tokens.bin``)
    never sees it.
    """

    name: Identifier = "default"
    sources: list[str] = []  # text files or globs, relative to the home or absolute; [] = built-in
    heldout: list[str] = []  # held-out files or globs (disjoint from sources); [] = the tail range
    heldout_fraction: float = Field(0.1, gt=0.0, lt=1.0)  # share held out when heldout == []
    # when heldout == []: "tail" holds out the text's last share (nanoGPT's split); "interleaved" every
    # k-th block of HELDOUT_BLOCK units (k = round(1 / heldout_fraction)), so a text whose parts differ
    # (the built-in one: classic prose, then generated simple English) is held out from all of them
    heldout_split: Literal["tail", "interleaved"] = "tail"
    # byte: any text, vocab 256; char: UTF-8 text, vocab = its sorted distinct characters (nanoGPT's
    # shakespeare_char), computed here over sources and held-out text and stored in meta.json
    tokenizer: Literal["byte", "char"] = "byte"


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
    threads: int = Field(1, ge=1, le=1024)  # torch threads; evals run many tiny forwards, where 1 is fastest

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


def lr_at(step: int, spec: TrainSpec) -> float:
    """Learning rate of the optimizer step with 0-based index ``step``; independent of ``spec.steps``."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    if spec.lr_decay_steps is None:
        return spec.lr
    if step >= spec.lr_decay_steps:
        return spec.min_lr
    ratio = (step - spec.warmup_steps) / max(1, spec.lr_decay_steps - spec.warmup_steps)
    return spec.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (spec.lr - spec.min_lr)


def format_validation_error(err: ValidationError, what: str, model: type[BaseModel] | None = None) -> str:
    """One line listing every problem of a pydantic ValidationError, unknown fields first.

    An unknown field names the closest known one (``stpes: unknown field (did you mean steps?)``);
    a wrong type says what JSON value the schema wants (strict types: ``"300"`` or ``true`` is
    not an integer).
    """
    problems = [_problem(e, model) for e in err.errors()]
    problems.sort(key=lambda p: not p[0])  # unknown fields first, otherwise in the schema's order
    return f"invalid {what}: " + "; ".join(text for _, text in problems)


_TYPE_WORDS = {
    "int_type": "must be an integer (a JSON number)",
    "int_from_float": "must be an integer (a JSON number)",
    "int_parsing": "must be an integer (a JSON number)",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "finite_number": "must be a finite number",
}


def _problem(e: ErrorDetails, model: type[BaseModel] | None) -> tuple[bool, str]:
    """(is an unknown field, one phrase) for one pydantic error."""
    loc = [p for p in e.get("loc", ()) if not (isinstance(p, str) and p.startswith(("function-", "lax-", "strict-")))]
    where = ".".join(str(p) for p in loc) or "(top level)"
    kind = e.get("type", "")
    if kind == "extra_forbidden":
        known = _known_fields(model, loc[:-1]) if model is not None else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6) if loc else []
        hint = f" (did you mean {close[0]}?)" if close else (f" (known: {', '.join(known)})" if known else "")
        return True, f"{where}: unknown field{hint}"
    if kind == "missing":
        return False, f"{where}: required field missing"
    if kind in _TYPE_WORDS:
        return False, f"{where}: {_TYPE_WORDS[kind]}, got {_shown(e.get('input'))}"
    if kind == "string_pattern_mismatch":
        allowed = ". _ -" if (e.get("ctx") or {}).get("pattern") == IDENTIFIER_PATTERN else ". _ - @ :"
        return False, (
            f"{where}: {_shown(e.get('input'))} is not a valid name (use letters, digits and {allowed}, "
            "starting with a letter or digit)"
        )
    words = _value_words(kind, e.get("ctx") or {})
    if words:
        return False, f"{where}: {words}, got {_shown(e.get('input'))}"
    msg = str(e.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):  # a validator's own sentence: without pydantic's label
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
            return False, msg if not loc else f"{where}: {msg}"
    return False, f"{where}: {msg}"


_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "greater than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}


def _value_words(kind: str, ctx: dict) -> str | None:
    """Pydantic's value errors in the project's words (its own wording and raw patterns never reach a user)."""
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"must be {words} {ctx.get(key)}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in ("string_too_long", "too_long"):
        return f"is too long (at most {ctx.get('max_length')})"
    if kind in ("string_too_short", "too_short"):
        return f"is too short (at least {ctx.get('min_length')})"
    return None


def _shown(value: object) -> str:
    text = (
        json.dumps(value, ensure_ascii=True, default=str) if not isinstance(value, BaseModel) else type(value).__name__
    )
    return text if len(text) <= 40 else text[:37] + "..."


def _known_fields(model: type[BaseModel], loc: list) -> list[str]:
    """The field names of the (nested) model at ``loc``, or [] where it is not a model."""
    current: object = model
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: same item model
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_in(fields[part].annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}) or [])


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``M``, ``M | None``, ``list[M]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def load_json_file(path: str | Path, what: str) -> object:
    """Read a JSON file, turning every failure into one ``SpecError`` line."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{what} file not found: {p}") from None
    except IsADirectoryError:
        raise SpecError(f"{what} {p} is a directory, not a file") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} file {p}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} file {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=refuse_duplicate_keys)
    except DuplicateKeyError as e:
        raise SpecError(f"{what} file {p}: {e} (strict JSON: each key once)") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} file {p} is not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        raise SpecError(f"{what} file {p} is not valid JSON: {str(e) or 'nested too deeply'}") from None


_M = TypeVar("_M", bound=BaseModel)


def _parse(model: type[_M], data: object, what: str) -> _M:
    """Validate ``data`` with strict types: a JSON number where the schema says integer, true/false
    where it says boolean (``"steps": "300"`` and ``"steps": true`` are refused, not coerced)."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = None  # not plain JSON data (e.g. a model instance): validate it as Python
    try:
        if text is None:
            return model.model_validate(data, strict=True)
        return model.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, what, model)) from None


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
