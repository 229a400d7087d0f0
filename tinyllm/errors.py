"""tinyllm's failure kinds that map to exit codes (importable with the standard library only).

``SpecError`` (bad input, exit 2; re-exported by tinyllm.spec), ``RunLocked`` (exit 75) and
``CheckpointError`` (a corrupt checkpoint: refused, another one used; exit 2 if it surfaces).
"""
from __future__ import annotations

import os
import signal


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
# ``signal``: the number of the first stop signal (0: none, or a stop asked for without a signal).
STOP = {"requested": False, "signal": 0}

# The polite-stop contract (issue 39): ctl passes an extra preemption signal (e.g. Slurm's
# ``--signal=B:USR1@60``) by name in this variable; a trainer treats it exactly like SIGTERM.
STOP_SIGNAL_ENV = "DURABLE_STOP_SIGNAL"


def stop_signals() -> tuple[int, ...]:
    """SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL`` (a name such as ``SIGUSR1`` or ``USR1``), as numbers.

    A value that names no catchable signal raises ``SpecError`` (bad input, one line)."""
    found = [signal.SIGTERM, signal.SIGINT]
    name = os.environ.get(STOP_SIGNAL_ENV, "").strip()
    if name:
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        sig = getattr(signal.Signals, full, None) if full.isidentifier() else None
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise SpecError(f"{STOP_SIGNAL_ENV}={name!r} names no signal a trainer can catch "
                            f"(e.g. SIGUSR1, SIGUSR2, SIGTERM)")
        if sig not in found:
            found.append(sig)
    return tuple(int(s) for s in found)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal <n>`` for a number with no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def request_stop(signum=None, frame=None) -> None:
    STOP["requested"] = True
    if signum and not STOP["signal"]:
        STOP["signal"] = int(signum)
