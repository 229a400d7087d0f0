"""What a campaign run is measured by: its training progress (where faults are scheduled) and the
engine's history (which trainer attempts resumed from a checkpoint inside a segment).

Faults are scheduled by progress, not by wall time, so that they land inside the run whatever the
machine's speed: each is due at a step of the run, drawn as a plain step, a checkpoint step or a
segment boundary (``fault_points``; a one-segment spec's only boundary is the run's end). A plain
step is due once the trainer has reached it (``progress_step``: the newest of metrics.jsonl's last
frame and LATEST); a checkpoint or a segment boundary once that checkpoint exists (``latest_step``:
LATEST's step), so that a kill there lands after the checkpoint, not in the step before it (a
trainer writes a step's metrics frame before its checkpoint), and one at a segment's end lands
between its last checkpoint and ctl recording the segment (its retry resumes at the segment's end).

A resume is counted from the engine's history, whatever the trainer: an attempt of a train activity
(``train-EEEEEE``, the segment ending at E) that started after a checkpoint of that activity was
heartbeated (the activity resumes from it, or from LATEST if newer), at a step strictly inside a
segment (not 0, not a segment's end). When the attempt's own resume line is in the history (a trainer's
``{"event": "resume", "resumed_from": ...}`` progress line, or the helper's ``"start"`` (fresh), recorded
as a heartbeat: tinyllm's, the helper's and the integrations'), its checkpoint decides instead: a kill after checkpoint N but before its heartbeat resumes
from N (LATEST), which the heartbeats alone do not show. A run with none tested no resume: it is
``untested``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from contracts.activity_ids import train_step
from contracts.layout import RunHome

from .core import last_step, latest_step, resumed_inside

_STEP = re.compile(r"step-(\d+)$")


def fault_points(
    rng: random.Random, n: int, steps: int, checkpoint_every: int, eval_every: int
) -> list[tuple[str, int]]:
    """``n`` seeded (what, step) points, sorted: a step after which to apply each fault."""
    every = max(1, checkpoint_every)
    ckpts = [c for c in range(every, steps, every)] or [max(1, steps // 2)]
    bounds = [e for e in range(eval_every, steps, eval_every)] if 0 < eval_every < steps else [steps]
    points = []
    for _ in range(n):
        kind = rng.choice(("step", "checkpoint", "segment"))
        if kind == "step":
            points.append(("step", rng.randint(1, max(1, steps - 1))))
        elif kind == "checkpoint":
            points.append(("checkpoint", rng.choice(ckpts)))
        else:
            points.append(("segment boundary", rng.choice(bounds)))
    return sorted(points, key=lambda p: p[1])


def progress_step(home: Path, name: str) -> int:
    """How far the run's trainer has got: the newest of metrics.jsonl's last frame and LATEST's step."""
    best = latest_step(home, name)
    step = last_step(RunHome(home).run(name).metrics, tail_bytes=8192)
    return best if step is None else max(best, step)


def history_resumes(histories: dict[str, list[dict]]) -> list[tuple[str, int, int]]:
    """``(activity id, attempt, step)`` of each train attempt that resumed from a checkpoint inside a
    segment, from the events of all the run's workflows (in time order)."""
    events = sorted((e for evs in histories.values() for e in evs), key=lambda e: (e.get("time", 0), e.get("seq", 0)))
    ends = {0} | {s for e in events if (s := train_step(e.get("attrs", {}).get("activity_id", ""))) is not None}
    said: dict[int, int] = {}  # id(activity_started event) -> what that attempt's trainer said it resumed from
    for evs in histories.values():  # (per workflow: a continuation /2 has its own train-E attempt 1)
        started: dict[tuple[str, int], dict] = {}
        for e in sorted(evs, key=lambda e: (e.get("time", 0), e.get("seq", 0))):
            attrs = e.get("attrs") or {}
            key = (str(attrs.get("activity_id", "")), int(attrs.get("attempt", 0)))
            details = attrs.get("details")
            if e.get("type") == "activity_started":
                started[key] = e
            elif (
                e.get("type") == "activity_heartbeat"
                and isinstance(details, dict)
                and key in started
                and details.get("event") in ("resume", "start")
            ):
                m = _STEP.search(str(details.get("resumed_from") or ""))
                said[id(started[key])] = int(m.group(1)) if m else 0
    heartbeated: dict[str, int] = {}
    out = []
    for e in events:
        attrs = e.get("attrs") or {}
        aid = str(attrs.get("activity_id", ""))
        if train_step(aid) is None:
            continue
        if e.get("type") == "activity_heartbeat":
            details = attrs.get("details")
            m = _STEP.search(str(details.get("checkpoint", ""))) if isinstance(details, dict) else None
            if m:
                heartbeated[aid] = max(heartbeated.get(aid, 0), int(m.group(1)))
        elif e.get("type") == "activity_started":
            attempt = int(attrs.get("attempt", 0))
            step = said.get(id(e), heartbeated.get(aid))
            if step is not None and resumed_inside(step, ends):
                out.append((aid, attempt, step))
    return out
