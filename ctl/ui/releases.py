"""The releases a page shows: each ModelRelease workflow as its recorded input and result say.

``release_of(status, input, current)``: the version it published (and whether releases/<run>/CURRENT
names it), the candidate checkpoint, its digest, each gate's outcome (passed / failed with its figure,
or ``no such figure``), the figures, or why nothing was published; a release still running shows the
gates it asked for. ``releases(engine, home, name)``: every release of run ``name``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import workflows

import app
from app import Backend

RELEASE = "ModelRelease"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass
class Release:
    """One ModelRelease workflow as its recorded input and result say (``release_of``)."""

    workflow_id: str
    state: str  # the workflow's state
    name: str = ""  # the run released
    outcome: str = "running"  # published | not published | running | failed | canceled
    version: str | None = None
    path: str | None = None
    current: bool = False  # releases/<run>/CURRENT names this version
    checkpoint: str | None = None
    step: int | None = None
    digest: str | None = None
    select: str | None = None
    gates: list[dict] = field(default_factory=list)  # {"gate", "figure", "passed"}; requested ones while running
    figures: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def gate_outcome(self) -> str:
        """``passed`` / ``failed`` / ``no gates`` / ``pending``."""
        if not self.gates:
            return "no gates"
        if any(g.get("passed") is False for g in self.gates):
            return "failed"
        return "passed" if all(g.get("passed") is True for g in self.gates) else "pending"

    def gate_texts(self) -> list[str]:
        """``ppl/ppl<=6.5 failed (242.775)`` for each gate."""
        out = []
        for g in self.gates:
            fig = g.get("figure")
            value = (
                "no such figure"
                if g.get("passed") is False and fig is None
                else (f"{fig:.6g}" if _num(fig) is not None else "")
            )
            verdicts: dict[Any, str] = {True: "passed", False: "failed"}
            verdict = verdicts.get(g.get("passed"), "pending")
            out.append(f"{g.get('gate')} {verdict}" + (f" ({value})" if value else ""))
        return out

    @property
    def css(self) -> str:
        """The state colour of its outcome: a release that published nothing reads as failed."""
        return {"published": "completed", "not published": "failed"}.get(self.outcome, self.state)


def current_versions(home: Path) -> dict[str, str]:
    """Run -> the version its releases/<run>/CURRENT names."""
    return {r["run"]: r["version"] for r in workflows.list_releases(home) if r.get("current")}


def release_of(st: Any, inp: Any, current: dict[str, str]) -> Release:
    """A ModelRelease workflow's ``Release``: its result when it ended, else its recorded request
    (``current``: run -> the version releases/<run>/CURRENT names)."""
    r = st.result if isinstance(st.result, dict) else {}
    i = inp if isinstance(inp, dict) else {}
    out = Release(st.workflow_id, st.state, name=str(r.get("name") or i.get("name") or ""))
    out.checkpoint = r.get("checkpoint") or i.get("checkpoint")
    step = r.get("step", i.get("step"))
    out.step = step if isinstance(step, int) else None
    out.digest = r.get("digest") or i.get("digest")
    out.select = r.get("select") or i.get("select")
    if isinstance(r.get("figures"), dict):
        out.figures = {k: float(v) for k, v in r["figures"].items() if _num(v) is not None}
    if isinstance(r.get("gates"), list):
        out.gates = [g for g in r["gates"] if isinstance(g, dict)]
    elif isinstance(i.get("gates"), list):  # not checked yet: the gates asked for
        out.gates = [
            {
                "gate": f"{g.get('suite')}/{g.get('figure')}{g.get('op')}{g.get('value'):g}",
                "figure": None,
                "passed": None,
            }
            for g in i["gates"]
            if isinstance(g, dict) and _num(g.get("value")) is not None
        ]
    if st.state == "completed" and r:
        out.outcome = "published" if r.get("published") else "not published"
        out.version, out.path, out.reason = r.get("version"), r.get("path"), str(r.get("reason") or "")
        out.current = bool(out.version) and current.get(out.name) == out.version
    elif st.state != "running":
        out.outcome = st.state
        out.reason = app.error_line(st.error) if st.error else ""
    return out


def releases(engine: Backend, home: Path, name: str) -> list[Release]:
    """The releases (ModelRelease workflows) of run ``name``, oldest first."""
    current = current_versions(home)
    out = [
        release_of(st, app.recorded_input(engine, st.workflow_id), current)
        for st in app.readable_workflows(engine)
        if st.workflow == RELEASE and st.workflow_id.startswith(f"release/{name}/")
    ]
    return sorted(out, key=lambda r: r.workflow_id)
