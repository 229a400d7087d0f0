"""Issue 40 items 4 and 5 (status): what ``ctl status`` says is true at the moments users ask it.

* right after ``ctl train`` is killed during a durable wait (``eval_interval_seconds``, nothing in flight, no
  lease to be late): "no live worker" and no ETA (ctl/presence.py: the live ``ctl`` processes running it);
  while it waits alive: its pid as the live worker;
* a canceled run names the newest of its history's checkpoint and ``LATEST`` as its last checkpoint (the
  cancel's stop checkpoint, written after the last heartbeat);
* an evaluation that stops making progress: status says what the worker waits for, how long there has been
  no progress and after how long it is stopped (``--eval-heartbeat-timeout``), and the attempt is stopped
  after that setting, not a fixed 120 s.

Real ``ctl`` and trainer processes, real signals; waits poll with generous deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bi_helpers import SPEC, ctl, env, write_json

pytestmark = pytest.mark.slow  # real ctl train, kill, cancel

DEADLINE_S = 240.0


def spawn(home: Path, *args: str, extra_env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "train", *args, "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env(), **(extra_env or {})},
        start_new_session=True,
    )


def wait_for(cond, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ctl ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def status_json(home: Path, wid: str) -> dict:
    p = ctl(home, "status", wid, "--json")
    return json.loads(p.stdout) if p.stdout.strip() else {}


def test_status_after_a_kill_during_a_durable_wait_says_no_live_worker(tmp_path: Path) -> None:
    write_json(tmp_path / "s.json", {**SPEC, "eval_every": 3, "eval_interval_seconds": 3600})
    proc = spawn(tmp_path, "--spec", str(tmp_path / "s.json"), "--no-eval", "--quiet")
    try:
        waiting = wait_for(
            lambda: (s := status_json(tmp_path, "train/mini")).get("timers") and s, "the durable wait", proc
        )
        assert waiting["worker"]["live"] is True and waiting["worker"]["pid"] == proc.pid, waiting["worker"]
        alive = ctl(tmp_path, "status", "train/mini").stdout
        assert f"worker: live, pid {proc.pid}" in alive and "ETA: " in alive and "no live worker" not in alive, alive
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        dead = ctl(tmp_path, "status", "train/mini")
        assert dead.returncode == 0, dead.stderr
        assert (
            "worker: no live worker (no ctl train, eval, release or worker process is running it): run the same "
            "`ctl train`" in dead.stdout
        ), dead.stdout
        assert "  ETA: none (no live worker runs it)" in dead.stdout, dead.stdout
        assert "timer: fires at" in dead.stdout  # the wait is still recorded: the same command waits the rest
        js = status_json(tmp_path, "train/mini")
        assert js["worker"]["live"] is False and js["progress"]["eta_s"] is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_canceled_run_names_its_stop_checkpoint_as_the_last(tmp_path: Path) -> None:
    write_json(tmp_path / "s.json", {**SPEC, "steps": 20, "checkpoint_every": 10})
    proc = spawn(
        tmp_path,
        "--spec",
        str(tmp_path / "s.json"),
        "--no-eval",
        "--quiet",
        extra_env={"TINYLLM_FAULT": "trainer.hold@14"},
    )  # holds at step 14 until stopped
    try:
        metrics = tmp_path / "runs/mini/metrics.jsonl"
        wait_for(lambda: metrics.exists() and '"step": 14' in metrics.read_text(), "step 14", proc)
        assert ctl(tmp_path, "cancel", "train/mini").returncode == 0
        assert proc.wait(timeout=DEADLINE_S) == 130, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    latest = (tmp_path / "runs/mini/ckpt/LATEST").read_text().strip()
    assert latest == "step-000014"  # the cancel's stop checkpoint
    st = ctl(tmp_path, "status", "train/mini")
    assert st.returncode == 130 and "canceled" in st.stdout, st.stdout
    assert "  last checkpoint: runs/mini/ckpt/step-000014 (step 14)" in st.stdout, st.stdout
    assert status_json(tmp_path, "train/mini")["progress"]["last_checkpoint_step"] == 14


def _history(home: Path, wid: str) -> list[dict]:
    p = ctl(home, "history", wid, "--json")
    return json.loads(p.stdout)["events"] if p.returncode == 0 else []


def test_a_hung_evaluation_is_said_and_stopped_after_eval_heartbeat_timeout(tmp_path: Path) -> None:
    """The durable example trainer (examples/durable_train.py) with an eval_command that hangs silently: status
    says the worker waits for that evaluation with no progress for N s and when it is stopped; the attempt is
    stopped after --eval-heartbeat-timeout (recorded in the eval activity's options), then retried."""
    from bi_helpers import ROOT

    spec = json.loads((ROOT / "examples/specs/durable.json").read_text())
    spec.update(name="hang", steps=10, eval_every=5, checkpoint_every=5)
    spec["trainer"] = {
        "command": ["python", "examples/durable_train.py"],
        "cwd": str(ROOT),
        "eval_command": ["python", "-c", "import time; time.sleep(3600)"],
    }
    write_json(tmp_path / "hang.json", spec)
    proc = spawn(
        tmp_path, "--spec", str(tmp_path / "hang.json"), "--suite", "acc", "--eval-heartbeat-timeout", "20", "--quiet"
    )
    try:

        def stalled():
            w = status_json(tmp_path, "train/hang").get("worker") or {}
            return w.get("activity_id") == "eval-000005-acc" and (w.get("heartbeat_age_s") or 0) > 7 and w

        w = wait_for(stalled, "the evaluation to go silent", proc)
        assert w["live"] is True and w["heartbeat_timeout_s"] == pytest.approx(20)
        text = ctl(tmp_path, "status", "train/hang").stdout
        line = next((ln for ln in text.splitlines() if ln.startswith("  waiting for: ")), "")
        assert line.startswith("  waiting for: evaluation eval-000005-acc (attempt 1): no progress for "), text
        assert line.endswith(" s (stopped after 20 s)"), text

        def retried():
            return any(
                e["type"] == "activity_started"
                and e["attrs"]["activity_id"] == "eval-000005-acc"
                and e["attrs"]["attempt"] == 2
                for e in _history(tmp_path, "train/hang")
            )

        wait_for(retried, "the hung evaluation's attempt 1 to be stopped and retried", proc)
        events = _history(tmp_path, "train/hang")
        scheduled = next(
            e for e in events if e["type"] == "activity_scheduled" and e["attrs"]["activity_id"] == "eval-000005-acc"
        )
        assert scheduled["attrs"]["options"]["heartbeat_timeout_s"] == 20  # the setting, not a fixed 120 s
        failed = next(
            e
            for e in events
            if e["type"] in ("activity_failed", "activity_timed_out", "activity_retry")
            and e["attrs"].get("activity_id") == "eval-000005-acc"
        )
        assert "no progress line for" in json.dumps(failed["attrs"]) or "heartbeat" in json.dumps(failed["attrs"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_eval_heartbeat_timeout_is_operational(tmp_path: Path) -> None:
    """Another --eval-heartbeat-timeout continues the run (never 'started with a different request') and says so."""
    write_json(tmp_path / "s.json", SPEC)
    first = ctl(tmp_path, "train", "--spec", str(tmp_path / "s.json"), "--eval-max-items", "2", "--detach")
    assert first.returncode == 0, first.stderr
    again = ctl(
        tmp_path,
        "train",
        "--spec",
        str(tmp_path / "s.json"),
        "--eval-max-items",
        "2",
        "--detach",
        "--eval-heartbeat-timeout",
        "30",
    )
    assert again.returncode == 0, again.stderr
    assert "ctl: --eval-heartbeat-timeout 30 s from now on (the run had 120 s)" in again.stderr, again.stderr


def test_ctl_eval_stops_a_hung_evaluation_after_its_heartbeat_timeout(tmp_path: Path) -> None:
    """``ctl eval --heartbeat-timeout 3`` of an eval_command that hangs silently: each of the 3 attempts is
    stopped after 3 s without progress, then the evaluation fails (exit 1) naming the silence."""
    (tmp_path / "ck").mkdir()
    write_json(
        tmp_path / "s.json",
        {
            "name": "hang",
            "steps": 2,
            "trainer": {
                "command": ["python", "-c", "pass"],
                "eval_command": ["python", "-c", "import time; time.sleep(3600)"],
            },
        },
    )
    proc = ctl(
        tmp_path,
        "eval",
        "--spec",
        str(tmp_path / "s.json"),
        "--suite",
        "acc",
        "--subject",
        "a=ck",
        "--heartbeat-timeout",
        "3",
        timeout=150,
    )  # 120 s (the old fixed timeout) would not end in time
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "eval/a failed: Timeout: activity 'eval-acc' timed out (attempt 3)" in proc.stderr, proc.stderr[-3000:]
    events = _history(tmp_path, "eval/a")
    assert [e["attrs"]["attempt"] for e in events if e["type"] == "activity_started"] == [1, 2, 3]
    scheduled = next(e for e in events if e["type"] == "activity_scheduled")
    assert scheduled["attrs"]["options"]["heartbeat_timeout_s"] == 3
