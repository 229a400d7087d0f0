"""Test-only fault injection: SIGKILL this process at a named point, chosen by an environment variable.

``<ENV>=<phase>@<step>`` makes the process send itself SIGKILL when it reaches ``phase`` at model
step ``step``: a real, uncatchable kill at a deterministic point, so tests need no timing. Unset in
normal use; then a kill point is one dictionary lookup and nothing else.

- ``TINYLLM_VALIDATION_KILL``: the phases of a durable validation (tinyllm/validation/faults.py);
- ``TINYLLM_CHECKPOINT_KILL``: ``between_renames`` (re-saving an existing step: the old directory
  renamed away, the new one not yet in place -- tinyllm/checkpoint.py).
"""
from __future__ import annotations

import os
import signal

CHECKPOINT_ENV = "TINYLLM_CHECKPOINT_KILL"


def kill_point(env: str, phase: str, step: int) -> None:
    target = os.environ.get(env)
    if target and target == f"{phase}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
