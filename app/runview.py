"""What a training run looks like now, derived from its history and its metrics file (no click, no rich).

``run_view(events, ...)`` folds a TrainRun's recorded events (plus the work earlier workflows
of the same run finished, ``prior`` in its input) into a ``RunView``: its segments with their
end step, checkpoint, loss, attempts, time taken and evaluation figures; the phase it is in
(training segment k/n, evaluating suite s of a checkpoint, waiting on a timer); the last
checkpoint; the last evaluation. ``MetricsTail`` reads ``runs/<name>/metrics.jsonl``
incrementally (current step, last and smoothed loss, tokens/s, a step rate for the ETA).

Everything here reads; nothing writes. ``ctl status``, ``ctl show`` and the live display of
``ctl train`` share it, so they agree on every figure.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.activity_ids import CORPUS_PREFIX, eval_id, is_eval, is_train, parse_activity_id, step_tag, train_id
from contracts.layout import step_dir_name
from workflows.plan import checkpoint_step, segments as segment_ends

MAX_FRAMES_KEPT = 512  # the rate window and the smoothing only need the recent frames
SMOOTHING = 0.9  # exponential moving average of the training loss (as TensorBoard's slider)
MAX_READ_BYTES = 1 << 20  # per poll: a huge backlog is skipped to its tail


def step_of(activity_id: str) -> int | None:
    """``train-000500`` / ``eval-000500-ppl`` -> 500; None for other ids."""
    parsed = parse_activity_id(activity_id)
    return parsed.step if parsed.kind in ("train", "eval") else None


def suite_of(activity_id: str) -> str:
    """``eval-000500-ppl`` -> ``ppl``; ``eval-ppl`` (no tag) -> ``ppl``."""
    parsed = parse_activity_id(activity_id)
    return parsed.rest or "" if parsed.kind == "eval" else ""


def first_subject_metrics(result: Any) -> dict[str, float]:
    """``{"heldout/ppl": 7.41, ...}`` of an eval activity's result (its first subject)."""
    metrics = ((result or {}).get("summary") or {}).get("metrics") if isinstance(result, dict) else None
    if not isinstance(metrics, dict):
        return {}
    for values in metrics.values():
        if isinstance(values, dict):
            return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {}


HEADLINE = ("heldout/ppl", "ppl", "heldout/loss")


def headline(suite: str, metrics: dict[str, float]) -> str:
    """The one figure to show of a suite: ``ppl 7.41`` for ppl, else ``task/metric value`` (the first)."""
    for key in HEADLINE:
        if key in metrics:
            return f"{key.rsplit('/', 1)[-1]} {metrics[key]:.4g}"
    if metrics:
        key = sorted(metrics)[0]
        return f"{key} {metrics[key]:.4g}"
    return f"{suite} done"


def figures_text(metrics: dict[str, float], limit: int = 4) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:limit])


@dataclass
class EvalView:
    activity_id: str
    suite: str
    step: int
    state: str = "pending"  # pending | running | done | failed
    attempts: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reused: bool = False  # finished by an earlier workflow of the run

    worked_s: float = 0.0  # attempts' time so far (a dead attempt's: to its last recorded event)
    attempt_at: float | None = None  # the open attempt's start
    seen_at: float | None = None  # its last recorded event

    @property
    def duration_s(self) -> float | None:
        """Time worked: the attempts' own time, not the time the run sat stopped between them."""
        return None if self.started_at is None or self.ended_at is None else self.worked_s

    def to_json(self) -> dict:
        return {
            "activity_id": self.activity_id,
            "suite": self.suite,
            "step": self.step,
            "state": self.state,
            "attempts": self.attempts,
            "duration_s": self.duration_s,
            "metrics": self.metrics,
            "reused": self.reused,
        }


