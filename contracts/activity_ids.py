"""The activity-id grammar: ids are idempotency keys that name what they do.

``train-000500`` is the training segment ending at step 500, ``eval-000500-ppl`` the ``ppl`` suite on that
checkpoint, ``eval-zoo`` a suite with no tag, ``corpus-default`` the build of corpus ``default``,
``publish...`` a release's publication. Formatted and parsed here only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRAIN_PREFIX = "train-"
EVAL_PREFIX = "eval-"
CORPUS_PREFIX = "corpus-"
PUBLISH_PREFIX = "publish"
_TRAIN = re.compile(r"^train-(\d+)$")


def step_tag(step: int) -> str:
    """The zero-padded end step that names a segment (``000500``)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{step:06d}"


def train_id(until: int) -> str:
    """The id of the segment that trains up to step ``until``."""
    return f"{TRAIN_PREFIX}{step_tag(until)}"


def eval_id(tag: str, suite: str) -> str:
    """``eval-<tag>-<suite>``, or ``eval-<suite>`` untagged (an EvalSuite workflow's own suite)."""
    return f"{EVAL_PREFIX}{tag}-{suite}" if tag else f"{EVAL_PREFIX}{suite}"


def corpus_id(name: str) -> str:
    return f"{CORPUS_PREFIX}{name}"


@dataclass(frozen=True)
class ActivityId:
    """What an id says: ``kind`` (train, eval, corpus, publish, other), the step (a segment's end, a tagged
    evaluation's checkpoint step) and the rest (an evaluation's suite, a corpus's name)."""

    kind: str
    step: int | None = None
    rest: str | None = None


def parse_activity_id(aid: str) -> ActivityId:
    """``train-000500`` -> train at 500; ``eval-000500-ppl`` -> eval at 500 of ``ppl``; ``eval-ppl`` (no tag)
    -> eval of ``ppl``; the step is the first ``-``-separated part of digits after the prefix."""
    aid = str(aid)
    if aid.startswith(TRAIN_PREFIX):
        head = aid.split("-")[1]
        return ActivityId("train", int(head) if head.isdigit() else None)
    if aid.startswith(EVAL_PREFIX):
        rest = aid[len(EVAL_PREFIX) :]
        head, _, tail = rest.partition("-")
        return ActivityId("eval", int(head) if head.isdigit() else None, tail if head.isdigit() and tail else rest)
    if aid.startswith(CORPUS_PREFIX):
        return ActivityId("corpus", None, aid[len(CORPUS_PREFIX) :])
    if aid.startswith(PUBLISH_PREFIX):
        return ActivityId("publish")
    return ActivityId("other")


def is_train(aid: object) -> bool:
    return str(aid).startswith(TRAIN_PREFIX)


def is_eval(aid: object) -> bool:
    return str(aid).startswith(EVAL_PREFIX)


def train_step(aid: object) -> int | None:
    """The end step a ``train-NNNNNN`` id names, or None."""
    m = _TRAIN.match(str(aid))
    return int(m.group(1)) if m else None
