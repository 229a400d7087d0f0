"""The checkpoint manifest and its verification (sha256; no torch, so ctl and displays verify too).

A checkpoint directory holds its component files (``<component>.pt`` for tinyllm), ``manifest.json``
``{"format", "step", "components", "resumable", "files": {name: {bytes, sha256}}, "meta",
"manifest_sha256"}`` and optional *sealed sidecars* (``<name>.json`` = ``{"sha256", "body"}``, written after
the commit). Verifying re-hashes every file against the manifest, the manifest against its own digest and
every sidecar against its seal; anything torn or corrupt is a ``CheckpointError`` naming why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .layout import MANIFEST

FORMAT = 1
FULL_COMPONENTS = frozenset({"model", "optimizer", "training_state"})
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint that must not be loaded (missing, torn, corrupt); the message names why."""


def canonical_sha256(body: Any) -> str:
    """sha256 of ``body``'s canonical JSON (sorted keys, no spaces): a manifest's digest, a sidecar's seal."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own digest: a damaged step, meta or
    ``resumable`` flag is refused like a damaged file (manifests without it are still read)."""
    return canonical_sha256({k: v for k, v in manifest.items() if k != "manifest_sha256"})


def build_manifest(
    step: int, components: list[str], files: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest of a checkpoint at ``step`` with these components and files, its own digest included."""
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "components": sorted(components),
        "resumable": FULL_COMPONENTS <= set(components),
        "files": dict(files),
        "meta": dict(meta or {}),
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    return manifest


def file_entry(data: bytes) -> dict[str, Any]:
    """A manifest's entry for one file: ``{"bytes", "sha256"}``."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_manifest(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest.json (not a checkpoint, or torn)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable manifest.json: {e}") from None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        raise CheckpointError(f"{path}: manifest.json has an unknown format")
    if "manifest_sha256" in manifest and manifest["manifest_sha256"] != manifest_digest(manifest):
        raise CheckpointError(f"{path}: manifest.json fails its own checksum (corrupt)")
    return manifest


def check_bytes(path: Path, name: str, entry: Mapping[str, Any], size: int, sha256: str) -> None:
    """Raise ``CheckpointError`` unless a file of ``size`` bytes hashing to ``sha256`` is ``entry``."""
    if size != entry.get("bytes"):
        raise CheckpointError(f"{path}: {name} has {size} bytes, manifest says {entry.get('bytes')} (truncated?)")
    if sha256 != entry.get("sha256"):
        raise CheckpointError(f"{path}: {name} fails its sha256 checksum (corrupt)")


def read_verified(path: Path, name: str, entry: Mapping[str, Any]) -> bytes:
    """The bytes of file ``name`` of checkpoint ``path``, checked against its manifest ``entry``."""
    try:
        data = (Path(path) / name).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {name}: {e.strerror}") from None
    check_bytes(path, name, entry, len(data), hashlib.sha256(data).hexdigest())
    return data


def _verify_file(path: Path, name: str, entry: Mapping[str, Any]) -> None:
    """``read_verified`` without holding the file in memory (a checkpoint can be gigabytes)."""
    h, size = hashlib.sha256(), 0
    try:
        with open(Path(path) / name, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {name}: {e.strerror}") from None
    check_bytes(path, name, entry, size, h.hexdigest())


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
    if canonical_sha256(sealed["body"]) != sealed["sha256"]:
        raise CheckpointError(f"{ckpt_dir}: {name} fails its sha256 checksum (corrupt)")
    return sealed["body"]


def is_sidecar_name(name: str) -> bool:
    """A sealed sidecar's file name: ``<x>.json``, not the manifest, not hidden, no folder."""
    return name.endswith(".json") and name != MANIFEST and "/" not in name and not name.startswith(".")


def verify_sidecars(path: Path) -> None:
    for p in sorted(Path(path).iterdir()):
        if is_sidecar_name(p.name):
            read_sidecar(path, p.name)


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Re-hash every file against the manifest and every sidecar against its seal; return the
    manifest or raise ``CheckpointError``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        _verify_file(path, name, entry)
    verify_sidecars(path)
    return manifest


def check_resumable(path: Path) -> dict[str, Any]:
    """``verify_checkpoint``, and the manifest says it holds every component a resume needs."""
    manifest = verify_checkpoint(path)
    if not manifest.get("resumable"):
        raise CheckpointError(f"{path}: not a resumable checkpoint (components {manifest.get('components')})")
    return manifest
