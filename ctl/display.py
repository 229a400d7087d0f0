"""The live display of ``ctl train`` (rich, on stderr).

On a terminal: one progress bar over the whole run's steps (step/total, smoothed and last
loss, tokens/s, elapsed, ETA) and a second row for the phase: training segment k/n (its own
step range), evaluating suite s of checkpoint c with its own progress (``37/120 windows, ETA
0:04``, from the counts ``tinyllm eval`` writes to its attempt's progress file, see
ctl/evalprogress.py; an ``eval_command`` without counts: the time elapsed against the previous
evaluations'), or waiting until HH:MM:SS with a countdown. Each checkpoint, finished segment
and evaluation is printed above it as one permanent line with its figure (``ppl 7.41 at step 200``),
and so is a warning a metrics frame carries (GRPO without a learning signal: tinyllm/objectives/no_signal.py).

Not a terminal (CI logs): the same permanent lines, the phase changes, and a status line
every ``CTL_PROGRESS_EVERY_S`` seconds (default 10) instead of the bar.

On resume (the history already has events when ``ctl train`` starts), one line says what
happens ("resumed train-000200 (segment 2/3) from step 150; 12 steps since that checkpoint
are redone") instead of replaying old events; the loss of the dead attempt's lease that the
engine records right after is not shown again.

It reads the history through the ``ctl`` process's own Engine (one connection per process:
never a second Engine, never an open() of engine.db) and follows ``runs/<name>/metrics.jsonl``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from app import Backend
from contracts.activity_ids import is_eval
from contracts.layout import RunHome
from contracts.layout import parse_step_dir as checkpoint_step
from contracts.resume import expected_resume
from engine import read_events
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from tinyllm.objectives.no_signal import warning_text

from .evalprogress import EvalCounts, EvalFollower, run_name
from .runstatus import worker_info
from app.runview import (
    MetricsTail,
    RunView,
    figures_text,
    first_subject_metrics,
    fmt_duration,
    headline,
    local_time,
    run_view,
)

DEFAULT_PLAIN_EVERY_S = 10.0
MAX_EVENTS_PER_POLL = 10_000  # a bounded read per poll; the rest comes with the next one


def _plain_every_s() -> float:
    try:
        return max(0.2, float(os.environ.get("CTL_PROGRESS_EVERY_S", DEFAULT_PLAIN_EVERY_S)))
    except ValueError:
        return DEFAULT_PLAIN_EVERY_S


def _loss(x: float | None) -> str:
    return "?" if x is None else f"{x:.4f}"


def _rate(tok_s: float | None) -> str:
    """``1.2k tok/s``; empty until measured (two frames of one stretch), never a ``?`` placeholder."""
    if tok_s is None:
        return ""
    return f"{tok_s / 1000:.1f}k tok/s" if tok_s >= 1000 else f"{tok_s:.0f} tok/s"


def resume_lines(details: dict) -> list[str]:
    """What a trainer's resume progress line says: each refused checkpoint and why, then what it used."""
    lines = [
        f"  [yellow]refused checkpoint[/] {r.get('checkpoint')}: {r.get('reason')}"
        for r in details.get("refused") or []
        if isinstance(r, dict)
    ]
    used = details.get("resumed_from")
    if used and lines:
        at = f" at step {details['step']}" if isinstance(details.get("step"), int) else ""
        lines.append(f"  resumed from {used}{at} instead")
    return lines