@dataclass
class SegmentView:
    index: int  # 1-based
    until: int
    activity_id: str
    state: str = "pending"  # pending | running | done | failed
    attempts: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    checkpoint: str | None = None
    final_loss: float | None = None
    final_loss_hex: str | None = None
    digest: str | None = None  # the checkpoint's digest (its manifest's manifest_sha256)
    resumed_from: str | None = None
    reused: bool = False
    evals: list[EvalView] = field(default_factory=list)

    worked_s: float = 0.0  # attempts' time so far (a dead attempt's: to its last recorded event)
    attempt_at: float | None = None  # the open attempt's start
    seen_at: float | None = None  # its last recorded event

    @property
    def duration_s(self) -> float | None:
        """Time worked: the attempts' own time, not the time the run sat stopped between them."""
        return None if self.started_at is None or self.ended_at is None else self.worked_s

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "until": self.until,
            "activity_id": self.activity_id,
            "state": self.state,
            "attempts": self.attempts,
            "duration_s": self.duration_s,
            "checkpoint": self.checkpoint,
            "final_loss": self.final_loss,
            "final_loss_hex": self.final_loss_hex,
            "digest": self.digest,
            "resumed_from": self.resumed_from,
            "reused": self.reused,
            "evals": [e.to_json() for e in self.evals],
        }


@dataclass
class Phase:
    kind: str  # starting | corpus | training | evaluating | waiting | ended
    text: str
    segment: int | None = None  # 1-based segment in flight / before the wait
    activity_id: str | None = None
    attempt: int | None = None
    since: float | None = None  # when this phase began (the attempt's start, the timer's start)
    until: float | None = None  # waiting: the timer's fire time
    suite_index: int | None = None  # evaluating: 1-based suite of the checkpoint's suites
    suites: int | None = None


@dataclass
class RunView:
    workflow_id: str
    name: str
    total_steps: int
    suites: list[str]
    segments: list[SegmentView]
    phase: Phase
    state: str = "running"
    started_at: float | None = None
    ended_at: float | None = None
    last_checkpoint: str | None = None
    last_checkpoint_step: int | None = None
    stopped_early: dict | None = None  # the trainer's stopped_early (tinyllm/selection.py): later segments skipped
    best_checkpoints: list | None = None  # keep_checkpoints.best of the last finished segment
    last_heartbeat_loss: float | None = None
    interval_s: float = 0.0
    timers_started: int = 0
    last_done_index: int = 0  # the highest index of a finished segment (0: none yet)
    stopped_s: float = 0.0  # time between a dead attempt's last event and its redelivery (nobody worked)
    preemptions: list = field(default_factory=list)  # polite stops: activity_preempted attrs (+ "time")

    @property
    def worked_s(self) -> float | None:
        """From the start to the end, less the time the run sat stopped."""
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at - self.stopped_s)

    def evals(self) -> list[EvalView]:
        return [e for s in self.segments for e in s.evals]

    def last_eval(self) -> EvalView | None:
        done = [e for e in self.evals() if e.state == "done"]
        return done[-1] if done else None

    def segment(self, activity_id: str) -> SegmentView | None:
        return next((s for s in self.segments if s.activity_id == activity_id), None)

    def steps_done(self) -> int:
        """The end step of the last finished segment (0 before any)."""
        done = [s.until for s in self.segments if s.state == "done"]
        return max(done) if done else 0

    def remaining_work_s(
        self, step: int, step_rate: float | None, now: float, eval_left_s: float | None = None
    ) -> float | None:
        """Seconds left, measured in this run: the segment in flight at ``step_rate``, the segments
        after it at the pace of the finished ones (trainer start-up included), the evaluation in
        flight by its own count (``eval_left_s``, else like the others), evaluations at their mean
        duration, and the cadence waits not yet over. None while nothing was measured."""
        if self.state != "running":
            return 0.0
        finished = [s for s in self.segments if s.state == "done" and not s.reused and s.duration_s]
        prev_end = {s.index: (self.segments[s.index - 2].until if s.index > 1 else 0) for s in self.segments}
        seg_rate = (
            sum(s.until - prev_end[s.index] for s in finished) / sum(s.duration_s or 0.0 for s in finished)
            if finished
            else None
        )
        total = 0.0
        for s in self.segments:
            if s.state == "done":
                continue
            if s.state == "running" and self.phase.kind == "training" and self.phase.segment == s.index:
                rate = step_rate or seg_rate
                left = max(0, s.until - max(step, prev_end[s.index]))
            else:
                rate = seg_rate or step_rate
                left = s.until - prev_end[s.index]
            if left and not rate:
                return None
            total += left / rate if left and rate else 0.0  # (left without a rate returned above)
        durations = [e.duration_s for e in self.evals() if e.duration_s is not None and not e.reused]
        mean_eval = sum(durations) / len(durations) if durations else 0.0
        left_evals = [e for e in self.evals() if e.state in ("pending", "running")]
        total += mean_eval * len(left_evals)
        if self.phase.kind == "evaluating" and eval_left_s is not None:
            total += eval_left_s - (mean_eval if left_evals else 0.0)  # the one in flight: its own ETA
        elif self.phase.kind == "evaluating" and self.phase.since is not None:
            total -= min(mean_eval, max(0.0, now - self.phase.since))
        first_open = next((s.index for s in self.segments if not s.reused), len(self.segments))
        waits_total = max(0, len(self.segments) - first_open) if self.interval_s > 0 else 0
        total += max(0, waits_total - self.timers_started) * self.interval_s
        if self.phase.kind == "waiting" and self.phase.until is not None:
            total += max(0.0, self.phase.until - now)
        return max(0.0, total)


