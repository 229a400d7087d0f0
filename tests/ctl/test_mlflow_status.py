"""The MLflow run's status follows the TrainRun's workflow (ctl/runsinks.py, tinyllm/sinks/mlflow_sink.py
``set_run_status``), against the real mlflow package and a local SQLite tracking store.

Checked: completed -> FINISHED, failed -> FAILED, canceled -> KILLED; a continuation that trains sets it
back to RUNNING, an attempt that resumes at its segment's end and trains nothing leaves it; a status the
sink's state already records is not set again (the store is not contacted); a dead store costs one
warning line. End to end: a ``ctl train`` SIGKILLed in its last segment leaves the run RUNNING (never
FINISHED while a segment remains), the same command finishes it FINISHED, and a kill between the
workflow's end and the status (simulated) is caught up by the next ``ctl train``, which trains nothing."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import runsinks
from tinyllm.sinks import mlflow_sink
from tinyllm.fsio import atomic_write
from tinyllm.sinks.metrics import JsonlSink

# found, not imported: mlflow's import takes seconds, and the everyday lane collects this module
if importlib.util.find_spec("mlflow") is None:
    pytest.skip("the mlflow extra is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow  # mlflow's import and its store's migrations: seconds; the end-to-end test: real ctl runs

ROOT = Path(__file__).resolve().parents[2]


def _status(uri: str, run_dir: Path) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_run(mlflow_sink.read_state(run_dir)["run_id"]).info.status


def _attempt(run_dir: Path, uri: str, resumed_step: int, steps: int) -> str:
    """One trainer attempt's MLflow sink (frames only, no torch): resumed at ``resumed_step``, trains to ``steps``
    (its frames written to metrics.jsonl first, as the trainer's reporter does: the delivery process reads them there)."""
    err = io.StringIO()
    jsonl = JsonlSink(run_dir / "metrics.jsonl", resumed_step)
    sink = mlflow_sink.MlflowSink(
        SimpleNamespace(tracking_uri=uri, experiment="t", flush_timeout_s=600),
        run_dir=run_dir,
        home=run_dir.parent.parent,
        spec={"name": "r", "steps": steps},
        resumed_step=resumed_step,
        warn_stream=err,
    )
    for step in range(resumed_step + 1, steps + 1):
        jsonl.write(step, {"train/loss": 1.0 / max(step, 1)})
        sink.write(step, {"train/loss": 1.0 / max(step, 1)})
    jsonl.close()
    sink.close()
    return err.getvalue()


def test_the_status_follows_the_workflow(tmp_path: Path, capsys) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    home = tmp_path / "home"
    run_dir = home / "runs" / "r"
    runsinks.workflow_state(home, "train/r", "completed")  # no sink on the run: nothing, no file
    assert not mlflow_sink.state_path(run_dir).exists()
    assert _attempt(run_dir, uri, -1, 10) == ""
    assert _status(uri, run_dir) == "RUNNING" and mlflow_sink.read_state(run_dir)["run_status"] == "RUNNING"
    runsinks.workflow_state(home, "train/r", "running")  # never closed: nothing to reopen
    runsinks.workflow_state(home, "train/r", "completed")
    assert _status(uri, run_dir) == "FINISHED" and mlflow_sink.read_state(run_dir)["run_status"] == "FINISHED"
    # recorded already: the store is not contacted (a broken URI in the state would warn if it were)
    good = mlflow_sink.read_state(run_dir)
    atomic_write(mlflow_sink.state_path(run_dir), json.dumps({**good, "tracking_uri": "bogus://x"}).encode())
    runsinks.workflow_state(home, "train/r", "completed")
    assert capsys.readouterr().err == ""
    atomic_write(mlflow_sink.state_path(run_dir), json.dumps(good).encode())
    # a failed workflow, its continuation /2 starting (ctl reopens), failing again
    runsinks.workflow_state(home, "train/r", "failed")
    assert _status(uri, run_dir) == "FAILED"
    runsinks.workflow_state(home, "train/r/2", "running")
    assert _status(uri, run_dir) == "RUNNING"
    runsinks.workflow_state(home, "train/r/2", "failed")
    # a trainer resumed at its segment's end trains nothing: the status stays; one that trains reopens it
    assert _attempt(run_dir, uri, 10, 10) == ""
    assert _status(uri, run_dir) == "FAILED" and mlflow_sink.read_state(run_dir)["run_status"] == "FAILED"
    assert _attempt(run_dir, uri, 10, 20) == ""
    assert _status(uri, run_dir) == "RUNNING" and mlflow_sink.read_state(run_dir)["run_status"] == "RUNNING"
    runsinks.workflow_state(home, "train/r/2", "canceled")
    assert _status(uri, run_dir) == "KILLED"
    assert capsys.readouterr().err == ""
    # a dead store: one warning line, the recorded status unchanged (the next ctl train tries again)
    atomic_write(
        mlflow_sink.state_path(run_dir),
        json.dumps(
            {**mlflow_sink.read_state(run_dir), "tracking_uri": f"sqlite:///{tmp_path}/no/such/dir/x.db"}
        ).encode(),
    )
    runsinks.workflow_state(home, "train/r/3", "completed")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ctl: warning: mlflow: run ") and "not set to FINISHED" in err, err
    assert mlflow_sink.read_state(run_dir)["run_status"] == "KILLED" and _status(uri, run_dir) == "KILLED"


SPEC = {
    "name": "mini",
    "steps": 8,
    "seed": 5,
    "eval_every": 4,
    "eval_interval_seconds": 0.2,
    "checkpoint_every": 2,
    "batch_size": 2,
    "threads": 1,
    "log_every": 2,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}


def _env(**extra: str) -> dict:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "MLFLOW_")) and k not in ("CTL_HOME", "TRACEPARENT")
    }
    e.update(PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""), OMP_NUM_THREADS="1", **extra)
    return e


