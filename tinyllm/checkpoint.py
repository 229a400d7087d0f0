"""Checkpoints: atomic writes, checksummed manifests, verified loads, newest-valid resume.

Layout of one checkpoint directory (``runs/<name>/ckpt/step-NNNNNN/``)::

    model.pt            torch.save of the model's state dict
    optimizer.pt        torch.save of the optimizer's state dict (AdamW moments, step counts)
    training_state.pt   step, data cursor, torch CPU RNG state, last loss
    <other>.pt          any extra component (e.g. validation's pending markers)
    manifest.json       {"format", "step", "components", "resumable", "files": {name: {bytes, sha256}}, "meta"}

Write protocol: every file into ``.tmp-<final>-<pid>/``, each fsynced, manifest last, the directory
fsynced, renamed to its final name, the parent fsynced; then (full checkpoints only) ``LATEST`` is
replaced atomically (temp file, fsync, ``os.replace``, dir fsync). A kill at any point leaves either
the previous state or the new complete checkpoint. Loading re-hashes every file against the
manifest; a torn or corrupt checkpoint raises ``CheckpointError`` and is never loaded.

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
from pathlib import Path
from typing import Any, Mapping

import torch

FULL_COMPONENTS = frozenset({"model", "optimizer", "training_state"})
FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that must not be loaded (missing, torn, corrupt); the message names why."""


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def artifact_dir_name(step: int) -> str:
    return f"iter_{step:06d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    from .diskfull import writing

    with writing(path), open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _serialize(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_checkpoint_dir(final: Path, step: int, components: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
    """Atomically create ``final`` holding ``components`` (name -> torch-saveable object)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    files = {}
    for name in sorted(components):
        data = _serialize(components[name])
        _write_file(tmp / f"{name}.pt", data)
        files[f"{name}.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "format": FORMAT,
        "step": step,
        "components": sorted(components),
        "resumable": FULL_COMPONENTS <= set(components),
        "files": files,
        "meta": dict(meta or {}),
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    _write_file(tmp / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
    _fsync_dir(tmp)
    replaced = None
    if final.exists():  # re-saving a step (e.g. resumed from an older checkpoint): swap it out
        replaced = final.parent / f".replaced-{final.name}-{os.getpid()}"
        os.rename(final, replaced)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: temp file, fsync, ``os.replace``, dir fsync."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_file(tmp, text.encode("utf-8"))
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def publish_latest(ckpt_root: Path, dir_name: str) -> None:
    """Point ``ckpt_root/LATEST`` at ``dir_name``, atomically."""
    write_text_atomic(ckpt_root / "LATEST", dir_name + "\n")


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
        manifest = json.loads((path / "manifest.json").read_text())
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
    """Re-hash every file against the manifest; return the manifest or raise ``CheckpointError``."""
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        _read_verified(path, name, entry)
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
    return components, manifest


def list_step_dirs(ckpt_root: Path) -> list[Path]:
    """Checkpoint directories of a run, newest step first (temporary and swapped-out ones excluded)."""
    if not ckpt_root.is_dir():
        return []
    dirs = [p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[5:]), reverse=True)


def clean_temporaries(run_dir: Path) -> None:
    """Remove leftovers of killed writes (only ever called under the run lock)."""
    for root in (run_dir / "ckpt", run_dir / "checkpoint_artifacts"):
        if root.is_dir():
            for p in root.iterdir():
                if p.name.startswith((".tmp-", ".replaced-", ".LATEST.tmp-")):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def find_resume_checkpoint(run_dir: Path, explicit: Path | None = None, log=None) -> Path | None:
    """The checkpoint to resume from: ``explicit``, else ``LATEST``, else None (fresh).

    A candidate that fails verification is refused with a line on ``log`` (stderr) and the newest
    valid resumable checkpoint older than it is used instead (None when there is none).
    """
    log = log or sys.stderr
    ckpt_root = run_dir / "ckpt"
    candidate = explicit
    if candidate is None:
        latest = ckpt_root / "LATEST"
        if latest.exists():
            candidate = ckpt_root / read_latest(latest)
        else:
            candidates = list_step_dirs(ckpt_root)
            candidate = candidates[0] if candidates else None
    if candidate is None:
        return None
    try:
        manifest = verify_checkpoint(candidate)
        if not manifest.get("resumable"):
            raise CheckpointError(f"{candidate}: not a resumable checkpoint (components {manifest.get('components')})")
        return candidate
    except CheckpointError as e:
        print(f"tinyllm: refusing checkpoint: {e}", file=log)
        # only a checkpoint that exists bounds the fallback: a damaged LATEST naming a step that
        # is not there (e.g. truncated to "step-0") must not hide the valid checkpoints
        refused_step = _step_of(candidate) if Path(candidate).is_dir() else None
    for older in list_step_dirs(ckpt_root):
        if refused_step is not None and int(older.name[5:]) >= refused_step:
            continue
        try:
            if verify_checkpoint(older).get("resumable"):
                print(f"tinyllm: resuming from the newest valid checkpoint instead: {older}", file=log)
                return older
        except CheckpointError as e:
            print(f"tinyllm: refusing checkpoint: {e}", file=log)
    print("tinyllm: no valid checkpoint left; starting fresh", file=log)
    return None


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


def _step_of(path: Path) -> int | None:
    name = Path(path).name
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None
