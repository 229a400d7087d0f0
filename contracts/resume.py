"""Which checkpoint a run resumes from: one rule, asked by the trainer, the workflow and every display.

``choose_resume`` is the trainer's decision (tinyllm, the durable helper, the integrations): the first
candidate is the explicit ``--resume``, else ``LATEST``'s target, else the newest step directory; a candidate
that fails verification is refused (with the reason) and the next is tried. ``resume_argument`` is what the
workflow hands a segment as ``--resume`` (the newer of the last heartbeated checkpoint and LATEST, at or before
the segment's end), and ``expected_resume`` is what the trainer will then really use, for the displays: the
two composed, so a display never re-decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import CKPT, LATEST, RunHome, checkpoint_ref, ckpt_ref, parse_step_dir
from .manifest import CheckpointError, check_resumable

DAMAGED_LATEST = "(damaged LATEST)"


@dataclass(frozen=True)
class Refusal:
    """A checkpoint the trainer would have used and did not: where, and why."""

    checkpoint: Path
    reason: str


@dataclass
class ResumeChoice:
    path: Path | None  # None: start fresh
    refused: list[Refusal] = field(default_factory=list)


def read_latest(latest: Path) -> str:
    """The directory name ``LATEST`` points at; a damaged pointer reads as ``"(damaged LATEST)"``,
    a name that fails verification, so the newest valid checkpoint is used instead."""
    try:
        name = Path(latest).read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return DAMAGED_LATEST
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        return DAMAGED_LATEST
    return name


def list_step_dirs(ckpt_root: Path) -> list[Path]:
    """Checkpoint directories of a run, newest step first (temporary and swapped-out ones excluded)."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    dirs = [p for p in ckpt_root.iterdir() if p.is_dir() and _step_of(p) is not None]
    return sorted(dirs, key=lambda p: _step_of(p) or 0, reverse=True)


def _step_of(path: Path | None) -> int | None:
    """The step of a ``step-<digits>`` name (any number of digits, as the trainer has always read them)."""
    name = Path(path).name if path is not None else ""
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None


def _latest_target(ckpt_root: Path) -> Path | None:
    latest = ckpt_root / LATEST
    if not latest.exists():
        return None
    name = read_latest(latest)
    return latest if name == DAMAGED_LATEST else ckpt_root / name  # damaged: refused below


def choose_resume(run_dir: Path, explicit: Path | None = None, max_step: int | None = None) -> ResumeChoice:
    """The checkpoint to resume from, and every candidate refused on the way.

    The first candidate is ``explicit``, else ``LATEST``'s target, else the newest step directory.
    When it fails verification (or is not resumable) the fallbacks are, in order: ``LATEST``'s
    target (so a corrupt ``--resume`` gives way to a newer valid LATEST), then every step
    directory older than LATEST (any, without LATEST), newest first. Fallbacks beyond
    ``max_step`` (the invocation's end) are skipped; none valid: start fresh.
    """
    ckpt_root = Path(run_dir) / CKPT
    latest = _latest_target(ckpt_root)
    dirs = list_step_dirs(ckpt_root)
    first = explicit or latest or (dirs[0] if dirs else None)
    if first is None:
        return ResumeChoice(None)
    # only a LATEST target that exists bounds the fallbacks: a damaged LATEST naming a step that is
    # not there (e.g. truncated to "step-0") must not hide the valid checkpoints
    bound = _step_of(latest) if latest is not None and latest.is_dir() else None
    fallbacks = ([latest] if latest is not None else []) + [
        d for d in dirs if bound is None or (_step_of(d) or 0) < bound
    ]
    choice = ResumeChoice(None)
    tried: set[Path] = set()
    for i, candidate in enumerate([first, *fallbacks]):
        key = Path(os.path.abspath(candidate))
        if key in tried:
            continue
        tried.add(key)
        step = _step_of(candidate)
        if i > 0 and max_step is not None and step is not None and step > max_step:
            continue
        try:
            check_resumable(candidate)
        except CheckpointError as e:
            reason = str(e).removeprefix(f"{candidate}: ")
            if candidate.name == LATEST:
                reason = "LATEST is unreadable or names no checkpoint directory"
            elif candidate == latest and not candidate.exists():
                reason = f"LATEST names {candidate.name}, which does not exist"
            choice.refused.append(Refusal(candidate, reason))
            continue
        choice.path = candidate
        return choice
    return choice


def resume_argument(home: Path, name: str, until: int, attempt: int, details: Any) -> str | None:
    """The ``--resume`` a segment of run ``name`` ending at ``until`` is handed (None: the trainer's own LATEST).

    Candidates are the last heartbeated checkpoint (a redelivered attempt) and LATEST; the newer
    one at or before ``until`` wins, so a kill between a checkpoint's write and its heartbeat
    redoes no steps. LATEST beyond ``until`` (a canceled earlier run went further) gives way to
    the newest checkpoint at or before ``until``, so that the segment still ends at its step.
    The trainer verifies whichever it gets and falls back to an older valid one if it is corrupt.
    """
    heartbeated: str | None = None
    if attempt > 1 and isinstance(details, dict) and details.get("checkpoint"):
        ckpt = str(details["checkpoint"])
        step = parse_step_dir(ckpt)
        if (home / ckpt).is_dir() and (step is None or step <= until):
            heartbeated = ckpt
    run = RunHome(home).run(name)
    try:
        latest = run.latest.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):  # none, or damaged: the trainer finds the newest valid one
        return heartbeated
    latest_step = parse_step_dir(latest)
    if latest_step is None or latest_step <= until:
        hb_step = parse_step_dir(heartbeated) if heartbeated else None
        if heartbeated and (latest_step is None or (hb_step is not None and hb_step >= latest_step)):
            return heartbeated
        return None  # LATEST is the newest usable checkpoint
    if heartbeated:
        return heartbeated
    steps = sorted(
        s for p in run.ckpt_root.iterdir() if p.is_dir() and (s := parse_step_dir(p)) is not None and s <= until
    )
    return checkpoint_ref(name, steps[-1]) if steps else None


def expected_resume(home: Path, name: str, until: int, attempt: int, details: Any) -> str | None:
    """The checkpoint (home-relative) a segment's next attempt will really resume from, None for the start:
    ``choose_resume`` of the trainer given the workflow's ``resume_argument``."""
    home = Path(home)
    arg = resume_argument(home, name, until, attempt, details)
    explicit = None if arg is None else (Path(arg) if os.path.isabs(arg) else home / arg)
    path = choose_resume(RunHome(home).run(name).path, explicit, max_step=until).path
    if path is None:
        return None
    try:
        return str(path.relative_to(home))
    except ValueError:
        return ckpt_ref(name, path.name) if path.parent.name == CKPT else str(path)
