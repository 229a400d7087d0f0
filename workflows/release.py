"""ModelRelease: evaluate a run's candidate checkpoint with EvalSuite, check gates, publish once.

Workflow ``release/<run>/<digest12>-<request8>`` (the candidate checkpoint's digest names it, so a
release is keyed by what was trained, never by a path alone): ``ctl release`` picks the candidate (the
best by the run's selection metric, or the latest) and its digest (the checkpoint manifest's
``manifest_sha256``) before starting it. Then:

1. EvalSuite on the candidate, each suite one activity ``eval-r<digest12>-<suite>``: recorded in
   this workflow's history, so the same command after a kill reuses them and never evaluates twice;
2. every gate (``ppl/ppl<=6.5``: suite ``ppl``, figure ``ppl`` -- ``task/metric`` or a metric
   name unique in that suite) is checked in workflow code from the recorded figures; a failed gate
   is a normal outcome (``published: false`` and the reason), nothing is written;
3. activity ``publish`` writes ``releases/<run>/<version>/`` (``model/``: what one serves, the weights
   ``model.pt``, ``config.json`` and ``tokenizer.json``, never the optimizer or resume state, which stay
   with the run (``serving_files``); ``manifest.json``: spec, corpus checksum, checkpoint digest, each
   file's bytes and sha256, figures, gates, code version) under
   a temporary name, fsynced, renamed, then ``releases/<run>/CURRENT`` replaced atomically. It is
   idempotent: a version whose manifest names the same digest is the publication (a kill after the
   rename and before the activity's completion publishes nothing twice).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.layout import MANIFEST, RunHome
from engine import ActivityError, Canceled, NonRetryableError, RetryPolicy, Runtime, StepOptions, is_canceled
from tinyllm import faults
from tinyllm.fsio import atomic_write, fsync_dir, write_synced
from tinyllm.trainer_spec import trainer_of

from .evaluation import eval_suite
from .models import EvalSubject, EvalSuiteInput, EvalSuiteResult
from .plan import ACTIVITY_PUBLISH, WORKFLOW_MODEL_RELEASE, list_releases  # noqa: F401 (re-exported)


_GATE = re.compile(
    r"^(?P<suite>[A-Za-z0-9_.-]+)/(?P<figure>[A-Za-z0-9_./-]+?)\s*(?P<op><=|>=|<|>|==)\s*"
    r"(?P<value>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)$"
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gate(_Model):
    suite: str
    figure: str  # "task/metric", or a metric name unique in the suite's figures
    op: Literal["<=", ">=", "<", ">", "=="]
    value: float

    @property
    def text(self) -> str:
        return f"{self.suite}/{self.figure}{self.op}{self.value:g}"


def parse_gate(text: str) -> Gate:
    """``ppl/ppl<=6.5`` -> Gate; ValueError (one phrase) otherwise."""
    m = _GATE.match(text.strip())
    if m is None:
        raise ValueError(f"gate {text!r} is not SUITE/FIGURE OP NUMBER (e.g. 'ppl/ppl<=6.5'; OP one of <= >= < > ==)")
    return Gate(suite=m["suite"], figure=m["figure"], op=m["op"], value=float(m["value"]))


class ModelReleaseInput(_Model):
    name: str  # the run
    select: Literal["best", "latest"]
    checkpoint: str  # the candidate, relative to the home
    step: int
    digest: str  # the checkpoint manifest's manifest_sha256
    suites: list[str] = Field(min_length=1)
    gates: list[Gate] = Field(default_factory=list)
    spec: dict[str, Any]  # the run's train spec
    corpus: str = "default"
    eval_seed: int = 0
    eval_max_items: int | None = None
    # how soon a publish attempt that stopped heartbeating (its worker died) is given to another worker: on
    # Temporal the only sign of a dead worker (the embedded engine also sees its process gone); an operational
    # setting (app/runs.py OPERATIONAL), not part of the request
    heartbeat_timeout_s: float = Field(default=60.0, gt=0)


class GateOutcome(_Model):
    gate: str
    figure: float | None
    passed: bool


class PublishInput(_Model):
    release: ModelReleaseInput
    figures: dict[str, float]  # "suite/task/metric" -> value
    gates: list[GateOutcome]


class PublishResult(_Model):
    version: str
    path: str  # releases/<run>/<version>, relative to the home
    reused: bool = False  # the publication existed already (this digest was published before)


class ModelReleaseResult(_Model):
    name: str
    checkpoint: str
    step: int
    digest: str
    select: str
    figures: dict[str, float]
    gates: list[GateOutcome]
    published: bool
    reason: str = ""  # why nothing was published
    version: str | None = None
    path: str | None = None
    evals: EvalSuiteResult


def pick_candidate(result: dict, select: str) -> tuple[str, int]:
    """(checkpoint, step) of a completed TrainRun's result for ``select`` (``ctl release`` and the simulator):
    ``latest``: its last checkpoint; ``best``: the first of its ``best_checkpoints``, else early stopping's
    best. ValueError (one phrase) when the run has no selection metric."""
    if select == "latest":
        return result["checkpoint"], int(result["steps"])
    best = result.get("best_checkpoints") or []
    if best and best[0].get("checkpoint"):
        return best[0]["checkpoint"], int(best[0]["step"])
    stop = result.get("stopped_early") or {}
    if stop.get("best_checkpoint"):
        return stop["best_checkpoint"], int(stop["best_step"])
    raise ValueError(
        "has no selection metric (keep_checkpoints.best or early_stopping in its spec): use --select latest"
    )


def release_workflow_id(inp: "ModelReleaseInput") -> str:
    """``release/<run>/<digest12>-<request8>``: the candidate's digest and a hash of the request (suites,
    gates, items), so the same command resumes its own workflow and another gate is another release
    request (its evaluations of this digest are reused: ``tinyllm eval`` returns complete outputs of the
    same spec, ``evals/<suite>/<run>-r<digest12>/``, without evaluating again)."""
    request = json.dumps(
        {
            "suites": inp.suites,
            "gates": [g.model_dump() for g in inp.gates],
            "max_items": inp.eval_max_items,
            "seed": inp.eval_seed,
        },
        sort_keys=True,
    )
    return f"release/{inp.name}/{inp.digest[:12]}-{hashlib.sha256(request.encode()).hexdigest()[:8]}"


def figures_of(evals: EvalSuiteResult) -> dict[str, float]:
    """``{"ppl/heldout/ppl": 150.1, ...}``: every figure of the (one) subject, by suite."""
    out: dict[str, float] = {}
    for s in evals.suites:
        for values in s.metrics().values():
            out.update({f"{s.suite}/{k}": float(v) for k, v in values.items() if isinstance(v, (int, float))})
    return out


def check_gate(gate: Gate, figures: dict[str, float]) -> GateOutcome:
    key = f"{gate.suite}/{gate.figure}"
    found = figures.get(key)
    if found is None:  # a metric name unique in the suite: ppl/ppl -> ppl/heldout/ppl
        matches = [v for k, v in figures.items() if k.startswith(f"{gate.suite}/") and k.split("/")[-1] == gate.figure]
        found = matches[0] if len(matches) == 1 else None
    if found is None:
        return GateOutcome(gate=gate.text, figure=None, passed=False)
    ok = {
        "<=": found <= gate.value,
        ">=": found >= gate.value,
        "<": found < gate.value,
        ">": found > gate.value,
        "==": found == gate.value,
    }[gate.op]
    return GateOutcome(gate=gate.text, figure=found, passed=ok)


def publish_options(heartbeat_timeout_s: float | None = None) -> StepOptions:
    """``publish``: it heartbeats before and after each file it writes (``publish``'s ``beat``)."""
    return StepOptions(
        id="publish",
        start_to_close_timeout_s=600.0,
        heartbeat_timeout_s=heartbeat_timeout_s,
        retry=RetryPolicy(
            max_attempts=5, initial_interval_s=0.5, backoff=2.0, max_interval_s=10.0, non_retryable=("BadInput",)
        ),
    )


async def model_release(rt: Runtime, input: ModelReleaseInput) -> ModelReleaseResult:
    """The ModelRelease workflow (see the module docstring)."""
    request = EvalSuiteInput(
        name=input.name,
        tag=f"r{input.digest[:12]}",
        suites=list(input.suites),
        subjects=[EvalSubject(id=f"{input.name}-r{input.digest[:12]}", model=input.checkpoint)],
        seed=input.eval_seed,
        corpus=input.corpus,
        max_items=input.eval_max_items,
        trainer=trainer_of(input.spec),
    )
    try:
        evals = await eval_suite(rt, request)
        figures = figures_of(evals)
        outcomes = [check_gate(g, figures) for g in input.gates]
        base = dict(
            name=input.name,
            checkpoint=input.checkpoint,
            step=input.step,
            digest=input.digest,
            select=input.select,
            figures=figures,
            gates=outcomes,
            evals=evals,
        )
        failed = [o for o in outcomes if not o.passed]
        if failed:
            reason = "; ".join(
                f"gate {o.gate} failed ({'no such figure' if o.figure is None else f'{o.figure:.6g}'})" for o in failed
            )
            return ModelReleaseResult(**base, published=False, reason=reason)
        done = await rt.execute_activity(
            ACTIVITY_PUBLISH,
            PublishInput(release=input, figures=figures, gates=outcomes),
            publish_options(input.heartbeat_timeout_s),
            result_type=PublishResult,
        )
    except ActivityError as e:
        if is_canceled(e):
            raise Canceled(f"{rt.workflow_id} canceled during {e.activity_id}") from e
        raise
    done = PublishResult.model_validate(done)
    return ModelReleaseResult(**base, published=True, version=done.version, path=done.path)


# --- the publish activity (plain files; no torch) ---------------------------------------------


def _code_version() -> str:
    try:
        return version("durable-train")
    except PackageNotFoundError:
        return "unknown"


def publish(
    home: Path,
    inp: PublishInput,
    *,
    point: Callable[[str, int], None] | None = None,
    beat: Callable[[], None] | None = None,
) -> PublishResult:
    """Publish ``inp`` once under ``releases/<run>/`` (idempotent by checkpoint digest).

    ``point(name, version_number)``: called at ``release.after_copy`` and ``release.after_rename``; default
    tinyllm's test fault points (armed by ``TINYLLM_FAULT``); the simulator passes its kill positions.
    ``beat()``: called before and after each file written (the activity's heartbeat)."""
    beat = beat or (lambda: None)
    beat()
    if point is None:
        try:
            faults.arm_from_env()  # tests only: release.after_copy / after_rename (tinyllm/faults.py)
        except faults.FaultError as e:
            raise NonRetryableError(str(e)) from None
        point = faults.point
    r = inp.release
    root = RunHome(home).release_dir(r.name)
    root.mkdir(parents=True, exist_ok=True)
    for p in root.glob(".tmp-*"):  # a publication killed before its rename
        shutil.rmtree(p, ignore_errors=True)
    existing = {x["version"]: x for x in list_releases(home, r.name)}
    same = [v for v, x in existing.items() if x["digest"] == r.digest]
    if same:
        version_name, reused = same[0], True
    else:
        version_name = f"v{len(existing) + 1:04d}"
        while (root / version_name).exists():
            version_name = f"v{int(version_name[1:]) + 1:04d}"
        reused = False
        src = Path(home) / r.checkpoint
        serving = serving_files(src)  # verified before anything is written
        tmp = root / f".tmp-{version_name}-{os.getpid()}"
        (tmp / "model").mkdir(parents=True)
        files = {}
        for name, data in serving:
            write_synced(tmp / "model" / name, data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            beat()
        fsync_dir(tmp / "model")
        meta = _corpus_meta(Path(home), r.corpus)
        manifest = {
            "run": r.name,
            "version": version_name,
            "checkpoint": r.checkpoint,
            "step": r.step,
            "checkpoint_digest": r.digest,
            "select": r.select,
            "spec": r.spec,
            "corpus": {"name": r.corpus, "checksum": meta.get("checksum")},
            "files": {f"model/{k}": v for k, v in files.items()},
            "figures": inp.figures,
            "gates": [g.model_dump() for g in inp.gates],
            "code_version": _code_version(),
        }
        write_synced(tmp / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        fsync_dir(tmp)
        point("release.after_copy", int(version_name[1:]))  # tests only (tinyllm/faults.py; the simulator)
        os.rename(tmp, root / version_name)
        fsync_dir(root)
        point("release.after_rename", int(version_name[1:]))
    atomic_write(root / "CURRENT", (version_name + "\n").encode())
    return PublishResult(version=version_name, path=f"releases/{r.name}/{version_name}", reused=reused)


TRAINING_ONLY = frozenset({"optimizer.pt", "training_state.pt", "scheduler.pt", "scaler.pt", "data.pt", MANIFEST})
"""Checkpoint files a release never holds, when the checkpoint has no ``model.pt`` to pick (a foreign layout):
the resume state stays with the run."""


def serving_files(src: Path) -> list[tuple[str, bytes]]:
    """What a release of checkpoint ``src`` holds under ``model/``: what one serves, never the optimizer state.

    A tinyllm-format checkpoint (``model.pt`` in its ``manifest.json``): ``model.pt`` (verified against the
    manifest's sha256: a damaged candidate is never published), ``config.json`` (the model config of its
    ``meta.trajectory.model``) and ``tokenizer.json`` (its ``meta.tokenizer``; absent: none was pinned, i.e.
    byte-level), when the manifest has them. Any other layout: its files but ``TRAINING_ONLY``.
    NonRetryableError (BadInput) when the checkpoint cannot be read or is damaged."""
    try:
        manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        manifest = None
    except (OSError, ValueError) as e:
        raise NonRetryableError(f"release candidate {src}: unreadable manifest.json ({e})", type="BadInput") from None
    entries = manifest.get("files") if isinstance(manifest, dict) else None
    if not (isinstance(entries, dict) and isinstance(entries.get("model.pt"), dict)):
        return [(f.name, f.read_bytes()) for f in sorted(src.iterdir()) if f.is_file() and f.name not in TRAINING_ONLY]
    data = (src / "model.pt").read_bytes()
    if hashlib.sha256(data).hexdigest() != entries["model.pt"].get("sha256"):
        raise NonRetryableError(
            f"release candidate {src}: model.pt fails its sha256 checksum (corrupt)", type="BadInput"
        )
    out = [("model.pt", data)]
    meta = m if isinstance(m := manifest.get("meta"), dict) else {}
    trajectory = t if isinstance(t := meta.get("trajectory"), dict) else {}
    for name, value in (("config.json", trajectory.get("model")), ("tokenizer.json", meta.get("tokenizer"))):
        if value is not None:
            out.append((name, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()))
    return out


def _corpus_meta(home: Path, corpus: str) -> dict:
    try:
        return json.loads((RunHome(home).corpus(corpus) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def publish_activity(
    home: str | Path,
    *,
    point: Callable[[str, int], None] | None = None,
    publish_fn: Callable[..., PublishResult] | None = None,
):
    """``publish`` as an activity function ``fn(ctx, input)`` of one home (``point``: see ``publish``;
    ``publish_fn``: the simulator's mutants replace ``publish``)."""

    def run(ctx: Any, input: Any) -> PublishResult:
        inp = PublishInput.model_validate(input)
        src = Path(home) / inp.release.checkpoint
        if not src.is_dir():
            raise NonRetryableError(f"release candidate {inp.release.checkpoint} is gone", type="BadInput")
        return (publish_fn or publish)(
            Path(home), inp, point=point, beat=lambda: ctx.heartbeat({"publishing": inp.release.digest[:12]})
        )

    return run
