"""The polite stop's signals, and data-loader workers that leave the stop to the main process.

Standard library only (the CLIs read it before torch loads; tinyllm.durable and the integrations use it).

- ``stop_signals()``: SIGTERM, SIGINT and the extra preemption signal named by ``$DURABLE_STOP_SIGNAL``
  (``ctl --stop-signal``, e.g. ``SIGUSR1`` or ``USR1`` for Slurm's ``--signal=B:USR1@N``): every trainer
  treats all of them alike (finish the step, checkpoint at it, exit 130). A name that is not a catchable
  signal is bad input: ``StopSignalError`` (the CLIs print one line and exit 2 before writing anything).
- ``install(handler)``: the handler for each of them (returns the previous handlers).
- ``quiet_worker_init(user_fn)`` / ``quiet_workers(loader)``: a DataLoader's worker processes IGNORE
  every stop signal. Slurm, a terminal's Ctrl-C and ``kill -- -PGID`` signal every process of the
  group; torch's workers die of SIGTERM (torch installs a C handler that re-raises it), and the main
  process's SIGCHLD handler then raises ``RuntimeError: DataLoader worker (pid ...) is killed by signal``
  anywhere, in the middle of the stop checkpoint too. ``quiet_workers`` also blocks the stop signals
  around each worker's start (the mask is inherited), so a group signal in the moment between a
  worker's birth and its ``worker_init_fn`` stays pending and is then discarded by SIG_IGN.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.context
import os
import signal
from typing import TYPE_CHECKING, Any, Callable

STOP_SIGNAL_ENV = "DURABLE_STOP_SIGNAL"
UNCATCHABLE = frozenset({"SIGKILL", "SIGSTOP"})


class StopSignalError(ValueError):
    """``$DURABLE_STOP_SIGNAL`` names no signal that can be caught (one line; exit 2)."""


def parse_signal_name(name: str) -> signal.Signals:
    """``SIGUSR1``, ``USR1`` or ``usr1`` -> ``signal.SIGUSR1``; ``StopSignalError`` otherwise."""
    text = name.strip().upper()
    full = text if text.startswith("SIG") else f"SIG{text}"
    sig = getattr(signal.Signals, full, None) if full.isidentifier() else None
    if sig is None or full in UNCATCHABLE or full.startswith("SIG_"):
        raise StopSignalError(
            f"{STOP_SIGNAL_ENV}={name!r} is not a signal a trainer can catch "
            f"(give a name such as SIGUSR1 or USR1; not SIGKILL or SIGSTOP)"
        )
    return sig


def extra_stop_signal(environ: Any = None) -> signal.Signals | None:
    """The signal ``$DURABLE_STOP_SIGNAL`` names (unset or empty: None); ``StopSignalError`` if bad."""
    value = (os.environ if environ is None else environ).get(STOP_SIGNAL_ENV, "")
    return parse_signal_name(value) if value.strip() else None


def stop_signals(environ: Any = None) -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL``'s signal (when set and not one of them)."""
    extra = extra_stop_signal(environ)
    base = (signal.SIGTERM, signal.SIGINT)
    return base if extra is None or extra in base else (*base, extra)


def install(handler: Callable, environ: Any = None) -> dict:
    """``handler`` for every stop signal; returns {signal: previous handler} (to put back)."""
    return {s: signal.signal(s, handler) for s in stop_signals(environ)}


def signal_name(signum: int | None) -> str:
    """``SIGTERM`` for 15 (the ``stopping`` line's ``signal``); ``SIGTERM`` when unknown."""
    if signum is None:
        return "SIGTERM"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


# -- data-loader workers -------------------------------------------------------------------------


def ignore_stop_signals(signals: tuple[int, ...]) -> None:
    """In a worker: ignore the stop signals (a pending one is discarded), then unblock them."""
    for s in signals:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def _quiet_init(signals: tuple[int, ...], user_fn: Callable | None, worker_id: int) -> None:
    ignore_stop_signals(signals)
    if user_fn is not None:
        user_fn(worker_id)


def quiet_worker_init(user_fn: Callable | None = None, environ: Any = None) -> Callable:
    """A ``worker_init_fn`` that makes the worker ignore the stop signals, then calls ``user_fn``
    (picklable: a ``functools.partial`` of module functions, so spawned workers work too)."""
    if isinstance(user_fn, functools.partial) and user_fn.func is _quiet_init:
        return user_fn  # already quiet
    return functools.partial(_quiet_init, tuple(int(s) for s in stop_signals(environ)), user_fn)


@contextlib.contextmanager
def blocked(signals: tuple[int, ...]):
    """The stop signals blocked in this thread (pending ones are delivered when it ends)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# (the mixin's base for the type checker: at run time the concrete classes below bring the process class)
if TYPE_CHECKING:
    _ProcessBase = multiprocessing.process.BaseProcess
else:
    _ProcessBase = object


class _QuietProcess(_ProcessBase):
    """Mixin: ``start()`` with the stop signals blocked, so the child is born with them blocked."""

    def start(self) -> None:
        with blocked(tuple(int(sig) for sig in stop_signals())):
            super().start()


# module-level (picklable: a spawned or forkserver child unpickles its process object by class name)
class QuietForkProcess(_QuietProcess, multiprocessing.context.ForkProcess):
    pass


class QuietSpawnProcess(_QuietProcess, multiprocessing.context.SpawnProcess):
    pass


class QuietForkServerProcess(_QuietProcess, multiprocessing.context.ForkServerProcess):
    pass


class QuietForkContext(multiprocessing.context.ForkContext):
    Process = QuietForkProcess


class QuietSpawnContext(multiprocessing.context.SpawnContext):
    Process = QuietSpawnProcess


class QuietForkServerContext(multiprocessing.context.ForkServerContext):
    Process = QuietForkServerProcess


_QUIET = {"fork": QuietForkContext, "spawn": QuietSpawnContext, "forkserver": QuietForkServerContext}


def quiet_context(base: Any = None) -> multiprocessing.context.BaseContext:
    """A multiprocessing context like ``base`` (a context, a start-method name, or None: the default)
    whose processes start with the stop signals blocked (see ``quiet_workers``); ``base`` itself when it
    is of a start method this does not know."""
    if isinstance(base, (QuietForkContext, QuietSpawnContext, QuietForkServerContext)):  # (_QUIET's)
        return base
    ctx = multiprocessing.get_context(base) if base is None or isinstance(base, str) else base
    quiet = _QUIET.get(ctx.get_start_method())
    return quiet() if quiet is not None else ctx


def quiet_workers(loader: Any, environ: Any = None) -> Any:
    """Make a ``torch.utils.data.DataLoader``'s worker processes ignore the stop signals (chained with
    its own ``worker_init_fn``; its multiprocessing context wrapped to start them blocked). Returns the
    loader; a loader without workers is left as it is. Call it before the loader's first iterator."""
    if getattr(loader, "num_workers", 0) <= 0:
        return loader
    loader.worker_init_fn = quiet_worker_init(loader.worker_init_fn, environ)
    loader.multiprocessing_context = quiet_context(loader.multiprocessing_context)
    return loader
