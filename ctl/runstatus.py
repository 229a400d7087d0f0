"""``ctl status ID`` of a training run: who runs it, how far it is, what it waits for.

``describe(engine, home, workflow_id, now)`` returns the ``--json`` fields that ``ctl status``
adds to ``app.outcome_json`` (stable; docs/ctl.md "Watching a run" documents them):

* ``worker``: ``{"live": bool, "activity_id", "attempt", "pid", "host", "lease_age_s",
  "heartbeat_age_s"}`` of the activity attempt in flight, or, when nothing is in flight,
  ``{"live": false/null, ...}``; ``null`` for an ended workflow. ``live`` is false when the
  lease's owner process is known dead or the heartbeat deadline passed, or when a timer or an
  activity has been due for longer than ``OVERDUE_S`` without any worker taking it, or when nothing
  is in flight and no ``ctl`` process runs the workflow (ctl/presence.py). With an attempt in
  flight also ``heartbeat_timeout_s`` and ``waiting_for`` (``waiting_for()``: what it waits for and
  how long it has made no progress).
* ``progress``: ``{"phase", "step", "total_steps", "last_loss", "last_checkpoint",
  "last_checkpoint_step", "last_eval", "eval_progress", "eta_s", "segments_done", "segments"}``;
  ``eval_progress`` is ``{"done", "of", "unit", "eta_s"}`` of the evaluation in flight, from its
  attempt's progress file (ctl/evalprogress.py), or null (none in flight, or no counts written).
* ``timers``: ``[{"fire_at", "fire_at_local", "remaining_s"}]`` of pending timers.

Reads the engine's tables through the engine's own connection (``engine.store.query``),
``runs/<name>/metrics.jsonl`` and the progress file of an evaluation in flight; writes nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from app import Backend
from app.runview import (
    MetricsTail,
    RunView,
    figures_text,
    fmt_duration,
    local_time,
    run_view,
    spec_of,
    stopped_early_text,
)
from contracts.activity_ids import CORPUS_PREFIX, EVAL_PREFIX, PUBLISH_PREFIX, TRAIN_PREFIX
from contracts.layout import RunHome, ckpt_ref
from contracts.layout import parse_step_dir as checkpoint_step
from engine import Event, Store, owner_dead
from simulator.proving.record import verdict_line, verdict_of

from . import presence
from .evalprogress import EvalCounts, EvalFollower

OVERDUE_S = 15.0  # due work nobody took for this long: no worker is running the home folder


def _activity_rows(store: Store, workflow_id: str) -> list[tuple]:
    return store.query(
        "SELECT activity_id, state, attempt, due_at, hb_deadline, last_hb_at, owner FROM activities "
        "WHERE workflow_id=? AND state IN ('scheduled', 'running') ORDER BY cmd",
        (workflow_id,),
    )


def _timer_rows(engine: Backend, workflow_id: str) -> list[float]:
    if engine.store is None:  # another backend: no local timer table
        return []
    return [
        r[0]
        for r in engine.store.query(
            "SELECT fire_at FROM timers WHERE workflow_id=? AND state='pending' ORDER BY fire_at", (workflow_id,)
        )
    ]


def worker_info(
    engine: Backend, workflow_id: str, now: float, started_at: dict[str, float], home: Path | None = None
) -> dict:
    """Whether a live worker holds the workflow (see the module docstring). With ``home``, a workflow with
    nothing in flight (a durable wait, a workflow task) is live only while a ``ctl train``/``ctl eval``
    following it or a ``ctl worker`` still runs (ctl/presence.py): after a kill, "no live worker", no ETA."""
    if engine.store is None:  # another backend: its server knows, not this table
        return {
            "live": None,
            "activity_id": None,
            "attempt": None,
            "pid": None,
            "host": None,
            "lease_age_s": None,
            "heartbeat_age_s": None,
            "reason": "not known on this backend",
        }
    rows = _activity_rows(engine.store, workflow_id)
    for aid, state, attempt, _due_at, hb_deadline, last_hb_at, owner_json in rows:
        if state != "running":
            continue
        owner = json.loads(owner_json) if owner_json else None
        late = hb_deadline is not None and now > hb_deadline
        live = not late and not owner_dead(owner)
        since = started_at.get(f"{aid}#{attempt}")
        age = None if last_hb_at is None else max(0.0, now - last_hb_at)
        timeout = hb_deadline - last_hb_at if hb_deadline is not None and last_hb_at is not None else None
        return {
            "live": live,
            "activity_id": aid,
            "attempt": attempt,
            "pid": (owner or {}).get("pid"),
            "host": (owner or {}).get("host"),
            "lease_age_s": None if since is None else max(0.0, now - since),
            "heartbeat_age_s": age,
            "heartbeat_timeout_s": timeout,
            "waiting_for": waiting_for(aid, attempt, age, timeout),
            "reason": None if live else ("heartbeat overdue" if late else "lease owner process is gone"),
        }
    due = [r[3] for r in rows if r[1] == "scheduled"] + _timer_rows(engine, workflow_id)
    if due and now - min(due) > OVERDUE_S:
        return {
            "live": False,
            "activity_id": None,
            "attempt": None,
            "pid": None,
            "host": None,
            "lease_age_s": None,
            "heartbeat_age_s": None,
            "reason": f"work due since {local_time(min(due))} and no worker took it",
        }
    if home is not None:
        runners = presence.live_runners(home, workflow_id)
        if not runners:
            return {
                "live": False,
                "activity_id": None,
                "attempt": None,
                "pid": None,
                "host": None,
                "lease_age_s": None,
                "heartbeat_age_s": None,
                "reason": "no ctl train, eval, release or worker process is running it",
            }
        owner, since = runners[0].get("owner") or {}, runners[0].get("since")
        return {
            "live": True,
            "activity_id": None,
            "attempt": None,
            "pid": owner.get("pid"),
            "host": owner.get("host"),
            "lease_age_s": None if since is None else max(0.0, now - since),
            "heartbeat_age_s": None,
            "reason": None,
        }
    return {
        "live": None,
        "activity_id": None,
        "attempt": None,
        "pid": None,
        "host": None,
        "lease_age_s": None,
        "heartbeat_age_s": None,
        "reason": "nothing in flight",
    }


KINDS = (
    (TRAIN_PREFIX, "training"),
    (EVAL_PREFIX, "evaluation"),
    (CORPUS_PREFIX, "corpus build"),
    (PUBLISH_PREFIX, "publication"),
)


def waiting_for(activity_id: str, attempt: int, heartbeat_age_s: float | None, timeout_s: float | None) -> str:
    """What the worker waits for, in one phrase: ``evaluation eval-000100-ppl (attempt 1): no progress for 95 s
    (stopped after 120 s)``. Liveness heartbeats are written at most every quarter of the timeout (engine
    ``ActivityContext.heartbeat``), so an age within that is "progressing", not a stall."""
    kind = next((k for prefix, k in KINDS if activity_id.startswith(prefix)), "activity")
    head = f"{kind} {activity_id} (attempt {attempt})"
    if timeout_s is None or heartbeat_age_s is None:
        return f"{head}: running (no progress timeout)"
    if heartbeat_age_s <= timeout_s / 4 + 1.0:
        return f"{head}: progressing (stopped after {_seconds(timeout_s)} without progress)"
    return f"{head}: no progress for {_seconds(heartbeat_age_s)} (stopped after {_seconds(timeout_s)})"


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 600 else fmt_duration(value)


def progress_info(view: RunView, tail: MetricsTail, now: float, counts: EvalCounts | None = None) -> dict:
    step = tail.step if tail.step is not None else view.last_checkpoint_step or view.steps_done()
    step_rate, _ = tail.rates()
    last = view.last_eval()
    loss = tail.last_loss if tail.last_loss is not None else view.last_heartbeat_loss
    return {
        "phase": view.phase.text if view.state == "running" else view.state,
        "step": step,
        "total_steps": view.total_steps,
        "last_loss": loss,
        "last_checkpoint": view.last_checkpoint,
        "last_checkpoint_step": view.last_checkpoint_step,
        "last_eval": None
        if last is None
        else {"activity_id": last.activity_id, "suite": last.suite, "step": last.step, "metrics": last.metrics},
        "eval_progress": None if counts is None else counts.to_json(),
        "eta_s": view.remaining_work_s(step or 0, step_rate, now, None if counts is None else counts.eta_s),
        "segments_done": len([s for s in view.segments if s.state == "done"]),
        "segments": len(view.segments),
        **({"stopped_early": view.stopped_early} if view.stopped_early is not None else {}),
    }


def describe(engine: Backend, home: Path, st: Any, now: float, *, events: list[Event] | None = None) -> dict:
    """The extra ``--json`` fields of ``ctl status`` for workflow status ``st`` (``events``: its history,
    when the caller read it already)."""
    if events is None:
        events = engine.history(st.workflow_id)
    timers = (
        [
            {"fire_at": t, "fire_at_local": local_time(t, date=True), "remaining_s": max(0.0, t - now)}
            for t in _timer_rows(engine, st.workflow_id)
        ]
        if st.state == "running"
        else []
    )
    out: dict[str, Any] = {"worker": None, "progress": None, "timers": timers}
    if st.state == "running":
        started = {
            f"{e.attrs.get('activity_id')}#{e.attrs.get('attempt')}": e.time
            for e in events
            if e.type == "activity_started"
        }
        out["worker"] = worker_info(engine, st.workflow_id, now, started, home)
        out["preempted"] = preempted_info(events)
        if out["preempted"] is not None and not (out["worker"] or {}).get("live"):
            out["worker"] = {
                **out["worker"],
                "live": False,
                "reason": f"stopped by {out['preempted']['signal']} (preempted)",
            }
    if st.workflow == "TrainRun":
        view = run_view(st.workflow_id, events, st.state)
        if (
            proof := verdict_of(home, spec_of(events)[0])
        ) is not None:  # a spec's own trainer (simulator/proving/record.py)
            out["resume_proof"] = proof
        tail = MetricsTail(RunHome(home).run(view.name).metrics) if view.name else None
        if tail is not None:
            tail.poll()
            counts = EvalFollower(home).counts(view, view.name, now) if st.state == "running" else None
            out["progress"] = progress_info(view, tail, now, counts)
            if st.state != "completed":  # running, or canceled/failed: a stop's checkpoint may be newer
                _newer_latest(out["progress"], home, view.name)
            if st.state == "running":
                if (out["worker"] or {}).get("live") is False:  # nobody runs it: no time left to estimate
                    out["progress"]["eta_s"] = None
    return out


def preempted_info(events: list[Any]) -> dict | None:
    """The polite stop that left the run as it is (no attempt started since): when, by which signal,
    what each preempted attempt saved; None when the run's last word is not a stop."""
    last_start = max((e.seq for e in events if e.type == "activity_started"), default=0)
    stops = [e for e in events if e.type in ("activity_preempted", "preempted") and e.seq > last_start]
    if not stops:
        return None
    attempts = [
        {k: e.attrs.get(k) for k in ("activity_id", "attempt", "step", "checkpoint", "steps_lost", "killed_at_grace")}
        for e in stops
        if e.type == "activity_preempted" and not str(e.attrs.get("message", "")).startswith("not started")
    ]
    return {
        "signal": stops[-1].attrs.get("signal"),
        "at": stops[-1].time,
        "at_local": local_time(stops[-1].time, date=True),
        "attempts": attempts,
        "waiting_on": next((e.attrs.get("waiting_on") for e in stops if e.type == "preempted"), None),
    }


