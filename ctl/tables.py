"""Aligned plain-text tables (what ``ctl history`` and ``ctl show`` print; greppable, no colour)."""

from __future__ import annotations

from typing import Sequence


def align(header: Sequence[str], body: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> list[str]:
    """One line per row, columns padded to their widest cell; columns in ``right`` right-aligned."""
    all_rows = [list(header), *[list(r) for r in body]]
    n = len(header)
    widths = [max(len(r[i]) for r in all_rows) for i in range(n)]
    lines = []
    for r in all_rows:
        cells = [r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(n)]
        lines.append("  ".join(cells).rstrip())
    return lines
