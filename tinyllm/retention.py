"""Checkpoint retention: ``keep_checkpoints`` prunes older intermediate checkpoints of a run.

Spec field (train spec, not part of the trajectory)::

    "keep_checkpoints": {"last": 2}                       # the 2 newest, plus every protected one
    "keep_checkpoints": {"last": 2, "boundaries": false}  # segment ends may go too (unless protected)

Absent (the default): every checkpoint is kept. After each full checkpoint the trainer (under
the run lock) prunes the checkpoints of ``runs/<name>/ckpt/`` that are none of:

* the ``last`` newest ones;
* the one ``LATEST`` names, and the one this attempt resumed from (a redelivered attempt, or the
  running one until its next heartbeat, names it);
* a segment boundary (a multiple of ``eval_every``, or the invocation's final step), unless
  ``boundaries`` is false;
* one an evaluation result names (``evals/*/*/summary.json`` rows and ``results.jsonl``);
* one with a validation that is not completed (its pending marker, no completed phase file);
* one a train spec's ``init_from`` or ``teacher`` names (``runs/*/activity/*/spec.json`` of the
  home: the specs ctl runs; a spec run by hand elsewhere is not seen);
* one beyond the current step (left by a run that went further);
* one model selection keeps (``"best": {"metric": "val/loss", "mode": "min", "k": 1}``: the k best
  by that validation figure, ties -> the earlier step; and ``early_stopping``'s best), ranked by the
  trainer from its recorded figures (tinyllm/selection.py).

Crash safety: a checkpoint is first renamed to ``.pruned-step-NNNNNN-<pid>`` (atomic; the
parent directory fsynced), which takes it out of every listing at once, then deleted. A kill
leaves at most such a hidden directory, which the next prune removes. Each pruning appends a
JSON line to ``runs/<name>/ckpt/retention.log`` and prints one line on stderr.
Tests kill the trainer between the two with ``TINYLLM_FAULT=retention.<phase>@<step>#<i>`` (tinyllm/faults.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field

from contracts.layout import ACTIVITY, CKPT, LATEST, MANIFEST, RUNS

from . import faults
from .fsio import fsync_dir
from .names import resolve_checkpoint, step_dir_name
from .selection import BestK

PRUNED_PREFIX = ".pruned-"
LOG_NAME = "retention.log"


class KeepCheckpoints(BaseModel):
    """``keep_checkpoints`` of a train spec."""

    model_config = ConfigDict(extra="forbid")

    last: int = Field(ge=1)  # the newest this many checkpoints are kept
    boundaries: bool = True  # segment-boundary (evaluated) checkpoints are kept too
    best: BestK | None = None  # the k best by a validation metric are kept too (tinyllm/selection.py)


def _step(name: str) -> int | None:
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None


def _named_paths(value: Any) -> Iterable[str]:
    """Every string in a JSON value (checkpoint paths hide at various depths)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _named_paths(v)
    elif isinstance(value, list):
        for v in value:
            yield from _named_paths(v)


def _dir_names_in(paths: Iterable[str], ckpt_root: Path, home: Path) -> set[str]:
    """Names of ``ckpt_root``'s step dirs that any of ``paths`` points at."""
    out = set()
    root = ckpt_root.resolve()
    for p in paths:
        path = Path(p) if Path(p).is_absolute() else home / p
        try:
            resolved = path.resolve()
        except OSError:
            continue
        if resolved.parent == root:
            out.add(resolved.name)
    return out


def evaluated(home: Path, ckpt_root: Path) -> set[str]:
    """Checkpoints an evaluation result names (summary.json and results.jsonl of every suite)."""
    paths: list[str] = []
    for f in list(home.glob("evals/*/*/summary.json")):
        try:
            paths += list(_named_paths(json.loads(f.read_text(encoding="utf-8")).get("results")))
        except (OSError, ValueError, AttributeError):
            continue
    for f in home.glob("evals/*/*/results.jsonl"):
        try:
            for line in f.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("model"), str):
                    paths.append(row["model"])
        except OSError:
            continue
    return _dir_names_in(paths, ckpt_root, home)


def init_from_named(home: Path, ckpt_root: Path) -> set[str]:
    """Checkpoints a train spec of the home (``runs/*/activity/*/spec.json``, as ctl runs them)
    starts from or learns from: ``init_from`` and ``teacher`` (``<run>@<step>`` or a path)."""
    paths = []
    for f in home.glob(f"{RUNS}/*/{ACTIVITY}/*/spec.json"):
        try:
            spec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in ("init_from", "teacher"):
            if isinstance(spec, dict) and isinstance(spec.get(key), str) and spec[key]:
                paths.append(str(resolve_checkpoint(spec[key], home)))
    return _dir_names_in(paths, ckpt_root, home)


