"""What every ``ctl`` command shares: the --home and --json options, the error edge (domain errors become
one line on stderr and an exit code, only here), JSON and time printing, a finished run's summary."""
from __future__ import annotations

import datetime as dt
import functools
import json
import math
import sqlite3
import sys
from typing import Any, Callable

import click

from engine import BadInput as EngineBadInput

from . import app
from .errors import BadRequest, CtlError
from .homecheck import as_ctl_error
from .interrupt import DEFAULT_GRACE_S, GRACE_ENV, SIGNAL_ENV, signal_number
from .runview import figures_text, first_subject_metrics, stopped_early_text

home_option = click.option("--home", type=click.Path(file_okay=False), default=None,
                           help="Home folder (default: $CTL_HOME, else the current directory).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (stable shape, see docs/ctl.md).")


def _stop_signal(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None or value == "":
        return None
    try:
        return signal_number(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def stop_options(fn: Callable) -> Callable:
    """``--stop-grace`` and ``--stop-signal`` (ctl/interrupt.py, docs/preemption.md), for every command that
    runs workflows here (train, eval, release, worker)."""
    fn = click.option(
        "--stop-signal", "stop_signal", default=None, metavar="NAME", envvar=SIGNAL_ENV, callback=_stop_signal,
        help=f"A preemption signal handled like SIGTERM, e.g. USR1 for Slurm's --signal=B:USR1@120 "
             f"[${SIGNAL_ENV}]; the trainers get it too ($DURABLE_STOP_SIGNAL).")(fn)
    fn = click.option(
        "--stop-grace", "stop_grace_s", type=click.FloatRange(min=1), default=DEFAULT_GRACE_S, show_default=True,
        metavar="SECONDS", envvar=GRACE_ENV,
        help=f"On SIGTERM/SIGINT/--stop-signal the trainer saves the step it is at; past this many seconds "
             f"ctl kills it and exits (keep it below the platform's own grace: Kubernetes 30 s, Slurm's "
             f"KillWait, `docker stop -t`) [${GRACE_ENV}].")(fn)
    return fn


def preempted_line(engine: Any, workflow_id: str, signal_name: str | None) -> str:
    """The one line a politely stopped command prints: what the stop saved of ``workflow_id``."""
    mine = [p for p in getattr(engine, "preempted", []) if p.get("workflow_id") == workflow_id and p.get("attempt")]
    sig = signal_name or "a signal"
    if not mine:
        return (f"ctl: stopped by {sig}: {workflow_id} had nothing running (a wait's remainder is waited when it "
                f"resumes); run the same command to resume")
    parts = []
    for p in mine:
        if str(p.get("message", "")).startswith("not started"):
            continue
        step, lost = p.get("step"), p.get("steps_lost")
        saved = f"saved step {step}" if step is not None else "no checkpoint yet"
        how = f"{lost} steps lost" if lost is not None else "steps lost unknown"
        if p.get("killed_at_grace"):
            how = f"killed at the grace, {how}"
        parts.append(f"{p.get('activity_id')} attempt {p.get('attempt')} preempted: {saved} ({how})")
    what = "; ".join(parts) or "nothing had started"
    return f"ctl: stopped by {sig}: {workflow_id} {what}; run the same command to resume"


def edge(fn: Callable) -> Callable:
    """Turn domain errors into one line on stderr and the exit code (the only place that does)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CtlError as e:
            exit_with(e)
        except EngineBadInput as e:  # a damaged record met while running: nothing was written
            exit_with(BadRequest(str(e)))
        except (sqlite3.Error, OSError) as e:
            home = kwargs.get("home")
            err = as_ctl_error(e, app.resolve_home(home) if "home" in kwargs else None)
            if err is None:
                raise
            exit_with(err)
    return wrapper


def exit_with(e: CtlError) -> None:
    click.echo(f"ctl: {e}", err=True)
    sys.stderr.flush()
    sys.exit(e.exit_code)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (a diverged loss: inf, nan) as None: strict JSON has no
    Infinity/NaN, which json.dumps would write and most parsers refuse (the exact bits stay in ``*_hex``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def print_json(value: Any) -> None:
    click.echo(json.dumps(finite(value), indent=2, sort_keys=True, allow_nan=False))


def when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def describe_train(result: dict) -> None:
    click.echo(f"run {result['name']}: {result['steps']} steps, checkpoint {result['checkpoint']}")
    for seg in result["segments"]:
        t = seg["train"]
        line = f"  step {t.get('steps', seg['until']):>7}  loss {t['final_loss']:.6f} ({t['final_loss_hex']})  digest {t['digest'][:16]}"
        for s in (seg.get("evals") or {}).get("suites", []):
            line += f"  {s['suite']}: {figures_text(first_subject_metrics(s), limit=2) or 'done'}"
        click.echo(line)
        for r in t.get("refused_checkpoints") or []:
            click.echo(f"    refused checkpoint {r['checkpoint']}: {r['reason']}; "
                       f"resumed from {t.get('resumed_from') or 'scratch'}")
    if result.get("stopped_early"):
        click.echo(f"  {stopped_early_text(result['stopped_early'])}")
    click.echo(f"final_loss_hex {result['final_loss_hex']}  digest {result['digest']}")


def resolved(engine: Any, workflow_id: str) -> str:
    wid = app.resolve_id(engine, workflow_id)
    if wid != workflow_id:
        why = "the run's first workflow" if workflow_id == f"{wid}/1" else "its newest run; `ctl list` shows all"
        click.echo(f"ctl: {workflow_id} -> {wid} ({why})", err=True)
    return wid
