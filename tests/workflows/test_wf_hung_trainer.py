"""A hung trainer is noticed (issue 9, defect 2): real TrainRun, real engine, real `tinyllm train`.

The trainer is frozen by SIGSTOP after its first checkpoint: the process exists but makes no
progress. Its liveness lines stop, so nothing heartbeats; past the (short, test-set) heartbeat
timeout the attempt is stopped (SIGTERM and SIGCONT: it checkpoints and exits) and redelivered.
The frozen process is gone before attempt 2 starts, and the run ends with the same final loss
bits and digest as one uninterrupted `tinyllm train`. Waits are bounded polls, never timings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import workflows
from engine import Engine
from workflows.models import TrainRunInput

pytestmark = pytest.mark.slow  # a real trainer frozen by SIGSTOP (~33 s)

HEARTBEAT_S = 12.0  # covers the trainer's longest silent phase here (the torch import, ~3 s) ~4x over
DEADLINE_S = 240
SPEC = {
    "name": "hang",
    "corpus": "default",
    "steps": 300,
    "seed": 3,
    "eval_every": 0,
    "checkpoint_every": 50,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 300,
    "threads": 1,
    "log_every": 100,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def tinyllm(home: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):  # not there yet, or a line being written
        return []


def poll(cond, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_trainer_frozen_by_sigstop_is_stopped_redelivered_and_exact(tmp_path: Path) -> None:
    ref_home, home = tmp_path / "ref", tmp_path / "run"
    for h in (ref_home, home):
        h.mkdir()
    (ref_home / "spec.json").write_text(json.dumps(SPEC))
    tinyllm(ref_home, "corpus")
    reference = tinyllm(ref_home, "train", "--spec", str(ref_home / "spec.json"))

    eng = Engine(str(home / "engine.db"), poll_interval_s=0.05)
    workflows.register(eng, activities=workflows.tinyllm_activities(home))
    inp = TrainRunInput(spec=SPEC, corpus={"name": "default"}, train_heartbeat_timeout_s=HEARTBEAT_S)
    eng.start(workflows.WORKFLOW_TRAIN_RUN, "train/hang", inp.model_dump(mode="json"))
    out: dict = {}

    def run() -> None:
        try:
            out["st"] = eng.run_until_complete("train/hang", timeout_s=DEADLINE_S)
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    work = home / "runs/hang/activity/train-000300"

    def checkpointed():  # the attempt that wrote a checkpoint first (a busy host may time out a startup)
        for n in range(1, 6):
            if [x for x in lines(work / f"progress-{n}.jsonl") if "checkpoint" in x]:
                return n
        return None

    frozen_pid = None
    try:
        n = poll(checkpointed, "a checkpoint")
        [start] = [x for x in lines(work / f"progress-{n}.jsonl") if x.get("event") == "starting"]
        frozen_pid = start["pid"]
        pstart = proc_start(frozen_pid)
        os.kill(frozen_pid, signal.SIGSTOP)
        assert pstart is not None, "the trainer ended before it could be frozen"
        assert not any(x.get("step") == SPEC["steps"] for x in lines(work / f"progress-{n}.jsonl"))
        give_up = time.monotonic() + 4 * HEARTBEAT_S + 60  # the timeout, the SIGTERM grace, a busy host
        while proc_start(frozen_pid) == pstart:  # until the runner has stopped it: no second trainer
            assert not (work / f"progress-{n + 1}.jsonl").exists(), "a new attempt started beside the frozen trainer"
            assert t.is_alive(), out
            assert time.monotonic() < give_up, "the frozen trainer was never stopped (heartbeats without progress?)"
            time.sleep(0.01)
        t.join(DEADLINE_S)
        assert not t.is_alive() and "error" not in out, out
    finally:
        if frozen_pid is not None and proc_start(frozen_pid) is not None:
            os.kill(frozen_pid, signal.SIGKILL)
        eng.close()

    assert out["st"].state == "completed"
    eng = Engine(str(home / "engine.db"))
    try:
        history = eng.history("train/hang")
        result = eng.status("train/hang").result
    finally:
        eng.close()
    train_events = [e for e in history if e.attrs.get("activity_id") == "train-000300"]
    ended = [
        (e.type, e.attrs.get("kind") or e.attrs["error"]["type"])
        for e in train_events
        if e.type in ("activity_timed_out", "activity_failed") and e.attrs["attempt"] == n
    ]
    assert ended and ended[0][1] in ("heartbeat timeout", "ProgressTimeout"), ended
    [done] = [e for e in train_events if e.type == "activity_completed"]
    assert done.attrs["attempt"] > n and done.attrs["result"]["resumed_from"] is not None  # from a checkpoint
    assert result["final_loss_hex"] == reference["final_loss_hex"]
    assert result["digest"] == reference["digest"]
