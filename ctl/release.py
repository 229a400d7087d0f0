"""``ctl release train/NAME --suite S [--gate 'ppl/ppl<=6.5'] [--select best|latest]`` and ``ctl release --list``.

Picks the finished run's candidate checkpoint (``best``: the first of the run's ``best_checkpoints``,
else early stopping's best; ``latest``: its last checkpoint) and its digest, then runs the
ModelRelease workflow ``release/<run>/<digest12>-<request8>`` (workflows/release.py) here to its end: each
suite evaluated once, the gates checked, one publication under ``releases/<run>/<version>/``.
The same command after a kill finishes the same release (no second evaluation or publication).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

import workflows

from . import app
from .cli_common import edge, home_option, json_option, print_json
from .errors import EXIT_FAILED, BadRequest
from .interrupt import Interrupt


def candidate(result: dict, select: str, workflow_id: str) -> tuple[str, int]:
    """(checkpoint, step) of a TrainRun result for ``select`` (workflows.pick_candidate); BadRequest when none."""
    try:
        return workflows.pick_candidate(result, select)
    except ValueError as e:
        raise BadRequest(f"{workflow_id} {e}") from None


def checkpoint_digest(home: Path, checkpoint: str) -> str:
    try:
        manifest = json.loads((home / checkpoint / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BadRequest(f"checkpoint {checkpoint} is missing or has no readable manifest.json") from None
    digest = manifest.get("manifest_sha256") if isinstance(manifest, dict) else None
    if not isinstance(digest, str) or len(digest) < 12:
        raise BadRequest(f"checkpoint {checkpoint}: its manifest has no digest (manifest_sha256)")
    return digest


def _list(home: Path, as_json: bool) -> None:
    rows = workflows.list_releases(home)
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no releases")
    for r in rows:
        click.echo(f"{r['path']}{'  CURRENT' if r['current'] else ''}  {r['checkpoint']}  digest {str(r['digest'])[:12]}  "
                   + " ".join(f"{k}={v:.6g}" for k, v in sorted(r["figures"].items())))


@click.command()
@click.argument("workflow_id", metavar="train/NAME", required=False)
@click.option("--suite", "suites", multiple=True, help="Evaluate the candidate with this suite (repeatable): ppl, zoo.")
@click.option("--gate", "gates", multiple=True, metavar="SUITE/FIGURE<=N",
              help="Publish only when this holds, e.g. 'ppl/ppl<=6.5' (repeatable; <= >= < > ==).")
@click.option("--select", type=click.Choice(["best", "latest"]), default="best", show_default=True,
              help="The candidate: the best by the run's selection metric, or the latest checkpoint.")
@click.option("--list", "list_only", is_flag=True, help="List the published releases and exit.")
@click.option("--eval-max-items", type=click.IntRange(min=1), default=None, help="At most this many items per suite.")
@click.option("--heartbeat-timeout", "heartbeat_timeout_s", type=click.FloatRange(min=1), default=60.0,
              show_default=True, metavar="SECONDS",
              help="A publication whose worker died is given to another worker after this long without a "
                   "heartbeat (on Temporal the only sign of a dead worker); the release's first value applies.")
@json_option
@home_option
@edge
def release(workflow_id: str | None, suites: tuple[str, ...], gates: tuple[str, ...], select: str, list_only: bool,
            eval_max_items: int | None, heartbeat_timeout_s: float, as_json: bool, home: str | None) -> None:
    """Release a finished run's checkpoint: evaluate it, check gates, publish it once.

    Publishes releases/<run>/<version>/ (model/: the weights model.pt, config.json, tokenizer.json,
    never the optimizer state, which stays with the run; manifest.json: digests and gates) and moves
    releases/<run>/CURRENT.
    A failed gate publishes nothing (exit 1, the reason in one line).

    \b
    Exit codes: 0 published, 1 a gate failed (or the release failed), 2 bad input, 130 interrupted
    (Ctrl-C, SIGINT, SIGTERM: the evaluation is killed; the same command finishes the release).
    \b
    Example:
      ctl release train/tiny --suite ppl --gate 'ppl/ppl<=6.5' --select best
      ctl release --list
    """
    home_dir = app.resolve_home(home)
    if list_only:
        _list(home_dir, as_json)
        return
    if not workflow_id:
        raise BadRequest("give the run to release (train/NAME), or --list")
    if not suites:
        raise BadRequest("give at least one --suite to evaluate the candidate with")
    try:
        parsed = [workflows.parse_gate(g) for g in gates]
    except ValueError as e:
        raise BadRequest(str(e)) from None
    unknown = sorted({g.suite for g in parsed} - set(suites))
    if unknown:
        raise BadRequest(f"gate on suite {unknown[0]!r}, which is not evaluated (add --suite {unknown[0]})")
    interrupt = Interrupt("the release", keeps="its finished evaluations").install()  # one line, exit 130
    engine = app.open_engine(home_dir, create=False)
    interrupt.engine = engine
    try:
        train_id = app.resolve_id(engine, workflow_id)
        st = engine.status(train_id)
        if st.workflow != "TrainRun":
            raise BadRequest(f"{train_id} is a {st.workflow}, not a training run")
        if st.state != "completed":
            raise BadRequest(f"{train_id} is {st.state}: release a completed run (run the same `ctl train` first)")
        spec = app.recorded_input(engine, train_id).get("spec") or {}
        ckpt, step = candidate(st.result or {}, select, train_id)
        digest = checkpoint_digest(home_dir, ckpt)
        name = str(st.result["name"])
        app._check_suites(list(suites), name)
        inp = workflows.ModelReleaseInput(name=name, select=select, checkpoint=ckpt, step=step, digest=digest,
                                          suites=list(suites), gates=parsed, spec=spec,
                                          corpus=str(spec.get("corpus") or "default"), eval_max_items=eval_max_items,
                                          heartbeat_timeout_s=heartbeat_timeout_s)
        started = app.start_run(engine, workflows.WORKFLOW_MODEL_RELEASE,
                                workflows.release_workflow_id(inp), inp)
        interrupt.workflow_id = started.workflow_id
        out = engine.status(started.workflow_id)
        if out.state == "running":
            logging.getLogger("engine").addHandler(logging.NullHandler())
            out = engine.run_until_complete(started.workflow_id)
    finally:
        engine.close()
    _finish(out, as_json)


def _finish(st: Any, as_json: bool) -> None:
    result = st.result if st.state == "completed" else None
    if as_json:
        print_json(app.outcome_json(st))
    elif result and result.get("published"):
        click.echo(f"released {result['name']} {result['version']}: {result['path']} "
                   f"({result['checkpoint']}, digest {result['digest'][:12]})")
        click.echo("  " + " ".join(f"{k}={v:.6g}" for k, v in sorted(result["figures"].items())))
    elif result:
        click.echo(f"ctl: {st.workflow_id}: not published: {result['reason']}", err=True)
    else:
        click.echo(f"ctl: {st.workflow_id} {st.state}: {app.error_line(st.error)}", err=True)
    if st.state == "completed":
        raise SystemExit(0 if result.get("published") else EXIT_FAILED)
    raise SystemExit(app.exit_code(st.state))
