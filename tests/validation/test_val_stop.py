"""A stop signal during in-loop validation, with the real ``tinyllm train`` and a real SIGTERM (issue 39):
the evaluation is abandoned between two batches (``TINYLLM_FAULT=validation.hold@4`` holds it after its
first batch until the signal lands), nothing of it is recorded (no val/* figure, not even the step's
frame, in metrics.jsonl), the stop checkpoint is at that step with the validation pending in its
journal, exit 130; the rerun evaluates step 4 once, before update 5, and ends with the uninterrupted
run's bits and figures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from val_helpers import LM, frames, journal, spec_dict, tinyllm_cli, val_frames, write_spec

pytestmark = pytest.mark.slow  # three real trainer processes (~15 s on 2 loaded cores)


def test_sigterm_during_validation_abandons_it_checkpoints_the_step_and_the_rerun_runs_it_once(home):
    v = {**LM, "every_steps": 2}
    base = tinyllm_cli(home, spec_dict(v, name="base"))
    assert base.returncode == 0, base.stderr
    spec = spec_dict(v)
    progress = home / "progress.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tinyllm.cli",
            "train",
            "--spec",
            str(write_spec(home, spec)),
            "--home",
            str(home),
            "--progress",
            str(progress),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TINYLLM_FAULT": "validation.hold@4"},
    )
    deadline = time.monotonic() + 120
    while not any(f.get("step") == 3 for f in frames(home)):  # step 3's frame: step 4's validation is next
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.5)  # into the evaluation (it holds there until the signal); landing earlier stops at 4 as well
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] and result["steps"] == 4 and result["checkpoint"] == "runs/v/ckpt/step-000004"
    assert journal(home, 4)["phase"] == "pending_evaluation"
    assert [f["step"] for f in frames(home)] == [1, 2, 3] and sorted(val_frames(home)) == [2]  # nothing of step 4
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    stop = [i for i, ln in enumerate(lines) if ln.get("event") == "stopping"]
    assert len(stop) == 1 and lines[stop[0]]["step"] == 4 and lines[stop[0]]["signal"] == "SIGTERM"
    assert [ln["step"] for ln in lines[stop[0] :] if "checkpoint" in ln and "event" not in ln] == [4]
    again = tinyllm_cli(home, spec)
    assert again.returncode == 0, again.stderr
    r = json.loads(again.stdout.strip().splitlines()[-1])
    assert r["resumed_from"] == "runs/v/ckpt/step-000004"
    assert [f["step"] for f in frames(home)] == [1, 2, 3, 4, 5, 6] and sorted(val_frames(home)) == [2, 4, 6]
    b = json.loads(base.stdout.strip().splitlines()[-1])
    assert (r["final_loss_hex"], r["digest"]) == (b["final_loss_hex"], b["digest"])
    assert {s: f["val/loss"].hex() for s, f in val_frames(home).items()} == {
        s: f["val/loss"].hex() for s, f in val_frames(home, "base").items()
    }
    assert journal(home, 6)["phase"] == "completed"
