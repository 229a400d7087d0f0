"""ctl worker's log (ctl/workerlog.py) hands every workflow end it sees to ``on_end`` (ctl worker: the
MLflow run's status, app/runsinks.py), also of a workflow another process worked on, and a failing
``on_end`` is one log line, never the worker's failure. No process, no database: events fed directly."""

from __future__ import annotations

from types import SimpleNamespace

from ctl.workerlog import WorkerLog
from engine import Event


def test_every_workflow_end_goes_to_on_end_and_a_failure_is_a_line() -> None:
    ended, lines = [], []
    engine = SimpleNamespace(owner={"host": "h", "pid": 1}, status=lambda wid: SimpleNamespace(created_at=0.0))
    log = WorkerLog(engine, lines.append, on_end=lambda wid, state: ended.append((wid, state)))
    log._line(
        "train/a", Event(1, "activity_started", 1.0, {"activity_id": "train-000004", "attempt": 1, "worker": "h:1"})
    )
    log._line("train/a", Event(2, "workflow_completed", 2.0, {"result": {}}))
    log._line("train/b/2", Event(9, "workflow_failed", 3.0, {"error": {"type": "X", "message": "m"}}))  # not touched
    log._line("train/c", Event(4, "workflow_canceled", 4.0, {}))
    log._line("train/c", Event(5, "activity_completed", 5.0, {"activity_id": "x", "attempt": 1}))
    assert ended == [("train/a", "completed"), ("train/b/2", "failed"), ("train/c", "canceled")]
    assert any("workflow train/a completed" in x for x in lines)

    def boom(wid, state):
        raise RuntimeError("store down")

    log = WorkerLog(engine, lines.append, on_end=boom)
    log._line("train/a", Event(2, "workflow_completed", 2.0, {}))
    assert lines[-1] == "(after train/a ended: RuntimeError: store down)"