def spec_of(events: list[Any]) -> tuple[dict, dict]:
    """(the run's spec, its whole request) from a TrainRun's first event."""
    if not events or events[0].type != "workflow_started":
        return {}, {}
    inp = events[0].attrs.get("input") or {}
    return (inp.get("spec") or {}), inp


def run_view(workflow_id: str, events: list[Any], state: str = "running") -> RunView:
    """Fold a TrainRun's history into a ``RunView`` (see the module docstring)."""
    spec, inp = spec_of(events)
    name = str(spec.get("name", ""))
    steps = int(spec.get("steps", 0) or 0)
    try:
        ends = segment_ends(steps, int(spec.get("eval_every", 0) or 0))
    except (TypeError, ValueError):
        ends = []
    suites = [str(s) for s in inp.get("eval_suites") or inp.get("suites") or []]
    segs = [SegmentView(i + 1, until, train_id(until)) for i, until in enumerate(ends)]
    for seg in segs:
        seg.evals = [EvalView(eval_id(step_tag(seg.until), s), s, seg.until) for s in suites]
    view = RunView(
        workflow_id,
        name,
        steps,
        suites,
        segs,
        Phase("starting", "starting"),
        state=state,
        interval_s=float(spec.get("eval_interval_seconds", 0) or 0),
    )
    by_id: dict[str, Any] = {s.activity_id: s for s in segs}
    by_id.update({e.activity_id: e for s in segs for e in s.evals})
    prior = inp.get("prior") or {}
    for aid, result in (prior.get("train") or {}).items():
        if aid in by_id:
            _train_done(view, by_id[aid], result, None)
            by_id[aid].reused = True
    for aid, result in (prior.get("evals") or {}).items():
        if aid in by_id:
            ev = by_id[aid]
            ev.state, ev.metrics, ev.reused = "done", first_subject_metrics(result), True
    if events:
        view.started_at = events[0].time
    for e in events:
        _apply(view, by_id, e)
    if view.stopped_early is not None:  # early stopping ended the run: the later segments never run
        for seg in view.segments:
            if seg.state == "pending":
                seg.state = "skipped"
                for ev in seg.evals:
                    ev.state = "skipped"
    if state != "running":
        view.phase = Phase("ended", state)
    return view


