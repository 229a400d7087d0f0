"""Activity options: ids, timeouts and the retry policy (keyword-only, units last)."""

from __future__ import annotations

from dataclasses import dataclass

from ._history import dumps


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed activity attempt is retried."""

    max_attempts: int = 3
    """Attempts in all, the first included; 0 means unlimited."""
    initial_interval_s: float = 1.0
    """Wait before the second attempt."""
    backoff: float = 2.0
    """Each later wait is the previous one times this."""
    max_interval_s: float = 60.0
    """No wait is longer than this."""
    non_retryable: tuple[str, ...] = ()
    """Error types (``NonRetryableError.type`` or the exception class name) that fail at once."""

    def delay_s(self, attempt: int) -> float:
        """Wait before attempt ``attempt + 1`` after attempt ``attempt`` (1-based) failed."""
        return min(self.initial_interval_s * self.backoff ** max(attempt - 1, 0), self.max_interval_s)


_RETRY_TEXT: dict[tuple, str] = {}  # StepOptions.to_text
DEFAULT_RETRY = RetryPolicy()
"""The policy of a ``StepOptions`` given none (frozen: one instance serves them all)."""


@dataclass(frozen=True)
class StepOptions:
    """Options of one activity command; ``id`` is its idempotency key within the workflow."""

    id: str
    """Unique within the workflow, stable across replays (e.g. ``train-000500``)."""
    start_to_close_timeout_s: float | None = None
    """An attempt running longer than this is timed out (and retried per ``retry``)."""
    heartbeat_timeout_s: float | None = None
    """An attempt silent for longer than this is timed out and redelivered."""
    retry: RetryPolicy = DEFAULT_RETRY
    """Retry policy for failed or timed-out attempts."""

    def to_json(self) -> dict:
        """The options as recorded in history (JSON): a fresh dict each call (the same keys as
        ``dataclasses.asdict``, written out: ``asdict`` deep-copies and cost a fifth of an activity)."""
        r = self.retry
        return {
            "id": self.id,
            "start_to_close_timeout_s": self.start_to_close_timeout_s,
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "retry": {
                "max_attempts": r.max_attempts,
                "initial_interval_s": r.initial_interval_s,
                "backoff": r.backoff,
                "max_interval_s": r.max_interval_s,
                "non_retryable": list(r.non_retryable),
            },
        }

    def to_text(self) -> str:
        """``dumps(self.to_json())``, written out (an activity's largest JSON): the retry policy's text
        is kept per policy (a few distinct policies in a program)."""
        r = self.retry
        retry = r.__dict__.get("_text")  # kept on the (frozen) policy itself, else per equal policy
        if retry is None:
            # keyed with the types: 1 == 1.0 == True, but their texts differ
            key: tuple | None
            key = (
                r.max_attempts,
                r.initial_interval_s,
                r.backoff,
                r.max_interval_s,
                r.non_retryable,
                type(r.max_attempts),
                type(r.initial_interval_s),
                type(r.backoff),
                type(r.max_interval_s),
                tuple(map(type, r.non_retryable)) if type(r.non_retryable) is tuple else None,
            )
            try:
                retry = _RETRY_TEXT.get(key)
            except TypeError:  # an unhashable field: not kept
                key, retry = None, None
            if retry is None:
                retry = dumps(self.to_json()["retry"])
                if key is not None and len(_RETRY_TEXT) < 256:
                    _RETRY_TEXT[key] = retry
            if key is not None:
                object.__setattr__(r, "_text", retry)
        return (
            f'{{"heartbeat_timeout_s":{dumps(self.heartbeat_timeout_s)},"id":{dumps(self.id)},"retry":{retry},'
            f'"start_to_close_timeout_s":{dumps(self.start_to_close_timeout_s)}}}'
        )

    @classmethod
    def from_json(cls, d: dict) -> "StepOptions":
        r = dict(d.get("retry") or {})
        r["non_retryable"] = tuple(r.get("non_retryable") or ())
        return cls(**{**d, "retry": RetryPolicy(**r)})


def attempt_deadlines(opts: StepOptions, now: float) -> tuple[float | None, float | None]:
    """Heartbeat and start-to-close deadlines of an attempt leased at ``now``."""
    hb = now + opts.heartbeat_timeout_s if opts.heartbeat_timeout_s else None
    close = now + opts.start_to_close_timeout_s if opts.start_to_close_timeout_s else None
    return hb, close
