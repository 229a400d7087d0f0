"""Server-rendered SVG line charts for ``ctl ui`` (no chart library, no script: the browser only draws).

``chart(title, lines, marks)`` draws one or more series of ``(step, value)`` points over a shared
step axis, with min/max labels, a legend and optional labelled marks (an evaluation's figure at
its step). Long series are thinned to ``MAX_POINTS`` (every point's min and max per bucket kept,
so a spike stays visible). Every label is escaped here (``html.escape``): the result is markup.
"""
from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 640, 220
PAD_L, PAD_R, PAD_T, PAD_B = 64, 12, 24, 28
MAX_POINTS = 800
COLOURS = ("#2563eb", "#f59e0b", "#16a34a", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d")


def _finite(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(x, y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]


def thin(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """At most about ``limit`` points: each bucket's lowest and highest, in step order."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / (limit // 2))
    out = []
    for i in range(0, len(points), size):
        bucket = points[i:i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def chart(title: str, lines: dict[str, list[tuple[int, float]]],
          marks: list[tuple[int, float, str]] | None = None) -> str:
    """The ``<svg>`` markup of one chart (an empty-state note when no series has a point)."""
    lines = {k: _finite(v) for k, v in lines.items()}
    marks = [(x, y, label) for x, y, label in marks or [] if isinstance(y, (int, float)) and math.isfinite(y)]
    pts = [p for v in lines.values() for p in v] + [(x, y) for x, y, _ in marks]
    head = (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
            f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
            f'<text x="{PAD_L}" y="16" class="ctitle">{escape(title)}</text>')
    if not pts:
        return head + f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle" class="empty">no data yet</text></svg>'
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.05 - 1e-12, y1 + abs(y1) * 0.05 + 1e-12
    w, h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return PAD_T + (1 - (y - y0) / (y1 - y0)) * h

    parts = [head,
             f'<rect x="{PAD_L}" y="{PAD_T}" width="{w}" height="{h}" class="frame"/>',
             f'<text x="{PAD_L - 4}" y="{PAD_T + 8}" text-anchor="end" class="tick">{_fmt(y1)}</text>',
             f'<text x="{PAD_L - 4}" y="{PAD_T + h}" text-anchor="end" class="tick">{_fmt(y0)}</text>',
             f'<text x="{PAD_L}" y="{HEIGHT - 8}" class="tick">step {x0}</text>',
             f'<text x="{PAD_L + w}" y="{HEIGHT - 8}" text-anchor="end" class="tick">{x1}</text>']
    legend_x = PAD_L + 8
    for i, (name, points) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        if points:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in thin(points))
            if len(points) == 1:
                x, y = points[0]
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
            else:
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
        parts.append(f'<text x="{legend_x}" y="{PAD_T + 14 + 14 * i}" fill="{colour}" class="legend">'
                     f'{escape(name)} {_fmt(points[-1][1]) if points else ""}</text>')
    for x, y, label in marks:
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" class="mark"><title>{escape(label)} at step '
                     f'{x}</title></circle><text x="{sx(x):.1f}" y="{sy(y) - 7:.1f}" text-anchor="middle" '
                     f'class="marklabel">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
