"""What the pages of ``ctl ui`` show, as plain data (no HTML here): read through ctl's read layer.

* ``runs(engine, home, now)``: one row per workflow of the home, with the same ``worker`` and
  ``progress`` figures ``ctl status ID --json`` prints (``runstatus.describe``, the same liveness).
* ``run(engine, home, workflow_id, now)``: one workflow: its status and those figures, the run's
  other workflows (continuations ``/2``), a timeline (train segments with their attempts and
  redone steps, evaluations with their figures, durable waits, cancels), the plotted series of
  ``ctl plot`` (``plot.series``), its checkpoints with their status and its events with the
  details ``ctl history`` prints (``historyview.details``).

Which checkpoint is best is never decided here: it is the one the run's own selection named
(``keep_checkpoints.best``, else early stopping's best: what ``ctl show`` marks ``<- best`` and what
``ctl release --select best`` takes); a run without a selection metric has no "best". A release
(ModelRelease workflow) is read from its recorded result: version, checkpoint, each gate's outcome,
figures (``releases(...)``); a train run's page lists the releases of its run.

Everything reads: the engine through its one read-only connection, files with ``open()`` for
reading only (never the database file).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import app
from app import Backend
from app.runview import RunView, best_checkpoints, fmt_duration, headline, local_time, run_view, stopped_early_text
from contracts.activity_ids import CORPUS_PREFIX
from contracts.layout import LATEST, RunHome, step_dir_name
from contracts.layout import parse_step_dir as checkpoint_step
from engine import BadInput, Event, NotFound
from workflows.activities import workflow_generation

from .. import historyview, runstatus
from ..logs import attempt_dirs
from ..plot import Series, series
from ..show import final_of, selection_lines
from .curves import charts
from .releases import RELEASE, Release, current_versions, release_of, releases
from .svg import Chart

TERMINAL_ACTIVITY = {
    "activity_completed": "completed",
    "activity_failed": "failed",
    "activity_timed_out": "timed out",
    "activity_canceled": "canceled",
    "activity_preempted": "preempted",
}


class UnknownRun(Exception):
    """No such workflow (the page is a 404)."""


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass
class RunRow:
    workflow_id: str
    workflow: str
    state: str
    cancel_requested: bool
    created_at: float
    updated_at: float
    worker: dict | None
    progress: dict | None
    timers: list[dict]
    error: str = ""
    release: Release | None = None  # a ModelRelease workflow: what it released, or why not

    @property
    def live(self) -> bool | None:
        return None if self.worker is None else self.worker.get("live")

    @property
    def step(self) -> int | None:
        return None if self.progress is None else self.progress.get("step")

    @property
    def total(self) -> int | None:
        return None if self.progress is None else self.progress.get("total_steps")

    @property
    def fraction(self) -> float:
        step, total = self.step or 0, self.total or 0
        return min(1.0, step / total) if total else (1.0 if self.state == "completed" else 0.0)

    @property
    def eta_s(self) -> float | None:
        """The ETA, shown only while a worker may be running it (not known dead)."""
        if self.state != "running" or self.progress is None or self.live is False:
            return None
        return self.progress.get("eta_s")

    @property
    def who(self) -> str:
        w = self.worker
        if w is None:
            return "none (ended)"
        if w.get("live"):
            return f"live: pid {w.get('pid')} on {w.get('host')}"
        if w.get("live") is False:
            return f"no live worker ({w.get('reason')})"
        return f"no activity in flight ({w.get('reason')})"


def _row(
    engine: Backend,
    home: Path,
    st: Any,
    now: float,
    current: dict[str, str] | None = None,
    events: list[Event] | None = None,
) -> RunRow:
    """``events``: the workflow's history when already read (a page reads each history once)."""
    extra = runstatus.describe(engine, home, st, now, events=events)
    row = RunRow(
        st.workflow_id,
        st.workflow,
        st.state,
        bool(st.cancel_requested),
        st.created_at,
        st.updated_at,
        extra.get("worker"),
        extra.get("progress"),
        extra.get("timers") or [],
        app.error_line(st.error) if st.error else "",
    )
    if st.workflow == RELEASE:
        inp = (
            (events[0].attrs.get("input") if events else None)
            if events is not None
            else app.recorded_input(engine, st.workflow_id)
        )
        row.release = release_of(st, inp, current_versions(home) if current is None else current)
    return row


