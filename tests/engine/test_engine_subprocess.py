"""The subprocess runner with real child processes: progress heartbeats, exit codes, cancel, no orphans."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from engine import RetryPolicy, StepOptions, SystemClock, VirtualClock, WorkflowFailed
from engine._leases import proc_start
from engine._subprocess_runner import run_subprocess

from eng_helpers import Crash, make_engine, python_cmd

pytestmark = pytest.mark.slow  # the subprocess runner with real child processes


def wait_for(cond, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def runner_activity(tmp_path, *child_args):
    def act(ctx, _):
        res = run_subprocess(
            ctx,
            python_cmd("eng_child.py", *child_args),
            progress_path=str(tmp_path / f"progress-{ctx.attempt}.jsonl"),
            poll_interval_s=0.02,
        )
        return {"rc": res.returncode, "result": res.result, "stdout_tail": res.stdout_tail}

    return act


async def one(rt, _):
    return await rt.execute_activity(
        "run",
        None,
        StepOptions(
            id="train-000030", heartbeat_timeout_s=300, retry=RetryPolicy(max_attempts=2, initial_interval_s=0.01)
        ),
    )


def test_progress_lines_become_heartbeats_and_result_is_the_last_stdout_line(tmp_path, db):
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        activities=[("run", runner_activity(tmp_path, "progress", str(tmp_path / "progress-1.jsonl"), "3"))],
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    out = eng.result("w")
    assert out["rc"] == 0 and out["result"] == {"steps": 30, "final_loss_hex": "0x1.8000000000000p+0"}
    assert "some log line" in out["stdout_tail"]
    beats = [e.attrs["details"] for e in eng.history("w") if e.type == "activity_heartbeat"]
    assert [b["step"] for b in beats] == [10, 20, 30]
    assert eng.activities("w")[0].last_heartbeat_details == {"step": 30, "checkpoint": "ckpt/step-000030"}


def test_exit_2_is_non_retryable_bad_input(tmp_path, db):
    eng = make_engine(
        db, SystemClock(), workflows=[("w", one)], activities=[("run", runner_activity(tmp_path, "badinput"))]
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    with pytest.raises(WorkflowFailed) as ei:
        eng.result("w")
    assert ei.value.type == "BadInput"
    assert "bad spec: 'steps' must be a positive integer" in str(ei.value)
    assert sum(e.type == "activity_started" for e in eng.history("w")) == 1


def test_a_command_that_cannot_start_is_non_retryable_bad_input(tmp_path, db):
    """No such program (a spec's trainer.command misspelt): the same argv fails the same way on every attempt;
    it was retried to max_attempts (ctl train: 'FileNotFoundError ... (attempt 5)'); now it fails at once."""

    def act(ctx, _):
        run_subprocess(
            ctx,
            ["no-such-trainer-xyz", "--spec", "s.json"],
            progress_path=str(tmp_path / "p.jsonl"),
            cwd=str(tmp_path),
            poll_interval_s=0.02,
        )

    eng = make_engine(db, SystemClock(), workflows=[("w", one)], activities=[("run", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    with pytest.raises(WorkflowFailed) as ei:
        eng.result("w")
    assert ei.value.type == "BadInput" and "cannot start 'no-such-trainer-xyz'" in str(ei.value), str(ei.value)
    assert sum(e.type == "activity_started" for e in eng.history("w")) == 1


def test_other_exit_codes_are_retried(tmp_path, db):
    eng = make_engine(
        db, SystemClock(), workflows=[("w", one)], activities=[("run", runner_activity(tmp_path, "crash"))]
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    failed = [e for e in eng.history("w") if e.type == "activity_failed"]
    assert [f.attrs["final"] for f in failed] == [False, True]
    assert failed[-1].attrs["error"]["type"] == "SubprocessFailed"
    assert "CUDA out of memory" in failed[-1].attrs["error"]["message"]
    assert failed[-1].attrs["error"]["details"]["returncode"] == 3


def test_cancel_sigterms_the_child_which_exits_130(tmp_path, db):
    pidfile = str(tmp_path / "child.pid")
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        activities=[("run", runner_activity(tmp_path, "term", pidfile))],
        inline=False,
        poll_interval_s=0.02,
    )
    eng.start("w", "w", None)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("st", eng.run_until_complete("w", timeout_s=60)))
    t.start()
    wait_for(lambda: os.path.exists(pidfile), what="the child to start")
    make_engine(db, SystemClock(), workflows=[("w", one)]).cancel("w")  # as `ctl cancel` would
    t.join(60)
    assert out["st"].state == "canceled"
    canceled = [e for e in eng.history("w") if e.type == "activity_canceled"]
    assert len(canceled) == 1 and canceled[0].attrs["error"]["type"] == "Canceled"


def test_recovering_worker_kills_a_leftover_child_of_a_dead_worker(tmp_path, db):
    """Belt and braces: a recorded child without a parent-death signal is killed before redelivery."""
    clock = VirtualClock()
    out, pidfile = str(tmp_path / "out"), str(tmp_path / "pid")
    children = []

    def act(ctx, _):
        if ctx.attempt == 1:
            p = subprocess.Popen(python_cmd("eng_child.py", "forever", out, pidfile), start_new_session=True)
            children.append(p)
            ctx.record_child(p.pid)
            wait_for(lambda: os.path.exists(out), what="the child to write")
            raise Crash("worker dies, child lives on")
        return "redelivered"

    eng = make_engine(db, clock, workflows=[("w", one)], activities=[("run", act)])
    eng.start("w", "w", None)
    with pytest.raises(Crash):
        eng.run_until_complete("w")
    assert children[0].poll() is None  # still running: nothing killed it yet
    eng2 = make_engine(db, clock, workflows=[("w", one)], activities=[("run", act)])
    eng2.run_until_complete("w")
    assert eng2.result("w") == "redelivered"
    assert children[0].wait(timeout=20) == -9  # SIGKILLed by the recovering worker


def test_sigkilled_worker_leaves_no_child_writing_and_is_redelivered(tmp_path):
    """Real processes: SIGKILL the worker mid-activity; its trainer-like child must stop writing."""
    db = str(tmp_path / "engine.db")
    out, pidfile, progress = str(tmp_path / "out"), str(tmp_path / "child.pid"), str(tmp_path / "progress")
    worker = subprocess.Popen(python_cmd("eng_worker.py", db, "train", str(tmp_path)))
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import eng_worker

        starter = eng_worker.make(db)
        starter.start("train", "train/tiny", {"out": out, "pidfile": pidfile, "progress": progress})
        wait_for(
            lambda: os.path.exists(pidfile) and os.path.exists(out) and os.path.getsize(out) > 20,
            what="the child to write",
        )
        child = int(open(pidfile).read())
        worker.kill()
        worker.wait(timeout=20)
        wait_for(lambda: proc_start(child) is None, what="the orphaned child to die")
        size = os.path.getsize(out)
        # the child is gone, so the file can no longer grow; a second look confirms it
        assert proc_start(child) is None and os.path.getsize(out) == size
        # a new worker redelivers at once (the owner pid is dead) with attempt 2
        worker2 = subprocess.Popen(python_cmd("eng_worker.py", db, "train", str(tmp_path)))
        try:
            wait_for(lambda: starter.status("train/tiny").state != "running", timeout_s=30, what="redelivery")
        finally:
            worker2.terminate()
            worker2.wait(timeout=20)
        assert starter.result("train/tiny")["attempt"] == 2
        lost = [e for e in starter.history("train/tiny") if e.type == "activity_timed_out"]
        assert len(lost) == 1 and lost[0].attrs["error"]["type"] == "WorkerLost"
    finally:
        if worker.poll() is None:
            worker.kill()


def test_output_dir_keeps_both_streams_of_each_attempt_and_the_error_still_names_the_last_stderr_line(tmp_path, db):
    """``output_dir`` (issue 40 item 8; ctl logs): each attempt's stdout and stderr stay in files of its own
    folder after it ended, a failure's message still carries the last stderr line, a success's result is still
    its last stdout line."""

    def act(ctx, _):
        mode = "crash" if ctx.attempt == 1 else "progress"
        args = ("crash",) if mode == "crash" else ("progress", str(tmp_path / f"progress-{ctx.attempt}.jsonl"), "1")
        res = run_subprocess(
            ctx,
            python_cmd("eng_child.py", *args),
            output_dir=tmp_path / f"out-{ctx.attempt}",
            progress_path=str(tmp_path / f"progress-{ctx.attempt}.jsonl"),
            poll_interval_s=0.02,
        )
        return {"result": res.result}

    eng = make_engine(db, SystemClock(), workflows=[("w", one)], activities=[("run", act)])
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=30)
    assert eng.result("w")["result"] == {"steps": 10, "final_loss_hex": "0x1.8000000000000p+0"}
    failed = next(e for e in eng.history("w") if e.type == "activity_failed")
    last_err = (tmp_path / "out-1/stderr.log").read_text().strip().splitlines()[-1]
    assert last_err and last_err in failed.attrs["error"]["message"], (last_err, failed.attrs)
    import json

    assert json.loads((tmp_path / "out-2/stdout.log").read_text().strip().splitlines()[-1]) == {
        "steps": 10,
        "final_loss_hex": "0x1.8000000000000p+0",
    }
    assert "some log line" in (tmp_path / "out-2/stdout.log").read_text()
