"""Checkpoints: atomic writes, checksummed manifests, verified loads, newest-valid resume.

Layout of one checkpoint directory (``runs/<name>/ckpt/step-NNNNNN/``)::

    model.pt            torch.save of the model's state dict
    optimizer.pt        torch.save of the optimizer's state dict (AdamW moments, step counts)
    training_state.pt   step, data cursor, torch CPU RNG state, last loss
    <other>.pt          any extra component (e.g. validation's pending markers)
    manifest.json       {"format", "step", "components", "resumable", "files": {name: {bytes, sha256}}, "meta"}
    <sidecar>.json      optional, written after the commit (validation_phase.json): sealed JSON

Write protocol, each step closing one crash window:

1. every directory created on the way (``ckpt/``, the run directory) is fsynced into its parent;
2. every file goes into ``.tmp-<final>-<pid>/``, each fsynced, manifest last, the directory fsynced;
3. re-saving an existing step (e.g. resumed from an older checkpoint): the old directory is renamed
   to ``.replaced-<final>-<pid>`` first;
4. the temporary is renamed to its final name and the parent fsynced; only then is the replaced copy
   removed;
5. (full checkpoints only) ``LATEST`` is replaced atomically (temp file, fsync, ``os.replace``, dir
   fsync).

A kill between the renames of 3 and 4 leaves ``LATEST`` naming a missing directory:
``recover_interrupted_writes`` (every trainer start, under the run lock) first puts the complete
new copy, else the replaced one, back under the final name, and only then deletes temporaries.

A committed manifest is never rewritten, so a file added to a checkpoint later (validation's
``validation_phase.json``) is a *sealed sidecar* (``write_sidecar``): ``{"sha256", "body"}``, the
checksum of the body's canonical JSON, replaced atomically. Loading re-hashes every file against
the manifest and every sidecar against its seal; a torn or corrupt checkpoint raises
``CheckpointError`` and is never loaded. ``choose_resume`` refuses such a checkpoint, says why,
and picks the newest valid one.

A component set that is a proper subset of ``FULL_COMPONENTS`` is a non-resumable artifact: it goes
to ``runs/<name>/checkpoint_artifacts/iter_NNNNNN/`` and never moves ``LATEST``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

import torch

from contracts.layout import ARTIFACTS, CKPT, LATEST, MANIFEST, artifact_dir_name, step_dir_name
from contracts.manifest import (
    FORMAT,
    FULL_COMPONENTS,
    build_manifest,
    canonical_sha256,
    file_entry,
    is_sidecar_name,
    manifest_digest,
    read_manifest,
    read_sidecar,
    read_verified,
    verify_checkpoint,
    verify_sidecars,
)
from contracts.resume import Refusal, ResumeChoice, choose_resume, list_step_dirs, read_latest

from .errors import CheckpointError
from .diskfull import writing
from . import faults
from .fsio import atomic_write, fsync_dir, write_synced

__all__ = [
    "FORMAT",
    "FULL_COMPONENTS",
    "MANIFEST",
    "CheckpointError",
    "Refusal",
    "ResumeChoice",
    "artifact_dir_name",
    "choose_resume",
    "describe_choice",
    "list_step_dirs",
    "load_checkpoint",
    "manifest_digest",
    "publish_latest",
    "read_latest",
    "read_manifest",
    "read_sidecar",
    "recover_interrupted_writes",
    "save_checkpoint",
    "step_dir_name",
    "verify_checkpoint",
    "write_checkpoint_dir",
    "write_sidecar",
]


def make_dirs(path: Path) -> None:
    """``mkdir -p path``, each directory it creates fsynced into its parent (a crash keeps it)."""
    missing: list[Path] = []
    p = Path(path)
    while not p.exists() and len(missing) < 64:  # bounded: a path has finitely many ancestors
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        fsync_dir(d.parent)


def _write_file(path: Path, data: bytes) -> None:
    with writing(path):
        write_synced(path, data)


def _serialize(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_checkpoint_dir(
    final: Path, step: int, components: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> Path:
    """Atomically create ``final`` holding ``components`` (name -> torch-saveable object)."""
    make_dirs(final.parent)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    files = {}
    for name in sorted(components):
        data = _serialize(components[name])
        _write_file(tmp / f"{name}.pt", data)
        files[f"{name}.pt"] = file_entry(data)
        if len(files) == 1:
            faults.hold_write(step, final.parent)  # tests only: a signal lands in the middle of this write
    manifest = build_manifest(step, list(components), files, meta)
    _write_file(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    fsync_dir(tmp)
    replaced = None
    if final.exists():  # re-saving a step (e.g. resumed from an older checkpoint): swap it out
        replaced = final.parent / f".replaced-{final.name}-{os.getpid()}"
        os.rename(final, replaced)
        faults.point("checkpoint.between_renames", step)  # the window recover_interrupted_writes closes
    try:
        os.rename(tmp, final)
    except OSError:  # e.g. ENOSPC growing the directory: put the old copy back, never leave the name missing
        if replaced is not None:
            os.rename(replaced, final)
        raise
    fsync_dir(final.parent)  # the new entry is durable before the old copy goes and LATEST moves
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: temp file, fsync, ``os.replace``, dir fsync."""
    atomic_write(path, text.encode("utf-8"), write=_write_file)