def runs(engine: Backend, home: Path, now: float, state: str | None = None) -> list[RunRow]:
    """Every readable workflow, newest first; only those in ``state`` when given."""
    current = current_versions(home)
    rows = [
        _row(engine, home, st, now, current) for st in app.readable_workflows(engine) if state in (None, "", st.state)
    ]
    return sorted(rows, key=lambda r: (r.created_at, r.workflow_id), reverse=True)


# --- one run ---------------------------------------------------------------------------------


@dataclass
class Attempt:
    number: int
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str = "running"  # running | completed | failed | timed out | canceled | lost
    worker: str = ""
    last_step: int | None = None  # the last step its heartbeats named
    resumed_from: str | None = None
    redone_steps: int | None = None
    error: str = ""
    output: str = ""  # the folder of its kept stdout.log / stderr.log (ctl logs), relative to the home

    @property
    def duration(self) -> str:
        return fmt_duration(self.ended_at - self.started_at) if self.started_at and self.ended_at else ""


@dataclass
class Item:
    """One row of the timeline."""

    kind: str  # segment | evaluation | wait | cancel | corpus | activity | workflow
    title: str
    state: str
    start: float | None = None
    end: float | None = None
    detail: str = ""
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class Checkpoint:
    name: str
    step: int | None
    present: bool
    flags: list[str]
    figures: str = ""


@dataclass
class EventRow:
    seq: int
    time: float
    type: str
    activity: str
    attempt: int | None
    details: str
    attrs_json: str


@dataclass
class RunPage:
    row: RunRow
    view: RunView | None
    spec_json: str
    generations: list[tuple[str, str]]  # (workflow id, state) of every workflow of the run
    timeline: list[Item]
    series: Series | None
    eval_series: dict[str, list[tuple[int, float]]]
    checkpoints: list[Checkpoint]
    events: list[EventRow]
    event_kinds: list[str]
    event_attempts: list[int]
    events_total: int
    stderr_tail: str
    timeline_total: int = 0
    charts: list[Chart] = field(default_factory=list)
    cards: list[tuple[str, float, str]] = field(default_factory=list)  # (title, value, note): one-point figures
    releases: list[Release] = field(default_factory=list)  # a train run's releases
    selection: list[str] = field(default_factory=list)  # ctl show's lines: the best checkpoint(s), the early stop
    stopped_early: str = ""
    final: dict = field(default_factory=dict)  # ctl show's final: step, checkpoint, final_loss_hex, digest


def _attempts(events: list[Any]) -> dict[str, dict[int, Attempt]]:
    """Every activity's attempts, from its started / heartbeat / terminal events."""
    out: dict[str, dict[int, Attempt]] = {}
    last_ckpt: dict[str, str] = {}
    max_step: dict[str, int] = {}
    att: Attempt | None
    for e in events:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        aid = a.get("activity_id")
        if not isinstance(aid, str):
            continue
        n = a.get("attempt")
        n = n if isinstance(n, int) else None
        per = out.setdefault(aid, {})
        if e.type == "activity_started" and n is not None:
            for earlier in per.values():  # an attempt that never ended was lost with its worker
                if earlier.outcome == "running":
                    earlier.outcome = "lost"
            att = per.setdefault(n, Attempt(n))
            att.started_at, att.worker = e.time, str(a.get("worker") or "")
            if n > 1 and aid in max_step:
                resume = checkpoint_step(last_ckpt[aid]) if aid in last_ckpt else 0
                att.resumed_from = last_ckpt.get(aid)
                att.redone_steps = max(0, max_step[aid] - (resume or 0))
        elif e.type == "activity_heartbeat" and n is not None:
            d = a.get("details")
            if isinstance(d, dict):
                att = per.setdefault(n, Attempt(n))
                if isinstance(d.get("step"), int):
                    att.last_step = d["step"]
                    max_step[aid] = max(max_step.get(aid, 0), d["step"])
                if d.get("checkpoint"):
                    last_ckpt[aid] = str(d["checkpoint"])
        elif e.type in TERMINAL_ACTIVITY:
            att = per.get(n) if n is not None else (per[max(per)] if per else None)
            if att is None:
                continue
            att.ended_at, att.outcome = e.time, TERMINAL_ACTIVITY[e.type]
            if e.type == "activity_completed" and isinstance(a.get("result"), dict):
                r = a["result"]
                if r.get("resumed_from"):
                    att.resumed_from = str(r["resumed_from"])
                    if att.number > 1 and aid in max_step:
                        att.redone_steps = max(0, max_step[aid] - (checkpoint_step(att.resumed_from) or 0))
            else:
                att.error = historyview.details(e)
    return out


