"""``tinyllm corpus|train|eval``: the subprocess contract (contracts/subprocess-activity.md).

Exit codes: 0 done (last stdout line = JSON result), 2 bad input (one line on stderr, nothing
written), 74 disk full (one line naming the file; this process's temporaries removed), 75 run locked by another live trainer, 130 stopped by a stop signal
(SIGTERM, SIGINT, or the one ``$DURABLE_STOP_SIGNAL`` names, e.g. ``SIGUSR1``; tinyllm/stopping.py): ``train``
after its checkpoint at the step it was at, ``eval`` and ``corpus`` before writing anything (the same
command runs them again). A ``$DURABLE_STOP_SIGNAL`` that names no catchable signal is bad input (2).
Paths: ``--spec`` and ``--progress`` are ordinary paths (relative to the current directory);
``--resume`` and checkpoint paths inside specs are relative to the home unless absolute.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal
import sys
import threading
from pathlib import Path

import click

from contracts.exits import (
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    EXIT_DISK_FULL,
    EXIT_LOCKED,
)  # the trainer contract's exit codes

from . import runtime_env, stopping
from .corpus import build_corpus
from .distributed.launch import check_resume_world_size, enter_rank, in_rank, launch, rank_argv
from .diskfull import is_disk_full, remove_own_temporaries
from .errors import CheckpointError, PeerLost, RunLocked, StopRequested, request_stop, stop_signals
from .fsio import resolve_home
from .progress import ProgressFile, activate
from .spec import CorpusSpec, SpecError, load_corpus_spec, load_eval_spec, load_train_spec
from .validation.errors import ArchiveError

# The trainer and the evals (they load torch) are imported inside the commands that need them, after
# the spec is read (a bad spec fails fast) and after tinyllm.runtime_env.prepare() set what libgomp
# and MKL read when torch loads: an order, not a start-up trick. Everything above loads no torch.


_RANK = None  # a torchrun rank's RankStatus (tinyllm/distributed/launch.py): its verdict goes to the launcher


def _fail(message: str, code: int) -> None:
    if _RANK is None or _RANK.rank == 0:  # one line, not one per rank
        click.echo(f"tinyllm: {message}", err=True)
    if _RANK is not None:
        _RANK.finish(code, message)
    sys.exit(code)


def _disk_full(err: OSError, home: Path) -> None:
    """Remove this process's temporaries, then one line and exit 74 (nothing written is lost)."""
    remove_own_temporaries(home)
    _fail(f"disk full writing {err.filename or home}; free some space and run the same command again", EXIT_DISK_FULL)


PERMISSION_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _not_permitted(err: OSError, home: Path) -> None:
    """A write this user may not do: retrying cannot help, so one line and exit 2 (not retried)."""
    where = Path(err.filename) if err.filename else home
    if where.name.startswith(".tmp-"):  # a temporary being written: the folder it goes in is what to fix
        where = where.parent
    _fail(
        f"permission denied writing {where}: make it writable by this user (uid {os.getuid()}) and run the "
        f"same command again",
        EXIT_BAD_INPUT,
    )


def _os_error(err: OSError, home: Path) -> None:
    """Disk full (74) or no permission (2) as one line; any other OSError is re-raised."""
    if is_disk_full(err):
        _disk_full(err, home)
    if isinstance(err, PermissionError) or err.errno in PERMISSION_ERRNOS:
        _not_permitted(err, home)
    raise err


def _stop_handlers() -> None:
    """SIGTERM, SIGINT and $DURABLE_STOP_SIGNAL set the stop flag (first thing: a stop during start-up
    still ends cleanly); a bad $DURABLE_STOP_SIGNAL is one line and exit 2, before anything is written."""
    try:
        stopping.install(request_stop)
    except stopping.StopSignalError as e:
        _fail(str(e), EXIT_BAD_INPUT)


def _stopped(e: StopRequested) -> None:
    click.echo(f"tinyllm: {e}", err=True)
    sys.exit(EXIT_CANCELED)


def _emit(result: dict) -> None:
    if _RANK is not None:  # a rank: the launcher prints rank 0's result as the run's one result line
        _RANK.result = result
        return
    click.echo(json.dumps(result, sort_keys=True))


