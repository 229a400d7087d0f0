"""Run names and checkpoint references (importable with nothing but the standard library): a name is
a folder name."""
from __future__ import annotations

import re
from pathlib import Path

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_RUN_AT_STEP = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)@(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def resolve_checkpoint(ref: str, home: Path) -> Path:
    """The checkpoint folder ``ref`` names: ``<run>@<step>`` (in the home's runs) or a path (relative: to the home)."""
    m = _RUN_AT_STEP.match(ref)
    if m:
        return Path(home) / "runs" / m.group(1) / "ckpt" / step_dir_name(int(m.group(2)))
    p = Path(ref)
    return p if p.is_absolute() else Path(home) / p


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