def timeline(view: RunView | None, events: list[Any], now: float, output: Any = None) -> list[Item]:
    """The run's history as rows in the order things began (see the module docstring); ``output(activity_id,
    attempt)``: where that attempt's output is kept ("" none)."""
    attempts = _attempts(events)
    for aid, by_number in attempts.items() if output is not None else ():
        for n, att in by_number.items():
            att.output = output(aid, n)
    segments = {s.activity_id: s for s in view.segments} if view else {}
    evals = {e.activity_id: e for e in view.evals()} if view else {}
    items: list[Item] = []
    if view:
        reused = [s for s in view.segments if s.reused]
        reused_evals = [e for e in view.evals() if e.reused]
        if reused or reused_evals:
            items.append(
                Item(
                    "continuation",
                    "continues the run",
                    "done",
                    detail=f"{len(reused)} segment(s) and {len(reused_evals)} evaluation(s) finished by "
                    f"earlier workflows, not run again",
                )
            )
    timers: list[Item] = []
    waiting: deque[Item] = deque()
    for e in events:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        aid = str(a.get("activity_id", ""))
        if e.type == "activity_scheduled":
            per = sorted(attempts.get(aid, {}).values(), key=lambda x: x.number)
            start = per[0].started_at if per else None
            end = per[-1].ended_at if per and per[-1].outcome != "running" else None
            if aid in segments:
                s = segments[aid]
                loss = f"loss {s.final_loss:.4f}" if _num(s.final_loss) is not None else ""
                redone = sum(x.redone_steps or 0 for x in per)
                detail = " · ".join(
                    x
                    for x in (
                        f"steps to {s.until}",
                        loss,
                        s.checkpoint or "",
                        f"{redone} step(s) redone" if redone else "",
                    )
                    if x
                )
                items.append(
                    Item("segment", f"segment {s.index}/{len(segments)} ({aid})", s.state, start, end, detail, per)
                )
            elif aid in evals:
                ev = evals[aid]
                items.append(
                    Item(
                        "evaluation",
                        f"{ev.suite} of {step_dir_name(ev.step)}",
                        ev.state,
                        start,
                        end,
                        headline(ev.suite, ev.metrics) + " · " + _figures(ev.metrics) if ev.metrics else "",
                        per,
                    )
                )
            else:
                state = per[-1].outcome if per else "scheduled"
                items.append(
                    Item(
                        "corpus" if aid.startswith(CORPUS_PREFIX) else "activity",
                        aid,
                        state,
                        start,
                        end,
                        str(a.get("name", "")),
                        per,
                    )
                )
        elif e.type == "timer_started":
            fire = _num(a.get("fire_at"))
            it = Item(
                "wait",
                f"durable wait of {a.get('seconds')} s",
                "waiting",
                e.time,
                fire,
                f"until {local_time(fire, date=True)}" if fire else "",
            )
            timers.append(it)
            waiting.append(it)
            items.append(it)
        elif e.type in ("timer_fired", "timer_canceled"):
            open_ = waiting.popleft() if waiting else None  # the oldest wait still open
            if open_ is not None:
                open_.state = "done" if e.type == "timer_fired" else "canceled"
                open_.end = e.time
        elif e.type == "cancel_requested":
            items.append(Item("cancel", "cancel requested", "requested", e.time, None))
        elif e.type in ("workflow_completed", "workflow_failed", "workflow_canceled"):
            items.append(
                Item(
                    "workflow",
                    e.type.replace("workflow_", "workflow "),
                    e.type.split("_")[1],
                    e.time,
                    e.time,
                    historyview.details(e),
                )
            )
    for t in timers:
        if t.state == "waiting" and t.end is not None:
            t.detail += f" · {fmt_duration(max(0.0, t.end - now))} left"
    if view is not None and isinstance(view.stopped_early, dict):
        _early_stop(view, items)
    return items


