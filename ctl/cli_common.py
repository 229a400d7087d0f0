"""What every ``ctl`` command shares: the --home and --json options, the error edge (domain errors become
one line on stderr and an exit code, only here), JSON and time printing, a finished run's summary."""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import json
import math
import re
import sqlite3
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeGuard

import click
from click import exceptions as click_errors
from engine import BadInput as EngineBadInput

from contracts.activity_ids import is_train

import app
from app.errors import BadRequest, CtlError
from app.homecheck import as_ctl_error
from .interrupt import DEFAULT_GRACE_S, GRACE_ENV, SIGNAL_ENV, signal_number
from app.runview import figures_text, first_subject_metrics, stopped_early_text

if TYPE_CHECKING:
    from pydantic import ValidationError

home_option = click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="Home folder (default: $CTL_HOME, else the current directory).",
)
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
        "--stop-signal",
        "stop_signal",
        default=None,
        metavar="NAME",
        envvar=SIGNAL_ENV,
        callback=_stop_signal,
        help=f"A preemption signal handled like SIGTERM, e.g. USR1 for Slurm's --signal=B:USR1@120 "
        f"[${SIGNAL_ENV}]; the trainers get it too ($DURABLE_STOP_SIGNAL).",
    )(fn)
    fn = click.option(
        "--stop-grace",
        "stop_grace_s",
        type=click.FloatRange(min=1),
        default=DEFAULT_GRACE_S,
        show_default=True,
        metavar="SECONDS",
        envvar=GRACE_ENV,
        help=f"On SIGTERM/SIGINT/--stop-signal the trainer saves the step it is at; past this many seconds "
        f"ctl kills it and exits (keep it below the platform's own grace: Kubernetes 30 s, Slurm's "
        f"KillWait, `docker stop -t`) [${GRACE_ENV}].",
    )(fn)
    return fn


def preempted_line(engine: app.Backend, workflow_id: str, signal_name: str | None) -> str:
    """The one line a politely stopped command prints: what the stop saved of ``workflow_id``."""
    mine = [p for p in engine.preempted if p.get("workflow_id") == workflow_id and p.get("attempt")]
    sig = signal_name or "a signal"
    if not mine:
        return (
            f"ctl: stopped by {sig}: {workflow_id} had nothing running (a wait's remainder is waited when it "
            f"resumes); run the same command to resume"
        )
    parts = []
    for p in mine:
        if str(p.get("message", "")).startswith("not started"):
            continue
        step, lost = p.get("step"), p.get("steps_lost")
        if not is_train(p.get("activity_id", "")) and step is None:  # an evaluation, a corpus build
            parts.append(
                f"{p.get('activity_id')} attempt {p.get('attempt')} stopped (it runs again when resumed; "
                f"nothing of it was recorded)"
            )
            continue
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
        except ValueError as e:  # a request model refused a value a check before it missed: still one line
            if not _validation_error(e):
                raise
            from tinyllm.spec import format_validation_error  # loaded already: a pydantic model raised it

            exit_with(BadRequest(format_validation_error(e, "request")))

    return wrapper


def _validation_error(e: BaseException) -> TypeGuard["ValidationError"]:
    """``e`` is pydantic's ValidationError (a ValueError). Only a loaded pydantic can have raised one, so a command
    that built no model (``ctl status``) never imports pydantic for this check."""
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(e, core.ValidationError)


def exit_with(e: CtlError) -> None:
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())  # always one line
    click.echo(f"ctl: {text}", err=True)
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
            click.echo(
                f"    refused checkpoint {r['checkpoint']}: {r['reason']}; "
                f"resumed from {t.get('resumed_from') or 'scratch'}"
            )
    if result.get("stopped_early"):
        click.echo(f"  {stopped_early_text(result['stopped_early'])}")
    click.echo(f"final_loss_hex {result['final_loss_hex']}  digest {result['digest']}")


def resolved(engine: app.Backend, workflow_id: str) -> str:
    wid = app.resolve_id(engine, workflow_id)
    if wid != workflow_id:
        why = "the run's first workflow" if workflow_id == f"{wid}/1" else "its newest run; `ctl list` shows all"
        click.echo(f"ctl: {workflow_id} -> {wid} ({why})", err=True)
    return wid


# --- click's own errors: one line in ctl's words, exit 2 ------------------------------------------------------


