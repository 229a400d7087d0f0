"""Per-step cost of the metrics sinks: none (console + JSONL), TensorBoard, MLflow, traces, side by side.

Run: ``python bench/sinks.py`` (CPU; a few minutes). Trains the same run (the tiny spec's model,
nanoGPT's CPU recipe's size: 4 layers, 128 wide, block 64, batch 16) three ways, alternating,
best of REPEATS each, and prints for each sink set: wall time per step, its ratio to none, the time
the training thread spends in the sink's ``write`` per step (MLflow's is a queue put: the delivery
runs on the sink's thread), and whether the final loss and digest are bit-identical to none's.
The MLflow store is a local SQLite file (``sqlite:///``), the same store type the tests use.
Traces (tinyllm/trace_export.py, the ``[trace]`` extra): the trainer's ``train.step`` spans as ``ctl train``
of a traced run makes them (``TRACEPARENT`` + ``CTL_TRACE_FILE``: a JSON-lines file, exported in batches
on the SDK's thread), sampled every 10 steps (nanoGPT's log_interval: ``trace/10``) and, the worst case,
every step (``trace/1``). ctl's own spans (from the history, once a second) are not on the trainer's path.
Aim (issue 30): under 2% of a step.
"""
from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyllm import metrics  # noqa: E402
from tinyllm.corpus import build_corpus  # noqa: E402
from tinyllm.spec import CorpusSpec, parse_train_spec  # noqa: E402
from tinyllm.trainer import Trainer  # noqa: E402

STEPS = 150
REPEATS = 2
MODEL = {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
SPEC = {"steps": STEPS, "seed": 7, "checkpoint_every": 1000, "batch_size": 16, "lr": 0.002,
        "warmup_steps": 10, "threads": 2, "log_every": 1000, "model": MODEL}


class Timed:
    """Wraps a sink: time spent in its write on the training thread."""

    def __init__(self, sink):
        self.sink, self.name, self.write_s = sink, sink.name, 0.0

    def write(self, step, frame):
        t0 = time.perf_counter()
        self.sink.write(step, frame)
        self.write_s += time.perf_counter() - t0

    def close(self):
        self.sink.close()


def run(home: Path, name: str, kind: str) -> tuple[float, float, dict]:
    sinks = {}
    if kind == "mlflow":
        sinks = {"sinks": {"mlflow": {"tracking_uri": f"sqlite:///{home / 'mlruns.db'}", "experiment": "bench",
                                      "flush_timeout_s": 600}}}
    spec = parse_train_spec({**SPEC, "name": name, **sinks})
    timed: list[Timed] = []
    real = metrics.default_reporter
    traced = kind.startswith("trace/")
    saved = {k: os.environ.get(k) for k in ("TRACEPARENT", "CTL_TRACE_FILE")}
    if traced:  # what ctl train gives a traced run's trainer
        os.environ["TRACEPARENT"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        os.environ["CTL_TRACE_FILE"] = str(home / f"{name}.trace.jsonl")

    def reporter(run_dir, resumed, total, every, **kw):
        r = real(run_dir, resumed, total, every, **kw)
        keep = {"none": {"console", "jsonl"}, "tensorboard": {"console", "jsonl", "tensorboard"},
                "mlflow": {"console", "jsonl", "mlflow"}}.get(kind, {"console", "jsonl", "trace"})
        r.sinks = [Timed(s) for s in r.sinks if s.name in keep]
        for t in r.sinks:
            if t.name == "trace":
                t.sink.every = int(kind.split("/")[1])  # sampled as log_every would (the spec's is 1000 here)
        timed.extend(r.sinks)
        return r

    import tinyllm.trainer as trainer_module
    trainer_module.default_reporter = reporter
    try:
        t0 = time.perf_counter()
        result = Trainer(spec, home, log=io.StringIO()).run()
        wall = time.perf_counter() - t0  # includes the MLflow sink's flush at the end
    finally:
        trainer_module.default_reporter = real
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if traced:
        spans = (home / f"{name}.trace.jsonl").read_text().count("\n")
        assert spans == STEPS // int(kind.split("/")[1]), (kind, spans)  # every sampled step's span arrived
    extra = sum(t.write_s for t in timed if t.name not in ("console", "jsonl"))
    return wall / STEPS, extra / STEPS, result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        build_corpus(CorpusSpec(), home)
        kinds = ["none", "tensorboard", "mlflow", "trace/10", "trace/1"]
        per_step: dict[str, list[float]] = {k: [] for k in kinds}
        write: dict[str, list[float]] = {k: [] for k in kinds}
        results: dict[str, dict] = {}
        # a first MLflow run creates the store's tables (seconds, once per store): not a per-step cost
        run(home, "warm", "mlflow")
        for r in range(REPEATS):
            for k in kinds:
                s, w, result = run(home, f"{k.replace('/', '-')}-{r}", k)
                per_step[k].append(s)
                write[k].append(w)
                results[k] = result
        base = min(per_step["none"])
        print(f"{'sinks':<12} {'s/step (best)':>14} {'ratio':>7} {'write us/step':>14}  same bits")
        for k in kinds:
            best = min(per_step[k])
            same = (results[k]["final_loss_hex"], results[k]["digest"]) == \
                   (results["none"]["final_loss_hex"], results["none"]["digest"])
            print(f"{k:<12} {best:>14.5f} {best / base:>7.3f} {statistics.median(write[k]) * 1e6:>14.1f}  {same}")


if __name__ == "__main__":
    main()