def _train_done(view: RunView, seg: SegmentView, result: Any, t: float | None) -> None:
    r = result if isinstance(result, dict) else {}
    seg.state, seg.ended_at = "done", t
    view.last_done_index = max(view.last_done_index, seg.index)
    seg.checkpoint = r.get("checkpoint")
    seg.final_loss = r.get("final_loss")
    seg.final_loss_hex = r.get("final_loss_hex")
    seg.digest = r.get("digest") if isinstance(r.get("digest"), str) else None
    seg.resumed_from = r.get("resumed_from")
    if isinstance(r.get("stopped_early"), dict):
        view.stopped_early = r["stopped_early"]
    if isinstance(r.get("best_checkpoints"), list):
        view.best_checkpoints = r["best_checkpoints"]
    if seg.checkpoint:
        view.last_checkpoint = seg.checkpoint
        at = checkpoint_step(seg.checkpoint)
        if at is not None and at != seg.until:  # an early stop inside the segment: its evaluations measure that step
            for ev in seg.evals:
                ev.step = at
        view.last_checkpoint_step = r["steps"] if isinstance(r.get("steps"), int) else seg.until


def _count_worked(view: RunView, item: Any, e: Any) -> None:
    """Add an attempt's own time to ``item.worked_s``: from its start to its end, or for an attempt that died
    (its lease timed out, or it is redelivered) to its last recorded event; the time after that, until the
    engine noticed, is time the run sat stopped (``view.stopped_s``)."""
    open_at, seen = item.attempt_at, item.seen_at
    if e.type == "activity_started" or (e.type == "activity_timed_out" and open_at is not None):
        if open_at is not None:  # the previous attempt died
            item.worked_s += (seen or open_at) - open_at
            view.stopped_s += max(0.0, e.time - (seen or open_at))
        item.attempt_at = item.seen_at = e.time if e.type == "activity_started" else None
    elif open_at is not None and e.type in (
        "activity_completed",
        "activity_failed",
        "activity_canceled",
        "activity_preempted",
    ):
        item.worked_s += e.time - open_at
        item.attempt_at = item.seen_at = None
    elif open_at is not None:
        item.seen_at = e.time


def _apply(view: RunView, by_id: dict[str, Any], e: Any) -> None:
    a = e.attrs if isinstance(e.attrs, dict) else {}
    aid = str(a.get("activity_id", ""))
    item = by_id.get(aid)
    if item is not None:
        _count_worked(view, item, e)
    if e.type == "activity_started":
        attempt = int(a.get("attempt", 1) or 1)
        if item is not None:
            item.state, item.attempts = "running", max(item.attempts, attempt)
            item.started_at = item.started_at or e.time
        view.phase = _phase_of(view, aid, attempt, e.time, item if isinstance(item, SegmentView) else None)
    elif e.type == "activity_heartbeat":
        d = a.get("details")
        if isinstance(d, dict) and d.get("checkpoint"):
            view.last_checkpoint = str(d["checkpoint"])
            view.last_checkpoint_step = d.get("step") if isinstance(d.get("step"), int) else view.last_checkpoint_step
            if isinstance(d.get("loss"), (int, float)):
                view.last_heartbeat_loss = float(d["loss"])
    elif e.type == "activity_completed":
        if isinstance(item, SegmentView):
            _train_done(view, item, a.get("result"), e.time)
        elif isinstance(item, EvalView):
            item.state, item.ended_at = "done", e.time
            item.metrics = first_subject_metrics(a.get("result"))
        view.phase = Phase("between", "working")
    elif e.type in ("activity_failed", "activity_timed_out", "activity_canceled"):
        if item is not None and (a.get("final") or e.type == "activity_canceled"):
            item.state = "failed"
        view.phase = Phase("between", "working")
    elif e.type == "activity_preempted":  # a polite stop: due again, resumes from the checkpoint it saved
        if not str(a.get("message", "")).startswith("not started"):
            view.preemptions.append({**a, "time": e.time})
        if item is not None:
            item.state = "pending"
        view.phase = Phase("between", f"preempted ({a.get('signal')})")
    elif e.type == "timer_started":
        view.timers_started += 1
        seg = view.last_done_index
        fire_at = a.get("fire_at")
        view.phase = Phase(
            "waiting",
            "waiting",
            segment=seg or None,
            since=e.time,
            until=float(fire_at) if isinstance(fire_at, (int, float)) else None,
        )
    elif e.type == "timer_fired":
        view.phase = Phase("between", "working")
    elif e.type in ("workflow_completed", "workflow_failed", "workflow_canceled"):
        view.ended_at = e.time
        view.phase = Phase("ended", e.type.split("_", 1)[1])  # (no stale "working | step ..." line after the end)


