"""``ctl plot train/<name>``: training loss, learning rate and held-out curves over steps.

The series come from ``runs/<name>/metrics.jsonl`` (``train/loss`` and its smoothed curve,
``optim/lr``, every ``val/*`` loss-like metric) and from the run's history (each checkpoint's
evaluation: its headline figure, marked at its step and labelled ``ppl 7.41``), and, when early
stopping ended the run, the step it stopped at and its best step (tinyllm/selection.py).

Two renderers:

* ``-o FILE.png``: matplotlib (Agg, no display needed; the optional extra ``[plot]``, imported
  only here), written to a temporary file and renamed. matplotlib is the well-kept reference for
  static plots; an extra because a training box rarely needs it.
* no ``-o``: ``ctl/termplot.py``, braille line charts with no dependency (rich, already
  required, has no charts; plotext 6.1's reworked signal-based API was not worth a dependency
  for two line charts). Colours on a terminal, none in a pipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.layout import RunHome

from app.runview import SMOOTHING, RunView, headline, read_frames, stopped_early_text
from .termplot import chart

INSTALL_HINT = "pip install 'durable-train[plot]'"


class PlotUnavailable(Exception):
    """The plotting library is not installed."""


@dataclass
class Series:
    """Everything one plot of a run shows (the same for both renderers; tests compare it to the files)."""

    title: str
    loss: list[tuple[int, float]] = field(default_factory=list)
    smoothed: list[tuple[int, float]] = field(default_factory=list)
    lr: list[tuple[int, float]] = field(default_factory=list)
    val: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    evals: list[tuple[int, float, str]] = field(default_factory=list)  # (step, value on the loss axis, label)
    stopped_early: dict | None = None  # the run's stopped_early (step, best_step, metric, ...), when it stopped early

    def to_json(self) -> dict:
        return {
            "title": self.title,
            "loss": self.loss,
            "smoothed": self.smoothed,
            "lr": self.lr,
            "val": self.val,
            "evals": [{"step": s, "value": v, "label": label} for s, v, label in self.evals],
            "stopped_early": self.stopped_early,
        }

    def stop_text(self) -> str | None:
        return None if self.stopped_early is None else stopped_early_text(self.stopped_early)

    def best_mark(self) -> tuple[float, float, str] | None:
        """(best step, the metric's value there, label) when the run stopped early and that value is plotted."""
        s = self.stopped_early
        if s is None or not isinstance(s.get("best_step"), int):
            return None
        value = next((v for st, v in self.val.get(str(s.get("metric")), []) if st == s["best_step"]), None)
        if value is None and isinstance(s.get("best_value"), (int, float)):
            value = float(s["best_value"])
        return None if value is None else (float(s["best_step"]), value, f"best {s['best_step']}")


def series(view: RunView, home: Path) -> Series:
    frames = read_frames(RunHome(home).run(view.name).metrics)
    out = Series(title=f"{view.workflow_id} ({view.state})", stopped_early=view.stopped_early)
    ema = None
    for f in frames:
        loss = f.get("train/loss")
        if isinstance(loss, (int, float)):
            out.loss.append((f["step"], float(loss)))
            ema = loss if ema is None else SMOOTHING * ema + (1 - SMOOTHING) * loss
            out.smoothed.append((f["step"], float(ema)))
        if isinstance(f.get("optim/lr"), (int, float)):
            out.lr.append((f["step"], float(f["optim/lr"])))
        for key, value in f.items():
            if key.startswith("val/") and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.val.setdefault(key, []).append((f["step"], float(value)))
    for ev in view.evals():
        if ev.state != "done":
            continue
        on_axis = next((ev.metrics[k] for k in ("heldout/loss", "loss") if k in ev.metrics), None)
        out.evals.append((ev.step, on_axis if on_axis is not None else float("nan"), headline(ev.suite, ev.metrics)))
    return out


def _xy(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    return [p[0] for p in points], [p[1] for p in points]


def figure(s: Series) -> Any:
    """The matplotlib figure: losses (+ evaluations marked) above, learning rate below."""
    try:
        import matplotlib  # lazy: the optional [plot] extra, only -o needs it

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotUnavailable(
            f"ctl plot -o needs matplotlib ({INSTALL_HINT}), or plot in the terminal without -o: {e}"
        ) from None
    fig = Figure(figsize=(9, 6.5), dpi=100, layout="constrained")
    ax, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    ax.plot(*_xy(s.loss), color="#9ecae1", linewidth=1, label="train/loss")
    ax.plot(*_xy(s.smoothed), color="#08519c", linewidth=2, label=f"train/loss (smoothed {SMOOTHING})")
    for key, points in sorted(s.val.items()):
        if "loss" in key or "objective" in key:
            ax.plot(*_xy(points), marker="o", linewidth=1.5, label=key)
    marked = [(st, v, label) for st, v, label in s.evals if v == v]  # nan: no loss-like figure
    if marked:
        ax.scatter(
            [m[0] for m in marked],
            [m[1] for m in marked],
            marker="D",
            color="#d94801",
            zorder=3,
            label="evaluation (held-out loss)",
        )
        for st, v, label in marked:
            ax.annotate(f"{label} at {st}", (st, v), textcoords="offset points", xytext=(4, 8), fontsize=8)
    for st, _, _label in s.evals:
        ax.axvline(st, color="#bbbbbb", linewidth=0.8, linestyle=":")
    if s.stopped_early is not None and isinstance(s.stopped_early.get("step"), int):
        ax.axvline(
            s.stopped_early["step"],
            color="#cb181d",
            linewidth=1.2,
            linestyle="--",
            label=f"stopped early at {s.stopped_early['step']}",
        )
        if (best := s.best_mark()) is not None:
            ax.scatter(
                [best[0]],
                [best[1]],
                marker="*",
                s=120,
                color="#cb181d",
                zorder=4,
                label=f"best: {s.stopped_early.get('metric')} at {int(best[0])}",
            )
    ax.set_ylabel("loss")
    ax.set_title(s.title)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    ax_lr.plot(*_xy(s.lr), color="#31a354", linewidth=1.5)
    ax_lr.set_ylabel("optim/lr")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    return fig


def write_png(s: Series, path: Path) -> Path:
    fig = figure(s)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def terminal(s: Series, *, width: int, height: int, color: bool) -> str:
    """The plot as text: losses with the evaluations marked, then the learning rate."""
    curves = [("train/loss", s.loss), ("smoothed", s.smoothed)]
    curves += [(k, v) for k, v in sorted(s.val.items()) if "loss" in k or "objective" in k]
    marks = [(float(st), v, label) for st, v, label in s.evals if v == v]
    if (best := s.best_mark()) is not None:
        marks.append(best)
    top = chart(
        curves,
        width=width,
        height=max(10, int(height * 0.65)),
        title=s.title,
        marks=marks,
        color=color,
        ylabel="loss over step",
    )
    lr = chart(
        [("optim/lr", s.lr)], width=width, height=max(6, height - int(height * 0.65)), color=color, ylabel="over step"
    )
    stop = s.stop_text()
    return top + "\n" + lr + (f"\n{stop}" if stop else "")