def _launch_distributed(
    spec, resume: Path | None, progress: str | None, total_steps: int | None, home_dir: Path, spec_path: str
) -> None:
    """This process is the launcher of a distributed spec: torchrun runs the ranks (tinyllm/distributed/launch.py)."""
    code, result, message = launch(
        spec, home_dir, rank_argv(spec_path, home_dir, progress, resume, total_steps), resume
    )
    if result is not None:
        _emit(result)
    if message:
        click.echo(f"tinyllm: {message}", err=True)
    if code == EXIT_CANCELED:
        click.echo("tinyllm: stopped by signal after checkpointing", err=True)
    sys.exit(code)


home_option = click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="Home folder (default: $CTL_HOME, else the current directory).",
)


@click.group()
def main() -> None:
    """A tiny GPT: build corpora, train with bitwise-exact resume, evaluate checkpoints."""


@main.command()
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Corpus spec (JSON). Without it: the built-in corpus named 'default'.",
)
@home_option
def corpus(spec_path: str | None, home: str | None) -> None:
    """Build corpora/<name>/ (idempotent; a stop signal before the write: exit 130, nothing written)."""
    _stop_handlers()
    try:
        spec = load_corpus_spec(spec_path) if spec_path else CorpusSpec()
        result = build_corpus(spec, resolve_home(home))
    except StopRequested as e:
        _stopped(e)
    except SpecError as e:
        _fail(str(e), EXIT_BAD_INPUT)
    except OSError as e:
        _os_error(e, resolve_home(home))
    _emit(result)


@main.command()
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), required=True, help="Train spec (JSON).")
@click.option(
    "--progress",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append one JSON line per checkpoint, and a liveness line every few seconds, to this file.",
)
@click.option(
    "--resume",
    type=click.Path(),
    default=None,
    help="Checkpoint directory to resume from (default: runs/<name>/ckpt/LATEST, else fresh). "
    "A corrupt one is refused (said on stderr, in --progress and in the result's "
    "refused_checkpoints) and the newest valid checkpoint is used instead.",
)
@click.option(
    "--total-steps",
    type=click.IntRange(min=1),
    default=None,
    help="The run's last step when this invocation trains one segment of it (to the spec's "
    "`steps`); validation's schedule and final step follow the run [default: the spec's steps].",
)
@home_option
def train(spec_path: str, progress: str | None, resume: str | None, total_steps: int | None, home: str | None) -> None:
    """Train the spec's model to its `steps`, resuming where possible.

    A spec with `distributed` ({"world_size": N}) runs N data-parallel ranks under torchrun
    (gloo on CPU); this process launches them and reports for all of them (tinyllm/distributed/launch.py).

    \b
    Speed: the spec's `threads` is the most torch threads training uses; at
    start it uses as many as the machine has free CPUs for (at least 1), and
    they spin while waiting (OMP_WAIT_POLICY=ACTIVE, full speed) when each has
    a free CPU, else sleep (PASSIVE, safe when CPUs are busy); both said in
    the --progress 'ready' line (its "omp" field). TINYLLM_THREADS=N pins the
    count; OMP_WAIT_POLICY the policy. Any count and either policy give
    bit-identical results, so a resume may run with another count (each
    segment decides again).
    """
    global _RANK
    try:
        stops = stop_signals()  # SIGTERM, SIGINT and $DURABLE_STOP_SIGNAL (tinyllm/errors.py)
    except SpecError as e:
        _fail(str(e), EXIT_BAD_INPUT)
    for sig in stops:  # a stop before the loop starts still exits 130
        signal.signal(sig, request_stop)
    # a torchrun rank starts with them blocked (tinyllm/distributed/agent.py): one sent before now arrives here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    home_dir = resolve_home(home)
    _RANK = enter_rank() if in_rank() else None
    try:
        spec = _read_train_spec(spec_path)  # before importing torch: a bad spec fails fast
        liveness = ProgressFile(progress if _RANK is None or _RANK.rank == 0 else None)
        liveness.event("starting", pid=os.getpid())  # alive before the torch import (seconds on a busy host)
        resume_path = None if resume is None else (Path(resume) if os.path.isabs(resume) else home_dir / resume)
        if _RANK is None:
            check_resume_world_size(spec, home_dir, resume_path)  # one line, before torch or the lock
        if spec.distributed is not None and _RANK is None:
            _launch_distributed(spec, resume_path, progress, total_steps, home_dir, spec_path)  # each rank prepares
        runtime_env.prepare(spec.threads)  # before torch: MKL_CBWR, threads and wait policy, heap (its docstring)
        from .trainer import Trainer

        trainer_cls: type[Trainer] = Trainer
        if _RANK is not None:
            from .distributed.trainer import DistributedTrainer

            trainer_cls = DistributedTrainer

        liveness.event("imported")
        trainer = trainer_cls(
            spec, home_dir, Path(progress).absolute() if progress else None, resume_path, total_steps=total_steps
        )
        result = trainer.run()
    except SpecError as e:
        _fail(str(e), EXIT_BAD_INPUT)
    except CheckpointError as e:  # found corrupt after it was chosen (verified at choice): never a traceback
        _fail(f"corrupt checkpoint: {e}", EXIT_BAD_INPUT)
    except RunLocked as e:
        _fail(str(e), EXIT_LOCKED)
    except PeerLost as e:  # a distributed rank whose peer died: one line, retryable
        _fail(str(e), 1)
    except ArchiveError as e:  # retryable: the resumed run retries only the publication
        _fail(str(e), e.exit_code)
    except OSError as e:
        _os_error(e, home_dir)
    _emit(result)
    if _RANK is not None:
        _RANK.finish(EXIT_CANCELED if result.get("canceled") else 0)
    if result.get("canceled"):
        if _RANK is None:
            click.echo("tinyllm: stopped by signal after checkpointing", err=True)
        if _RANK is None and __name__ == "__main__":
            _exit_now(EXIT_CANCELED)
        sys.exit(EXIT_CANCELED)
    if _RANK is None and __name__ == "__main__":  # the command, not an in-process caller of main()
        _exit_now(0)


