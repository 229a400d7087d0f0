"""Step options of the workflows' activities: idempotency-key ids, timeouts, retries.

Ids name what they do (pitfall 2): ``train-000500`` is the segment ending at step 500,
``eval-000500-ppl`` the ppl suite on that checkpoint, ``eval-zoo`` a suite with no tag.
"""

from __future__ import annotations

from contracts.activity_ids import corpus_id, eval_id, train_id
from engine import RetryPolicy, StepOptions

# A command that writes no progress line for its heartbeat timeout is presumed hung: its process tree is
# stopped and the attempt redelivered (engine/subprocess_runner.py). The timeout must cover the longest
# silent phase: tinyllm writes a liveness line before and after the torch import, when set up, and every
# 2 s of training or evaluation, so what remains is one import, one step, one checkpoint write or one
# validation pass (a few seconds for tinyllm on CPU; raise it with TrainRunInput.train_heartbeat_timeout_s).
TRAIN_HEARTBEAT_TIMEOUT_S = 60.0
TRAIN_START_TO_CLOSE_S = 7 * 24 * 3600.0  # a segment may train for days
# tinyllm eval --progress writes liveness lines every 2 s of work; an evaluation silent this long is stopped and
# its attempt retried (the default of TrainRunInput.eval_heartbeat_timeout_s: `ctl train --eval-heartbeat-timeout`)
EVAL_HEARTBEAT_TIMEOUT_S = 120.0
EVAL_START_TO_CLOSE_S = 24 * 3600.0
CORPUS_START_TO_CLOSE_S = 6 * 3600.0  # tinyllm corpus writes no progress lines: no heartbeat timeout
NON_RETRYABLE = ("BadInput",)


def train_options(
    until: int, *, heartbeat_timeout_s: float = TRAIN_HEARTBEAT_TIMEOUT_S, max_attempts: int = 5
) -> StepOptions:
    """Options of the segment that trains up to step ``until``: retried, heartbeat-watched."""
    return StepOptions(
        id=train_id(until),
        start_to_close_timeout_s=TRAIN_START_TO_CLOSE_S,
        heartbeat_timeout_s=heartbeat_timeout_s,
        retry=RetryPolicy(
            max_attempts=max_attempts,
            initial_interval_s=1.0,
            backoff=2.0,
            max_interval_s=60.0,
            non_retryable=NON_RETRYABLE,
        ),
    )


def eval_options(tag: str, suite: str, heartbeat_timeout_s: float = EVAL_HEARTBEAT_TIMEOUT_S) -> StepOptions:
    """Options of one suite's evaluation: ``eval-<tag>-<suite>``, or ``eval-<suite>`` untagged; an evaluation
    silent (no progress line) for ``heartbeat_timeout_s`` is stopped and retried."""
    return StepOptions(
        id=eval_id(tag, suite),
        start_to_close_timeout_s=EVAL_START_TO_CLOSE_S,
        heartbeat_timeout_s=heartbeat_timeout_s,
        retry=RetryPolicy(max_attempts=3, initial_interval_s=1.0, non_retryable=NON_RETRYABLE),
    )


def corpus_options(name: str) -> StepOptions:
    """Options of the corpus build of ``name``."""
    return StepOptions(
        id=corpus_id(name),
        start_to_close_timeout_s=CORPUS_START_TO_CLOSE_S,
        heartbeat_timeout_s=None,
        retry=RetryPolicy(max_attempts=3, initial_interval_s=1.0, non_retryable=NON_RETRYABLE),
    )
