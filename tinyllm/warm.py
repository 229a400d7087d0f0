"""What a warm trainer server (engine/_forkserver.py) loads once, before it forks each ``tinyllm train`` (and
each ``tinyllm eval`` of a run's evaluations).

``preload()`` runs in the server process only, in the order a cold ``tinyllm train`` does it:
``runtime_env.prepare()`` (MKL_CBWR, the OpenMP wait policy chosen by the load at the server's start,
the heap) before torch loads, then torch and the trainer's modules. It runs no tensor operation: a
fork copies only the forking thread, so nothing may have started a thread pool yet (the server checks
it is single-threaded; numpy's OpenBLAS would start one at import: ``OPENBLAS_NUM_THREADS=1`` in the
server only; training runs on torch, not numpy's BLAS). The thread count is still chosen per segment
by the forked trainer (``prepare(spec.threads)`` in tinyllm/cli.py), and MKL reads ``MKL_CBWR`` at its
first call, which happens in the child. Neither the count nor the wait policy changes any bit
(tinyllm/runtime_env.py), and a forked trainer starts from modules that ran nothing, so a warm
segment is the same computation as a cold one (tests/workflows/test_warm_start.py).
"""

from __future__ import annotations

import os

from . import runtime_env

MODULES = ("tinyllm.cli",)
"""The commands a warm server may run (``python -m tinyllm.cli ...``)."""
PRELOAD = ("tinyllm.warm:preload",)


def preload() -> None:
    """Import what ``tinyllm train`` imports, after what it sets before torch loads (see the module docstring)."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    runtime_env.prepare()
    runtime_env.PRELOADED.update(runtime_env.status().get("omp", {}))
    import torch  # noqa: F401

    from . import checkpoint, cli, evals, model, trainer  # noqa: F401
    from .validation import runner  # noqa: F401
