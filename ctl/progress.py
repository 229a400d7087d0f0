"""The live progress of a run, read from its history and its metrics file (rich, on stderr).

A thread polls the history through the ``ctl`` process's own Engine (one connection per process:
never a second Engine or any other open of engine.db, see engine/store.py) and
``runs/<name>/metrics.jsonl``:
finished steps of the history are printed as lines (segment, checkpoint, evaluation, wait);
on a terminal a live status line shows the segment, step and loss of the trainer in flight.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

import workflows


def _tail_json(path: Path, max_bytes: int = 8192) -> dict | None:
    """The last complete JSON line of ``path`` (or None)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def start_line(workflow_id: str, inp: dict, ends: list[int]) -> str:
    """The header of a run: a training's segments, or an evaluation's suites and subjects."""
    if isinstance(inp.get("suites"), list) and isinstance(inp.get("subjects"), list):
        subjects = [str(s.get("id")) if isinstance(s, dict) else str(s) for s in inp["subjects"]]
        shown = ", ".join(subjects[:4]) + (" ..." if len(subjects) > 4 else "")
        return (f"[bold]{workflow_id}[/]: evaluating {len(subjects)} subject(s) ({shown}) with "
                f"{', '.join(map(str, inp['suites']))}")
    return f"[bold]{workflow_id}[/]: {len(ends)} segment(s) to step {ends[-1] if ends else '?'}"


def summary_text(result: dict, limit: int = 4) -> str:
    """``task/metric=value ...`` of an eval result's summary (first subject), or ``done``."""
    metrics = (result.get("summary") or {}).get("metrics") or {}
    flat = []
    for subject, values in metrics.items():
        if isinstance(values, dict):
            flat += [f"{k}={v:.4g}" for k, v in values.items() if isinstance(v, (int, float))]
        break
    return " ".join(flat[:limit]) or "done"


class Progress:
    """Follows workflow ``workflow_id`` until ``stop()``; prints to stderr."""

    def __init__(self, home: Path, engine: Any, workflow_id: str, *, poll_s: float = 0.5,
                 console: Console | None = None):
        """``engine``: the Engine this process runs the workflow with (its reads are thread-safe)."""
        self.home, self.engine, self.workflow_id, self.poll_s = home, engine, workflow_id, poll_s
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctl-progress", daemon=True)
        self._seen = 0
        self._ends: list[int] = []
        self._name = ""
        self._current: str | None = None

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        engine = self.engine
        try:
            if self.console.is_terminal:
                with Live(Text(""), console=self.console, refresh_per_second=4, transient=True) as live:
                    while True:
                        self._poll(engine, live.console.print)
                        live.update(Text(self._status_line()))
                        if self._stop.wait(self.poll_s):
                            break
            else:
                while True:
                    self._poll(engine, self.console.print)
                    if self._stop.wait(self.poll_s):
                        break
            self._poll(engine, self.console.print)
        except Exception as e:  # the display must never break the run
            self.console.print(f"(progress display stopped: {e})")

    def _segment_label(self, activity_id: str) -> str:
        try:
            until = int(activity_id.split("-")[1])
            i = self._ends.index(until) + 1
            return f"segment {i}/{len(self._ends)} ({activity_id})"
        except (ValueError, IndexError):
            return activity_id

    def _poll(self, engine: Any, emit: Any) -> None:
        events = engine.history(self.workflow_id)
        for e in events[self._seen:]:
            a = e.attrs
            aid = a.get("activity_id", "")
            if e.type == "workflow_started":
                spec = (a.get("input") or {}).get("spec") or {}
                self._name = str(spec.get("name", ""))
                try:
                    self._ends = workflows.segments(int(spec.get("steps", 0)), int(spec.get("eval_every", 0)))
                except (TypeError, ValueError):
                    self._ends = []
                emit(start_line(self.workflow_id, a.get("input") or {}, self._ends))
            elif e.type == "activity_started":
                self._current = aid
                label = self._segment_label(aid) if aid.startswith("train-") else aid
                resume = " (redelivered)" if a.get("attempt", 1) > 1 else ""
                emit(f"{label}: attempt {a.get('attempt', 1)} started{resume}")
            elif e.type == "activity_heartbeat" and isinstance(a.get("details"), dict):
                d = a["details"]
                if "checkpoint" in d:
                    loss = d.get("loss")
                    loss_text = f" loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
                    emit(f"  checkpoint step {d.get('step')}{loss_text} -> {d['checkpoint']}")
            elif e.type == "activity_completed":
                r = a.get("result") or {}
                if aid.startswith("train-"):
                    emit(f"{self._segment_label(aid)}: done at step {r.get('steps')} "
                         f"loss {r.get('final_loss_hex')} digest {str(r.get('digest', ''))[:12]}")
                elif aid.startswith("eval-"):
                    emit(f"{aid}: {summary_text(r)}")
                else:
                    emit(f"{aid}: done")
                self._current = None
            elif e.type in ("activity_failed", "activity_timed_out"):
                err = a.get("error") or {}
                final = "failed for good" if a.get("final") else "will retry"
                msg = err.get("message", "") if isinstance(err, dict) else str(err)
                emit(f"{aid}: attempt {a.get('attempt')} {e.type.split('_', 1)[1]} ({final}): {msg.splitlines()[0] if msg else ''}")
            elif e.type == "timer_started":
                emit(f"waiting {a.get('seconds')} s before the next segment")
            elif e.type == "cancel_requested":
                emit("[yellow]cancel requested[/]: stopping after a checkpoint")
            elif e.type == "workflow_completed":
                emit(f"[green]{self.workflow_id} completed[/]")
            elif e.type == "workflow_canceled":
                emit(f"[yellow]{self.workflow_id} canceled[/] (checkpoints kept; the same command continues it)")
            elif e.type == "workflow_failed":
                emit(f"[red]{self.workflow_id} failed[/]")
        self._seen = len(events)

    def _status_line(self) -> str:
        if not self._current or not self._current.startswith("train-") or not self._name:
            return f"{self._current or 'working'}..."
        frame = _tail_json(self.home / "runs" / self._name / "metrics.jsonl") or {}
        loss = frame.get("train/loss")
        loss_text = f" loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
        return f"{self._segment_label(self._current)}: step {frame.get('step', '?')}{loss_text}"
