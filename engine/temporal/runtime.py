"""The ``Runtime`` seam on Temporal: what a workflow function sees when a Temporal worker runs it.

``TemporalRuntime`` maps each seam call onto the Temporal Python SDK's workflow API:

- ``execute_activity(name, input, options)`` -> ``workflow.execute_activity`` with the activity id
  (``options.id``, the idempotency key) as Temporal's activity id and summary and as the activity's
  second argument, the timeouts, the ``RetryPolicy`` field by field (``non_retryable`` as
  non-retryable error types) and ``WAIT_CANCELLATION_COMPLETED``, so that a cancel waits for the
  activity's checkpoint. Failures come back as ``engine.errors.ActivityError`` (a cancel as one
  whose ``__cause__`` is ``Canceled``), exactly as on the embedded engine.
- ``sleep`` -> ``workflow.sleep`` (a durable timer); ``now()`` -> ``workflow.now()``.
- A command issued after the workflow's cancel was requested raises ``Canceled``.

``run_registered`` runs a registered workflow function (``async def f(rt, input)``) and turns its
outcome into Temporal's: a result (JSON), a cancel (``CancelledError``) or a workflow failure
(``ApplicationError`` carrying the engine error's type, message and details).

This module is imported by the workflow sandbox as a pass-through module (it and its imports are
deterministic: no file I/O, no clocks, no torch).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from collections.abc import Sequence
from typing import Any, Callable

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy as TemporalRetryPolicy
from temporalio.exceptions import ActivityError as TemporalActivityError
from temporalio.exceptions import ApplicationError, CancelledError, TimeoutError as TemporalTimeoutError
from temporalio.workflow import ActivityCancellationType

from .._errors import ActivityError, Canceled, EngineError, NondeterminismError, is_canceled
from .._history import to_jsonable
from .._options import RetryPolicy, StepOptions

DEFAULT_START_TO_CLOSE_S = 30 * 24 * 3600.0  # Temporal needs one; the seam's None means "no limit"

# name -> (workflow function, input type); the same functions on every backend
_WORKFLOWS: dict[str, tuple[Callable, Any]] = {}


def register_workflow(name: str, fn: Callable, input_type: Any = None) -> None:
    """Make ``fn`` the workflow of type ``name`` for every Temporal worker of this process."""
    known = _WORKFLOWS.get(name)
    if known is not None and (known[0] is not fn or known[1] is not input_type):
        raise ValueError(f"workflow {name!r} is already registered with another function")
    _WORKFLOWS[name] = (fn, input_type)


def registered(name: str) -> tuple[Callable, Any]:
    try:
        return _WORKFLOWS[name]
    except KeyError:
        raise ApplicationError(
            f"no workflow registered under {name!r} on this worker", type="NotFound", non_retryable=True
        ) from None


def retry_policy(p: RetryPolicy) -> TemporalRetryPolicy:
    """The seam's RetryPolicy, field by field (0 attempts means unlimited on both)."""
    return TemporalRetryPolicy(
        initial_interval=timedelta(seconds=p.initial_interval_s),
        backoff_coefficient=p.backoff,
        maximum_interval=timedelta(seconds=max(p.max_interval_s, p.initial_interval_s)),
        maximum_attempts=p.max_attempts,
        non_retryable_error_types=list(p.non_retryable),
    )


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def _error_info(err: BaseException | None) -> tuple[str, str, Any, bool]:
    """(type, message, details, non_retryable) of an activity failure's cause."""
    if isinstance(err, ApplicationError):
        details = err.details[0] if err.details else None
        return err.type or "ApplicationError", err.message, details, bool(err.non_retryable)
    if isinstance(err, TemporalTimeoutError):
        return "TimedOut", f"{err.type.name.lower() if err.type else 'timeout'}: {err.message}", None, False
    if err is None:
        return "ActivityError", "", None, False
    return type(err).__name__, str(err), None, False