def _phase_of(view: RunView, aid: str, attempt: int, t: float, seg: SegmentView | None = None) -> Phase:
    if is_train(aid):  # seg: the segment of aid, looked up by the caller (a scan is quadratic)
        k = seg.index if seg else None
        text = f"training segment {k}/{len(view.segments)}" if k else f"training {aid}"
        return Phase("training", text, segment=k, activity_id=aid, attempt=attempt, since=t)
    if is_eval(aid):
        known = [x for x in view.suites if aid == eval_id("", x) or aid.endswith(f"-{x}")]
        suite, step = (known[0] if known else suite_of(aid)), step_of(aid)
        idx = view.suites.index(suite) + 1 if suite in view.suites else None
        of = f" of {step_dir_name(step)}" if step is not None else ""
        text = f"evaluating {suite}" + (f" ({idx}/{len(view.suites)})" if idx else "") + of
        return Phase(
            "evaluating", text, activity_id=aid, attempt=attempt, since=t, suite_index=idx, suites=len(view.suites)
        )
    if aid.startswith(CORPUS_PREFIX):
        return Phase("corpus", f"building corpus ({aid})", activity_id=aid, attempt=attempt, since=t)
    return Phase("running", aid, activity_id=aid, attempt=attempt, since=t)


# --- metrics.jsonl ---------------------------------------------------------------------------


