"""Test-only fault injection: SIGKILL this process at a named point, chosen by an environment variable.

``<ENV>=<phase>@<step>`` makes the process send itself SIGKILL when it reaches ``phase`` at model
step ``step``: a real, uncatchable kill at a deterministic point, so tests need no timing. Unset in
normal use; then a kill point is one dictionary lookup and nothing else.

- ``TINYLLM_VALIDATION_KILL``: the phases of a durable validation (tinyllm/validation/faults.py);
- ``TINYLLM_CHECKPOINT_KILL``: ``between_renames`` (re-saving an existing step: the old directory
  renamed away, the new one not yet in place -- tinyllm/checkpoint.py).

``TINYLLM_HOLD_AT=<step>`` is the one fault that is not a kill: the training loop holds at model step
``step`` (after that step's checkpoint, if one was due), still writing its liveness lines, until a stop
(SIGTERM/SIGINT) is requested or ``HOLD_LIMIT_S`` pass. A test that cancels "in the middle of a segment"
then needs no race against a fast machine (a 120-step tiny segment can end in a second).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable

CHECKPOINT_ENV = "TINYLLM_CHECKPOINT_KILL"
HOLD_ENV = "TINYLLM_HOLD_AT"
HOLD_LIMIT_S = 300.0


def kill_point(env: str, phase: str, step: int) -> None:
    target = os.environ.get(env)
    if target and target == f"{phase}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def hold_point(step: int, stopping: Callable[[], bool], alive: Callable[[], None]) -> bool:
    """Hold at ``step`` when ``TINYLLM_HOLD_AT`` names it (see the module docstring); else return at once.
    True when it held (``stopping`` is then worth asking again; it is never called otherwise: on
    distributed ranks asking is a collective)."""
    if os.environ.get(HOLD_ENV) != str(step):
        return False
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not stopping() and time.monotonic() < deadline:
        alive()  # timed: at most one liveness line every few seconds
        time.sleep(0.05)
    return True
