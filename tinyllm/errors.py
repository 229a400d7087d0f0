"""tinyllm's failure kinds that map to exit codes (importable with the standard library only).

``SpecError`` (bad input, exit 2; re-exported by tinyllm.spec), ``RunLocked`` (exit 75) and
``CheckpointError`` (a corrupt checkpoint: refused, another one used; exit 2 if it surfaces).
"""

from __future__ import annotations

import signal

import contracts.manifest

from . import stopping


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


CheckpointError = contracts.manifest.CheckpointError  # the contract's (contracts/manifest.py): ctl verifies too


class RunLocked(Exception):
    """Another live trainer holds runs/<name>/.lock (exit 75, retryable)."""


class StopRequested(Exception):
    """A stop signal arrived during work that has no checkpoint (``tinyllm eval``, ``tinyllm corpus``):
    abandoned between two units, nothing written; the CLI exits 130 and the same command runs it again."""


class PeerLost(Exception):
    """A distributed run's collective failed: another rank died or hung (exit 1, retryable)."""


# SIGTERM/SIGINT (or $DURABLE_STOP_SIGNAL, tinyllm/stopping.py) before the trainer's loop starts (e.g.
# during ``import torch``) must still end in a clean stop (exit 130), so the CLI installs this handler
# first and the trainer reads the flag. ``signal``: the number of the first stop signal (0: none, or a
# stop asked for without a signal; ``signal_name`` gives the ``stopping`` line's name).
STOP = {"requested": False, "signal": 0}

STOP_SIGNAL_ENV = stopping.STOP_SIGNAL_ENV  # (ctl --stop-signal's name for it: the trainer treats it as SIGTERM)


def stop_signals() -> tuple[int, ...]:
    """SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL`` as numbers (tinyllm/stopping.py); a value that names no
    catchable signal raises ``SpecError`` (bad input, one line)."""
    try:
        return tuple(int(s) for s in stopping.stop_signals())
    except stopping.StopSignalError as e:
        raise SpecError(str(e)) from None


def signal_name(signum: int | None) -> str:
    """``SIGTERM`` for 15 (and for 0/None: a stop asked for without a signal); ``signal <n>`` for a number
    with no name."""
    if not signum:
        return "SIGTERM"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def request_stop(signum=None, frame=None) -> None:
    """The stop handler: only sets the flag (a second or third signal changes nothing, so it can never
    interrupt a checkpoint being written); the loop notices it at its next step boundary."""
    STOP["requested"] = True
    if signum and not STOP["signal"]:
        STOP["signal"] = int(signum)
