"""Every path of a run home, spelled once (contracts/subprocess-activity.md, "Home folder").

::

    <home>/.ctl/engine.db                              the engine's database
    <home>/.ctl/activity/<activity-id>/                a corpus build's spec and progress
    <home>/corpora/<corpus>/                           tokens.bin, heldout.bin, meta.json
    <home>/runs/<name>/.lock                           the run lock (one live trainer)
    <home>/runs/<name>/ckpt/step-NNNNNN/               one checkpoint, its manifest.json
    <home>/runs/<name>/ckpt/LATEST                     the newest full checkpoint's directory name
    <home>/runs/<name>/checkpoint_artifacts/iter_NNNNNN/   non-resumable partial artifacts
    <home>/runs/<name>/metrics.jsonl                   one JSON frame per step
    <home>/runs/<name>/activity/<activity-id>/         spec.json, progress-<attempt>.jsonl, logs/
    <home>/evals/<suite>/<run>/                        results.jsonl, summary.json
    <home>/releases/<run>/<version>/                   a published model

``RunHome(home)`` gives the absolute paths; ``checkpoint_ref`` the home-relative string a result line,
a heartbeat and a resume argument carry (``runs/<name>/ckpt/step-NNNNNN``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CTL_DIR = ".ctl"
ENGINE_DB = "engine.db"
RUNS = "runs"
CORPORA = "corpora"
EVALS = "evals"
RELEASES = "releases"
CKPT = "ckpt"
LATEST = "LATEST"
MANIFEST = "manifest.json"
ARTIFACTS = "checkpoint_artifacts"
ACTIVITY = "activity"
METRICS = "metrics.jsonl"
LOCK = ".lock"
STEP_PREFIX = "step-"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
_RUN_AT_STEP = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)@(\d+)$")


def step_dir_name(step: int) -> str:
    """``step-000500``: a checkpoint's directory name."""
    return f"{STEP_PREFIX}{step:06d}"


def parse_step_dir(path: str | Path | None) -> int | None:
    """The step a ``.../step-NNNNNN`` path (or name) names, or None."""
    if path is None:
        return None
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def artifact_dir_name(step: int) -> str:
    """``iter_000500``: a non-resumable artifact's directory name."""
    return f"iter_{step:06d}"


def checkpoint_ref(name: str, step: int) -> str:
    """The home-relative path of run ``name``'s checkpoint at ``step``: ``runs/<name>/ckpt/step-NNNNNN``."""
    return f"{RUNS}/{name}/{CKPT}/{step_dir_name(step)}"


def ckpt_ref(name: str, dir_name: str) -> str:
    """The home-relative path of the checkpoint directory ``dir_name`` of run ``name`` (e.g. LATEST's target)."""
    return f"{RUNS}/{name}/{CKPT}/{dir_name}"


def progress_name(attempt: int) -> str:
    """``progress-<attempt>.jsonl``: one attempt's progress file in its activity folder."""
    return f"progress-{attempt}.jsonl"


@dataclass(frozen=True)
class RunDir:
    """The folder of one run, ``<home>/runs/<name>``, and every path in it."""

    path: Path
    name: str

    @property
    def ckpt_root(self) -> Path:
        return self.path / CKPT

    @property
    def latest(self) -> Path:
        return self.path / CKPT / LATEST

    def step_dir(self, step: int) -> Path:
        return self.path / CKPT / step_dir_name(step)

    @property
    def artifacts_root(self) -> Path:
        return self.path / ARTIFACTS

    def artifact_dir(self, step: int) -> Path:
        return self.path / ARTIFACTS / artifact_dir_name(step)

    @property
    def activity_root(self) -> Path:
        return self.path / ACTIVITY

    def activity_dir(self, activity_id: str) -> Path:
        return self.path / ACTIVITY / activity_id

    def progress_file(self, activity_id: str, attempt: int) -> Path:
        return self.activity_dir(activity_id) / progress_name(attempt)

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def lock(self) -> Path:
        return self.path / LOCK


@dataclass(frozen=True)
class RunHome:
    """A home folder and every path in it (``RunHome(home).run(name).step_dir(500)``)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def ctl_dir(self) -> Path:
        return self.root / CTL_DIR

    @property
    def engine_db(self) -> Path:
        return self.root / CTL_DIR / ENGINE_DB

    def ctl_activity_dir(self, activity_id: str) -> Path:
        """A corpus build's spec and progress (shared by the runs on that corpus)."""
        return self.root / CTL_DIR / ACTIVITY / activity_id

    @property
    def runs(self) -> Path:
        return self.root / RUNS

    def run(self, name: str) -> RunDir:
        return RunDir(self.root / RUNS / name, name)

    @property
    def corpora(self) -> Path:
        return self.root / CORPORA

    def corpus(self, name: str) -> Path:
        return self.root / CORPORA / name

    @property
    def evals(self) -> Path:
        return self.root / EVALS

    def eval_dir(self, suite: str, run: str) -> Path:
        return self.root / EVALS / suite / run

    @property
    def releases(self) -> Path:
        return self.root / RELEASES

    def release_dir(self, run: str, version: str | None = None) -> Path:
        return self.root / RELEASES / run if version is None else self.root / RELEASES / run / version

    def checkpoint(self, name: str, step: int) -> Path:
        return self.run(name).step_dir(step)

    def resolve_checkpoint(self, ref: str) -> Path:
        """The checkpoint folder ``ref`` names: ``<run>@<step>`` (in the home's runs) or a path (relative: to
        the home)."""
        m = _RUN_AT_STEP.match(ref)
        if m:
            return self.checkpoint(m.group(1), int(m.group(2)))
        p = Path(ref)
        return p if p.is_absolute() else self.root / p