class LiveDisplay:
    """Follows workflow ``workflow_id`` of ``engine`` from ``start()`` to ``stop()``."""

    def __init__(
        self,
        home: Path,
        engine: Backend,
        workflow_id: str,
        *,
        console: Console | None = None,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ):
        self.home, self.engine, self.workflow_id, self.poll_s, self.clock = (
            Path(home),
            engine,
            workflow_id,
            poll_s,
            clock,
        )
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self.plain_every_s = _plain_every_s()
        self._stop = threading.Event()
        self._final = True  # stop(): poll once more for whatever ended the run (not after an interrupt)
        self._thread = threading.Thread(target=self._run, name="ctl-display", daemon=True)
        self.events: list[Any] = []
        self.tail: MetricsTail | None = None
        self._t0 = clock()
        self._last_plain = 0.0
        self._last_phase = ""
        self._suppress: set[str] = set()  # "activity#attempt" of the dead attempt a resume replaces
        self._progress: Progress | None = None
        self._tasks: dict[str, Any] = {}
        self._evals = EvalFollower(self.home)
        self._eval_counts: EvalCounts | None = None  # of the evaluation in flight, from its progress file
        self._warned: set[str] = set()  # a frame's warning (tinyllm/objectives/no_signal.py), printed once
        self._stopping: str | None = None  # the signal of a polite stop in progress (ctl/interrupt.py)
        self._stopping_shown = False

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> "LiveDisplay":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Print the opening line (a new run's plan, or the resume line), then follow in a thread."""
        self._read_events()
        view = self._view()
        if view.name:
            self.tail = MetricsTail(RunHome(self.home).run(view.name).metrics)
            # the file as the last attempt left it (its last step is what a resume redoes); its warnings were shown then
            self._warned.update(t for f in self.tail.poll() if (t := warning_text(f)))
        self._emit(self._opening_line(view))
        self._thread.start()

    def stop(self, *, final: bool = True, wait_s: float = 5.0) -> None:
        """Stop following. ``final`` False (ctl interrupted): no last poll, and no error is reported any
        more (the process is going away under the display)."""
        self._final = self._final and final
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=wait_s)

    def stopping(self, signal_name: str) -> None:
        """A polite stop began (called from the signal handler: one assignment); the display says so."""
        self._stopping = signal_name

    def _stopping_text(self, view: RunView) -> str:
        step = self.tail.step if self.tail is not None and self.tail.step is not None else None
        what = (
            f"checkpointing step {step}"
            if step is not None and view.phase.kind == "training"
            else f"stopping {view.phase.text or 'the run'}"
        )
        return f"stopping ({self._stopping}): {what} ... (Ctrl-C again to stop now)"

    # -- reading -------------------------------------------------------------------------

    def _read_events(self) -> list[Any]:
        after = self.events[-1].seq if self.events else 0
        store = self.engine.store
        if store is None:  # another backend (Temporal): its own history call
            new = [e for e in self.engine.history(self.workflow_id) if e.seq > after][:MAX_EVENTS_PER_POLL]
        else:
            with store._lock:  # the engine's own connection; its reads are serialized by this lock
                new = read_events(store.conn, self.workflow_id, after, MAX_EVENTS_PER_POLL)
        self.events.extend(new)
        return new

    def _view(self) -> RunView:
        return run_view(self.workflow_id, self.events)

    # -- the opening line ----------------------------------------------------------------

    def _opening_line(self, view: RunView) -> str:
        inp = (self.events[0].attrs.get("input") or {}) if self.events else {}
        if not view.name and isinstance(inp.get("subjects"), list):  # an EvalSuite workflow (ctl eval)
            subjects = [str(s.get("id")) if isinstance(s, dict) else str(s) for s in inp["subjects"]]
            shown = ", ".join(subjects[:4]) + (" ..." if len(subjects) > 4 else "")
            return (
                f"[bold]{self.workflow_id}[/]: evaluating {len(subjects)} subject(s) ({shown}) with "
                f"{', '.join(map(str, inp.get('suites') or []))}"
            )
        n = len(view.segments)
        plan = f"{view.total_steps} steps in {n} segment(s)" + (
            f", each checkpoint evaluated with {', '.join(view.suites)}" if view.suites else ", no evaluation"
        )
        if len(self.events) <= 1 and not any(s.reused for s in view.segments):
            return f"[bold]{self.workflow_id}[/]: {plan}"
        return f"[bold]{self.workflow_id}[/]: " + self._resume_text(view)

    def _resume_text(self, view: RunView) -> str:
        done = len([s for s in view.segments if s.state == "done"])
        head = f"segments {done}/{len(view.segments)} done"
        p = view.phase
        if p.kind in ("training", "evaluating", "corpus") and p.activity_id:
            started = {
                f"{e.attrs.get('activity_id')}#{e.attrs.get('attempt')}": e.time
                for e in self.events
                if e.type == "activity_started"
            }
            w = worker_info(self.engine, self.workflow_id, self.clock(), started)
            if w.get("live") and w.get("pid") != os.getpid():
                return f"attached; pid {w['pid']} on {w['host']} runs {p.activity_id} ({head})"
            self._suppress.add(f"{p.activity_id}#{p.attempt}")
        if p.kind == "training" and p.activity_id:
            return self._resume_training(view, p.activity_id)
        if p.kind == "evaluating":
            return f"resumed ({head}): {p.text} is run again (its attempt was interrupted)"
        if p.kind == "waiting" and p.until is not None:
            left = max(0.0, p.until - self.clock())
            return (
                f"resumed ({head}): waiting until {local_time(p.until)} ({fmt_duration(left)} left, the recorded timer)"
            )
        reused = [s for s in view.segments if s.reused]
        if reused:
            return f"continuing the run ({head}, finished by earlier workflows: not run again)"
        return f"resumed ({head}), at step {view.steps_done()}/{view.total_steps}"

    def _resume_training(self, view: RunView, activity_id: str) -> str:
        seg = view.segment(activity_id)
        label = f"{activity_id} (segment {seg.index}/{len(view.segments)})" if seg else activity_id
        details = next(
            (
                e.attrs.get("details")
                for e in reversed(self.events)
                if e.type == "activity_heartbeat" and e.attrs.get("activity_id") == activity_id
            ),
            None,
        )
        until = seg.until if seg else view.total_steps
        # what the trainer will really resume from: the workflow's --resume, then the trainer's own choice
        ckpt = expected_resume(self.home, view.name, until, (seg.attempts if seg else 1) + 1, details)
        from_step = checkpoint_step(ckpt) if ckpt else None
        last = self.tail.step if self.tail is not None else None
        if from_step is None:
            lost = f"; {last} step(s) are redone" if last else ""
            return f"resumed {label} from the start (no checkpoint yet){lost}"
        redone = max(0, (last or from_step) - from_step)
        return f"resumed {label} from step {from_step} ({ckpt}); {redone} step(s) since that checkpoint are redone"

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.live:
                self._progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(bar_width=24),
                    TextColumn("{task.fields[info]}"),
                    console=self.console,
                    transient=True,
                    refresh_per_second=4,
                )
                with self._progress:
                    self._tasks["run"] = self._progress.add_task("run", total=1, info="")
                    self._tasks["phase"] = self._progress.add_task("", total=None, info="")
                    self._loop()
                self._progress = None
            else:
                self._loop()
            if self._final:
                self._poll()  # whatever ended the run
        except Exception as e:  # noqa: BLE001 - the display must never break the run
            if self._final:  # not while ctl is going away under it (interrupted)
                self.console.print(f"(progress display stopped: {type(e).__name__}: {e})")

    def _loop(self) -> None:
        while True:
            self._poll()
            if self._stop.wait(self.poll_s):
                return

    def _emit(self, text: str) -> None:
        (self._progress.console if self._progress else self.console).print(text)

    def _poll(self) -> None:
        new = self._read_events()
        if self.tail is None and self.events:
            name = self._view().name
            if name:
                self.tail = MetricsTail(RunHome(self.home).run(name).metrics)
        if self.tail is not None:
            for frame in self.tail.poll():
                text = warning_text(frame)
                if text and text not in self._warned:  # once: a resume re-reads the rewritten file
                    self._warned.add(text)
                    self._emit(f"[yellow]warning[/] at step {frame['step']}: {text}")
        view = self._view()
        for e in new:
            line = self._event_line(view, e)
            if line:
                self._emit(line)
        now = self.clock()
        self._eval_counts = self._evals.counts(view, run_name(view, self.events), now)
        self._update(view, now)

    def _event_line(self, view: RunView, e: Any) -> str | None:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        aid = str(a.get("activity_id", ""))
        if f"{aid}#{a.get('attempt')}" in self._suppress and e.type in ("activity_timed_out", "activity_failed"):
            return None
        if e.type == "activity_heartbeat":
            d = a.get("details")
            if isinstance(d, dict) and d.get("event") == "resume":
                return "\n".join(resume_lines(d)) or None
            if isinstance(d, dict) and d.get("checkpoint"):
                return f"  checkpoint step {d.get('step')}  loss {_loss(d.get('loss'))}  {d['checkpoint']}"
        elif e.type == "activity_started" and not self.live:
            seg = view.segment(aid)  # each segment's start is said even when it ends between two polls (warm starts)
            text = f"training segment {seg.index}/{len(view.segments)}" if seg is not None else None
            if text is not None and text != self._last_phase:
                self._last_phase = text
                return text
        elif e.type == "activity_completed":
            seg = view.segment(aid)
            if seg is not None:
                took = fmt_duration(seg.duration_s) if seg.duration_s is not None else "?"
                return (
                    f"segment {seg.index}/{len(view.segments)} done: step {seg.until}, "
                    f"loss {_loss(seg.final_loss)} ({seg.final_loss_hex}), {took}"
                )
            ev = next((x for x in view.evals() if x.activity_id == aid), None)
            if ev is not None:
                return f"[green]{headline(ev.suite, ev.metrics)}[/] at step {ev.step}  ({ev.suite}: {figures_text(ev.metrics)})"
            if is_eval(aid):  # an EvalSuite workflow's suite
                r = res if isinstance(res := a.get("result"), dict) else {}
                metrics = first_subject_metrics(r)
                return f"[green]{headline(str(r.get('suite', aid)), metrics)}[/]  ({aid}: {figures_text(metrics)})"
        elif e.type in ("activity_failed", "activity_timed_out"):
            err = a.get("error") or {}
            msg = (err.get("message", "") if isinstance(err, dict) else str(err)).strip().splitlines()
            how = "failed for good" if a.get("final") else "will retry"
            return f"[yellow]{aid} attempt {a.get('attempt')} {e.type.split('_', 1)[1]} ({how})[/]: {msg[0] if msg else ''}"
        elif e.type == "timer_started" and not self.live:
            fire = a.get("fire_at")
            return f"waiting {a.get('seconds')} s, until {local_time(fire) if isinstance(fire, (int, float)) else '?'}"
        elif e.type == "activity_preempted":
            step, lost = a.get("step"), a.get("steps_lost")
            saved = f"saved step {step}" if step is not None else "no checkpoint"
            more = f", {lost} steps lost" if lost is not None else ""
            grace = " (killed at the grace)" if a.get("killed_at_grace") else ""
            return f"[yellow]{aid} attempt {a.get('attempt')} preempted by {a.get('signal')}[/]: {saved}{more}{grace}"
        elif e.type == "preempted":
            return f"[yellow]stopped by {a.get('signal')}[/] while {a.get('waiting_on') or 'nothing ran'}"
        elif e.type == "cancel_requested":
            return "[yellow]cancel requested[/]: stopping after a checkpoint"
        elif e.type == "workflow_completed":
            wall = e.time - view.started_at if view.started_at else None
            worked = view.worked_s if view.worked_s is not None else wall
            also = (
                f" ({fmt_duration(wall)} wall)"
                if wall is not None and worked is not None and wall - worked >= 1
                else ""
            )
            return f"[green]{self.workflow_id} completed[/] in {fmt_duration(worked)}{also}"
        elif e.type == "workflow_canceled":
            return f"[yellow]{self.workflow_id} canceled[/] (checkpoints kept; the same command continues it)"
        elif e.type == "workflow_failed":
            return f"[red]{self.workflow_id} failed[/]"
        return None

    # -- the live part ---------------------------------------------------------------------

    def _figures(self, view: RunView, now: float) -> dict:
        tail = self.tail
        step = (tail.step if tail and tail.step is not None else None) or view.last_checkpoint_step or view.steps_done()
        step_rate, tok_rate = tail.rates() if tail else (None, None)
        eval_left_s = self._eval_counts.eta_s if self._eval_counts is not None else None
        return {
            "step": step,
            "smoothed": tail.smoothed if tail else None,
            "last": tail.last_loss if tail else None,
            "tok_s": tok_rate,
            "eta_s": view.remaining_work_s(step, step_rate, now, eval_left_s),
            "elapsed_s": now - self._t0,
        }

    def run_line(self, view: RunView, now: float) -> str:
        f = self._figures(view, now)
        pct = 100.0 * f["step"] / view.total_steps if view.total_steps else 0.0
        parts = [
            f"step {f['step']}/{view.total_steps} ({pct:.0f}%)",
            f"ETA {fmt_duration(f['eta_s'])}",
            f"loss {_loss(f['smoothed'])} (last {_loss(f['last'])})",
            _rate(f["tok_s"]),
            f"elapsed {fmt_duration(f['elapsed_s'])}",
        ]
        return " | ".join(p for p in parts if p)

    def phase_line(self, view: RunView, now: float) -> tuple[str, str, float | None, float]:
        """(what, detail, total, completed) of the phase row."""
        p = view.phase
        if p.kind == "training" and p.segment:
            seg = view.segments[p.segment - 1]
            lo = view.segments[p.segment - 2].until if p.segment > 1 else 0
            step = self.tail.step if self.tail and self.tail.step is not None else lo
            done = min(max(0, step - lo), seg.until - lo)
            return p.text, f"steps {lo + 1}..{seg.until}", float(seg.until - lo), float(done)
        if p.kind == "evaluating":
            what, _, of = p.text.partition(" of ")
            of = f"{of}: " if of else ""
            c = self._eval_counts
            if c is not None:  # its own count (tinyllm eval's progress lines)
                return what, f"{of}{c.text()}", float(c.of), float(c.done)
            took = [e.duration_s for e in view.evals() if e.duration_s is not None and not e.reused]
            elapsed = max(0.0, now - (p.since or now))
            if took:
                expect = sum(took) / len(took)
                return what, f"{of}{fmt_duration(elapsed)} of ~{fmt_duration(expect)}", expect, min(elapsed, expect)
            return what, f"{of}{fmt_duration(elapsed)}", None, 0.0
        if p.kind == "waiting" and p.until is not None:
            total = max(0.0, p.until - (p.since or p.until))
            left = max(0.0, p.until - now)
            return "waiting", f"until {local_time(p.until)}: {fmt_duration(left)} left", total or 1.0, total - left
        return p.text, "", None, 0.0

    def _update(self, view: RunView, now: float) -> None:
        if view.phase.kind == "ended":
            return
        if self._stopping is not None:
            text = self._stopping_text(view)
            if self._progress is not None:
                self._progress.update(self._tasks["phase"], description="[yellow]stopping[/]", total=None, info=text)
            elif not self._stopping_shown:
                self.console.print(text)
            self._stopping_shown = True
            return
        if not view.total_steps:  # not a training run: the phase only
            if self._progress is not None:
                what, detail, ptotal, pdone = self.phase_line(view, now)
                self._progress.update(self._tasks["run"], visible=False)
                self._progress.update(
                    self._tasks["phase"], description=what, total=ptotal, completed=pdone, info=detail
                )
            elif view.phase.text != self._last_phase and view.phase.kind == "evaluating":
                self._last_phase = view.phase.text
                self.console.print(view.phase.text)
            return
        what, detail, ptotal, pdone = self.phase_line(view, now)
        if self._progress is not None:
            f = self._figures(view, now)
            self._progress.update(
                self._tasks["run"],
                description=f"[bold]{self.workflow_id}[/]",
                total=max(1, view.total_steps),
                completed=f["step"],
                info=self.run_line(view, now),
            )
            self._progress.update(self._tasks["phase"], description=what, total=ptotal, completed=pdone, info=detail)
            return
        phase = f"{what}: {detail}" if detail else what
        if view.phase.kind == "evaluating" and self._eval_counts is not None:
            phase = f"{view.phase.text}: {self._eval_counts.text()}"
        key = view.phase.text
        if key != self._last_phase and view.phase.kind in ("training", "evaluating", "corpus"):
            self._last_phase = key
            self.console.print(key)
        if now - self._last_plain >= self.plain_every_s and view.phase.kind != "starting":
            self._last_plain = now
            self.console.print(f"{phase} | {self.run_line(view, now)}")