def publish_latest(ckpt_root: Path, dir_name: str) -> None:
    """Point ``ckpt_root/LATEST`` at ``dir_name``, atomically."""
    write_text_atomic(ckpt_root / LATEST, dir_name + "\n")


def write_sidecar(ckpt_dir: Path, name: str, body: Any) -> None:
    """Add or replace the sealed JSON sidecar ``name`` of a committed checkpoint, atomically."""
    assert is_sidecar_name(name), name
    write_text_atomic(
        Path(ckpt_dir) / name, json.dumps({"sha256": canonical_sha256(body), "body": body}, indent=1, sort_keys=True)
    )


def save_checkpoint(
    run_dir: Path, step: int, components: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> Path:
    """Save one checkpoint of ``run_dir`` at ``step``.

    The full set (``FULL_COMPONENTS`` plus any extras) goes to ``ckpt/step-NNNNNN`` and becomes
    ``LATEST``; a proper subset is a non-resumable artifact under ``checkpoint_artifacts/iter_NNNNNN``.
    """
    if FULL_COMPONENTS <= set(components):
        root = run_dir / CKPT
        path = write_checkpoint_dir(root / step_dir_name(step), step, components, meta)
        publish_latest(root, path.name)
        return path
    return write_checkpoint_dir(run_dir / ARTIFACTS / artifact_dir_name(step), step, components, meta)


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict]:
    """Verify and load every component: ({component: object}, manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    components = {}
    for name, entry in sorted(manifest["files"].items()):
        data = read_verified(path, name, entry)
        try:
            components[name.removesuffix(".pt")] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # checksums matched, yet torch cannot read it: still refuse
            raise CheckpointError(f"{path}: {name} cannot be loaded: {e}") from None
    verify_sidecars(path)
    return components, manifest


_TEMPORARY = (".tmp-", ".replaced-", ".LATEST.tmp-")


def _leftover_of(name: str, prefix: str) -> tuple[str, str] | None:
    """``.replaced-step-000004-123`` -> ("step-000004", "123")."""
    target, sep, pid = name[len(prefix) :].rpartition("-")
    return (target, pid) if sep and target and pid.isdigit() else None


def recover_interrupted_writes(run_dir: Path, log=None) -> list[Path]:
    """Undo what a kill mid-write left; only ever called under the run lock. Returns what it restored.

    A checkpoint directory that is missing while its ``.replaced-`` copy exists (a kill between
    the two renames of a re-save) is put back first: from the new copy when it is complete (it
    verifies), else from the replaced one. Then every temporary is removed.
    """
    log = log or sys.stderr
    restored: list[Path] = []
    for root in (run_dir / CKPT, run_dir / ARTIFACTS):
        if not root.is_dir():
            continue
        for replaced in sorted(p for p in root.iterdir() if p.name.startswith(".replaced-")):
            parsed = _leftover_of(replaced.name, ".replaced-")
            if parsed is None or (root / parsed[0]).exists():
                continue
            target, new = root / parsed[0], root / f".tmp-{parsed[0]}-{parsed[1]}"
            source, what = replaced, "the copy it was replacing"
            try:
                verify_checkpoint(new)
                source, what = new, "its complete new copy"
            except CheckpointError:
                pass
            os.rename(source, target)
            fsync_dir(root)
            restored.append(target)
            print(
                f"tinyllm: restored {target} from {what} (a write was killed between its two renames)",
                file=log,
                flush=True,
            )
        for p in root.iterdir():
            if p.name.startswith(_TEMPORARY):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            elif p.is_dir():  # a killed sidecar write leaves .<name>.tmp-<pid> inside a checkpoint
                for q in p.glob(".*.tmp-*"):
                    q.unlink(missing_ok=True)
    return restored


def describe_choice(choice: ResumeChoice, rel=str) -> list[str]:
    """The stderr lines of a choice with refusals: each refused checkpoint and why, then what is used."""
    lines = [f"tinyllm: refused checkpoint {rel(r.checkpoint)}: {r.reason}" for r in choice.refused]
    if choice.refused:
        lines.append(
            f"tinyllm: resuming from {rel(choice.path)} instead"
            if choice.path is not None
            else "tinyllm: no valid checkpoint left; starting fresh"
        )
    return lines