def _early_stop(view: RunView, items: list[Item]) -> None:
    """The early stop and the segments and evaluations it skipped, before the workflow's end row."""
    stop = view.stopped_early or {}
    at = next((i for i, it in enumerate(items) if it.kind == "workflow"), len(items))
    when = next(
        (
            s.ended_at
            for s in view.segments
            if s.state == "done"
            and s.ended_at is not None
            and s.checkpoint
            and checkpoint_step(s.checkpoint) == stop.get("step")
        ),
        None,
    )
    rows = [
        Item("stop", f"stopped early at step {stop.get('step')}", "stopped early", when, when, stopped_early_text(stop))
    ]
    for seg in view.segments:
        if seg.state == "skipped":
            rows.append(
                Item(
                    "segment",
                    f"segment {seg.index}/{len(view.segments)} ({seg.activity_id})",
                    "skipped",
                    detail=f"steps to {seg.until}: not run, the run stopped early at step {stop.get('step')}",
                )
            )
            rows += [
                Item(
                    "evaluation", f"{ev.suite} of {step_dir_name(ev.step)}", "skipped", detail="not run: stopped early"
                )
                for ev in seg.evals
                if ev.state == "skipped"
            ]
    items[at:at] = rows


def _figures(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def eval_series(view: RunView) -> dict[str, list[tuple[int, float]]]:
    """Each evaluation figure over the steps of the checkpoints it was measured on (``ppl/heldout/ppl``)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for ev in view.evals():
        if ev.state == "done":
            for key, value in ev.metrics.items():
                out.setdefault(f"{ev.suite}: {key}", []).append((ev.step, value))
    return out


def checkpoints(
    view: RunView, home: Path, events: Sequence[Any] = (), released: Sequence[Release] = ()
) -> list[Checkpoint]:
    """The run's checkpoints: on disk, named by its history, or pruned (retention.log), with their status:
    ``best`` as the run's selection named it (``best_checkpoints``), ``released vN`` by its published releases."""
    root = RunHome(home).run(view.name).ckpt_root
    try:
        on_disk = {p for p in os.listdir(root) if p.startswith("step-") and checkpoint_step(p) is not None}
    except OSError:
        on_disk = set()
    try:
        latest = Path((root / LATEST).read_text(encoding="utf-8").strip()).name
    except (OSError, UnicodeDecodeError):
        latest = ""
    pruned: set[str] = set()
    try:
        for line in (root / "retention.log").read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("pruned"), list):
                pruned.update(str(x) for x in entry["pruned"])
    except (OSError, UnicodeDecodeError):
        pass
    named = {Path(s.checkpoint).name for s in view.segments if s.checkpoint}
    if view.last_checkpoint:
        named.add(Path(view.last_checkpoint).name)
    for e in events:  # every checkpoint a heartbeat reported
        d = e.attrs.get("details") if e.type == "activity_heartbeat" and isinstance(e.attrs, dict) else None
        if isinstance(d, dict) and d.get("checkpoint"):
            named.add(Path(str(d["checkpoint"])).name)
    by_step: dict[int, list] = {}
    for ev in view.evals():
        if ev.state == "done":
            by_step.setdefault(ev.step, []).append(ev)
    best = {Path(str(b["checkpoint"])).name for b in best_checkpoints(view)}
    named |= best
    versions: dict[str, list[str]] = {}
    for r in released:
        if r.outcome == "published" and r.checkpoint and r.version:
            versions.setdefault(Path(r.checkpoint).name, []).append(r.version + (" CURRENT" if r.current else ""))
    out = []
    for name in sorted(on_disk | named | pruned, key=lambda n: checkpoint_step(n) or 0):
        step = checkpoint_step(name)
        flags = []
        if name == latest:
            flags.append(LATEST)
        if step in by_step:
            flags.append("evaluated")
        if name in best:
            flags.append("best")
        flags += [f"released {v}" for v in sorted(set(versions.get(name, [])))]
        present = name in on_disk
        if not present:
            flags.append("pruned" if name in pruned else "not on disk")
        figures = [headline(ev.suite, ev.metrics) for ev in (by_step.get(step, []) if step is not None else [])]
        figures += [
            f"{b.get('metric')} {b['value']:.4g}"
            for b in best_checkpoints(view)
            if Path(str(b["checkpoint"])).name == name and _num(b.get("value")) is not None
        ]
        out.append(Checkpoint(name, step, present, flags, "; ".join(figures)))
    return out