def read_frames(path: Path) -> list[dict]:
    """Every complete frame of a metrics.jsonl (torn or foreign lines skipped), in file order."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in data.splitlines():
        try:
            frame = json.loads(line)  # bytes: a line that is no UTF-8 is a ValueError, skipped as a torn one
        except ValueError:
            continue
        if isinstance(frame, dict) and isinstance(frame.get("step"), int):
            out.append(frame)
    return out


class JsonlTail:
    """Follows a JSON-lines file by offset, read-only and bounded: at most ``MAX_READ_BYTES`` per
    poll (a bigger backlog is skipped to its tail), an unfinished last line waits for the next
    poll, a line that is not a JSON object is skipped, a file that shrank (rewritten) is read again."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self._partial = b""

    def restarted(self) -> None:
        """The file was rewritten: what was read of it is gone (subclasses forget their state)."""

    def poll_objects(self) -> list[dict]:
        """The JSON objects of the lines completed since the last poll."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:  # rewritten: start over
            self.offset, self._partial = 0, b""
            self.restarted()
        if size == self.offset:
            return []
        start = max(self.offset, size - MAX_READ_BYTES)
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(size - start)
        except OSError:
            return []
        skipped, self.offset = start > self.offset, start + len(data)
        if skipped:  # skipped a backlog: drop the torn first line
            self._partial, data = b"", data.split(b"\n", 1)[-1]
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


class MetricsTail(JsonlTail):
    """Follows ``metrics.jsonl``; a file that shrank (a resume rewrote it) is re-read."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.frames: list[dict] = []
        self.smoothed: float | None = None
        self.last_loss: float | None = None

    def restarted(self) -> None:
        self.frames, self.smoothed = [], None

    def poll(self) -> list[dict]:
        """New frames since the last poll."""
        new = []
        for frame in self.poll_objects():
            if isinstance(frame.get("step"), int):
                new.append(frame)
                loss = frame.get("train/loss")
                if isinstance(loss, (int, float)):
                    self.last_loss = float(loss)
                    self.smoothed = (
                        loss if self.smoothed is None else SMOOTHING * self.smoothed + (1 - SMOOTHING) * loss
                    )
        if new:
            self.frames = (self.frames + new)[-MAX_FRAMES_KEPT:]
        return new

    @property
    def step(self) -> int | None:
        return self.frames[-1]["step"] if self.frames else None

    def rates(self, window: int = 50) -> tuple[float | None, float | None]:
        """(steps/s, tokens/s) over the last ``window`` frames of one uninterrupted stretch, by wall clock."""
        frames = [f for f in self.frames[-window:] if isinstance(f.get("time"), (int, float))]
        gaps = sorted(b["time"] - a["time"] for a, b in zip(frames, frames[1:]))
        typical = gaps[len(gaps) // 2] if gaps else 0.0
        for i in range(len(frames) - 1, 0, -1):  # one stretch: cut at a resume or a pause (eval, wait)
            gap = frames[i]["time"] - frames[i - 1]["time"]
            if frames[i]["step"] <= frames[i - 1]["step"] or gap > max(1.0, 5 * typical):
                frames = frames[i:]
                break
        if len(frames) < 2:
            return None, None
        dt = frames[-1]["time"] - frames[0]["time"]
        if dt <= 0:
            return None, None
        steps = (frames[-1]["step"] - frames[0]["step"]) / dt
        t1, t0 = frames[-1].get("train/tokens"), frames[0].get("train/tokens")
        tokens = (t1 - t0) / dt if isinstance(t1, (int, float)) and isinstance(t0, (int, float)) else None
        return steps, tokens


def fmt_duration(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def local_time(t: float, *, date: bool = False) -> str:
    stamp = dt.datetime.fromtimestamp(t).astimezone()
    return stamp.isoformat(timespec="seconds") if date else stamp.strftime("%H:%M:%S")


def stopped_early_text(s: dict) -> str:
    """One line of a run early stopping ended (tinyllm/selection.py's ``stopped_early``)."""
    best = s.get("best_value")
    return (
        f"stopped early at step {s.get('step')}: {s.get('metric')} ({s.get('mode')}) did not improve for "
        f"{s.get('patience')} check(s); best step {s.get('best_step')}"
        + (f" ({best:.4g})" if isinstance(best, (int, float)) else "")
        + f", {s.get('best_checkpoint') or '-'}"
    )


def best_checkpoints(view: RunView) -> list[dict]:
    """The run's best checkpoint(s) as its own selection named them, never judged by a reader:
    ``keep_checkpoints.best`` (``best_checkpoints``), else early stopping's best (the fields ``ctl show``
    marks ``<- best`` and ``workflows.pick_candidate`` releases with ``--select best``)."""
    best = [b for b in view.best_checkpoints or [] if isinstance(b, dict) and b.get("checkpoint")]
    if best:
        return best
    stop = view.stopped_early
    if isinstance(stop, dict) and stop.get("best_checkpoint"):
        return [
            {
                "checkpoint": stop["best_checkpoint"],
                "step": stop.get("best_step"),
                "metric": stop.get("metric"),
                "value": stop.get("best_value"),
            }
        ]
    return []


def release_outcome(workflow: str, state: str, result: Any) -> dict | None:
    """A ModelRelease's outcome as users must read it later (``ctl status``, ``ctl list``, the UI): a completed
    release whose gate failed published nothing, which its state alone ("completed") does not say.

    ``{"published": bool, "version", "path", "gates": [{"gate", "figure", "passed"}], "text"}``, ``text`` one
    phrase: ``published v0001 (releases/tiny/v0001); gates passed: ppl/ppl<=6.5 (4.12)`` or ``not published:
    gate ppl/ppl<=2 failed (22.5)``. None for another workflow, or a release not completed."""
    if workflow != "ModelRelease" or state != "completed" or not isinstance(result, dict):
        return None
    gates = [g for g in result.get("gates") or [] if isinstance(g, dict)]

    def shown(g: dict) -> str:
        fig = g.get("figure")
        return f"{g.get('gate')} ({'no such figure' if fig is None else f'{fig:.6g}'})"

    if result.get("published"):
        text = f"published {result.get('version')} ({result.get('path')})"
        if gates:
            text += "; gates passed: " + ", ".join(shown(g) for g in gates)
    else:
        failed = [g for g in gates if not g.get("passed")]
        text = "not published: " + (
            "; ".join(f"gate {shown(g).replace(' (', ' failed (', 1)}" for g in failed)
            if failed
            else str(result.get("reason") or "no reason recorded")
        )
    return {
        "published": bool(result.get("published")),
        "version": result.get("version"),
        "path": result.get("path"),
        "gates": gates,
        "text": text,
    }
