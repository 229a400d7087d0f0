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

import hashlib
import io
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from .errors import CheckpointError
from .diskfull import writing
from . import faults
from .fsio import atomic_write, fsync_dir, write_synced
from .names import step_dir_name

FULL_COMPONENTS = frozenset({"model", "optimizer", "training_state"})
FORMAT = 1
MANIFEST = "manifest.json"


def artifact_dir_name(step: int) -> str:
    return f"iter_{step:06d}"


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


def write_checkpoint_dir(final: Path, step: int, components: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
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
        files[f"{name}.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if len(files) == 1:
            faults.hold_write(step, final.parent)  # tests only: a signal lands in the middle of this write
    manifest = {
        "format": FORMAT,
        "step": step,
        "components": sorted(components),
        "resumable": FULL_COMPONENTS <= set(components),
        "files": files,
        "meta": dict(meta or {}),
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
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
    write_text_atomic(ckpt_root / "LATEST", dir_name + "\n")


def _seal(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_sidecar(ckpt_dir: Path, name: str, body: Any) -> None:
    """Add or replace the sealed JSON sidecar ``name`` of a committed checkpoint, atomically."""
    assert name.endswith(".json") and name != MANIFEST and "/" not in name and not name.startswith("."), name
    write_text_atomic(Path(ckpt_dir) / name, json.dumps({"sha256": _seal(body), "body": body}, indent=1, sort_keys=True))


def read_sidecar(ckpt_dir: Path, name: str) -> Any | None:
    """The body of sidecar ``name`` (None when absent); ``CheckpointError`` when it fails its seal."""
    path = Path(ckpt_dir) / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt_dir}: cannot read {name}: {e}") from None
    try:
        sealed = json.loads(text)
    except ValueError:
        raise CheckpointError(f"{ckpt_dir}: {name} is not valid JSON (torn or corrupt)") from None
    if not isinstance(sealed, dict) or set(sealed) != {"sha256", "body"}:
        raise CheckpointError(f"{ckpt_dir}: {name} has no checksum seal (corrupt)")
    if _seal(sealed["body"]) != sealed["sha256"]:
        raise CheckpointError(f"{ckpt_dir}: {name} fails its sha256 checksum (corrupt)")
    return sealed["body"]


def _verify_sidecars(path: Path) -> None:
    for p in sorted(path.iterdir()):
        if p.name.endswith(".json") and p.name != MANIFEST and not p.name.startswith("."):
            read_sidecar(path, p.name)


def save_checkpoint(run_dir: Path, step: int, components: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
    """Save one checkpoint of ``run_dir`` at ``step``.

    The full set (``FULL_COMPONENTS`` plus any extras) goes to ``ckpt/step-NNNNNN`` and becomes
    ``LATEST``; a proper subset is a non-resumable artifact under ``checkpoint_artifacts/iter_NNNNNN``.
    """
    if FULL_COMPONENTS <= set(components):
        root = run_dir / "ckpt"
        path = write_checkpoint_dir(root / step_dir_name(step), step, components, meta)
        publish_latest(root, path.name)
        return path
    return write_checkpoint_dir(run_dir / "checkpoint_artifacts" / artifact_dir_name(step), step, components, meta)


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest.json (not a checkpoint, or torn)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable manifest.json: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path}: manifest.json has an unknown format")
    if "manifest_sha256" in manifest and manifest["manifest_sha256"] != manifest_digest(manifest):
        raise CheckpointError(f"{path}: manifest.json fails its own checksum (corrupt)")
    return manifest


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own digest: a damaged step, meta or
    ``resumable`` flag is refused like a damaged file (manifests without it are still read)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_verified(path: Path, name: str, entry: Mapping[str, Any]) -> bytes:
    try:
        data = (path / name).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {name}: {e.strerror}") from None
    if len(data) != entry.get("bytes"):
        raise CheckpointError(f"{path}: {name} has {len(data)} bytes, manifest says {entry.get('bytes')} (truncated?)")
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise CheckpointError(f"{path}: {name} fails its sha256 checksum (corrupt)")
    return data


def verify_checkpoint(path: Path) -> dict:
    """Re-hash every file against the manifest and every sidecar against its seal; return the
    manifest or raise ``CheckpointError``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        _read_verified(path, name, entry)
    _verify_sidecars(path)
    return manifest


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict]:
    """Verify and load every component: ({component: object}, manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    components = {}
    for name, entry in sorted(manifest["files"].items()):
        data = _read_verified(path, name, entry)
        try:
            components[name.removesuffix(".pt")] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # checksums matched, yet torch cannot read it: still refuse
            raise CheckpointError(f"{path}: {name} cannot be loaded: {e}") from None
    _verify_sidecars(path)
    return components, manifest


def list_step_dirs(ckpt_root: Path) -> list[Path]:
    """Checkpoint directories of a run, newest step first (temporary and swapped-out ones excluded)."""
    if not ckpt_root.is_dir():
        return []
    dirs = [p for p in ckpt_root.iterdir() if p.is_dir() and _step_of(p) is not None]
    return sorted(dirs, key=lambda p: _step_of(p) or 0, reverse=True)  # (each has a step: filtered above)


_TEMPORARY = (".tmp-", ".replaced-", ".LATEST.tmp-")


def _leftover_of(name: str, prefix: str) -> tuple[str, str] | None:
    """``.replaced-step-000004-123`` -> ("step-000004", "123")."""
    target, sep, pid = name[len(prefix):].rpartition("-")
    return (target, pid) if sep and target and pid.isdigit() else None


def recover_interrupted_writes(run_dir: Path, log=None) -> list[Path]:
    """Undo what a kill mid-write left; only ever called under the run lock. Returns what it restored.

    A checkpoint directory that is missing while its ``.replaced-`` copy exists (a kill between
    the two renames of a re-save) is put back first: from the new copy when it is complete (it
    verifies), else from the replaced one. Then every temporary is removed.
    """
    log = log or sys.stderr
    restored: list[Path] = []
    for root in (run_dir / "ckpt", run_dir / "checkpoint_artifacts"):
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
            print(f"tinyllm: restored {target} from {what} (a write was killed between its two renames)",
                  file=log, flush=True)
        for p in root.iterdir():
            if p.name.startswith(_TEMPORARY):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            elif p.is_dir():  # a killed sidecar write leaves .<name>.tmp-<pid> inside a checkpoint
                for q in p.glob(".*.tmp-*"):
                    q.unlink(missing_ok=True)
    return restored


@dataclass(frozen=True)
class Refusal:
    """A checkpoint the trainer would have used and did not: where, and why."""

    checkpoint: Path
    reason: str


@dataclass
class ResumeChoice:
    path: Path | None  # None: start fresh
    refused: list[Refusal] = field(default_factory=list)


def _latest_target(ckpt_root: Path) -> Path | None:
    latest = ckpt_root / "LATEST"
    if not latest.exists():
        return None
    name = read_latest(latest)
    return latest if name == "(damaged LATEST)" else ckpt_root / name  # damaged: refused below


def _check_resumable(path: Path) -> None:
    manifest = verify_checkpoint(path)
    if not manifest.get("resumable"):
        raise CheckpointError(f"{path}: not a resumable checkpoint (components {manifest.get('components')})")


def choose_resume(run_dir: Path, explicit: Path | None = None, max_step: int | None = None) -> ResumeChoice:
    """The checkpoint to resume from, and every candidate refused on the way.

    The first candidate is ``explicit``, else ``LATEST``'s target, else the newest step directory.
    When it fails verification (or is not resumable) the fallbacks are, in order: ``LATEST``'s
    target (so a corrupt ``--resume`` gives way to a newer valid LATEST), then every step
    directory older than LATEST (any, without LATEST), newest first. Fallbacks beyond
    ``max_step`` (the invocation's end) are skipped; none valid: start fresh.
    """
    ckpt_root = run_dir / "ckpt"
    latest = _latest_target(ckpt_root)
    dirs = list_step_dirs(ckpt_root)
    first = explicit or latest or (dirs[0] if dirs else None)
    if first is None:
        return ResumeChoice(None)
    # only a LATEST target that exists bounds the fallbacks: a damaged LATEST naming a step that is
    # not there (e.g. truncated to "step-0") must not hide the valid checkpoints
    bound = _step_of(latest) if latest is not None and latest.is_dir() else None
    fallbacks = ([latest] if latest is not None else []) + [d for d in dirs if bound is None or (_step_of(d) or 0) < bound]
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
            _check_resumable(candidate)
        except CheckpointError as e:
            reason = str(e).removeprefix(f"{candidate}: ")
            if candidate.name == "LATEST":
                reason = "LATEST is unreadable or names no checkpoint directory"
            elif candidate == latest and not candidate.exists():
                reason = f"LATEST names {candidate.name}, which does not exist"
            choice.refused.append(Refusal(candidate, reason))
            continue
        choice.path = candidate
        return choice
    return choice


def describe_choice(choice: ResumeChoice, rel=str) -> list[str]:
    """The stderr lines of a choice with refusals: each refused checkpoint and why, then what is used."""
    lines = [f"tinyllm: refused checkpoint {rel(r.checkpoint)}: {r.reason}" for r in choice.refused]
    if choice.refused:
        lines.append(f"tinyllm: resuming from {rel(choice.path)} instead" if choice.path is not None
                     else "tinyllm: no valid checkpoint left; starting fresh")
    return lines


def read_latest(latest: Path) -> str:
    """The directory name ``LATEST`` points at; a damaged pointer reads as ``"(damaged LATEST)"``,
    a name that fails verification, so the newest valid checkpoint is used instead."""
    try:
        name = latest.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return "(damaged LATEST)"
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        return "(damaged LATEST)"
    return name


def _step_of(path: Path | None) -> int | None:
    name = Path(path).name if path is not None else ""
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None
