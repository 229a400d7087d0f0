"""How far the evaluation in flight is: the ``done``/``of`` counts of its attempt's progress file.

``tinyllm eval --progress FILE`` writes ``ready`` and ``progress`` liveness lines with ``done``,
``of`` and ``unit`` (held-out ``windows`` for ppl, ``items`` for zoo, over the whole suite;
contracts/subprocess-activity.md). The runner names the file
``runs/<name>/activity/<activity-id>/progress-<attempt>.jsonl`` (``workflows.activities.progress_path``).
``EvalProgress`` follows it read-only and bounded (``JsonlTail``), and gives the latest counts with
an ETA from the rate between the first and the latest counted line. A user's ``eval_command``
that writes no counts gives None: the callers then show the time elapsed against earlier
evaluations, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflows.plan import progress_path

from app.runview import JsonlTail, RunView, fmt_duration

MAX_UNIT_CHARS = 24


@dataclass(frozen=True)
class EvalCounts:
    done: int
    of: int
    unit: str
    eta_s: float | None  # None: no rate measured yet

    def text(self) -> str:
        """``37/120 windows, ETA 0:04``."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.done}/{self.of}{unit}, ETA {fmt_duration(self.eta_s)}"

    def to_json(self) -> dict:
        return {"done": self.done, "of": self.of, "unit": self.unit, "eta_s": self.eta_s}


def _count(line: dict) -> tuple[int, int] | None:
    done, of = line.get("done"), line.get("of")
    if type(done) is int and type(of) is int and 0 <= done <= of and of > 0:  # (bool is no count)
        return done, of
    return None


class EvalProgress(JsonlTail):
    """Follows one eval attempt's progress file."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.first: tuple[float, int] | None = None  # (time, done) of the first counted line
        self.last: tuple[float | None, int, int, str] | None = None  # (time, done, of, unit) of the latest

    def restarted(self) -> None:
        self.first = self.last = None

    def poll(self) -> None:
        for line in self.poll_objects():
            c = _count(line)
            if c is None:
                continue
            t = line.get("time")
            t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
            unit = line.get("unit")
            unit = unit[:MAX_UNIT_CHARS] if isinstance(unit, str) else ""
            if self.last is not None and self.last[2] != c[1]:  # another total: a new count
                self.first = None
            if self.first is None and t is not None:
                self.first = (t, c[0])
            self.last = (t, c[0], c[1], unit)

    def counts(self, now: float) -> EvalCounts | None:
        """The latest counts (None before any), the ETA extrapolated to ``now``."""
        if self.last is None:
            return None
        t, done, of, unit = self.last
        eta = None
        if done >= of:
            eta = 0.0
        elif self.first is not None and t is not None and t > self.first[0] and done > self.first[1]:
            rate = (done - self.first[1]) / (t - self.first[0])
            eta = max(0.0, (of - done) / rate - max(0.0, now - t))
        return EvalCounts(done, of, unit, eta)


class EvalFollower:
    """The ``EvalProgress`` of the evaluation a run's phase names (a new one for each attempt)."""

    def __init__(self, home: Path):
        self.home = Path(home)
        self._key: tuple[str, str, int] | None = None
        self._tail: EvalProgress | None = None

    def counts(self, view: RunView, name: str, now: float) -> EvalCounts | None:
        """The counts of the eval in flight in ``view`` (run ``name``), or None."""
        p = view.phase
        if p.kind != "evaluating" or not p.activity_id or not name or not isinstance(p.attempt, int):
            self._key = self._tail = None
            return None
        key = (name, p.activity_id, p.attempt)
        if key != self._key:
            self._key, self._tail = key, EvalProgress(progress_path(self.home, name, p.activity_id, p.attempt))
        assert self._tail is not None
        self._tail.poll()
        return self._tail.counts(now)


def run_name(view: RunView, events: list[Any]) -> str:
    """The run whose folder holds the evals' files: the TrainRun's spec name, else EvalSuite's ``name``."""
    if view.name:
        return view.name
    inp = (events[0].attrs.get("input") or {}) if events and isinstance(events[0].attrs, dict) else {}
    return str(inp.get("name") or "") if isinstance(inp, dict) else ""
