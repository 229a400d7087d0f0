"""The read-only ``ctl`` commands: status, list, history, show, plot, doctor (registered on ``ctl.cli.main``).

Each opens the home's database read-only (``app.open_engine(..., readonly=True)``) and writes nothing;
doctor --fix removes leftover temporaries only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

import app
from app import Backend, errors

from . import historyview, runstatus
from . import plot as plotting
from app.errors import BadRequest, CtlError
from app.homecheck import as_ctl_error
from .cli_common import describe_train, edge, home_option, json_option, print_json, resolved, when
from app.runview import release_outcome, run_view
from .show import show as show_run


@click.command()
@click.argument("workflow_id", required=False)
@json_option
@home_option
@edge
def status(workflow_id: str | None, as_json: bool, home: str | None) -> None:
    """Show WORKFLOW_ID's state, or a table of every workflow.

    For a run: whether a live worker holds it (pid, host, lease age) or nobody does, what it
    waits for (e.g. an evaluation with no progress for 95 s, stopped after 120 s), the
    current step and last loss, the last checkpoint, the last evaluation's figures, the ETA,
    and pending timers in local time with the time remaining. --json adds the fields
    "worker", "progress" and "timers" (docs/ctl.md, "Watching a run").

    \b
    Exit codes: 0 completed or running (or no id given), 130 canceled, 1 failed,
                2 unknown id or no database.
    \b
    Examples:
      ctl status                  # a table of all workflows
      ctl status train/tiny --json
    """
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=False, readonly=True)
    try:
        if workflow_id is None:
            _list_all(engine, as_json)
            return
        st = engine.status(resolved(engine, workflow_id))
        now = time.time()
        extra = runstatus.describe(engine, home_dir, st, now)
        if as_json:
            print_json(app.outcome_json(st) | {"waiting_on": st.waiting_on} | extra | _release_json(st))
        else:
            click.echo(
                f"{st.workflow_id} ({st.workflow}): {st.state}"
                + (" (cancel requested)" if st.cancel_requested and st.state == "running" else "")
            )
            if st.waiting_on and not st.waiting_on.startswith("timer"):  # timers: below, in local time
                click.echo(f"  waiting on: {runstatus.readable(st.waiting_on)}")
            for line in runstatus.status_lines(st, extra, now):
                click.echo(line)
            if st.error:
                click.echo(f"  error: {app.error_line(st.error)}")
            if (released := release_outcome(st.workflow, st.state, st.result)) is not None:
                click.echo(f"  release: {released['text']}")
            if st.state == "completed" and st.workflow == "TrainRun":
                describe_train(st.result)
        sys.exit(app.exit_code(st.state))
    finally:
        engine.close()


def _release_json(st: Any) -> dict:
    """``{"release": {...}}`` for a completed ModelRelease (runview.release_outcome), else nothing."""
    released = release_outcome(st.workflow, st.state, st.result)
    return {"release": released} if released is not None else {}


def _table(rows: list) -> None:
    if not rows:
        click.echo("no workflows")
        return
    click.echo(f"{'WORKFLOW ID':<32} {'KIND':<12} {'STATE':<10} {'UPDATED':<19} OUTCOME")
    for s in rows:
        state = s.state + ("*" if s.cancel_requested and s.state == "running" else "")
        released = release_outcome(s.workflow, s.state, s.result)
        click.echo(
            f"{s.workflow_id:<32} {s.workflow:<12} {state:<10} {when(s.updated_at):<19} "
            f"{released['text'] if released else ''}".rstrip()
        )


@click.command(name="list")
@json_option
@home_option
@edge
def list_(as_json: bool, home: str | None) -> None:
    """List every workflow of the home folder: id, kind, state (* = cancel requested), last update,
    and a completed release's outcome (published VERSION, or not published: which gate failed).

    \b
    Exit codes: 0, or 2 when the home has no database.
    \b
    Example:
      ctl list --json
    """
    engine = app.open_engine(app.resolve_home(home), create=False, readonly=True)
    try:
        _list_all(engine, as_json)
    finally:
        engine.close()


def _list_all(engine: Backend, as_json: bool) -> None:
    """Every readable workflow; each damaged one as a line on stderr, then exit 2."""
    rows, damaged = engine.list_readable()
    if as_json:
        print_json([app.outcome_json(s) | _release_json(s) for s in rows])
    else:
        _table(rows)
    for e in damaged:
        click.echo(f"ctl: {e}", err=True)
    if damaged:
        sys.exit(errors.EXIT_BAD_INPUT)


@click.command()
@click.argument("workflow_id")
@json_option
@home_option
@edge
def history(workflow_id: str, as_json: bool, home: str | None) -> None:
    """Print WORKFLOW_ID's recorded events as aligned columns: seq, ISO local time, event,
    activity#attempt, and the details that matter (checkpoint, loss, evaluation figures,
    error class and message, a timer's fire time).

    --json prints every event in full: {"workflow_id", "events": [{"seq", "type", "time", "attrs"}]}.

    \b
    Exit codes: 0, or 2 for an unknown id or no database.
    \b
    Example:
      ctl history train/tiny --json
    """
    engine = app.open_engine(app.resolve_home(home), create=False, readonly=True)
    try:
        wid = resolved(engine, workflow_id)
        events = engine.history(wid)
        if as_json:
            print_json({"workflow_id": wid, "events": [e.to_json() for e in events]})
        else:
            for line in historyview.table(events):
                click.echo(line)
    finally:
        engine.close()


def _train_run(engine: Backend, workflow_id: str) -> tuple[Any, list]:
    """A TrainRun's status and history; BadRequest for another kind of workflow."""
    wid = resolved(engine, workflow_id)
    st = engine.status(wid)
    if st.workflow != "TrainRun":
        raise BadRequest(f"{wid} is a {st.workflow}, not a training run (train/<name>)")
    return st, engine.history(wid)


