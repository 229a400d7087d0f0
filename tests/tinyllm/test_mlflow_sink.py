"""The MLflow sink (tinyllm/sinks/mlflow_sink.py) against the real mlflow package: a local SQLite tracking
store, and a real ``mlflow server`` on loopback that is killed mid-run and started again.

What is checked: one MLflow run per TrainRun (found again by its workflow id, never created anew);
after kills, resumes and a dead server, every metric's history has each step exactly once and equals
metrics.jsonl; a dead server costs one warning line, never the run or its bits; ``ctl show`` and
``ctl doctor`` say the sink fell behind; the next attempt catches up."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlflow_check import history_vs_jsonl
from tinyllm.sinks import mlflow_sink
from tinyllm.sinks.metrics import JsonlSink
from tl_helpers import SMALL_SPEC, last_json, run_tinyllm, start_tinyllm, wait_for_progress

# found, not imported: mlflow's import takes seconds, and the everyday lane collects this module
if importlib.util.find_spec("mlflow") is None:
    pytest.skip("the mlflow extra is not installed", allow_module_level=True)


def test_flatten_gives_dotted_params():
    assert mlflow_sink.flatten({"a": 1, "m": {"n": 2, "l": [1, 2]}, "s": "x", "z": None}) == {
        "a": "1",
        "m.n": "2",
        "m.l": "[1, 2]",
        "s": "x",
        "z": "null",
    }


def test_behind_says_how_far():
    assert mlflow_sink.behind(None) is None
    assert mlflow_sink.behind({"delivered_step": 5, "last_step": 5, "error": None}) is None
    assert "up to step 3 of 9" in mlflow_sink.behind({"delivered_step": 3, "last_step": 9, "error": None})
    assert "ConnectionError" in mlflow_sink.behind({"delivered_step": 3, "last_step": 3, "error": "ConnectionError: x"})


def _attempt(run_dir: Path, uri: str, resumed_step: int, steps: range) -> str:
    """One trainer attempt as tinyllm.sinks.metrics runs it: JSONL (cut back to the resume) and MLflow sinks."""
    err = io.StringIO()
    jsonl = JsonlSink(run_dir / "metrics.jsonl", resumed_step)
    sink = mlflow_sink.MlflowSink(
        SimpleNamespace(tracking_uri=uri, experiment="t", flush_timeout_s=600),
        run_dir=run_dir,
        home=run_dir.parent.parent,
        spec={"name": "r", "steps": 20},
        resumed_step=resumed_step,
        warn_stream=err,
    )
    for step in steps:
        frame = {"train/loss": 1.0 / step, "optim/lr": 0.001 * step}
        jsonl.write(step, frame)
        sink.write(step, frame)
    jsonl.close()
    sink.close()
    return err.getvalue()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_redone_steps_are_not_delivered_twice_and_a_dead_server_is_caught_up(tmp_path):
    """Frames only (no torch): attempt 1 delivers 1..10; attempt 2 resumes at 6 and redoes 7..10 (skipped,
    MLflow has them), then 11..12; attempt 3 reports 13..15 to a dead server (one warning, behind);
    attempt 4 resumes at 15 and catches 13..15 up from metrics.jsonl. Each step once, equal to the JSONL."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    run_dir = tmp_path / "home" / "runs" / "r"
    assert _attempt(run_dir, uri, -1, range(1, 11)) == ""
    assert _attempt(run_dir, uri, 6, range(7, 13)) == ""
    dead = f"http://127.0.0.1:{_closed_port()}"
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # the sink's own default waits a few seconds more
    try:
        state = json.loads(mlflow_sink.state_path(run_dir).read_text())
        warned = _attempt(run_dir, dead, 12, range(13, 16))
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert warned.count("\n") == 1 and "metrics sink 'mlflow' failed" in warned, warned
    behind = mlflow_sink.read_state(run_dir)
    assert behind["error"] and "fell behind" in mlflow_sink.behind(behind, 15)
    # the run was found again, not created anew: attempt 4 (back on the good store) continues it
    mlflow_sink.atomic_write(mlflow_sink.state_path(run_dir), json.dumps(state).encode())
    assert _attempt(run_dir, uri, 15, range(16, 18)) == ""
    got, want = history_vs_jsonl(uri, run_dir)
    assert got == want and sorted(got["train/loss"]) == list(range(1, 18))
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("t").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == state["run_id"]


