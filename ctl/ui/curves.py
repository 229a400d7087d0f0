"""The charts of a run page, as plain data (``svg.Chart``; ``svg.py`` draws them): which series share
an axis, the planned x-range, and the marks ``ctl plot -o`` draws too (the early stop, the steps it
skipped, the best checkpoint, each evaluation's figure).

* train loss and its smoothed curve, each evaluation marked with its figure, the early stop and the
  best checkpoint's step as vertical lines; the learning rate;
* the ``val/*`` figures by kind: losses together (the best checkpoint's figure starred on its metric),
  counts (``val/token_count``) never on a loss axis (figure cards when constant), every other scale
  (``val/ppl``) alone;
* each evaluation figure over the checkpoints' steps; a series of one point is a figure card, not a
  chart with an axis made up around it;
* every chart over ``1..steps`` of the spec (a live run's planned range, not ``1..last step``).
"""

from __future__ import annotations

from typing import Any

from contracts.layout import step_dir_name

from ..plot import Series
from app.runview import SMOOTHING, RunView, best_checkpoints
from .svg import Chart

Card = tuple[str, float, str]  # (title, value, note)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def val_kind(key: str) -> str:
    """Which chart a ``val/*`` figure goes on: ``loss`` (losses, objectives), ``count`` (tokens, batches,
    samples counted), else its own name (``ppl``, ``acc``): figures of other scales never share an axis."""
    last = key.rsplit("/", 1)[-1]
    if "loss" in key or "objective" in key:
        return "loss"
    if last.endswith("count") or last in ("tokens", "samples", "batches") or last.startswith("n_"):
        return "count"
    return last


def charts(view: RunView, s: Series, ev_series: dict[str, list[tuple[int, float]]]) -> tuple[list[Chart], list[Card]]:
    """The run page's charts and figure cards (see the module docstring)."""
    x_range = (1.0, float(view.total_steps)) if view.total_steps else None
    stop = view.stopped_early if isinstance(view.stopped_early, dict) else None
    stop_step = stop.get("step") if stop and isinstance(stop.get("step"), int) else None
    vstop = [(float(stop_step), f"stopped early at {stop_step}", "stop")] if stop_step is not None else []
    shade = (
        (float(stop_step), float(view.total_steps), "not run (stopped early)")
        if stop_step is not None and view.total_steps > stop_step
        else None
    )
    best = [b for b in best_checkpoints(view) if isinstance(b.get("step"), int)]
    vbest = [(float(b["step"]), f"best {b['step']}", "best") for b in best[:1]]
    out = [
        Chart(
            "train loss",
            {"train/loss": s.loss, f"smoothed {SMOOTHING}": s.smoothed},
            x_range,
            marks=[(float(st), v, label) for st, v, label in s.evals if v == v],
            vlines=vstop + vbest,
            shade=shade,
            y_label="loss",
            marks_name="evaluation (held-out loss)",
        ),
        Chart("learning rate", {"optim/lr": s.lr}, x_range, vlines=vstop, shade=shade, y_label="optim/lr"),
    ]
    cards: list[Card] = []
    groups: dict[str, dict[str, list]] = {}
    for key, points in sorted(s.val.items()):
        groups.setdefault(val_kind(key), {})[key] = points
    counts = groups.pop("count", {})
    for kind, lines in sorted(groups.items(), key=lambda kv: (kv[0] != "loss", kv[0])):
        if all(len(p) <= 1 for p in lines.values()):
            cards += [(k, p[-1][1], f"at step {p[-1][0]}") for k, p in lines.items() if p]
            continue
        stars = []
        for b in best:
            if b.get("metric") in lines:
                at = next((v for st, v in lines[b["metric"]] if st == b["step"]), None)
                value = at if at is not None else _num(b.get("value"))
                if value is not None:
                    stars.append((float(b["step"]), value, f"best {b['step']}: {b['metric']} {value:.4g}"))
        out.append(Chart(f"validation {kind}", lines, x_range, stars=stars, vlines=vstop, shade=shade, y_label=kind))
    if counts and all(len({v for _, v in p}) <= 1 for p in counts.values()):
        cards += [(k, p[-1][1], "each validation") for k, p in counts.items() if p]
    elif counts:
        out.append(Chart("validation counts", counts, x_range, vlines=vstop, shade=shade, y_label="count"))
    for name, points in ev_series.items():
        if len(points) == 1:
            cards.append((f"evaluation {name}", points[0][1], f"of {step_dir_name(points[0][0])}"))
        elif points:
            out.append(Chart(f"evaluation {name}", {name: points}, x_range, vlines=vstop, shade=shade))
    return out, cards
