"""Per-step cost of the metrics sinks: none (console + JSONL), TensorBoard, MLflow, traces, side by side.

Run: ``python bench/sinks.py`` (CPU; a few minutes). Trains the same run (the tiny spec's model,
nanoGPT's CPU recipe's size: 4 layers, 128 wide, block 64, batch 16) three ways, alternating,
best of REPEATS each, and prints for each sink set: wall time per step in steady state (from step
WARM_STEPS's frame, and for MLflow from the first frame after its thread imported mlflow and found the
run, to the last frame; the rest of the attempt, its start, that import and the sinks' end-of-attempt
flush, is printed apart as fixed seconds), its ratio to none, the process's CPU time per step over the
same steps (every thread: training and the sinks' own delivery threads; on a machine other processes
load, the figure their load changes least; the MLflow delivery process is not in it, see below) and its ratio, the time
the training thread spends in the sink's ``write`` per step (MLflow's records the step only: delivery
runs in a child process that tails metrics.jsonl, tinyllm/sinks/mlflow_delivery.py), the CPU seconds of the
attempt's child processes (the MLflow delivery process: its mlflow import, its store, every request;
``getrusage(RUSAGE_CHILDREN)``, reaped by the sink's close), and whether the final loss and digest are bit-identical to none's.
The MLflow store is a local SQLite file (``sqlite:///``), the same store type the tests use.
Traces (tinyllm/sinks/trace_export.py, the ``[trace]`` extra): the trainer's ``train.step`` spans as ``ctl train``
of a traced run makes them (``TRACEPARENT`` + ``CTL_TRACE_FILE``: a JSON-lines file, exported in batches
on the SDK's thread), sampled every 10 steps (nanoGPT's log_interval: ``trace/10``) and, the worst case,
every step (``trace/1``). ctl's own spans (from the history, once a second) are not on the trainer's path.
Aim (issue 30): under 2% of a step.

``--model nanogpt-cpu``: the shape of nanoGPT's README CPU recipe for shakespeare_char (``--device=cpu
--compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
--n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``): a char-level corpus (the built-in
text with ``tokenizer: char``, as shakespeare_char), batch 12, no dropout, no bias, lr 1e-3 decayed over
2000 steps, a frame every step (``log_interval=1``: ``log_every`` 1, so ``trace/log_every`` is
``trace/1``; ``trace/10`` is nanoGPT's default ``log_interval``), ``--steps`` of its 2000 (default 150).
Not reproduced: the recipe's evaluation every ``eval_interval`` (``eval_iters=20`` batches; tinyllm's
``validation`` block would add its own frames; this measures the per-step cost of the sinks).
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyllm.sinks import metrics  # noqa: E402
from tinyllm.corpus import build_corpus  # noqa: E402
from tinyllm.spec import CorpusSpec, parse_train_spec  # noqa: E402
from tinyllm.trainer import Trainer  # noqa: E402

STEPS = 150
REPEATS = 2
WARM_STEPS = 10  # the steady-state clock starts at this step's frame
MODEL = {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
SPEC = {
    "steps": STEPS,
    "seed": 7,
    "checkpoint_every": 1000,
    "batch_size": 16,
    "lr": 0.002,
    "warmup_steps": 10,
    "threads": 2,
    "log_every": 1000,
    "model": MODEL,
}
# nanoGPT's README CPU recipe for shakespeare_char (see the module docstring)
NANOGPT_CPU = {
    "steps": 150,
    "seed": 7,
    "checkpoint_every": 100_000,
    "batch_size": 12,
    "lr": 1e-3,
    "min_lr": 1e-4,
    "warmup_steps": 100,
    "lr_decay_steps": 2000,
    "threads": 2,
    "log_every": 1,
    "corpus": "char",
    "model": {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0, "bias": False},
}
SETUPS = {
    "default": (SPEC, ["none", "tensorboard", "mlflow", "trace/10", "trace/1"]),
    "nanogpt-cpu": (NANOGPT_CPU, ["none", "tensorboard", "mlflow", "trace/10", "trace/1"]),
}


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


def run(home: Path, name: str, kind: str, base: dict = SPEC, measure: bool = True) -> tuple[float, float, dict]:
    sinks = {}
    if kind == "mlflow":
        sinks = {
            "sinks": {
                "mlflow": {
                    "tracking_uri": f"sqlite:///{home / 'mlruns.db'}",
                    "experiment": "bench",
                    "flush_timeout_s": 600,
                }
            }
        }
    spec = parse_train_spec({**base, "name": name, **sinks})
    steps = spec.steps
    timed: list[Timed] = []
    stamps: list[tuple[int, float, bool, float]] = []
    real = metrics.default_reporter
    traced = kind.startswith("trace/")
    saved = {k: os.environ.get(k) for k in ("TRACEPARENT", "CTL_TRACE_FILE")}
    if traced:  # what ctl train gives a traced run's trainer
        os.environ["TRACEPARENT"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        os.environ["CTL_TRACE_FILE"] = str(home / f"{name}.trace.jsonl")

    def reporter(run_dir, resumed, total, every, **kw):
        r = real(run_dir, resumed, total, every, **kw)
        keep = {
            "none": {"console", "jsonl"},
            "tensorboard": {"console", "jsonl", "tensorboard"},
            "mlflow": {"console", "jsonl", "mlflow"},
        }.get(kind, {"console", "jsonl", "trace"})
        r.sinks = [Timed(s) for s in r.sinks if s.name in keep]
        for t in r.sinks:
            if t.name == "trace":
                t.sink.every = int(kind.split("/")[1])  # sampled as log_every would (the spec's is 1000 here)
        timed.extend(r.sinks)
        inner = r.report

        def report(step, frame):  # when each step's frame has gone to every sink (the steady-state clock)
            inner(step, frame)
            ready = all(t.sink.state.get("run_id") for t in r.sinks if t.name == "mlflow")  # imported, run found
            stamps.append((step, time.perf_counter(), ready, time.process_time()))

        r.report = report
        return r

    import tinyllm.trainer as trainer_module

    trainer_module.default_reporter = reporter
    try:
        ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        result = Trainer(spec, home, log=io.StringIO()).run()
        wall = time.perf_counter() - t0  # includes the MLflow sink's flush at the end
        ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the delivery process, reaped by its close()
        child_cpu_s = (ch1.ru_utime - ch0.ru_utime) + (ch1.ru_stime - ch0.ru_stime)
    finally:
        trainer_module.default_reporter = real
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if traced:
        spans = (home / f"{name}.trace.jsonl").read_text().count("\n")
        every = int(kind.split("/")[1])
        assert spans == steps // every + (steps % every > 0), (kind, spans)  # every sampled step's span (and the last)
    extra = sum(t.write_s for t in timed if t.name not in ("console", "jsonl"))
    if not measure:
        return 0.0, 0.0, result
    # per step in steady state: from the frame of step WARM_STEPS (start-up, first-step allocations and the
    # sinks' imports behind) to the last frame; what the attempt costs besides (start, the end's flush): fixed
    # (and, with MLflow, from the first frame after its thread imported mlflow and found the run: that
    # start-up, seconds of CPU beside training, is fixed, not per step)
    first = next((i for i, (st, _, ready, _) in enumerate(stamps) if st >= min(WARM_STEPS, steps // 4) and ready), None)
    if first is None or len(stamps) - first < steps // 4:
        raise SystemExit(f"{kind}: under {steps // 4} steps after the sinks' start-up; run more --steps")
    (s0, t0_, _, c0), (s1, t1, _, c1) = stamps[first], stamps[-1]
    per_step = (t1 - t0_) / max(1, s1 - s0)
    cpu_per_step = (c1 - c0) / max(1, s1 - s0)  # the process's CPU, every thread: robust to other processes' load
    return (
        per_step,
        extra / steps,
        {**result, "fixed_s": wall - per_step * steps, "cpu_s": cpu_per_step, "child_cpu_s": child_cpu_s},
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        choices=sorted(SETUPS),
        default="default",
        help="default: the tiny spec's model, batch 16; nanogpt-cpu: nanoGPT's README CPU recipe's shape",
    )
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: 150, both models)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="runs of each sink set (the best counts)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default 2; on a machine others load, 1 keeps the steps from stalling)",
    )
    args = ap.parse_args(argv)
    base, kinds = SETUPS[args.model]
    base = {
        **base,
        **({"steps": args.steps} if args.steps else {}),
        **({"threads": args.threads} if args.threads else {}),
    }
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        build_corpus(CorpusSpec(), home)
        if base.get("corpus") == "char":  # nanoGPT's shakespeare_char: characters, not bytes
            build_corpus(CorpusSpec(name="char", tokenizer="char"), home)
        per_step: dict[str, list[float]] = {k: [] for k in kinds}
        write: dict[str, list[float]] = {k: [] for k in kinds}
        fixed: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        child: dict[str, list[float]] = {k: [] for k in kinds}
        results: dict[str, dict] = {}
        # a first MLflow run creates the store's tables (seconds, once per store): not a per-step cost
        run(home, "warm", "mlflow", {**base, "steps": 2}, measure=False)
        for r in range(args.repeats):
            for k in kinds:
                s, w, result = run(home, f"{k.replace('/', '-')}-{r}", k, base)
                per_step[k].append(s)
                write[k].append(w)
                fixed[k].append(result["fixed_s"])
                cpu[k].append(result["cpu_s"])
                child[k].append(result["child_cpu_s"])
                results[k] = result
        floor, cpu_floor = min(per_step["none"]), min(cpu["none"])
        print(
            f"model {args.model}: {base['steps']} steps, batch {base['batch_size']}, {base['threads']} thread(s), {base['model']}, "
            f"best of {args.repeats}, {time.perf_counter() - t_start:.0f} s in all"
        )
        print(
            "s/step: steady state (from step 10's frame, and MLflow's run found, to the last frame), best of the "
            "repeats; fixed: the rest of the attempt (start-up, mlflow's import, the sinks' close and flush), median"
        )
        print(
            "cpu s/step: the process's CPU time per step over the same steps (all its threads: training, the "
            "sinks' own threads), best of the repeats; what other processes' load changes least"
        )
        print(
            f"{'sinks':<12} {'s/step (best)':>14} {'ratio':>7} {'cpu s/step':>11} {'ratio':>7} {'write us/step':>14} "
            f"{'write/step':>11} {'fixed s':>8} {'child cpu s':>11}  same bits"
        )
        for k in kinds:
            best = min(per_step[k])
            same = (results[k]["final_loss_hex"], results[k]["digest"]) == (
                results["none"]["final_loss_hex"],
                results["none"]["digest"],
            )
            wr = statistics.median(write[k])
            c = min(cpu[k])
            print(
                f"{k:<12} {best:>14.5f} {best / floor:>7.3f} {c:>11.5f} {c / cpu_floor:>7.3f} {wr * 1e6:>14.1f} "
                f"{wr / floor:>10.2%} "
                f"{statistics.median(fixed[k]):>8.2f} {statistics.median(child[k]):>11.2f}  {same}"
            )
        # the noise: how far a sink set's own repeats lie apart (a ratio below it is not resolved here)
        print(
            "spread of the repeats (worst / best), s/step: "
            + ", ".join(f"{k} {max(per_step[k]) / min(per_step[k]):.3f}" for k in kinds)
        )


if __name__ == "__main__":
    main()
