"""tinyllm's failure kinds that map to exit codes (importable with the standard library only).

``SpecError`` (bad input, exit 2; re-exported by tinyllm.spec), ``RunLocked`` (exit 75) and
``CheckpointError`` (a corrupt checkpoint: refused, another one used; exit 2 if it surfaces).
"""
from __future__ import annotations


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


class CheckpointError(Exception):
    """A checkpoint that must not be loaded (missing, torn, corrupt); the message names why."""


class RunLocked(Exception):
    """Another live trainer holds runs/<name>/.lock (exit 75, retryable)."""


class PeerLost(Exception):
    """A distributed run's collective failed: another rank died or hung (exit 1, retryable)."""


# SIGTERM/SIGINT before the trainer's loop starts (e.g. during ``import torch``) must still end in a
# clean stop (exit 130), so the CLI installs this handler first and the trainer reads the flag.
STOP = {"requested": False}


def request_stop(signum=None, frame=None) -> None:
    STOP["requested"] = True
