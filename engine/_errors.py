"""The engine's small exception hierarchy (shape after temporalio's).

Workflow code sees these from ``rt.execute_activity`` and ``rt.sleep``;
activity code raises ``NonRetryableError`` to fail a step at once.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class Unsupported(EngineError):
    """This backend lacks the capability asked of it (``app.backend.Backend``: its ``polite_stop`` and
    ``attempt_overrides`` flags say which it has). The Temporal adapter raises it for a polite stop
    (``request_stop``, ``stop_grace_s``: its workers stop by cancelling activities) and for per-attempt
    option overrides (``attempt_options``: the cluster schedules attempts with the recorded options)."""


class Canceled(EngineError):
    """The workflow was canceled (the seed's ErrCanceled).

    Raised inside workflow code at the command in flight (activity or timer),
    or at the next command after a cancel request. A workflow that lets it
    propagate ends in state ``canceled``.
    """


class Preempted(EngineError):
    """Raised by an activity whose attempt ended on a polite stop (SIGTERM, SIGINT, a preemption signal):
    its process checkpointed where it was and exited, or was killed when the stop's grace ran out.

    Not a failure: the worker records it as ``activity_preempted``, counts no retry for it, makes the
    activity due again at once, and stops (engine/_worker.py). ``signal``: the signal's name;
    ``checkpoint``/``step``: the last checkpoint the attempt reported (None: none); ``stopping_step``:
    the step the trainer had reached when it saw the stop (its ``stopping`` progress line), so
    ``steps_lost`` is ``stopping_step - step`` when both are known; ``killed_at_grace``: it did not exit
    within the grace and was killed.
    """

    def __init__(
        self,
        message: str,
        *,
        signal: str | None = None,
        checkpoint: str | None = None,
        step: int | None = None,
        stopping_step: int | None = None,
        last_step: int | None = None,
        killed_at_grace: bool = False,
    ):
        super().__init__(message)
        self.signal = signal
        self.checkpoint = checkpoint
        self.step = step
        self.stopping_step = stopping_step
        self.last_step = last_step
        self.killed_at_grace = killed_at_grace

    @property
    def steps_lost(self) -> int | None:
        """Steps trained and not saved, as far as the progress lines tell (None: unknown)."""
        reached = max((s for s in (self.stopping_step, self.last_step) if s is not None), default=None)
        if reached is None:
            return None
        return max(0, reached - (self.step or 0))

    def attrs(self) -> dict:
        """What the ``activity_preempted`` event records of it."""
        return {
            "signal": self.signal,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "stopping_step": self.stopping_step,
            "steps_lost": self.steps_lost,
            "killed_at_grace": self.killed_at_grace,
            "message": str(self),
        }


class NonRetryableError(EngineError):
    """Raised by an activity to fail its step at once, without retries.

    ``type`` names the failure (e.g. ``"BadSpec"``) so that a RetryPolicy's
    ``non_retryable`` list and the recorded history can name it.
    """

    def __init__(self, message: str, *, type: str = "NonRetryableError", details: object = None):
        super().__init__(message)
        self.type = type
        self.details = details


class ActivityError(EngineError):
    """An activity failed for good: non-retryable, out of attempts, or timed out.

    Raised in workflow code by ``rt.execute_activity``. ``__cause__`` holds a
    ``Canceled`` when the activity ended because of a cancel.
    """

    def __init__(
        self,
        message: str,
        *,
        activity_id: str,
        activity_name: str,
        attempt: int,
        type: str = "ActivityError",
        non_retryable: bool = False,
        details: object = None,
    ):
        super().__init__(message)
        self.activity_id = activity_id
        self.activity_name = activity_name
        self.attempt = attempt
        self.type = type
        self.non_retryable = non_retryable
        self.details = details


class NondeterminismError(EngineError):
    """Workflow code issued a command that differs from the recorded history.

    The workflow stops in state ``failed`` with this error; nothing recorded is
    re-run or rewritten.
    """


class WorkflowFailed(EngineError):
    """``Engine.result`` of a workflow that ended failed; carries the recorded error."""

    def __init__(self, message: str, *, workflow_id: str, type: str, details: object = None):
        super().__init__(message)
        self.workflow_id = workflow_id
        self.type = type
        self.details = details


class WorkflowCanceled(Canceled):
    """``Engine.result`` of a workflow that ended canceled."""

    def __init__(self, message: str, *, workflow_id: str):
        super().__init__(message)
        self.workflow_id = workflow_id


class LeaseLost(EngineError):
    """Raised by ``ctx.heartbeat`` (and the like) in an attempt that is no longer current.

    Its lease timed out or another attempt (a higher fencing token) took over;
    the stale attempt must stop. Whatever it returns afterwards is discarded.
    """


class WorkflowRunning(EngineError):
    """``Engine.result`` of a workflow that has not finished yet."""


class NotFound(EngineError):
    """No workflow with that id, or no workflow/activity registered under that name."""


class BadInput(EngineError):
    """A malformed id, an input that does not validate, a corrupt or foreign database."""


class DamagedRecord(BadInput):
    """A record of the database that cannot be read back as written (bad JSON or UTF-8, a checksum
    that does not match, a page SQLite calls malformed). Nothing is written on its account: the
    message names the database, the workflow and the record; ``ctl doctor`` lists them all."""

    def __init__(self, message: str, *, workflow_id: str | None = None, record: str | None = None):
        super().__init__(message)
        self.workflow_id = workflow_id
        self.record = record


def is_canceled(err: BaseException | None) -> bool:
    """True when ``err`` is, or wraps (through ``__cause__``/``__context__``), a ``Canceled``."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, Canceled):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