@click.command()
@click.argument("workflow_id", metavar="train/NAME")
@json_option
@home_option
@edge
def show(workflow_id: str, as_json: bool, home: str | None) -> None:
    """Show a training run as a table: each segment with its end step, state, checkpoint,
    train loss, time taken, attempts and each suite's figure; then, when the spec has held-out
    validation, every validation frame of runs/<name>/metrics.jsonl.

    \b
    Exit codes: 0, or 2 for an unknown id, not a training run, or no database.
    \b
    Example:
      ctl show train/tiny
    """
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=False, readonly=True)
    try:
        st, events = _train_run(engine, workflow_id)
        view = run_view(st.workflow_id, events, st.state)
        recorded = events[0].attrs.get("input") if events else {}  # its input: the history read once, above
        lines, data = show_run(view, home_dir, recorded.get("spec") or {}, recorded.get("trace"))
        if as_json:
            print_json(data)
        else:
            for line in lines:
                click.echo(line)
    finally:
        engine.close()


@click.command()
@click.argument("workflow_id", metavar="train/NAME")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.png",
    help="Write a PNG (matplotlib) instead of plotting in the terminal (plotext).",
)
@json_option
@home_option
@edge
def plot(workflow_id: str, output: str | None, as_json: bool, home: str | None) -> None:
    """Plot a training run: training loss (and its smoothed curve), held-out validation
    curves and each checkpoint's evaluation figure over steps, and the learning rate.

    The curves come from runs/<name>/metrics.jsonl, the evaluations from the run's history.
    Without -o it draws in the terminal (no dependency); -o needs the optional extra
    pip install 'durable-train[plot]' (matplotlib). --json prints the plotted series instead.

    \b
    Exit codes: 0, 2 for an unknown id, not a training run, no metrics yet, no database or an
                -o file that cannot be written, 1 when matplotlib (for -o) is not installed, 74 disk full.
    \b
    Examples:
      ctl plot train/tiny
      ctl plot train/tiny -o tiny.png
    """
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=False, readonly=True)
    try:
        st, events = _train_run(engine, workflow_id)
        s = plotting.series(run_view(st.workflow_id, events, st.state), home_dir)
    finally:
        engine.close()
    if as_json:
        print_json(s.to_json())
        return
    if not s.loss:
        raise BadRequest(f"{st.workflow_id} has no training steps in runs/*/metrics.jsonl yet; nothing to plot")
    try:
        if output:
            try:
                path = plotting.write_png(s, Path(output))
            except OSError as e:  # its folder cannot be made, no permission, no space
                full = as_ctl_error(e, None)
                raise (
                    full
                    if isinstance(full, errors.DiskFull)
                    else BadRequest(f"cannot write the plot {output}: {e.strerror or e}")
                ) from None
            click.echo(f"wrote {path} ({len(s.loss)} steps, {len(s.evals)} evaluation(s))")
        else:
            size = os.get_terminal_size(sys.stdout.fileno()) if sys.stdout.isatty() else os.terminal_size((100, 30))
            click.echo(plotting.terminal(s, width=size.columns, height=min(size.lines, 40), color=sys.stdout.isatty()))
    except plotting.PlotUnavailable as e:
        raise CtlError(str(e)) from None


@click.command()
@click.option("--fix", is_flag=True, help="Remove leftover temporaries of unfinished writes (nothing else).")
@json_option
@home_option
@edge
def doctor(fix: bool, as_json: bool, home: str | None) -> None:
    """Check the home folder and say what each problem means for which run.

    Checks the database (SQLite integrity, application and schema, every workflow's row and
    history with each event's checksum, activities leased to a worker that is gone), each
    run's checkpoints against their manifests and its LATEST pointer, each corpus against its
    checksums, and leftover temporaries of writes that did not finish. Read-only: it repairs
    nothing unless --fix, which removes leftover temporaries only (run locks are kernel locks,
    never stale; a lease of a dead worker is expired by the next `ctl train` or `ctl worker`).

    \b
    Exit codes: 0 clean (or everything found was fixed), 1 problems found, 2 bad home.
    \b
    Example:
      ctl doctor --home runs-home && ctl doctor --fix
    """
    home_dir = app.resolve_home(home)
    if not home_dir.is_dir():
        raise BadRequest(f"home {home_dir} does not exist")
    from . import doctor as doc  # the MLflow sink's state, run locks, manifests: only ctl doctor reads them

    report = doc.examine(home_dir)
    removed = doc.fix(home_dir, report) if fix else []
    left = [f for f in report.findings if f.path not in removed]
    if as_json:
        print_json(report.to_json() | {"removed": removed})
    else:
        for f in left:
            click.echo(f.line())
        for r in removed:
            click.echo(f"removed  {r}")
        c = report.checked
        click.echo(
            f"checked {c['workflows']} workflow(s), {c['events']} event(s), {c['runs']} run(s), "
            f"{c['checkpoints']} checkpoint(s), {c['corpora']} corpus(es): "
            + ("no problems" if not left else f"{len(left)} problem(s)")
        )
    sys.exit(errors.EXIT_FAILED if left else errors.EXIT_OK)


COMMANDS = (status, list_, history, show, plot, doctor)