def _output_of(home: Path, name: str, workflow_id: str) -> Any:
    """``fn(activity_id, attempt)``: the folder of that attempt's kept output in this workflow ("" none)."""
    gen = workflow_generation(workflow_id)

    def find(activity_id: str, attempt: int) -> str:
        kept = [a for a in attempt_dirs(home, name, activity_id) if (a.generation, a.attempt) == (gen, attempt)]
        return str(kept[-1].directory.relative_to(home)) + "/" if kept else ""

    return find


def _stderr_tail(error: Any) -> str:
    for _ in range(8):
        if not isinstance(error, dict):
            return ""
        details = error.get("details")
        if isinstance(details, dict) and details.get("stderr_tail"):
            return str(details["stderr_tail"])
        error = error.get("cause")
    return ""


def run(
    engine: Backend,
    home: Path,
    workflow_id: str,
    now: float,
    *,
    kind: str = "",
    attempt: int | None = None,
    limit: int | None = 500,
    timeline_limit: int | None = 300,
) -> RunPage:
    """One workflow's page (``UnknownRun`` when there is no such workflow)."""
    try:
        st = engine.status(workflow_id)
        events = engine.history(workflow_id)
    except (NotFound, BadInput, KeyError) as err:
        raise UnknownRun(workflow_id) from err
    row = _row(engine, home, st, now, events=events)
    view = run_view(st.workflow_id, events, st.state) if st.workflow == "TrainRun" else None
    inp = events[0].attrs.get("input") if events and isinstance(events[0].attrs, dict) else {}
    spec = inp.get("spec") if isinstance(inp, dict) and isinstance(inp.get("spec"), dict) else inp
    base = workflow_id
    parts = workflow_id.split("/")
    if len(parts) >= 3 and parts[-1].isdigit():
        base = "/".join(parts[:-1])
    generations = [(g.workflow_id, g.state) for g in app.run_generations(engine, base)]
    shown = [
        e
        for e in events
        if (not kind or e.type == kind)
        and (attempt is None or (isinstance(e.attrs, dict) and e.attrs.get("attempt") == attempt))
    ]
    total_shown = len(shown)
    if limit is not None and len(shown) > limit:
        shown = shown[-limit:]
    rows = []
    for e in shown:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        n = a.get("attempt") if isinstance(a.get("attempt"), int) else None
        rows.append(
            EventRow(
                e.seq,
                e.time,
                e.type,
                str(a.get("activity_id", "")),
                n,
                historyview.details(e),
                json.dumps(a, indent=1, sort_keys=True, default=str),
            )
        )
    items = timeline(view, events, now, _output_of(home, view.name, workflow_id) if view and view.name else None)
    release = row.release
    runs_releases = releases(engine, home, view.name) if view and view.name else []
    s = series(view, home) if view and view.name else None
    ev_series = eval_series(view) if view else {}
    drawn, cards = charts(view, s, ev_series) if view and s is not None else ([], [])
    final = (final_of(view) or {}) if view else {}
    kinds = sorted({e.type for e in events})
    attempts = sorted(
        {e.attrs["attempt"] for e in events if isinstance(e.attrs, dict) and isinstance(e.attrs.get("attempt"), int)}
    )
    return RunPage(
        row=row,
        view=view,
        spec_json=json.dumps(spec, indent=2, sort_keys=True, default=str),
        generations=generations,
        timeline=items[-timeline_limit:] if timeline_limit else items,
        timeline_total=len(items),
        series=s,
        eval_series=ev_series,
        checkpoints=checkpoints(view, home, events, runs_releases) if view and view.name else [],
        events=rows,
        event_kinds=kinds,
        event_attempts=attempts,
        events_total=total_shown,
        stderr_tail=_stderr_tail(st.error),
        charts=drawn,
        cards=cards,
        releases=runs_releases if view else ([release] if release else []),
        selection=[line.strip() for line in selection_lines(view)] if view else [],
        stopped_early=stopped_early_text(view.stopped_early) if view and isinstance(view.stopped_early, dict) else "",
        final=final,
    )