class TemporalRuntime:
    """``engine._seam.Runtime`` inside a Temporal workflow (see the module docstring)."""

    @property
    def workflow_id(self) -> str:
        return workflow.info().workflow_id

    @property
    def is_replaying(self) -> bool:
        return workflow.unsafe.is_replaying()

    def now(self) -> float:
        return workflow.now().timestamp()

    def _check_cancel(self) -> None:
        if workflow.cancellation_reason() is not None:
            raise Canceled(f"workflow {self.workflow_id!r} was canceled")

    async def execute_activity(self, name: str, input: Any, options: StepOptions, *, result_type: Any = None) -> Any:
        if not isinstance(options, StepOptions):
            raise TypeError(f"options must be a StepOptions, got {type(options).__name__}")
        self._check_cancel()
        try:
            result = await workflow.execute_activity(
                name,
                args=[to_jsonable(input), options.id],
                activity_id=options.id,
                summary=options.id,
                start_to_close_timeout=_seconds(options.start_to_close_timeout_s or DEFAULT_START_TO_CLOSE_S),
                heartbeat_timeout=_seconds(options.heartbeat_timeout_s),
                retry_policy=retry_policy(options.retry),
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except TemporalActivityError as e:
            cause = e.cause
            if isinstance(cause, CancelledError):
                err = ActivityError(
                    f"activity {options.id!r} canceled",
                    activity_id=options.id,
                    activity_name=name,
                    attempt=0,
                    type="Canceled",
                )
                raise err from Canceled(f"workflow {self.workflow_id!r} was canceled")
            kind, message, details, non_retryable = _error_info(cause)
            raise ActivityError(
                f"activity {options.id!r} failed: {kind}: {message}",
                activity_id=options.id,
                activity_name=name,
                attempt=0,
                type=kind,
                non_retryable=non_retryable or kind in options.retry.non_retryable,
                details=details,
            ) from None
        except asyncio.CancelledError:
            raise Canceled(f"workflow {self.workflow_id!r} was canceled") from None
        if result_type is not None and hasattr(result_type, "model_validate"):
            return result_type.model_validate(result)
        return result

    async def sleep(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or seconds < 0 or math.isnan(seconds):
            raise ValueError(f"sleep needs a non-negative number of seconds, got {seconds}")
        self._check_cancel()
        try:
            await workflow.sleep(seconds, summary=f"sleep {seconds:g}s")
        except asyncio.CancelledError:
            raise Canceled(f"timer canceled: workflow {self.workflow_id!r} was canceled") from None


def _failure(err: BaseException) -> ApplicationError:
    """A workflow error as Temporal's workflow failure: type, message, details and non-retryable."""
    kind = getattr(err, "type", None)
    kind = kind if isinstance(kind, str) else type(err).__name__
    details: dict[str, Any] = {"class": type(err).__name__}
    for attr in ("activity_id", "non_retryable", "details"):
        value = getattr(err, attr, None)
        if value is not None:
            details[attr] = value
    cause = err.__cause__ or err.__context__
    if cause is not None and cause is not err:
        details["cause"] = {"type": getattr(cause, "type", None) or type(cause).__name__, "message": str(cause)}
    return ApplicationError(str(err), details, type=kind, non_retryable=True)


async def run_registered(args: Sequence[RawValue]) -> Any:
    """Run the workflow function registered under this workflow's type with its (JSON) input."""
    fn, input_type = registered(workflow.info().workflow_type)
    raw = workflow.payload_converter().from_payload(args[0].payload) if args else None
    try:
        value = (
            input_type.model_validate(raw) if input_type is not None and hasattr(input_type, "model_validate") else raw
        )
    except Exception as e:  # noqa: BLE001 - a bad input fails the workflow, not its task
        raise ApplicationError(
            f"invalid workflow input: {str(e).splitlines()[0]}", type="BadInput", non_retryable=True
        ) from None
    try:
        return to_jsonable(await fn(TemporalRuntime(), value))
    except (ApplicationError, CancelledError):
        raise
    except asyncio.CancelledError:
        raise CancelledError("workflow canceled") from None
    except BaseException as e:  # noqa: BLE001 - mapped onto Temporal's outcome below
        if is_canceled(e):
            raise CancelledError(str(e)) from None
        if isinstance(e, (EngineError, ValueError, TypeError, KeyError)) and not isinstance(e, NondeterminismError):
            raise _failure(e) from None
        raise  # anything else fails the workflow task (a bug to fix and redeploy; Temporal retries it)
