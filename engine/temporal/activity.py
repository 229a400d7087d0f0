"""The ``ActivityContext`` seam on a Temporal worker, and the one dynamic activity that runs them.

An activity function ``fn(ctx, input)`` (the embedded engine's, unchanged) runs in a worker thread:

- ``ctx.heartbeat(details)`` -> ``activity.heartbeat(details)``. Temporal keeps only the latest
  details, so a heartbeat without details re-sends the last ones (the checkpoint is never lost).
- ``ctx.last_heartbeat_details`` -> ``activity.info().heartbeat_details`` of the earlier attempt:
  a redelivered train attempt resumes from the last heartbeated checkpoint.
- ``ctx.cancel_requested`` -> ``activity.is_cancelled()``. A cancel reaches an activity only with
  the answer to one of its heartbeats; the worker's heartbeat throttle bounds the delay.

The SDK's default for thread activities (raise ``CancelledError`` inside the thread at any line)
is off: the subprocess runner sees ``cancel_requested``, sends SIGTERM, the trainer checkpoints and
exits 130. Outcomes map onto Temporal's: ``Canceled`` -> ``CancelledError`` when the workflow asked
(else a retryable ``Abandoned``: worker shutdown or a timed-out attempt), ``NonRetryableError`` ->
a non-retryable ``ApplicationError`` of its type, anything else a retryable ``ApplicationError``
named after the error (``SubprocessFailed``...).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Callable, Mapping

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, CancelledError

from .. import _proctree as proctree
from .._errors import NonRetryableError, is_canceled
from .._options import StepOptions


class TemporalActivityContext:
    """``engine._seam.ActivityContext`` over ``temporalio.activity`` (see the module docstring)."""

    def __init__(self, activity_id: str, on_heartbeat: Callable[[str, Any], None] | None = None):
        info = activity.info()
        self._info = info
        self._activity_id = activity_id
        details = list(info.heartbeat_details or ())
        self._last = details[0] if details else None
        self._earlier = self._last
        self._on_heartbeat = on_heartbeat

    @property
    def workflow_id(self) -> str:
        assert self._info.workflow_id is not None  # (an activity of a workflow, never a standalone one)
        return self._info.workflow_id

    @property
    def activity_id(self) -> str:
        return self._activity_id

    @property
    def activity_name(self) -> str:
        return self._info.activity_type

    @property
    def attempt(self) -> int:
        return self._info.attempt

    @property
    def last_heartbeat_details(self) -> Any:
        return self._earlier

    @property
    def options(self) -> StepOptions:
        """The attempt's options as far as the runner needs them (its heartbeat timeout: hung-child limit)."""
        hb = self._info.heartbeat_timeout
        return StepOptions(id=self._activity_id, heartbeat_timeout_s=hb.total_seconds() if hb else None)

    @property
    def process_tag(self) -> str:
        """Tags the attempt's processes (engine/_proctree.py): scope = the cluster and namespace."""
        scope = hashlib.sha256(f"temporal|{self._info.workflow_namespace}".encode()).hexdigest()[:16]
        return proctree.attempt_tag(scope, self.workflow_id, self._activity_id, self.attempt)

    @property
    def cancel_requested(self) -> bool:
        return activity.is_cancelled()

    def heartbeat(self, details: Any = None) -> None:
        if details is not None:
            self._last = details
            if self._on_heartbeat is not None:
                self._on_heartbeat(self._activity_id, details)
        if self._last is None:
            activity.heartbeat()
        else:
            activity.heartbeat(self._last)


def _outcome_error(err: BaseException) -> BaseException:
    if is_canceled(err):
        details = activity.cancellation_details()
        if details is not None and details.cancel_requested:
            return CancelledError(str(err))
        return ApplicationError(
            f"attempt abandoned ({err}); the next attempt resumes from its checkpoint", type="Abandoned"
        )
    if isinstance(err, NonRetryableError):
        return ApplicationError(
            str(err), *([err.details] if err.details is not None else []), type=err.type, non_retryable=True
        )
    kind = getattr(err, "type", None)
    details = getattr(err, "details", None)
    return ApplicationError(
        str(err) or type(err).__name__,
        *([details] if details is not None else []),
        type=kind if isinstance(kind, str) else type(err).__name__,
    )


def seam_activity(
    activities: Mapping[str, Callable[[Any, Any], Any]], on_heartbeat: Callable[[str, Any], None] | None = None
) -> Callable:
    """One dynamic Temporal activity that runs ``activities[activity_type](ctx, input)``."""
    table = dict(activities)

    @activity.defn(dynamic=True, no_thread_cancel_exception=True)
    def run_seam_activity(args: Sequence[RawValue]) -> Any:
        info = activity.info()
        fn = table.get(info.activity_type)
        if fn is None:
            raise ApplicationError(
                f"no activity {info.activity_type!r} on this worker (known: {sorted(table)})",
                type="NotFound",
                non_retryable=True,
            )
        convert = activity.payload_converter()
        values = [convert.from_payload(a.payload) for a in args]
        activity_id = str(values[1]) if len(values) > 1 else info.activity_id
        ctx = TemporalActivityContext(activity_id, on_heartbeat)
        try:
            result = fn(ctx, values[0] if values else None)
        except ApplicationError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is reported to Temporal as one of ours
            raise _outcome_error(e) from None
        return result.model_dump(mode="json") if hasattr(result, "model_dump") else result

    return run_seam_activity