def test_the_delivery_process_waits_for_a_torn_last_line(tmp_path):
    """metrics.jsonl read on from where the last read ended: a line still being written waits until whole."""
    from tinyllm.sinks.mlflow_delivery import Tail

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a"')
    tail = Tail(path)
    assert tail.frames(100) == ([(1, {"step": 1, "a": 1})], True)
    with path.open("a") as f:
        f.write(': 2}\n{"step": 3}\n')
    assert tail.frames(1) == ([(2, {"step": 2, "a": 2})], False)  # the read-ahead bound
    assert tail.frames(100) == ([(3, {"step": 3})], True)


TRAINER = """
import json, os, sys, time
from pathlib import Path
from types import SimpleNamespace
from tinyllm.sinks import mlflow_sink
from tinyllm.sinks.metrics import JsonlSink
run_dir, uri, n, hold = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
jsonl = JsonlSink(run_dir / "metrics.jsonl", -1)
sink = mlflow_sink.MlflowSink(SimpleNamespace(tracking_uri=uri, experiment="t", flush_timeout_s=600), run_dir=run_dir,
                              home=run_dir.parent.parent, spec={"name": "r", "steps": n}, resumed_step=-1)
if hold and os.fork() == 0:  # a forked worker (a DataLoader's): it holds the delivery process's stdin open
    time.sleep(600)
    os._exit(0)
for step in range(1, n + 1):  # a burst: all of it still undelivered when close() asks for the stop
    jsonl.write(step, {"train/loss": 1.0 / step})
    sink.write(step, {"train/loss": 1.0 / step})
print(json.dumps({"pid": os.getpid(), "child": sink.pid}), flush=True)
if hold:
    time.sleep(600)
jsonl.close()
sink.close()
print(json.dumps({"mlflow_imported": "mlflow" in sys.modules}), flush=True)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_frames_are_delivered_from_another_process_and_a_stop_delivers_every_pending_one(tmp_path):
    """A trainer (a process of its own, as tinyllm train) writes 350 frames in a burst and closes at once:
    every one reaches MLflow (several requests after the stop), each once; the state file names the
    delivering process, not the trainer; and the trainer never imported mlflow."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    run_dir = tmp_path / "home" / "runs" / "r"
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER, str(run_dir), uri, "350", "go"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    started, ended = (json.loads(x) for x in proc.stdout.splitlines())
    assert ended == {"mlflow_imported": False}
    state = mlflow_sink.read_state(run_dir)
    assert state["pid"] == started["child"] != started["pid"] == state["trainer_pid"]
    assert (state["delivered_step"], state["last_step"], state["error"]) == (350, 350, None)
    got, want = history_vs_jsonl(uri, run_dir)
    assert got == want and sorted(got["train/loss"]) == list(range(1, 351))


