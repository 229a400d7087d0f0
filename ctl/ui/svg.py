"""Line charts as inline SVG, drawn on the server (no script, nothing fetched from elsewhere).

``chart(Chart(...))`` draws one chart the way TensorBoard's scalars read: a title, a legend in its
own row above the plot (never over a curve), y ticks at round values with light gridlines, x ticks in
steps along the bottom with the axis named, the x-range the caller plans (a live run's ``1..steps``
of its spec, not ``1..last step``), vertical marks (an early stop, the best checkpoint), a shaded
range (steps an early stop skipped), labelled points (each evaluation's figure) and stars (the best
checkpoint's figure, as ``ctl plot -o`` marks it). Labels near an edge are anchored inward, so none
is clipped. ``figure_card(...)`` is one figure with its step, for a series of one point (a chart of
one point would be an axis made up around it). Long series are thinned to ``MAX_POINTS`` (every
bucket's min and max kept, so a spike stays visible). Every label is escaped here
(``html.escape``): the result is markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 640, 250
PAD_R, PAD_B = 18, 36  # right margin; below the plot: tick labels and the axis name
CHAR_W = 6.4  # about one character of the 11 px labels, to lay out the legend and the y labels
MAX_POINTS = 800
MAX_MARK_LABELS = 8  # evaluation marks labelled at most (every one has its figure on hover)
COLOURS = ("#2563eb", "#f59e0b", "#16a34a", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d")

Point = tuple[float, float]


@dataclass
class Chart:
    """What one chart shows (plain data: pages.py builds these, tests read them)."""

    title: str
    lines: Mapping[str, Sequence[Point]]
    x_range: tuple[float, float] | None = None  # the planned steps (always shown, the data may extend it)
    marks: list[tuple[float, float, str]] = field(default_factory=list)  # labelled points (evaluations)
    stars: list[tuple[float, float, str]] = field(default_factory=list)  # the best checkpoint's figure
    vlines: list[tuple[float, str, str]] = field(default_factory=list)  # (step, label, kind: stop | best | info)
    shade: tuple[float, float, str] | None = None  # (from, to, label): steps not run
    y_label: str = ""
    marks_name: str = "evaluation"  # the legend's name of the labelled points


def _finite(points: Sequence[Point]) -> list[Point]:
    return [(x, y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]


def thin(points: list[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most about ``limit`` points: each bucket's lowest and highest, in step order."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / (limit // 2))
    out = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def nice_step(span: float, count: int) -> float:
    """A round tick spacing (1, 2, 2.5 or 5 times a power of ten) giving at most about ``count`` ticks."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def ticks(lo: float, hi: float, count: int = 6, integer: bool = False) -> list[float]:
    """Round values in ``[lo, hi]``, spaced by ``nice_step``; whole numbers only when ``integer``."""
    step = nice_step(hi - lo, count)
    if integer:
        step = max(1.0, round(step)) if step >= 1 else 1.0
    first = math.ceil(lo / step - 1e-9) * step
    out, k = [], 0
    while first + k * step <= hi + step * 1e-9 and k < 100:
        out.append(first + k * step)
        k += 1
    return out


def tick_text(v: float, step: float) -> str:
    """A tick's label with as many decimals as its spacing needs (``0.0005``, ``2.5``, ``1000``; ``1e-05``)."""
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or (abs(v) < 1e-3 and step < 1e-4):
        return f"{v:.3g}"
    decimals = min(9, max(0, -math.floor(math.log10(step) + 1e-12)))
    if abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:  # 2.5 at this scale: one more
        decimals += 1
    return f"{v:.{decimals}f}"


def _text_w(text: str) -> float:
    return len(text) * CHAR_W


def _anchored(x: float, text: str, lo: float, hi: float) -> tuple[float, str]:
    """(x, text-anchor) that keeps ``text`` inside ``[lo, hi]`` (inward near an edge)."""
    w = _text_w(text)
    if x + w / 2 > hi:
        return min(x, hi), "end"
    if x - w / 2 < lo:
        return max(x, lo), "start"
    return x, "middle"


def _legend(names: list[tuple[str, str]], left: float) -> tuple[list[str], int]:
    """The legend's items laid out in rows from ``left`` (markup, rows used)."""
    parts, x, row = [], left, 0
    for label, colour in names:
        w = 18 + _text_w(label) + 14
        if x + w > WIDTH - PAD_R and x > left:
            row, x = row + 1, left
        y = 36 + 14 * row
        swatch = (
            f'<circle cx="{x + 7:.1f}" cy="{y - 4}" r="4" class="{colour[1:]}"/>'
            if colour.startswith(".")
            else f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 14:.1f}" y2="{y - 4}" stroke="{colour}" '
            f'stroke-width="2.5"/>'
        )
        parts.append(f'{swatch}<text x="{x + 18:.1f}" y="{y}" class="legend">{escape(label)}</text>')
        x += w
    return parts, row + 1 if names else 0


