"""Issue 27's smaller rough edges, on recorded events and files (no process): durations count worked time, a
failure's stderr line is not repeated, status takes a newer LATEST and gives no ETA without a live worker, the
resume line names a checkpoint that verifies, and the interrupt handler kills what ctl started.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
from app.runview import run_view
from contracts.resume import expected_resume
from ctl import display, interrupt, runstatus


T0 = 1_800_000_000.0


def _ev(seq: int, type: str, t: float, **attrs) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, type=type, time=T0 + t, attrs=attrs)


SPEC = {"name": "w", "steps": 20, "eval_every": 0, "checkpoint_every": 5}


def test_a_segment_counts_its_attempts_time_not_the_time_the_run_sat_stopped() -> None:
    events = [
        _ev(1, "workflow_started", 0.0, input={"spec": SPEC, "eval_suites": []}),
        _ev(2, "activity_scheduled", 0.0, activity_id="train-000020", name="train"),
        _ev(3, "activity_started", 0.0, activity_id="train-000020", attempt=1),
        _ev(
            4,
            "activity_heartbeat",
            10.0,
            activity_id="train-000020",
            attempt=1,
            details={"checkpoint": "runs/w/ckpt/step-000005", "step": 5},
        ),
        # killed at ~12 s; nobody ran it for an hour; the next ctl records the dead lease, then attempt 2
        _ev(5, "activity_timed_out", 3610.0, activity_id="train-000020", attempt=1),
        _ev(6, "activity_started", 3610.0, activity_id="train-000020", attempt=2),
        _ev(
            7,
            "activity_completed",
            3640.0,
            activity_id="train-000020",
            attempt=2,
            result={"checkpoint": "runs/w/ckpt/step-000020", "final_loss": 1.0, "final_loss_hex": "0x1p+0"},
        ),
        _ev(8, "workflow_completed", 3640.0, result={}),
    ]
    view = run_view("train/w", events, "completed")
    [seg] = view.segments
    assert seg.duration_s == 10.0 + 30.0  # attempt 1 to its last event, attempt 2 in full
    assert view.worked_s == 40.0 and view.stopped_s == 3600.0
    assert view.phase.kind == "ended"  # from its last event: the display prints no status line after the end
    line = display.LiveDisplay.__new__(display.LiveDisplay)
    line.workflow_id, line.live, line._suppress = "train/w", False, set()
    assert line._event_line(view, events[-1]) == "[green]train/w completed[/] in 0:40 (1:00:40 wall)"


def test_the_stderr_line_is_not_repeated_after_the_same_message() -> None:
    msg = "tinyllm: disk full writing runs/x/ckpt/.tmp-1; free some space and run the same command again"
    error = {
        "type": "ActivityError",
        "message": "train-000100 failed",
        "cause": {"type": "DiskFull", "message": msg},
        "details": {"stderr_tail": "noise\n" + msg + "\n"},
    }
    assert app.error_line(error).count("disk full writing") == 1
    same = {
        "type": "ActivityError",
        "message": f"train-000100 failed: {msg}",
        "cause": {"type": "DiskFull", "message": msg},
        "details": {"stderr_tail": msg},
    }
    assert app.error_line(same) == f"ActivityError: train-000100 failed: {msg}"
    other = {"type": "X", "message": "m", "details": {"stderr_tail": "the real reason\n"}}
    assert app.error_line(other) == "X: m | stderr: the real reason"


def _checkpoint(root: Path, step: int, *, corrupt: bool = False) -> str:
    d = root / f"step-{step:06d}"
    d.mkdir(parents=True)
    data = b"weights %d" % step
    (d / "model.pt").write_bytes(data + (b"!" if corrupt else b""))
    body = {
        "format": 1,
        "step": step,
        "resumable": True,
        "files": {"model.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
    }
    body["manifest_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    (d / "manifest.json").write_text(json.dumps(body))
    return d.name


def test_the_resume_line_names_a_checkpoint_that_verifies(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "w" / "ckpt"
    _checkpoint(root, 5)
    _checkpoint(root, 10)
    _checkpoint(root, 15, corrupt=True)  # the trainer refuses it and resumes from 10

    def expected(ckpt: str) -> str | None:  # a redelivered attempt (2) whose last heartbeat named ckpt
        return expected_resume(tmp_path, "w", 20, 2, {"checkpoint": ckpt})

    assert expected("runs/w/ckpt/step-000015") == "runs/w/ckpt/step-000010"
    assert expected("runs/w/ckpt/step-000010") == "runs/w/ckpt/step-000010"
    (root / "step-000010" / "model.pt").write_bytes(b"torn")
    assert expected("runs/w/ckpt/step-000015") == "runs/w/ckpt/step-000005"


def test_status_takes_a_newer_latest_and_no_eta_without_a_live_worker(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "w" / "ckpt"
    _checkpoint(root, 10)
    _checkpoint(root, 20)
    (root / "LATEST").write_text("step-000020\n")
    progress = {"last_checkpoint": "runs/w/ckpt/step-000010", "last_checkpoint_step": 10}
    runstatus._newer_latest(progress, tmp_path, "w")
    assert progress == {"last_checkpoint": "runs/w/ckpt/step-000020", "last_checkpoint_step": 20}
    (root / "LATEST").write_text("step-000005\n")  # older than the history's (and absent): the history's stands
    runstatus._newer_latest(progress, tmp_path, "w")
    assert progress["last_checkpoint_step"] == 20
    st = SimpleNamespace(state="running")
    p = {
        "step": 12,
        "total_steps": 20,
        "last_loss": None,
        "segments_done": 0,
        "segments": 1,
        "phase": "training",
        "last_checkpoint": None,
        "last_eval": None,
        "eta_s": None,
    }
    dead = {"live": False, "activity_id": "train-000020", "attempt": 1, "reason": "lease owner process is gone"}
    lines = runstatus.status_lines(st, {"worker": dead, "progress": {**p, "eta_s": 30.0}}, time.time())
    assert "  ETA: none (no live worker runs it)" in lines


@pytest.mark.slow  # starts processes
def test_kill_descendants_leaves_nothing_of_what_this_process_started() -> None:
    # a child that starts a grandchild in its own session (as the runner starts a trainer), both sleeping
    code = (
        "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)'], "
        "start_new_session=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(interrupt.descendants(os.getpid())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(interrupt.descendants(os.getpid())) == 2
    assert interrupt.kill_descendants(os.getpid()) == []
    assert interrupt.descendants(os.getpid()) == []
    child.wait()


def test_no_status_line_is_printed_after_the_final_line(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    events = [
        _ev(1, "workflow_started", 0.0, input={"spec": SPEC, "eval_suites": []}),
        _ev(2, "activity_scheduled", 0.0, activity_id="train-000020", name="train"),
        _ev(3, "activity_started", 0.0, activity_id="train-000020", attempt=1),
        _ev(
            4,
            "activity_completed",
            5.0,
            activity_id="train-000020",
            attempt=1,
            result={"checkpoint": "runs/w/ckpt/step-000020", "final_loss": 1.0, "final_loss_hex": "0x1p+0"},
        ),
        _ev(5, "workflow_completed", 5.0, result={}),
    ]
    out = io.StringIO()
    engine = SimpleNamespace(history=lambda wid, after_seq=0: events, store=None)  # a backend without a local store
    d = display.LiveDisplay(tmp_path, engine, "train/w", console=Console(file=out, force_terminal=False))
    d.plain_every_s = 0.0  # a status line at every poll
    d._poll()
    lines = out.getvalue().strip().splitlines()
    assert lines[-1].startswith("train/w completed in"), lines
    assert not [ln for ln in lines if "| step" in ln], lines