class CtlGroup(click.Group):
    """``ctl``'s command group: click's usage errors (a missing or unknown option, a value out of range, an
    unknown command, an extra argument) become ONE line ``ctl: ...`` in the project's words and exit 2, for
    every command, instead of click's usage block and ``Error: ...`` (3 lines)."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name or "ctl", complete_var, standalone_mode=False, **extra)
        except click_errors.ClickException as e:
            if not standalone_mode:
                raise
            click.echo(f"ctl: {usage_line(e, self._resolved)}", err=True)
            sys.stderr.flush()
            sys.exit(2 if isinstance(e, click_errors.UsageError) else e.exit_code)
        except click_errors.Abort:  # Ctrl-C outside a command's own handling: as click says it
            if not standalone_mode:
                raise
            click.echo("Aborted!", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)  # an int: an Exit's code (--help, --version)

    _resolved = "ctl"  # the command line's command ("ctl train"), for an error click gives no context

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if self.get_command(ctx, name) is not None:
            self._resolved = f"{ctx.command_path} {name}"
        elif not ctx.resilient_parsing and not name.startswith("-"):
            known = sorted(self.list_commands(ctx))
            close = difflib.get_close_matches(name, known, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise click_errors.UsageError(f"unknown command {name!r}{guess}; commands: {', '.join(known)}", ctx)
        return super().resolve_command(ctx, args)


def _option_name(param: Any) -> str:
    if isinstance(param, click.Option):
        longs = [o for o in param.opts if o.startswith("--")]
        return (longs or param.opts)[0]
    return (param.human_readable_name if param is not None else "value").upper()


def _bounds(t: Any) -> str:
    """``at least 1``, ``greater than 0``, ``at least 1 and at most 65535``: a click range type's bounds in words."""
    parts = []
    if t.min is not None:
        parts.append(f"greater than {t.min:g}" if t.min_open else f"at least {t.min:g}")
    if t.max is not None:
        parts.append(f"less than {t.max:g}" if t.max_open else f"at most {t.max:g}")
    return " and ".join(parts)


def _given(message: str) -> str:
    """The value click quotes at the start of its message (``'abc' is not a valid integer.`` -> abc)."""
    m = re.match(r"^'?(.*?)'? (is not|does not|is a )", message)
    return m.group(1) if m else ""


def _bad_value(param: Any, message: str) -> str:
    t = getattr(param, "type", None)
    given = _given(message)
    what = f"{_option_name(param)} {given}".rstrip() if given else _option_name(param)
    if isinstance(t, (click.FloatRange, click.IntRange)) and "range" in message:
        unit = f" ({param.metavar.lower()})" if getattr(param, "metavar", None) else ""
        return f"{what}: must be {_bounds(t)}{unit}"
    if isinstance(t, click.Choice):
        return f"{what}: must be one of {', '.join(map(str, t.choices))}"
    if isinstance(t, (click.IntRange, click.types.IntParamType)):
        return f"{what}: must be an integer"
    if isinstance(t, (click.FloatRange, click.types.FloatParamType)):
        return f"{what}: must be a number"
    return f"{_option_name(param)}: {message.rstrip('.')}"


def usage_line(e: click_errors.ClickException, command: str = "ctl") -> str:
    """One line for a click error, naming the command (``command`` when click gives no context), the option
    and what it must be."""
    ctx = getattr(e, "ctx", None)
    cmd = ctx.command_path if ctx is not None else command
    where = cmd.split(" ", 1)[1] + ": " if " " in cmd else ""
    hint = f"; see `{cmd} --help`"
    message = " ".join(e.format_message().split()).rstrip(".")
    if message.startswith("unknown command "):  # CtlGroup.resolve_command's own words
        return f"{where}{message}"
    if isinstance(e, click_errors.NoSuchOption):
        close = sorted(e.possibilities or [])
        return f"{where}unknown option {e.option_name}" + (f" (did you mean {close[0]}?)" if close else "") + hint
    if isinstance(e, click_errors.MissingParameter) and e.param is not None:
        if isinstance(e.param, click.Option):
            metavar = f" {e.param.metavar}" if e.param.metavar else ""
            return f"{where}{_option_name(e.param)}{metavar} is required{hint}"
        return f"{where}missing {_option_name(e.param)}{hint}"
    if isinstance(e, click_errors.BadParameter):
        return (
            f"{where}{_bad_value(e.param, e.message)}{hint}"
            if e.param is not None
            else f"{where}{e.message.rstrip('.')}{hint}"
        )
    if isinstance(e, click_errors.BadOptionUsage):
        m = re.match(r"Option '(.*)' (requires an argument|does not take a value)", e.message)
        if m:
            need = "needs a value" if m.group(2).startswith("requires") else "takes no value"
            return f"{where}{m.group(1)} {need}{hint}"
        return f"{where}{e.message[:1].lower() + e.message[1:].rstrip('.')}{hint}"
    m = re.match(r"Got unexpected extra arguments? \((.*)\)", message)
    if m:
        return f"{where}unexpected argument {m.group(1)!r}{hint}"
    return f"{where}{message[:1].lower() + message[1:]}{hint}"