def _exit_now(code: int) -> None:
    """End ``tinyllm train`` (and ``eval``) once its result line is out: join what threads still run, run the ``atexit``
    handlers, flush stdio, then ``os._exit``. Everything it wrote is closed and fsynced by then (checkpoints,
    LATEST, progress and metrics lines); what it skips is the interpreter's teardown of torch's objects, which
    took 1.6-2.8 s a segment on this loaded 2-CPU machine (0.1 s with this), all of it between one segment's
    last step and the next one's first (bench/durable.py's segment boundary)."""
    threading_shutdown = getattr(threading, "_shutdown", None)
    if threading_shutdown is not None:
        threading_shutdown()  # the interpreter's own join of non-daemon threads (a sink's delivery, a writer)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _read_train_spec(spec_path: str):
    return load_train_spec(spec_path)


@main.command(name="eval")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), required=True, help="Eval spec (JSON).")
@click.option(
    "--progress",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append a JSON liveness line to this file every few seconds of work.",
)
@home_option
def eval_(spec_path: str, progress: str | None, home: str | None) -> None:
    """Run one suite (ppl or zoo) over the spec's subjects (a stop signal: exit 130, nothing written)."""
    _stop_handlers()
    try:
        spec = load_eval_spec(spec_path)  # before importing torch: a bad spec fails fast
        activate(progress).event("starting", pid=os.getpid())  # alive before the torch import
        runtime_env.prepare()  # before torch: MKL_CBWR and the wait policy (tinyllm/runtime_env.py)
        from .evals import run_eval

        result = run_eval(spec, resolve_home(home))
    except StopRequested as e:
        _stopped(e)
    except SpecError as e:
        _fail(str(e), EXIT_BAD_INPUT)
    except OSError as e:
        _os_error(e, resolve_home(home))
    _emit(result)
    if __name__ == "__main__":  # results.jsonl and summary.json are written and closed: no teardown to wait for
        _exit_now(0)


if __name__ == "__main__":
    main()
