"""The simulated ModelRelease: the real workflow (workflows/release.py) after the simulated TrainRun.

A scenario with ``release`` (``--release``) runs, once its TrainRun has completed, one ModelRelease
request per entry of ``release`` (``pass``: a gate the candidate passes, ``fail``: one it fails), in
order, in the same worker lives as the TrainRun: a kill anywhere in them restarts the worker, which
attaches to the completed TrainRun and to each release workflow and goes on. What is fake here is
only what ``ctl release`` and ``tinyllm eval`` do outside the workflow code:

- **picking the candidate** (``requests``): ``workflows.pick_candidate`` on the TrainRun's result, as
  ``ctl release`` does; its digest is the fake checkpoint's (sha256 of its ``state.json``: the fake
  trainer writes no manifest), so the release is keyed by what was trained;
- **evaluating** it: the fake ``eval`` activity (simulator/fakes.py), which in a release workflow
  records the evaluated checkpoint's digest and reuses complete outputs of the same spec, as
  ``tinyllm eval`` does (``eval-reused`` in the ledger: a kill between the outputs and the activity's
  completion evaluates nothing twice);
- **publishing**: the real ``workflows.release.publish`` (its once-guard, its temporary folder, rename
  and atomic ``CURRENT``) with a kill position at each of its fault points (``release.after_copy``,
  ``release.after_rename``); the ledger records each publication (``published``) where it happens.

``simulator/release_checks.py`` is the oracle (exactly one publication per digest, no second evaluation of a
suite for one checkpoint's digest, ``CURRENT`` naming a complete release of the candidate, a failed
gate publishing nothing and recorded as such, the figures the candidate's) and compares with the
uninterrupted run's releases.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from contracts.layout import RunHome
import workflows
from workflows.release import Gate, ModelReleaseInput, PublishResult, publish_activity


GATES = ("pass", "fail")


def gate_for(suite: str, outcome: str) -> Gate:
    """A gate the fake figures of ``suite`` always pass (``pass``) or always fail (``fail``)."""
    if suite == "ppl":  # exp(loss) of a fake loss in (0, 10): far below 1e9, never below 1
        return workflows.parse_gate("ppl/ppl<=1e9" if outcome == "pass" else "ppl/ppl<=1")
    return workflows.parse_gate(f"{suite}/acc>=0" if outcome == "pass" else f"{suite}/acc>=2")  # acc in (0, 1)


def release_suites(scn: Any) -> list[str]:
    return list(scn.suites) or ["ppl"]


def requests(scn: Any, home: Path, train_result: dict) -> list[ModelReleaseInput]:
    """The ModelRelease inputs ``ctl release`` would make, one per entry of ``scn.release``."""
    ckpt, step = workflows.pick_candidate(train_result, scn.select)
    digest = checkpoint_digest(home, ckpt)
    suites = release_suites(scn)
    return [
        ModelReleaseInput(
            name=scn.name,
            select=scn.select,
            checkpoint=ckpt,
            step=step,
            digest=digest,
            suites=suites,
            gates=[gate_for(suites[0], outcome)],
            spec=scn.spec(),
            eval_seed=scn.seed,
        )
        for outcome in scn.release
    ]


def run_releases(eng: Any, scn: Any, home: Path, train_result: dict) -> list[dict]:
    """Start (or attach to) each release request in turn and run it to its end on ``eng``."""
    out = []
    for inp in requests(scn, home, train_result):
        wid = workflows.release_workflow_id(inp)
        eng.start(workflows.WORKFLOW_MODEL_RELEASE, wid, inp.model_dump(mode="json"))
        st = eng.run_until_complete(wid)
        out.append(
            {
                "workflow_id": wid,
                "state": st.state,
                "result": st.result,
                "error": st.error,
                "commands": [e.attrs["activity_id"] for e in eng.history(wid) if e.type == "activity_scheduled"],
            }
        )
    return out


# --- the fake activities' part ------------------------------------------------------------------

COMPLETE = "complete.json"  # the fake evaluator's marker of a release's complete outputs (tinyllm/evals.py has its own)


def checkpoint_digest(home: Path, checkpoint: str) -> str:
    """The fake checkpoint's digest: sha256 of its state.json (ctl release reads a real one's manifest)."""
    with open(os.path.join(home, checkpoint, "state.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def reused_outputs(home: Path, suite: str, run: str, spec: dict) -> dict | None:
    """The outputs of an earlier complete evaluation of the same spec, as the activity returns them."""
    out = str(RunHome(home).eval_dir(suite, run))
    try:
        with open(os.path.join(out, COMPLETE)) as f:
            if json.load(f) != spec:
                return None
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    rel = f"evals/{suite}/{run}"
    return {
        "suite": suite,
        "run": run,
        "results": f"{rel}/results.jsonl",
        "summary_path": f"{rel}/summary.json",
        "summary": summary,
    }


def publish_fake(fakes: Any, publish_fn: Callable[..., PublishResult] | None = None) -> Callable:
    """The ``publish`` activity: the real one (or a mutant's ``publish_fn``), a kill position at each
    of its fault points, every file it leaves under ``releases/`` in the fakes' files log."""
    home = fakes.home

    def log_releases() -> None:
        root = RunHome(home).releases
        for path, _dirs, files in os.walk(root):
            for name in sorted(files):
                full = os.path.join(path, name)
                with open(full, "rb") as f:
                    fakes._wrote(os.path.relpath(full, home), f.read())

    def run(ctx: Any, input: Any) -> Any:
        wf, aid = ctx.workflow_id, ctx.activity_id
        digest = input["release"]["digest"] if isinstance(input, dict) else input.release.digest

        def point(name: str, version: int) -> None:
            log_releases()
            if name == "release.after_rename":  # a new version is in place: a publication, whatever comes next
                fakes.ledger.record("published", wf=wf, activity=aid, digest=digest, version=version)
            fakes.hook("publish", f"{aid}:{name.split('.')[-1]}:v{version:04d}")

        fakes.ledger.record("publish-start", wf=wf, activity=aid, attempt=ctx.attempt, digest=digest)
        fakes.hook("publish", f"{aid}:start")
        res = publish_activity(home, point=point, publish_fn=publish_fn)(ctx, input)
        log_releases()
        fakes.writes += 1
        fakes.ledger.record("publish-done", wf=wf, activity=aid, digest=digest, version=res.version, reused=res.reused)
        return res

    return run
