"""The campaign's graceful preemption faults (issue 39): a polite stop of the process running the run.

- ``preempt``: SIGTERM to ``ctl train`` (or the ``ctl worker``) alone, as Kubernetes, docker and
  systemd send it to a container's or unit's main process;
- ``preempt-group``: SIGTERM to every process of the job at once, as Slurm sends it (ctl's process
  group and the trainer's, which runs in its own): the trainer gets it directly and from ctl.

Then the campaign waits for ctl to exit, as a scheduler does, and starts the same command again. The
oracle demands, besides what every run must satisfy (the final bits equal to the uninterrupted run's):

- ctl exits by itself within the stop's grace (default 25 s) plus a margin, with 143 (preempted,
  resumable; 0 only when nothing was left to do: a finished ``ctl train``, an idle worker), and leaves no
  trainer process behind;
- **0 steps lost**: every preempted training attempt (``activity_preempted`` in the history) was not
  killed at the grace, and the steps it had done (its ``stopping`` line, the furthest step its progress
  lines named, and the last per-step record of ``metrics.jsonl`` when it got as far as setting up:
  its ``ready`` line) are all in its checkpoint; and the next attempt of that activity resumed from that
  very checkpoint (its own resume line in the history).

A preemption fault is counted like the others: ``survived`` only in a run where some fault made a
trainer resume inside a segment (a preemption mid-segment does, from the checkpoint it wrote).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from contracts.activity_ids import is_train
from contracts.exits import EXIT_PREEMPTED
from contracts.layout import RunHome

from . import procs
from .campaign_progress import progress_step
from .campaign_targets import PREEMPT_FAULTS
from .core import steps_lost as lost_since


class Run(Protocol):
    """What a preemption fault uses of the campaign's run (simulator/proving/campaign.py ``Run``), named here so that
    this module does not import campaign.py back (campaign.py imports it)."""

    home: Path
    problems: list
    preempted: Any
    worker_mode: bool
    primary: Any

    def children(self) -> Any: ...

    def start(self, *args: Any, **kwargs: Any) -> Any: ...

    def _wait_gone(self, *args: Any, **kwargs: Any) -> Any: ...


KINDS = PREEMPT_FAULTS
STOP_WAIT_S = 25.0 + 60.0  # ctl's default --stop-grace, plus start-up and recording on a loaded machine
_STEP = re.compile(r"step-(\d+)$")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _ready(home: Path, name: str, activity: str, attempt: int) -> bool:
    """Did that attempt's trainer get as far as setting up (its ``ready`` line: metrics.jsonl cut back to its
    resume, so the file's last record is its own)?"""
    try:
        raw = RunHome(home).run(name).progress_file(activity, attempt).read_bytes()
    except OSError:
        return False
    for line in raw.splitlines():
        try:
            if json.loads(line).get("event") == "ready":
                return True
        except (ValueError, AttributeError):
            continue
    return False


def steps_lost(attrs: dict, reached: int | None) -> tuple[int, int | None, int]:
    """``(lost, done, saved)`` of one preempted training attempt (its ``activity_preempted`` attrs): done = the
    furthest of its ``stopping`` line (``stopping_step``) and ``reached`` (the run's last per-step record, when
    the attempt set up: None otherwise); saved = its checkpoint's step; lost = done - saved (core.steps_lost),
    or the event's own ``steps_lost`` (what ctl's runner saw in the progress lines) when larger."""
    saved = s if isinstance(s := attrs.get("step"), int) else 0
    lost, top = lost_since((attrs.get("stopping_step"), reached), saved)
    said = n if isinstance(n := attrs.get("steps_lost"), int) else 0
    return max(said, lost or 0), top, saved


