"""Continuing a run: what earlier workflows of the same run already finished.

A run that ended canceled or failed is continued by a fresh workflow (``train/<name>/2``)
whose input carries ``PriorWork``: the train results and suite outputs that earlier
workflows recorded as completed, by activity id, and the ids they scheduled. TrainRun then
runs only what is missing, so each checkpoint is still evaluated exactly once. It is input,
so replay stays deterministic.

Cadence waits: the wait after boundary ``b`` is skipped when an earlier workflow already
scheduled the next segment (its wait had ended). A wait that a cancel interrupted is waited
again in full, without repeating the evaluation before it.
"""

from __future__ import annotations

from typing import Any, Iterable

from contracts.activity_ids import is_eval, is_train

from .models import PriorWork, SuiteOutputs, TrainActivityResult

__all__ = ["PriorWork", "collect_prior"]


def collect_prior(histories: Iterable[Iterable[Any]]) -> PriorWork:
    """``PriorWork`` from the histories (lists of events with ``.type``/``.attrs``) of earlier workflows.

    Only ``train-*`` and ``eval-*`` activities that completed count; the first completion of
    an id wins (ids are idempotency keys: a later one would be the same work).
    """
    train: dict[str, TrainActivityResult] = {}
    evals: dict[str, SuiteOutputs] = {}
    scheduled: list[str] = []
    for events in histories:
        for e in events:
            aid = e.attrs.get("activity_id") if isinstance(e.attrs, dict) else None
            if not isinstance(aid, str):
                continue
            if e.type == "activity_scheduled" and aid not in scheduled:
                scheduled.append(aid)
            elif e.type == "activity_completed":
                if is_train(aid) and aid not in train:
                    train[aid] = TrainActivityResult.model_validate(e.attrs.get("result"))
                elif is_eval(aid) and aid not in evals:
                    evals[aid] = SuiteOutputs.model_validate(e.attrs.get("result"))
    return PriorWork(train=train, evals=evals, scheduled=sorted(scheduled))