def _newer_latest(progress: dict, home: Path, name: str) -> None:
    """``LATEST`` names a newer checkpoint than the history's last heartbeat (a kill between the trainer's
    write and the runner's heartbeat): that one is the last checkpoint, as the next attempt resumes from it."""
    try:
        run = RunHome(home).run(name)
        latest = run.latest.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return
    step = checkpoint_step(latest)
    if step is not None and step > (progress.get("last_checkpoint_step") or -1) and (run.ckpt_root / latest).is_dir():
        progress["last_checkpoint"], progress["last_checkpoint_step"] = ckpt_ref(name, latest), step


def status_lines(st: Any, extra: dict, now: float) -> list[str]:
    """The human lines of ``ctl status ID`` below its state line."""
    lines = []
    w = extra.get("worker")
    if w is not None:
        if w["live"] and not w["activity_id"]:
            lines.append(
                f"  worker: live, pid {w['pid']} on {w['host']} (running it for {fmt_duration(w['lease_age_s'])};"
                f" no activity in flight)"
            )
        elif w["live"]:
            lines.append(
                f"  worker: live, pid {w['pid']} on {w['host']}, {w['activity_id']} attempt {w['attempt']}"
                f" (lease held {fmt_duration(w['lease_age_s'])}, last heartbeat "
                f"{fmt_duration(w['heartbeat_age_s'])} ago)"
            )
        elif w["live"] is False:
            what = f"{w['activity_id']} attempt {w['attempt']}: " if w["activity_id"] else ""
            lines.append(
                f"  worker: no live worker ({what}{w['reason']}): run the same `ctl train` or `ctl worker` to continue"
            )
    if w is not None and w.get("waiting_for"):
        lines.append(f"  waiting for: {w['waiting_for']}")
    pre = extra.get("preempted")
    if pre is not None:
        saved = (
            "; ".join(
                f"{a['activity_id']} attempt {a['attempt']} saved "
                + (f"step {a['step']}" if a.get("step") is not None else "no checkpoint")
                + (f" ({a['steps_lost']} steps lost)" if a.get("steps_lost") is not None else "")
                + (", killed at the grace" if a.get("killed_at_grace") else "")
                for a in pre["attempts"]
            )
            or f"during {pre.get('waiting_on') or 'a wait'}"
        )
        lines.append(
            f"  preempted: stopped by {pre['signal']} at {pre['at_local']}: {saved}; the same command resumes it"
        )
    p = extra.get("progress")
    if p is not None:
        loss = f", last loss {p['last_loss']:.4f}" if isinstance(p["last_loss"], (int, float)) else ""
        ev = p.get("eval_progress")
        counted = f": {EvalCounts(**ev).text()}" if ev else ""
        lines.append(
            f"  progress: step {p['step'] or 0}/{p['total_steps']}{loss}; segments {p['segments_done']}/"
            f"{p['segments']} done; {p['phase']}{counted}"
        )
        if p.get("stopped_early"):
            lines.append(f"  {stopped_early_text(p['stopped_early'])}")
        if p["last_checkpoint"]:
            lines.append(f"  last checkpoint: {p['last_checkpoint']} (step {p['last_checkpoint_step']})")
        ev = p["last_eval"]
        if ev:
            lines.append(f"  last evaluation: {ev['suite']} at step {ev['step']}: {figures_text(ev['metrics'])}")
        if st.state == "running":
            eta = p["eta_s"]
            if w is not None and w["live"] is False:
                lines.append("  ETA: none (no live worker runs it)")
            else:
                lines.append(
                    f"  ETA: {fmt_duration(eta)}"
                    + (f" (about {local_time(now + eta)})" if eta is not None else " (no recent steps to measure)")
                )
    if extra.get("resume_proof"):
        lines.append(f"  {verdict_line(extra['resume_proof'])}")
    for t in extra.get("timers") or []:
        lines.append(f"  timer: fires at {t['fire_at_local']} (in {fmt_duration(t['remaining_s'])})")
    return lines


def readable(text: str) -> str:
    """Epoch seconds in an engine message (``due at 1796106682.433``) as local time."""
    return re.sub(r"\b(1\d{9}(?:\.\d+)?)\b", lambda m: local_time(float(m.group(1)), date=True), text)
