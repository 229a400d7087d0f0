"""A worker process for the multi-process engine tests.

    python eng_worker.py <db> <mode> <dir>

Modes: ``log`` (activity ``work`` logs its start/end to <dir>/log), ``train`` (activity
``train`` runs eng_child.py as a subprocess activity), ``launch`` (activity ``launch``: attempt 1
runs a launcher whose rank has its own session, later attempts check in-process that it is gone). Runs until SIGTERM. Writes
<dir>/ready-<pid> once its Engine is open.
"""

import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

from engine import Engine, RetryPolicy, StepOptions  # noqa: E402
from engine._leases import proc_start  # noqa: E402
from engine._subprocess_runner import run_subprocess  # noqa: E402

DIR = sys.argv[3] if len(sys.argv) > 3 else "."


def work(ctx, x):
    line = f"{ctx.workflow_id} {ctx.activity_id} {ctx.attempt} {os.getpid()}"
    with open(os.path.join(DIR, "log"), "a") as f:
        f.write(f"start {line} {time.monotonic()}\n")
    time.sleep(0.05)
    with open(os.path.join(DIR, "log"), "a") as f:
        f.write(f"end {line} {time.monotonic()}\n")
    return x


async def three(rt, _):
    out = []
    for i in range(3):
        out.append(await rt.execute_activity("work", i, StepOptions(id=f"w{i}")))
    return out


def train(ctx, x):
    if ctx.attempt == 1:
        argv = [sys.executable, os.path.join(HERE, "eng_child.py"), "forever", x["out"], x["pidfile"]]
    else:
        argv = [sys.executable, os.path.join(HERE, "eng_child.py"), "progress", x["progress"] + "2", "1"]
    res = run_subprocess(ctx, argv, progress_path=x["progress"] + str(ctx.attempt), poll_interval_s=0.05)
    return {"attempt": ctx.attempt, "result": res.result}


def launch(ctx, x):
    if ctx.attempt > 1:  # in this process, no runner: only the recovering worker's kill can have helped
        pid, start = open(x["pidfile"]).read().split()
        return {"attempt": ctx.attempt, "rank": "alive" if proc_start(int(pid)) == start else "gone"}
    argv = [
        sys.executable,
        os.path.join(HERE, "eng_child.py"),
        "launcher",
        x["progress"] + "1",
        x["out"],
        x["pidfile"],
        "100000",
    ]
    res = run_subprocess(ctx, argv, progress_path=x["progress"] + "1", poll_interval_s=0.05)
    return {"attempt": ctx.attempt, "result": res.result}


async def launch_wf(rt, x):
    opts = StepOptions(id="train-000010", heartbeat_timeout_s=600, retry=RetryPolicy(max_attempts=1))
    return await rt.execute_activity("launch", x, opts)


async def train_wf(rt, x):
    opts = StepOptions(id="train-000010", heartbeat_timeout_s=600, retry=RetryPolicy(max_attempts=1))
    return await rt.execute_activity("train", x, opts)


def make(db):
    eng = Engine(db, poll_interval_s=0.02)
    eng.register_workflow("three", three)
    eng.register_activity("work", work)
    eng.register_workflow("train", train_wf)
    eng.register_activity("train", train)
    eng.register_workflow("launch", launch_wf)
    eng.register_activity("launch", launch)
    return eng


def main():
    db = sys.argv[1]
    eng = make(db)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    with open(os.path.join(DIR, f"ready-{os.getpid()}"), "w") as f:
        f.write("ok")
    eng.run_forever(stop)
    eng.close()


if __name__ == "__main__":
    main()
