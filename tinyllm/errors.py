"""tinyllm's failure kinds that map to exit codes (importable with the standard library only).

``SpecError`` (bad input, exit 2; re-exported by tinyllm.spec), ``RunLocked`` (exit 75) and
``CheckpointError`` (a corrupt checkpoint: refused, another one used; exit 2 if it surfaces).
"""
from __future__ import annotations

import signal


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


class CheckpointError(Exception):
    """A checkpoint that must not be loaded (missing, torn, corrupt); the message names why."""


class RunLocked(Exception):
    """Another live trainer holds runs/<name>/.lock (exit 75, retryable)."""


class StopRequested(Exception):
    """A stop signal arrived during work that has no checkpoint (``tinyllm eval``, ``tinyllm corpus``):
    abandoned between two units, nothing written; the CLI exits 130 and the same command runs it again."""


class PeerLost(Exception):
    """A distributed run's collective failed: another rank died or hung (exit 1, retryable)."""


# SIGTERM/SIGINT (or $DURABLE_STOP_SIGNAL, tinyllm/stopping.py) before the trainer's loop starts (e.g.
# during ``import torch``) must still end in a clean stop (exit 130), so the CLI installs this handler
# first and the trainer reads the flag. ``signal``: the first stop signal's name (the ``stopping`` line's).
STOP = {"requested": False, "signal": None}


def request_stop(signum=None, frame=None) -> None:
    """The stop handler: only sets the flag (a second or third signal changes nothing, so it can never
    interrupt a checkpoint being written); the loop notices it at its next step boundary."""
    if STOP.get("signal") is None and signum is not None:
        try:
            STOP["signal"] = signal.Signals(signum).name
        except ValueError:
            STOP["signal"] = str(signum)
    STOP["requested"] = True
