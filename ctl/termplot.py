"""A small line chart in the terminal, drawn with braille dots (2 x 4 dots per character cell).

Used by ``ctl plot`` without ``-o``: no dependency (rich has no charts; plotext 6's reworked,
signal-based API was not worth a dependency for two line charts). Series are drawn in order
(later ones over earlier ones), joined point to point; marks are single labelled points.
"""

from __future__ import annotations

import math
from typing import Sequence

BRAILLE = 0x2800
DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][col] within a cell
COLOURS = ("\x1b[34m", "\x1b[36m", "\x1b[35m", "\x1b[33m", "\x1b[32m")
RESET = "\x1b[0m"
MAX_POINTS = 20_000  # a longer series is thinned to this many points before drawing


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    width: int,
    height: int,
    title: str = "",
    marks: Sequence[tuple[float, float, str]] = (),
    color: bool = False,
    ylabel: str = "",
) -> str:
    """``series``: (label, [(x, y), ...]); ``marks``: (x, y, label) points shown as ``◆`` with their label below."""
    pts = [(x, y) for _, s in series for x, y in s if math.isfinite(y)] + [
        (x, y) for x, y, _ in marks if math.isfinite(y)
    ]
    if not pts:
        return f"{title}\n(no data)"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    label_w = max(len(_fmt(y0)), len(_fmt(y1))) + 1
    cols, rows = max(10, width - label_w - 1), max(4, height - 3)
    dw, dh = cols * 2, rows * 4
    cells = [[0] * cols for _ in range(rows)]
    owner = [[-1] * cols for _ in range(rows)]

    def dot(px: int, py: int, k: int) -> None:
        if 0 <= px < dw and 0 <= py < dh:
            r, c = py // 4, px // 2
            cells[r][c] |= DOT[py % 4][px % 2]
            owner[r][c] = k

    def to_dot(x: float, y: float) -> tuple[int, int]:
        return round((x - x0) / (x1 - x0) * (dw - 1)), round((y1 - y) / (y1 - y0) * (dh - 1))

    for k, (_, s) in enumerate(series):
        step = max(1, len(s) // MAX_POINTS)
        prev = None
        for x, y in list(s)[::step]:
            if not math.isfinite(y):
                prev = None
                continue
            cur = to_dot(x, y)
            if prev is None:
                dot(*cur, k)
            else:
                n = max(abs(cur[0] - prev[0]), abs(cur[1] - prev[1]), 1)
                for i in range(n + 1):
                    dot(round(prev[0] + (cur[0] - prev[0]) * i / n), round(prev[1] + (cur[1] - prev[1]) * i / n), k)
            prev = cur
    grid = [[chr(BRAILLE + cells[r][c]) if cells[r][c] else " " for c in range(cols)] for r in range(rows)]
    if color:
        for r in range(rows):
            for c in range(cols):
                if owner[r][c] >= 0:
                    grid[r][c] = COLOURS[owner[r][c] % len(COLOURS)] + grid[r][c] + RESET
    for x, y, _ in marks:
        if math.isfinite(y):
            px, py = to_dot(x, y)
            grid[min(rows - 1, py // 4)][min(cols - 1, px // 2)] = "◆"
    lines = [title] if title else []
    for r in range(rows):
        y_label = _fmt(y1) if r == 0 else (_fmt(y0) if r == rows - 1 else "")
        lines.append(f"{y_label:>{label_w}}┤" + "".join(grid[r]))
    lines.append(" " * label_w + "└" + "─" * cols)
    left, right = _fmt(x0), _fmt(x1)
    lines.append(" " * (label_w + 1) + left + " " * max(1, cols - len(left) - len(right)) + right)
    legend = "   ".join(
        (f"{COLOURS[k % len(COLOURS)]}⣿{RESET} " if color else "") + f"{label}" for k, (label, _) in enumerate(series)
    )
    lines.append(" " * (label_w + 1) + legend + (f"   {ylabel}" if ylabel else ""))
    for x, _y, label in marks:
        lines.append(" " * (label_w + 1) + f"◆ {label} at step {_fmt(x)}")
    return "\n".join(lines)