def _star(cx: float, cy: float, r: float = 7.0) -> str:
    pts = []
    for k in range(10):
        a = -math.pi / 2 + k * math.pi / 5
        rr = r if k % 2 == 0 else r * 0.45
        pts.append(f"{cx + rr * math.cos(a):.1f},{cy + rr * math.sin(a):.1f}")
    return " ".join(pts)


def chart(c: Chart) -> str:
    """The ``<svg>`` markup of one chart (an empty-state note when no series has a point)."""
    lines = {k: _finite(v) for k, v in c.lines.items()}
    marks = [(x, y, t) for x, y, t in c.marks if isinstance(y, (int, float)) and math.isfinite(y)]
    stars = [(x, y, t) for x, y, t in c.stars if isinstance(y, (int, float)) and math.isfinite(y)]
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(c.title)}"><title>{escape(c.title)}</title>'
        f'<text x="10" y="17" class="ctitle">{escape(c.title)}</text>'
    )
    pts = [p for v in lines.values() for p in v] + [(x, y) for x, y, _ in marks + stars]
    if not pts:
        return head + (
            f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle" class="empty">no data yet</text></svg>'
        )
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if c.x_range is not None:
        x0, x1 = min(x0, c.x_range[0]), max(x1, c.x_range[1])
    for x, _, _ in c.vlines:
        x0, x1 = min(x0, x), max(x1, x)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(ys), max(ys)
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    else:
        pad = (y1 - y0) * 0.06  # the curve never touches the frame
        y0, y1 = y0 - pad, y1 + pad
    y_ticks = ticks(y0, y1)
    y_step = (y_ticks[1] - y_ticks[0]) if len(y_ticks) > 1 else (y1 - y0)
    y_texts = [tick_text(v, y_step) for v in y_ticks]
    pad_l = max(40, int(max(map(_text_w, y_texts), default=0)) + 14) + (16 if c.y_label else 0)
    legend_items = [
        (f"{name} {_fmt(points[-1][1])}" if points else name, COLOURS[i % len(COLOURS)])
        for i, (name, points) in enumerate(lines.items())
    ]
    if marks:  # a colour starting with "." is a dot of that CSS class
        legend_items.append((c.marks_name, ".mark"))
    legend, rows = _legend(legend_items, pad_l)
    pad_t = 26 + 14 * rows + (6 if rows else 0)
    w, h = WIDTH - pad_l - PAD_R, HEIGHT - pad_t - PAD_B

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * h

    parts = [head, *legend]
    shade_label = ""
    if c.shade is not None:
        a, b, label = c.shade
        left, right = sx(max(a, x0)), sx(min(b, x1))
        if right > left:
            parts.append(
                f'<rect x="{left:.1f}" y="{pad_t}" width="{right - left:.1f}" height="{h}" class="shade">'
                f"<title>{escape(label)}</title></rect>"
            )
            tx, anchor = _anchored((left + right) / 2, label, left + 2, right - 2)
            if _text_w(label) < right - left:
                shade_label = (
                    f'<text x="{tx:.1f}" y="{pad_t + h - 6}" text-anchor="{anchor}" class="shadelabel">'
                    f"{escape(label)}</text>"
                )
    for v, text in zip(y_ticks, y_texts):
        y = sy(v)
        parts.append(
            f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + w}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{pad_l - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{text}</text>'
        )
    x_ticks = ticks(x0, x1, 6, integer=True)
    x_step = (x_ticks[1] - x_ticks[0]) if len(x_ticks) > 1 else 1.0
    for v in x_ticks:
        x = sx(v)
        text = tick_text(v, x_step)
        tx, anchor = _anchored(x, text, 0, WIDTH - 2)
        parts.append(
            f'<line x1="{x:.1f}" y1="{pad_t}" x2="{x:.1f}" y2="{pad_t + h}" class="grid"/>'
            f'<line x1="{x:.1f}" y1="{pad_t + h}" x2="{x:.1f}" y2="{pad_t + h + 4}" class="axis"/>'
            f'<text x="{tx:.1f}" y="{pad_t + h + 16}" text-anchor="{anchor}" class="tick">{text}</text>'
        )
    parts.append(
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" class="frame"/>'
        f'<text x="{pad_l + w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle" class="axisname">step</text>'
    )
    parts.append(shade_label)  # over the gridlines
    if c.y_label:
        parts.append(
            f'<text x="12" y="{pad_t + h / 2:.1f}" text-anchor="middle" class="axisname" '
            f'transform="rotate(-90 12 {pad_t + h / 2:.1f})">{escape(c.y_label)}</text>'
        )
    for i, points in enumerate(lines.values()):
        colour = COLOURS[i % len(COLOURS)]
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        elif points:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in thin(points))
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
            if len(points) <= 40:  # few points (validations, evaluations): each one shown
                parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in points)
    taken: list[tuple[float, float, float, float]] = []  # boxes of the labels placed so far (x0, y0, x1, y1)

    def place(
        candidates: Sequence[tuple[float, float, str]], text: str, must: bool = True
    ) -> tuple[float, float, str] | None:
        """The first (x, baseline, anchor) whose box stays inside the plot and overlaps no placed label;
        when none does: the first, kept inside (``must``), else None (the label is left out)."""
        tw = _text_w(text)
        for x, y, anchor in candidates:
            left = x - tw if anchor == "end" else x - tw / 2 if anchor == "middle" else x
            box = (left, y - 10, left + tw, y + 2)
            inside = box[0] >= pad_l + 1 and box[2] <= pad_l + w - 1 and box[1] >= pad_t and box[3] <= pad_t + h
            if inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken):
                taken.append(box)
                return x, y, anchor
        if not must:
            return None
        x, y, anchor = candidates[0]
        x, anchor = _anchored(x, text, pad_l + 2, pad_l + w - 2)
        return x, y, anchor

    row = pad_t + 12
    for x, label, kind in c.vlines:
        px = sx(x)
        parts.append(
            f'<line x1="{px:.1f}" y1="{pad_t}" x2="{px:.1f}" y2="{pad_t + h}" class="vline vline-{kind}">'
            f"<title>{escape(label)}</title></line>"
        )
        tx, ty, anchor = place(
            [(px + 4, row + 13 * k, "start") for k in range(4)] + [(px - 4, row + 13 * k, "end") for k in range(4)],
            label,
        ) or (px + 4, row, "start")
        parts.append(
            f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" class="vlabel vlabel-{kind}">'
            f"{escape(label)}</text>"
        )
    radius = 4 if len(marks) <= 20 else 2.5
    every = max(1, math.ceil(len(marks) / MAX_MARK_LABELS))  # many evaluations: some labelled, all on hover
    for i, (x, y, label) in reversed(list(enumerate(marks))):  # the newest labelled first
        px, py = sx(x), sy(y)
        last = i == len(marks) - 1
        spot = (
            place(
                [
                    (px, py - 8, "middle"),
                    (px, py + 16, "middle"),
                    (px + 7, py + 4, "start"),
                    (px - 7, py + 4, "end"),
                    (px + 4, py - 8, "start"),
                    (px - 4, py - 8, "end"),
                ],
                label,
                must=last,
            )
            if last or (len(marks) - 1 - i) % every == 0
            else None
        )
        parts.append(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{radius}" class="mark"><title>{escape(label)} at step '
            f"{x:g}</title></circle>"
        )
        if spot is not None:
            parts.append(
                f'<text x="{spot[0]:.1f}" y="{spot[1]:.1f}" text-anchor="{spot[2]}" class="marklabel">'
                f"{escape(label)}</text>"
            )
    for x, y, label in stars:  # beside the star first (a curve through it runs above or below)
        px, py = sx(x), sy(y)
        tx, ty, anchor = place(
            [
                (px + 10, py + 4, "start"),
                (px - 10, py + 4, "end"),
                (px + 8, py + 18, "start"),
                (px - 8, py + 18, "end"),
                (px + 8, py - 10, "start"),
                (px - 8, py - 10, "end"),
            ],
            label,
        ) or (px + 10, py + 4, "start")
        parts.append(
            f'<polygon points="{_star(px, py)}" class="star"><title>{escape(label)}</title></polygon>'
            f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" class="starlabel">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def figure_card(title: str, value: float, note: str = "") -> str:
    """One figure as a card (a series of one point; a constant count): ``title``, the value, ``note``."""
    v = _fmt(value) if isinstance(value, (int, float)) and math.isfinite(value) else "-"
    return (
        f'<div class="figure" role="figure" aria-label="{escape(title)}"><div class="fname">{escape(title)}</div>'
        f'<div class="fvalue">{escape(v)}</div><div class="fnote">{escape(note)}</div></div>'
    )
