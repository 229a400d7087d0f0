"""One reporter, one frame per step, independent sinks.

A frame is a flat dict of floats keyed by namespace: ``train/*`` (loss, tokens), ``optim/*`` (lr,
grad_norm), ``timer/*`` (step_s, tokens_per_s), ``val/*`` (held-out validation, when it ran at this
step), ``warn/*`` (a warning in figures, once per run: GRPO without a learning signal,
tinyllm/objectives/no_signal.py). ``Reporter.report(step, frame)`` hands the frame to every sink; a sink that raises is
disabled alone with one warning on stderr and training goes on.

Sinks: console (a progress line on stderr every ``every`` steps and at the last step), JSONL
(``runs/<name>/metrics.jsonl``, one object per frame with ``step`` and wall ``time``; on resume,
frames after the resumed step are dropped so the file reads as one run), TensorBoard
(``tinyllm/sinks/tensorboard_sink.py``: ``runs/<name>/tensorboard/``, the same names, one event per
frame, cut back to the resumed step likewise; only when the ``[tensorboard]`` extra is installed),
MLflow (``tinyllm/sinks/mlflow_sink.py``: when the spec's ``sinks.mlflow`` asks; one MLflow run per TrainRun,
each step delivered once across resumes, by a child process that reads metrics.jsonl: built after
the JSONL sink, which cuts the file back first; mlflow is imported only there), traces
(``tinyllm/sinks/trace_export.py``: sampled ``train.step`` spans, when ``$TRACEPARENT`` and a trace destination
are set, as ``ctl train`` sets them for a traced run; OpenTelemetry is imported only then).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Protocol

from contracts.layout import METRICS

from ..diskfull import writing
from .mlflow_sink import MlflowSink
from .tensorboard_sink import TensorBoardSink
from .tracing import trainer_tracing


class Sink(Protocol):
    name: str

    def write(self, step: int, frame: dict) -> None: ...

    def close(self) -> None: ...


class ConsoleSink:
    name = "console"

    def __init__(self, every: int, total_steps: int, stream=None, prefix: str = ""):
        self.every, self.total, self.stream, self.prefix = every, total_steps, stream or sys.stderr, prefix

    def write(self, step: int, frame: dict) -> None:
        has_val = any(k.startswith("val/") for k in frame)
        if step % self.every and step != self.total and not has_val:  # validation frames always print
            return
        parts = [f"{self.prefix}step {step:>6}/{self.total}"]
        if "train/loss" in frame:
            parts.append(f"loss {frame['train/loss']:.4f}")
        for key, value in frame.items():
            if key.startswith("val/") and isinstance(value, int):
                parts.append(f"{key} {value}")
            elif key.startswith("val/") and isinstance(value, float):
                parts.append(f"{key} {value:.4f}")
        if "optim/lr" in frame:
            parts.append(f"lr {frame['optim/lr']:.2e}")
        if "timer/tokens_per_s" in frame:
            parts.append(f"{frame['timer/tokens_per_s'] / 1000:.1f}k tok/s")
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


class JsonlSink:
    name = "jsonl"

    def __init__(self, path: Path, resumed_step: int):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_after(resumed_step)
        self.file = open(path, "a", encoding="utf-8")

    def _drop_after(self, step: int) -> None:
        """Keep frames up to ``step``: frames of a killed run's lost steps would read as duplicates."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line + "\n")
            except ValueError:
                continue  # a line torn by a kill
        tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
        try:
            with writing(tmp):
                tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)  # gone after the replace; a torn temporary never stays

    def write(self, step: int, frame: dict) -> None:
        self.file.write(json.dumps({"step": step, "time": time.time(), **frame}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Reporter:
    """Fans each step's frame out to its sinks; a failing sink is disabled, never fatal."""

    def __init__(self, sinks: list, warn_stream=None):
        self.sinks = list(sinks)
        self.warn_stream = warn_stream or sys.stderr

    def report(self, step: int, frame: dict) -> None:
        for sink in list(self.sinks):
            try:
                sink.write(step, frame)
            except Exception as e:
                self._disable(sink, e)

    def _disable(self, sink, err: Exception) -> None:
        self.sinks.remove(sink)
        print(
            f"tinyllm: warning: metrics sink {sink.name!r} failed ({type(err).__name__}: {err}); disabled, training goes on",
            file=self.warn_stream,
            flush=True,
        )

    def close(self) -> None:
        for sink in list(self.sinks):
            try:
                sink.close()
            except Exception as e:
                self._disable(sink, e)


def default_reporter(
    run_dir: Path,
    resumed_step: int,
    total_steps: int,
    log_every: int,
    *,
    sinks=None,
    spec=None,
    home: Path | None = None,
    corpus_checksum: str | None = None,
) -> Reporter:
    """Console, JSONL, TensorBoard (when installed), and the spec's ``sinks`` (MLflow: tinyllm/sinks/mlflow_sink.py)."""
    out: list = [ConsoleSink(log_every, total_steps), JsonlSink(run_dir / METRICS, resumed_step)]
    try:
        out.append(TensorBoardSink(run_dir / "tensorboard", resumed_step))
    except ImportError:
        pass  # tensorboard is optional (the sink imports it only when first used)
    if sinks is not None and sinks.mlflow is not None:
        try:  # after JsonlSink (it cut metrics.jsonl back, and the sink's delivery process reads that file) and
            # closed after it (Reporter.close's order), so the sink's stop finds every frame in the file
            out.append(
                MlflowSink(
                    sinks.mlflow,
                    run_dir=run_dir,
                    home=home or run_dir.parent.parent,
                    spec=spec.model_dump(mode="json"),
                    resumed_step=resumed_step,
                    corpus_checksum=corpus_checksum,
                )
            )
        except ValueError as e:  # no tracking URI anywhere: the sink is off, training goes on
            print(f"tinyllm: warning: metrics sink 'mlflow' off: {e}", file=sys.stderr, flush=True)
    if (traced := trainer_tracing()) is not None:  # ctl's traced run: this attempt's span is $TRACEPARENT
        try:
            from .trace_export import StepSpanSink  # lazy: the optional [trace] extra

            out.append(StepSpanSink(log_every, total_steps, *traced))
        except (ImportError, ValueError) as e:
            print(f"tinyllm: warning: traces off: {e}", file=sys.stderr, flush=True)
    return Reporter(out)
