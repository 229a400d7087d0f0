"""Data files named in specs (standard library only): where a path points, its UTF-8 text, JSONL rows.

Shared by the post-training data (tinyllm.posttrain_data) and the held-out source (tinyllm.validation.source).
"""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN_DIR = Path(__file__).resolve().parent / "data" / "validation"


def resolve_path(path: str, home: str | Path) -> Path:
    """``builtin:<file>`` -> shipped file; relative -> under the home; absolute as is."""
    if path.startswith("builtin:"):
        return BUILTIN_DIR / path.removeprefix("builtin:")
    p = Path(path)
    return p if p.is_absolute() else Path(home) / p


def read_utf8(path: Path, what: str, error: type[Exception]) -> tuple[bytes, str]:
    """The bytes of a data file and their UTF-8 text; any problem is one ``error`` line naming ``what``."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} file not found: {path}") from None
    except OSError as e:
        raise error(f"cannot read {what} file {path}: {e.strerror}") from None
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} file {path} is not UTF-8 text (byte {e.start})") from None


def jsonl_objects(text: str, label: str, error: type[Exception]):
    """(line number, object) for each non-blank line of JSONL ``text``; ``error`` naming ``label`` and the
    line for one that is not a JSON object."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{label} line {n} is not valid JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise error(f"{label} line {n} is not a JSON object")
        yield n, row
