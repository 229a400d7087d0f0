"""torchrun's agent for tinyllm's ranks: ``python -m tinyllm.distributed.agent <torchrun's arguments>``.

This is ``torch.distributed.run`` (torchrun) itself, with one change: a stop signal (SIGTERM, SIGINT,
``$DURABLE_STOP_SIGNAL``; tinyllm/errors.py) that reaches the agent is passed on, the same signal, to
every rank of this node, and the agent goes on supervising them: the ranks agree on a step, write one
checkpoint and exit 130 (tinyllm/distributed/trainer.py), and the launcher reports (tinyllm/distributed/launch.py).

Why not torchrun's own handling: on SIGTERM or SIGINT torchrun sends the signal to its ranks and
SIGKILLs them 30 s later (its shutdown timeout), whether their checkpoint is written or not, and a
second signal meanwhile makes it exit at once; a stop signal it does not handle (SIGUSR1, Slurm's
usual warning) kills it, and its ranks die with it (their parent-death SIGKILL). So the launcher
runs torchrun with ``--signals-to-handle SIGHUP,SIGQUIT`` and the stop signals left to this module.

How: the launcher starts the agent with the stop signals blocked (tinyllm/distributed/launch.py), and they
stay blocked in every thread of the agent; one thread takes them with ``sigtimedwait``. Ranks inherit
the blocked mask across exec, so a stop signal that reaches a rank before its handler is installed
stays pending until tinyllm/cli.py unblocks it, right after installing the handler: never lost, never
fatal. Ranks are found by the ``started-<rank>.json`` files they write once their handlers are in
place (``$TINYLLM_DDP_STATUS``); ranks that start after the signal get it when they appear. Without
that variable (run by hand, not by tinyllm's launcher) it is plain torchrun.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from .launch import POLL_S, RANK_STATUS_ENV, forward_stop
from ..errors import stop_signals


def _pass_on(stops: tuple[int, ...], folder: Path) -> None:
    """The agent's signal thread: wait for a stop signal, then keep passing it on to every started rank."""
    first = 0
    signaled: set[int] = set()
    while True:
        got = signal.sigtimedwait(stops, POLL_S)
        if got is not None and not first:
            first = got.si_signo
        if first:
            forward_stop(folder, first, signaled)


def main(argv: list[str]) -> None:
    folder = os.environ.get(RANK_STATUS_ENV)
    if folder:  # started by tinyllm's launcher (run by hand without it: plain torchrun)
        stops = stop_signals()
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # blocked by the launcher already: stays so, every thread
        threading.Thread(target=_pass_on, args=(stops, Path(folder)), name="tinyllm-stop", daemon=True).start()
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
