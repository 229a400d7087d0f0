"""Run names and checkpoint references (importable with nothing but the standard library): a name is
a folder name."""

from __future__ import annotations

from pathlib import Path

from contracts.layout import RunHome, step_dir_name

__all__ = ["IDENTIFIER_PATTERN", "DuplicateKeyError", "refuse_duplicate_keys", "resolve_checkpoint", "step_dir_name"]

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def resolve_checkpoint(ref: str, home: Path) -> Path:
    """The checkpoint folder ``ref`` names: ``<run>@<step>`` (in the home's runs) or a path (relative: to the home)."""
    return RunHome(home).resolve_checkpoint(ref)


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice (``json`` would silently keep the last value)."""


def refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for ``json.loads``: a dict, or ``DuplicateKeyError`` naming the key.
    Applies to every object, nested ones included."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"duplicate key {key!r}")
        out[key] = value
    return out
