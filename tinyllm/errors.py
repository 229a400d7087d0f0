"""tinyllm's failure kinds that map to exit codes (importable without torch).

``SpecError`` (bad input, exit 2) lives in tinyllm.spec; ``RunLocked`` (exit 75) and
``CheckpointError`` (a corrupt checkpoint: refused, another one used; exit 2 if it surfaces) are here.
"""
from __future__ import annotations


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
