"""A run's plan and where its files are (activities, releases): plain functions over numbers and paths.

The standard library and contracts/ only (no pydantic model, no engine): the readers of a home (``ctl status``, ``ctl show``,
the live display, ``ctl ui``) import this module and not the workflows' models, whose pydantic classes
cost ~0.1 s of start-up. ``workflows.training`` and ``workflows.activities`` re-export these names.
"""

from __future__ import annotations

import json
from pathlib import Path

from contracts.layout import MANIFEST, RunHome
from contracts.layout import parse_step_dir as checkpoint_step  # noqa: F401 (re-exported)

ACTIVITY_TRAIN = "train"
ACTIVITY_EVAL = "eval"
ACTIVITY_CORPUS = "corpus"

WORKFLOW_TRAIN_RUN = "TrainRun"
WORKFLOW_EVAL_SUITE = "EvalSuite"
WORKFLOW_CORPUS_BUILD = "CorpusBuild"
WORKFLOW_MODEL_RELEASE = "ModelRelease"
ACTIVITY_PUBLISH = "publish"

MAX_SEGMENTS = 10_000
"""At most this many segments per run: each is a train activity, its evaluations and a timer in
one history that every replay walks, so the count is bounded before any work (issue 9, defect 8)."""


def check_segment_count(steps: int, eval_every: int) -> int:
    """How many segments ``segments(steps, eval_every)`` makes (not building them); ValueError over the bound."""
    n = 1 if eval_every <= 0 or eval_every >= steps else -(-steps // eval_every)
    if n > MAX_SEGMENTS:
        raise ValueError(
            f"steps {steps} with eval_every {eval_every} make {n} segments; at most {MAX_SEGMENTS} "
            f"are allowed (raise eval_every to at least {-(-steps // MAX_SEGMENTS)})"
        )
    return n


def segments(steps: int, eval_every: int) -> list[int]:
    """End steps ``[e, 2e, ..., N]``, ending exactly at N; ``e = 0`` or ``e >= N`` is one segment."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0, got {eval_every}")
    check_segment_count(steps, eval_every)
    if eval_every == 0 or eval_every >= steps:
        return [steps]
    ends = list(range(eval_every, steps, eval_every))
    return ends + [steps]


def activity_dir(home: Path, name: str, activity_id: str) -> Path:
    """Where an activity of run ``name`` keeps its spec and its attempts' progress files."""
    return RunHome(home).run(name).activity_dir(activity_id)


def progress_path(home: Path, name: str, activity_id: str, attempt: int) -> Path:
    """The progress file of one attempt (``ctl`` reads it to show how far an evaluation is)."""
    return RunHome(home).run(name).progress_file(activity_id, attempt)


def list_releases(home: Path, name: str | None = None) -> list[dict]:
    """Every published release of the home (or of run ``name``): manifest fields and CURRENT."""
    out = []
    root = RunHome(home).releases
    for run_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if name is not None and run_dir.name != name:
            continue
        try:
            current = (run_dir / "CURRENT").read_text(encoding="utf-8").strip()
        except OSError:
            current = None
        for v in sorted(run_dir.glob("v[0-9]*")):
            try:
                m = json.loads((v / MANIFEST).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            m = m if isinstance(m, dict) else {}  # damaged: the version is listed, without its fields
            given = m.get("figures")
            figures: dict = given if isinstance(given, dict) else {}
            out.append(
                {
                    "run": run_dir.name,
                    "version": v.name,
                    "path": f"releases/{run_dir.name}/{v.name}",
                    "current": v.name == current,
                    "checkpoint": m.get("checkpoint"),
                    "step": m.get("step"),
                    "digest": m.get("checkpoint_digest"),
                    "figures": {
                        k: x for k, x in figures.items() if isinstance(x, (int, float)) and not isinstance(x, bool)
                    },
                }
            )
    return out
