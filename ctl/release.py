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
import sys
from pathlib import Path
from typing import Any

import click

from contracts.layout import MANIFEST
import workflows

import app
from . import presence
from .cli_common import edge, home_option, json_option, preempted_line, print_json, stop_options
from app.errors import EXIT_FAILED, EXIT_PREEMPTED, BadRequest
from .interrupt import Interrupt


def candidate(result: dict, select: str, workflow_id: str) -> tuple[str, int]:
    """(checkpoint, step) of a TrainRun result for ``select`` (workflows.pick_candidate); BadRequest when none."""
    try:
        return workflows.pick_candidate(result, select)
    except ValueError as e:
        raise BadRequest(f"{workflow_id} {e}") from None


def checkpoint_digest(home: Path, checkpoint: str) -> str:
    try:
        manifest = json.loads((home / checkpoint / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BadRequest(f"checkpoint {checkpoint} is missing or has no readable manifest.json") from None
    digest = manifest.get("manifest_sha256") if isinstance(manifest, dict) else None
    if not isinstance(digest, str) or len(digest) < 12:
        raise BadRequest(f"checkpoint {checkpoint}: its manifest has no digest (manifest_sha256)")
    return digest


def check_gate_figures(gates: list[Any]) -> None:
    """BadRequest (nothing started) for a gate on a figure its suite does not produce, or one that names
    several (``zoo/acc``: a metric of every multiple-choice task), naming the figures the suite has."""
    from tinyllm.eval_figures import resolve_figure, suite_figures  # importlib.resources: only a release's gates

    for g in gates:
        figures = suite_figures(g.suite)
        if figures is None or resolve_figure(g.figure, figures) is not None:
            continue
        metrics = sorted({f.split("/")[-1] for f in figures})
        unique = [m for m in metrics if sum(f.split("/")[-1] == m for f in figures) == 1]
        several = (
            f" ({g.figure!r} is a figure of several tasks: name one as TASK/{g.figure})" if g.figure in metrics else ""
        )
        raise BadRequest(
            f"gate {g.text}: suite {g.suite} has no figure {g.figure!r}{several}; its figures: "
            f"{', '.join(figures)}" + (f" (or just {', '.join(unique)})" if unique else "")
        )


def _list(home: Path, as_json: bool) -> None:
    rows = workflows.list_releases(home)
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no releases")
    for r in rows:
        click.echo(
            f"{r['path']}{'  CURRENT' if r['current'] else ''}  {r['checkpoint']}  digest {str(r['digest'])[:12]}  "
            + " ".join(f"{k}={v:.6g}" for k, v in sorted(r["figures"].items()))
        )


@click.command()
@click.argument("workflow_id", metavar="train/NAME", required=False)
@click.option("--suite", "suites", multiple=True, help="Evaluate the candidate with this suite (repeatable): ppl, zoo.")
@click.option(
    "--gate",
    "gates",
    multiple=True,
    metavar="SUITE/FIGURE<=N",
    help="Publish only when this holds, e.g. 'ppl/ppl<=6.5' (repeatable; <= >= < > ==).",
)
@click.option(
    "--select",
    type=click.Choice(["best", "latest"]),
    default="best",
    show_default=True,
    help="The candidate: the best by the run's selection metric, or the latest checkpoint.",
)
@click.option("--list", "list_only", is_flag=True, help="List the published releases and exit.")
@click.option("--eval-max-items", type=click.IntRange(min=1), default=None, help="At most this many items per suite.")
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="A publication whose worker died is given to another worker after this long without a "
    "heartbeat (on Temporal the only sign of a dead worker); the release's first value applies.",
)
@stop_options
@json_option
@home_option
@edge
def release(
    workflow_id: str | None,
    suites: tuple[str, ...],
    gates: tuple[str, ...],
    select: str,
    list_only: bool,
    eval_max_items: int | None,
    heartbeat_timeout_s: float,
    stop_grace_s: float,
    stop_signal: Any,
    as_json: bool,
    home: str | None,
) -> None:
    """Release a finished run's checkpoint: evaluate it, check gates, publish it once.

    Publishes releases/<run>/<version>/ (model/: the weights model.pt, config.json, tokenizer.json,
    never the optimizer state, which stays with the run; manifest.json: digests and gates) and moves
    releases/<run>/CURRENT.
    A failed gate publishes nothing (exit 1, the reason in one line; `ctl status` and `ctl list`
    show it later). A gate on a figure its suite does not produce (ppl's: heldout/loss,
    heldout/ppl, heldout/bpb, or just loss, ppl, bpb) is bad input before anything starts.

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
    interrupt = Interrupt(
        "the release", keeps="its finished evaluations", grace_s=stop_grace_s, stop_signal=stop_signal
    ).install()  # a polite stop: the evaluation in flight stops, 143
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
        app.check_suites(list(suites), name)
        from tinyllm.trainer_spec import has_trainer  # the spec's pydantic models: a release builds its request

        if not has_trainer(spec):  # tinyllm's suites: their figures are known (a trainer's own suites: not)
            check_gate_figures(parsed)
        inp = workflows.ModelReleaseInput(
            name=name,
            select=select,
            checkpoint=ckpt,
            step=step,
            digest=digest,
            suites=list(suites),
            gates=parsed,
            spec=spec,
            corpus=str(spec.get("corpus") or "default"),
            eval_max_items=eval_max_items,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )
        started = app.start_run(engine, workflows.WORKFLOW_MODEL_RELEASE, workflows.release_workflow_id(inp), inp)
        interrupt.workflow_id = started.workflow_id
        out = engine.status(started.workflow_id)
        if out.state == "running":
            logging.getLogger("engine").addHandler(logging.NullHandler())
            here = presence.announce(home_dir, engine, started.workflow_id)  # ctl status: a live runner
            try:
                out = engine.run_until_complete(started.workflow_id)
            finally:
                presence.withdraw(here)
        if out.state == "running" and app.stopped(engine):  # a polite stop: the same command resumes
            if as_json:
                print_json({**app.outcome_json(out), "state": "preempted", "signal": interrupt.signal_name})
            else:
                click.echo(preempted_line(engine, started.workflow_id, interrupt.signal_name), err=True)
            sys.exit(EXIT_PREEMPTED)
    finally:
        engine.close()
    _finish(out, as_json)


def _finish(st: Any, as_json: bool) -> None:
    result = st.result if st.state == "completed" else None
    if as_json:
        print_json(app.outcome_json(st))
    elif result and result.get("published"):
        click.echo(
            f"released {result['name']} {result['version']}: {result['path']} "
            f"({result['checkpoint']}, digest {result['digest'][:12]})"
        )
        click.echo("  " + " ".join(f"{k}={v:.6g}" for k, v in sorted(result["figures"].items())))
    elif result:
        click.echo(f"ctl: {st.workflow_id}: not published: {result['reason']}", err=True)
    else:
        click.echo(f"ctl: {st.workflow_id} {st.state}: {app.error_line(st.error)}", err=True)
    if st.state == "completed":
        raise SystemExit(0 if result and result.get("published") else EXIT_FAILED)
    raise SystemExit(app.exit_code(st.state))
