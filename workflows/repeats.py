"""A deterministic failure is not retried blindly: the same failure at the same point twice in a row stops.

A train attempt that fails (its command exits non-zero) records ``failure-<attempt>.json`` in its activity
folder: the error's type and message (the runner's message ends with the command's last stderr line, e.g.
``ValueError: Tried to step 41 times``) and the point it failed at -- the step of the newest checkpoint the
segment has at or before its end, i.e. the step the next attempt would resume from. When attempt N fails with
the same type and message at the same point as attempt N-1, attempt N+1 would replay the same steps from the
same checkpoint into the same failure: the segment fails for good at once (``RepeatedFailure``, not retried),
with one line saying so, instead of using up every attempt with growing waits (5 attempts, ~1 minute).

A failure with another message, or after a new checkpoint (the attempt made progress: a transient failure
such as a lost machine or memory pressure at a different step), is retried as before; so is a hang (a
progress timeout: a slow step is not a crash), a trainer killed by a signal (SIGKILL from outside, the OOM
killer: exit < 0), a run directory locked by another trainer (exit 75) and an attempt lost with its worker:
none of these is recorded, so they also break a chain of equal failures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.exits import EXIT_LOCKED
from engine import NonRetryableError

RECORD = "failure-{attempt}.json"
TRANSIENT_EXITS = (EXIT_LOCKED,)  # tinyllm's "run directory locked by another live trainer": retried, whatever repeats


def _read(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def check_repeat(work: Path, attempt: int, error: Any, point: int | None) -> NonRetryableError | None:
    """Record attempt ``attempt``'s failure in ``work``; the error to raise instead when attempt ``attempt - 1``
    failed the same way at the same point, else None (retried as the policy says)."""
    code = getattr(error, "returncode", None)
    if not isinstance(code, int) or code <= 0 or code in TRANSIENT_EXITS:
        return None  # killed by a signal, or a lock held by another trainer: not the trainer's own doing
    record = {"type": str(getattr(error, "type", type(error).__name__)), "message": str(error), "point": point}
    try:
        (work / RECORD.format(attempt=attempt)).write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
    except OSError:
        pass  # a record that cannot be written only means this failure is retried as before
    before = _read(work / RECORD.format(attempt=attempt - 1)) if attempt > 1 else None
    if before != record:
        return None
    where = f"at step {point} (no new checkpoint between them)" if point is not None else "before any checkpoint"
    return NonRetryableError(
        f"{error} -- the same failure {where} in attempts {attempt - 1} and {attempt}: not retried again, a "
        f"deterministic failure (fix its cause, then run the same command: it continues from the last checkpoint)",
        type="RepeatedFailure",
        details=getattr(error, "details", None),
    )