def validation_pending(ckpt_root: Path, names: Iterable[str]) -> set[str]:
    """Checkpoints carrying a validation marker whose phase file does not say completed."""
    out = set()
    for name in names:
        d = ckpt_root / name
        try:
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out.add(name)  # unreadable: not ours to judge, keep it
            continue
        if "validation" not in (manifest.get("components") or []):
            continue
        try:
            sealed = json.loads((d / "validation_phase.json").read_text(encoding="utf-8"))
            body = sealed.get("body", sealed)  # a sealed sidecar (checkpoint.write_sidecar): {"sha256", "body"}
            phase = body.get("phase") if isinstance(body, dict) else None
        except (OSError, ValueError, AttributeError):
            phase = None
        if phase != "completed":
            out.add(name)
    return out


def plan(
    *,
    names: list[str],
    keep: KeepCheckpoints,
    step: int,
    eval_every: int,
    final_step: int,
    latest: str | None,
    resumed_from: str | None,
    protected: set[str],
    selected: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(names to prune oldest first, {kept name: why}) of a run's step dirs ``names``; ``selected``:
    {name: why} of the checkpoints model selection keeps (the best k, early stopping's best)."""
    steps = {n: s for n in names if (s := _step(n)) is not None}
    why: dict[str, str] = {n: w for n, w in (selected or {}).items() if n in steps}
    for n in sorted(steps, key=steps.__getitem__, reverse=True)[: keep.last]:
        why.setdefault(n, f"last {keep.last}")
    for n, s in steps.items():
        if n in why:
            continue
        if n == latest:
            why[n] = LATEST
        elif n == resumed_from:
            why[n] = "resumed from"
        elif n in protected:
            why[n] = "protected"
        elif s > step:
            why[n] = "beyond the current step"
        elif keep.boundaries and (s == final_step or (eval_every > 0 and s % eval_every == 0)):
            why[n] = "segment boundary"
    prune = sorted((n for n in steps if n not in why), key=steps.__getitem__)
    return prune, why


def remove_leftovers(ckpt_root: Path) -> None:
    """Delete directories an earlier pruning renamed but was killed before deleting."""
    for p in ckpt_root.iterdir():
        if p.name.startswith(PRUNED_PREFIX) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def prune(
    run_dir: Path,
    home: Path,
    keep: KeepCheckpoints | None,
    *,
    step: int,
    eval_every: int,
    final_step: int,
    resumed_from: Path | None = None,
    log=None,
    selected: dict[int, str] | None = None,
) -> list[str]:
    """Apply ``keep`` to ``run_dir/ckpt`` (call under the run lock); returns the pruned names."""
    ckpt_root = run_dir / CKPT
    if keep is None or not ckpt_root.is_dir():
        return []
    remove_leftovers(ckpt_root)
    names = sorted(p.name for p in ckpt_root.iterdir() if p.is_dir() and _step(p.name) is not None)
    try:
        latest = (ckpt_root / LATEST).read_text(encoding="utf-8").strip() or None
    except OSError:
        latest = None
    protected = evaluated(home, ckpt_root) | init_from_named(home, ckpt_root) | validation_pending(ckpt_root, names)
    doomed, why = plan(
        names=names,
        keep=keep,
        step=step,
        eval_every=eval_every,
        final_step=final_step,
        latest=latest,
        resumed_from=Path(resumed_from).name if resumed_from else None,
        protected=protected,
        selected={step_dir_name(s): w for s, w in (selected or {}).items()},
    )
    if not doomed:
        return []
    for i, name in enumerate(doomed):
        hidden = ckpt_root / f"{PRUNED_PREFIX}{name}-{os.getpid()}"
        os.rename(ckpt_root / name, hidden)  # atomic: gone from every listing at once
        fsync_dir(ckpt_root)
        faults.point("retention.after_rename", step, i)
        for j, f in enumerate(sorted(hidden.iterdir())):  # file by file: a kill leaves a torn, hidden dir
            f.unlink() if not f.is_dir() else shutil.rmtree(f)
            if j == 0:
                faults.point("retention.during_delete", step, i)
        hidden.rmdir()
        faults.point("retention.after_delete", step, i)
    entry = {
        "time": time.time(),
        "step": step,
        "pruned": doomed,
        "kept": dict(sorted(why.items())),
        "keep_checkpoints": keep.model_dump(),
    }
    with open(ckpt_root / LOG_NAME, "a", encoding="utf-8") as log_file:
        log_file.write(json.dumps(entry, sort_keys=True) + "\n")
        log_file.flush()
        os.fsync(log_file.fileno())
    print(
        f"tinyllm: pruned {len(doomed)} checkpoint(s) ({', '.join(doomed)}); keep_checkpoints last "
        f"{keep.last}{'' if keep.boundaries else ', boundaries not kept'}",
        file=log or sys.stderr,
        flush=True,
    )
    return doomed