def test_a_sigkilled_trainer_leaves_no_delivery_process(tmp_path):
    """SIGKILL of the trainer (while a forked worker of it still holds the delivery process's stdin open,
    so stdin's end never comes): the kernel's parent-death signal ends the delivery process too."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    run_dir = tmp_path / "home" / "runs" / "r"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(run_dir), uri, "5", "hold"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        started = json.loads(proc.stdout.readline())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # delivering: past its start-up, mlflow imported, the run found
            state = mlflow_sink.read_state(run_dir)
            if state and state.get("pid") == started["child"] and state.get("delivered_step") == 5:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        else:
            raise AssertionError("the delivery process did not deliver")
        assert not _gone(started["child"])
        proc.send_signal(signal.SIGKILL)  # the trainer alone, not its group
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while not _gone(started["child"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(started["child"]), "the delivery process outlived its SIGKILLed trainer"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the forked worker (and anything left)
        proc.wait(timeout=60)


def _spec(home: Path, uri: str, **extra) -> Path:
    s = json.loads(SMALL_SPEC.read_text())
    s.update(extra)
    s["sinks"] = {"mlflow": {"tracking_uri": uri, "experiment": "small", "flush_timeout_s": 600}}  # a loaded CI
    path = home / "small-mlflow.json"
    path.write_text(json.dumps(s))
    return path


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_has_each_step_once_and_the_same_bits(home, tmp_path):
    """A real ``tinyllm train`` with the sink, SIGKILLed while held after its checkpoint at step 20
    (frames 21.. never reached MLflow or were queued), then resumed: MLflow's history equals
    metrics.jsonl, each step once; the final loss and digest equal a run without the sink."""
    plain = tmp_path / "plain"
    shutil.copytree(home, plain)
    base = run_tinyllm(plain, "train", "--spec", str(SMALL_SPEC))
    assert base.returncode == 0, base.stderr
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    spec = _spec(home, uri)
    progress = home / "progress-1.jsonl"
    proc = start_tinyllm(
        home, "train", "--spec", str(spec), "--progress", str(progress), env={"TINYLLM_FAULT": "trainer.hold@25"}
    )
    wait_for_progress(progress, 20, proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the sink has delivered something: the kill lands mid-delivery
        state = mlflow_sink.read_state(home / "runs" / "small")
        if state and (state.get("delivered_step") or 0) > 0:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    again = run_tinyllm(home, "train", "--spec", str(spec), timeout=300)
    assert again.returncode == 0, again.stderr
    result = last_json(again.stdout)
    assert result["resumed_from"] is not None
    assert (result["final_loss_hex"], result["digest"]) == (
        last_json(base.stdout)["final_loss_hex"],
        last_json(base.stdout)["digest"],
    )
    assert "mlflow" not in again.stderr, again.stderr  # no warning: nothing failed
    got, want = history_vs_jsonl(uri, home / "runs" / "small")
    assert got == want and sorted(got["train/loss"]) == list(range(1, 41))


def _server(tmp_path: Path, port: int) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'server.db'}",
        "--default-artifact-root",
        str(tmp_path / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 400  # a loaded 2-core machine took over three minutes once
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            assert proc.poll() is None, "mlflow server exited"
            time.sleep(0.5)
    raise AssertionError("mlflow server did not start")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.soak  # two `mlflow server` starts (~30 s; minutes on a loaded machine)
@pytest.mark.timeout(1200)
def test_a_killed_tracking_server_costs_a_warning_not_the_run(home, tmp_path):
    """A real ``mlflow server`` on loopback, SIGKILLed once the sink has delivered: the run completes
    (exit 0, the same bits as without a sink) with one warning line; ``ctl show`` and ``ctl doctor``
    say the sink fell behind; with the server back, the next attempt (the same command: it resumes at
    the end) catches up, and the history equals metrics.jsonl, each step once."""
    plain = tmp_path / "plain"
    shutil.copytree(home, plain)
    base = run_tinyllm(plain, "train", "--spec", str(SMALL_SPEC), "--progress", str(plain / "p.jsonl"))
    assert base.returncode == 0, base.stderr
    port = _closed_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(tmp_path, port)
    try:
        spec = _spec(home, uri)
        progress = home / "progress-1.jsonl"
        proc = start_tinyllm(
            home,
            "train",
            "--spec",
            str(spec),
            "--progress",
            str(progress),
            env={"TINYLLM_FAULT": "trainer.hold@10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
        )
        wait_for_progress(progress, 10, proc, deadline_s=300)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            state = mlflow_sink.read_state(home / "runs" / "small")
            if state and (state.get("delivered_step") or 0) >= 1:
                break
            time.sleep(0.1)
        _stop(server)
        proc.send_signal(signal.SIGTERM)  # ends the hold: a checkpoint, exit 130 (the contract's stop)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 130, stderr
        # at most one line (none when every frame reached the server before it died: nothing failed yet)
        assert stderr.count("metrics sink 'mlflow'") <= 1, stderr
        finish = run_tinyllm(home, "train", "--spec", str(spec), timeout=300)  # no server: warns, finishes
        assert finish.returncode == 0, finish.stderr
        assert finish.stderr.count("metrics sink 'mlflow'") == 1, finish.stderr
        assert (last_json(finish.stdout)["final_loss_hex"], last_json(finish.stdout)["digest"]) == (
            last_json(base.stdout)["final_loss_hex"],
            last_json(base.stdout)["digest"],
        )
        line = mlflow_sink.behind(mlflow_sink.read_state(home / "runs" / "small"), 40)
        assert line and "fell behind" in line
        doctor = subprocess.run(
            [sys.executable, "-m", "ctl.cli", "doctor", "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "mlflow sink fell behind" in doctor.stdout, doctor.stdout + doctor.stderr
        server = _server(tmp_path, port)
        again = run_tinyllm(home, "train", "--spec", str(spec), timeout=300)
        assert again.returncode == 0 and "mlflow" not in again.stderr, again.stderr
        got, want = history_vs_jsonl(uri, home / "runs" / "small")
        assert got == want and sorted(got["train/loss"]) == list(range(1, 41))
        assert mlflow_sink.behind(mlflow_sink.read_state(home / "runs" / "small"), 40) is None
    finally:
        if server.poll() is None:
            _stop(server)
