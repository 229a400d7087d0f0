"""What ctl tells a run's external sinks about its workflow: the MLflow run's status.

A segment's trainer does not know whether it is the run's last (its evaluations follow, early stopping
or a failure may end the run), so the MLflow run's status follows the TrainRun's *workflow*: once it
ended, ``ctl train`` (and ``ctl worker``, for the runs it finishes) sets it (completed -> FINISHED, failed
-> FAILED, canceled -> KILLED; tinyllm/sinks/mlflow_sink.py ``set_run_status``). Every later ``ctl train`` of the
run sets it again from the recorded end, so a kill between the workflow's end and the status is caught
up; a continuation (``/2``) sets it back to RUNNING when it starts. Nothing is imported and nothing
contacted when the run has no MLflow sink or the sink's state already records the status.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from contracts.layout import RunHome
from tinyllm.sinks import mlflow_sink


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_dir_of(home: Path, workflow_id: str) -> Path | None:
    """``runs/<name>`` of a TrainRun's workflow (``train/<name>``, ``train/<name>/2``), else None."""
    parts = workflow_id.split("/")
    if len(parts) < 2 or parts[0] != "train" or not parts[1]:
        return None
    return RunHome(home).run(parts[1]).path


def workflow_state(home: Path, workflow_id: str, state: str, warn: Callable[[str], None] = _stderr) -> None:
    """The workflow ``workflow_id`` is now ``state``: tell the run's MLflow run (one warning line to ``warn``,
    stderr by default, on failure)."""
    run_dir = run_dir_of(home, workflow_id)
    if run_dir is None:
        return
    why = mlflow_sink.set_run_status(run_dir, state)
    if why:
        warn(f"ctl: warning: {why}")