def preempt(run: Run, kind: str, name: str, wid: str) -> str:
    """Apply one preemption fault to ``run`` now; what was done, in words (problems go to ``run.problems``)."""
    p = run.primary
    if p is None or p.poll() is not None:
        return f"{kind} (nothing running)"
    what = "ctl worker" if run.worker_mode else "ctl train"
    kids = [pid for pid, _ in run.children()]
    sent = time.time()  # (the history is read after: a ctl history now would take seconds the trainer trains on)
    if kind == "preempt":
        _signal(p.pid, signal.SIGTERM)
    else:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for pid in kids:
            _signal(pid, signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        run.problems.append(f"{kind}: {what} did not exit within {STOP_WAIT_S:.0f} s of SIGTERM")
        procs.killpg(p)
        err = ""
    rc = p.returncode
    if rc not in (EXIT_PREEMPTED, 0):
        run.problems.append(
            f"{kind}: {what} exited {rc} after SIGTERM, not 143 (preempted, resumable): {(err or '').strip()[-300:]}"
        )
    run._wait_gone(f"{kind} ({what} exited {rc})")
    lost, mine = [], []
    for e in procs.history(run.home, wid) or []:
        if e.get("time", 0) < sent:
            continue
        a = e.get("attrs") or {}
        aid = str(a.get("activity_id", ""))
        if e.get("type") != "activity_preempted" or not is_train(aid):
            continue
        reached = progress_step(run.home, name) if _ready(run.home, name, aid, int(a.get("attempt", 0))) else None
        n, done, saved = steps_lost(a, reached)
        mine.append({"activity_id": aid, "attempt": a.get("attempt"), "step": a.get("step"), "lost": n})
        if a.get("killed_at_grace"):
            run.problems.append(f"{kind}: {aid} attempt {a.get('attempt')} was killed at the stop's grace")
        if n:
            lost.append(f"{aid} lost {n}")
            how = f"done up to step {done}" if done is not None and done - saved == n else "as ctl's runner counted"
            run.problems.append(
                f"{kind}: {aid} attempt {a.get('attempt')} lost {n} step(s) ({how}), checkpoint at step {saved}"
            )
    run.preempted += mine
    run.start()
    where = ", ".join(f"{x['activity_id']} saved at step {x['step']}" for x in mine) or "no training in flight"
    how = "SIGTERM of" if kind == "preempt" else "SIGTERM of the whole job:"
    return f"{how} {what} (exit {rc}; {where}{'; ' + ', '.join(lost) if lost else ''}), started again"


def resume_violations(histories: dict[str, list[dict]]) -> list[str]:
    """0 steps lost across the restart: the attempt after each preempted training attempt resumed from the
    checkpoint that attempt saved (its own resume line, recorded as a heartbeat)."""
    bad = []
    for wid, events in histories.items():
        events = sorted(events, key=lambda e: e.get("seq", 0))
        for i, e in enumerate(events):
            a = e.get("attrs") or {}
            aid = str(a.get("activity_id", ""))
            if e.get("type") != "activity_preempted" or not is_train(aid) or not isinstance(a.get("step"), int):
                continue
            nxt = a.get("attempt", 0) + 1
            for f in events[i + 1 :]:
                b = f.get("attrs") or {}
                d = b.get("details")
                if (
                    f.get("type") == "activity_heartbeat"
                    and b.get("activity_id") == aid
                    and b.get("attempt") == nxt
                    and isinstance(d, dict)
                    and d.get("event") in ("resume", "start")
                ):
                    m = _STEP.search(str(d.get("resumed_from") or ""))
                    got = int(m.group(1)) if m else 0
                    if got < a["step"]:
                        bad.append(
                            f"{wid}: {aid} attempt {a.get('attempt')} was preempted with its checkpoint at step "
                            f"{a['step']}, attempt {nxt} resumed from step {got}: "
                            f"{a['step'] - got} step(s) lost"
                        )
                    elif got > a["step"]:  # the steps were saved, but the history says otherwise: a wrong record
                        bad.append(
                            f"{wid}: {aid} attempt {a.get('attempt')} was recorded preempted with its checkpoint "
                            f"at step {a['step']}, but attempt {nxt} resumed from step {got}: the preempted "
                            "event names a stale checkpoint"
                        )
                    break
    return bad
