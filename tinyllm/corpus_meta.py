"""A built corpus's ``meta.json`` (``corpora/<name>/meta.json``: its checksums), read with the standard library
only: ``ctl doctor`` checks corpora with it without importing numpy and the spec's models (tinyllm.corpus does)."""

from __future__ import annotations

import json
from pathlib import Path


def read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads((path / "meta.json").read_text())
        return meta if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None