@pytest.mark.soak  # (~40 s: CI's lane keeps the real store's transitions above, the soak lane this end to end)
def test_killed_in_its_last_segment_running_then_finished_by_the_rerun(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home = tmp_path / "home"
    home.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    (home / "mini.json").write_text(
        json.dumps({**SPEC, "sinks": {"mlflow": {"tracking_uri": uri, "flush_timeout_s": 600}}})
    )
    args = [
        sys.executable,
        "-m",
        "ctl.cli",
        "train",
        "--spec",
        str(home / "mini.json"),
        "--no-eval",
        "--json",
        "--home",
        str(home),
    ]
    run_dir = home / "runs" / "mini"
    # segment 2's trainer holds at step 7, after its checkpoint at 6, until killed (tinyllm/faults.py)
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(TINYLLM_FAULT="trainer.hold@7"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = mlflow_sink.read_state(run_dir)
            if (
                (run_dir / "ckpt" / "step-000006").is_dir()
                and state
                and state.get("run_id")
                and (state.get("delivered_step") or 0) >= 5
            ):
                break
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.1)  # a poll interval, not a wait for the outcome
        else:
            raise AssertionError("the last segment's trainer did not reach its hold")
        assert _status(uri, run_dir) == "RUNNING"  # segment 1 completed, segment 2 in flight: not FINISHED
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # ctl and its trainer
        proc.wait(timeout=60)
    assert _status(uri, run_dir) == "RUNNING"
    again = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "completed", again.stderr[-3000:]
    assert _status(uri, run_dir) == "FINISHED" and "warning" not in again.stderr, again.stderr[-3000:]
    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("mini").experiment_id])
    assert len(runs) == 1
    shown = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "show", "train/mini", "--home", str(home)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert f"mlflow: run {runs[0].info.run_id} " in shown.stdout and "; status FINISHED" in shown.stdout, shown.stdout
    # killed between the workflow's end and the status (as if): the next ctl train, which trains nothing, sets it
    MlflowClient(uri).update_run(runs[0].info.run_id, status="RUNNING")
    atomic_write(
        mlflow_sink.state_path(run_dir),
        json.dumps({**mlflow_sink.read_state(run_dir), "run_status": "RUNNING"}).encode(),
    )
    third = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert _status(uri, run_dir) == "FINISHED"
