"""``tinyllm train`` under a polite stop, with real processes and real signals (issue 39):

- ``DURABLE_STOP_SIGNAL=USR1`` is a stop like SIGTERM: the ``stopping`` line at the step the loop
  noticed, the stop checkpoint AT that step (not a multiple of checkpoint_every), its checkpoint line,
  the result line, exit 130; the rerun resumes from that checkpoint (0 steps lost);
- a ``DURABLE_STOP_SIGNAL`` that names no catchable signal: one line, exit 2, nothing written;
- more stop signals (SIGTERM again, SIGINT, the stop signal, a group SIGTERM) while the stop
  checkpoint is being written (held there by ``TINYLLM_FAULT=checkpoint.hold_write@S``) change
  nothing: the write finishes, the checkpoint verifies, exit 130, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tinyllm.checkpoint import verify_checkpoint
from tl_helpers import REPO

pytestmark = pytest.mark.slow  # real trainer processes (~5 s each on 2 loaded cores)

SPEC = {
    "name": "stop",
    "steps": 40,
    "seed": 3,
    "checkpoint_every": 10,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 2,
    "threads": 1,
    "log_every": 1000,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1},
}


def progress_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def start(home: Path, progress: Path, env: dict) -> subprocess.Popen:
    spec = home / "stop.json"
    spec.write_text(json.dumps(SPEC))
    argv = [
        sys.executable,
        "-m",
        "tinyllm.cli",
        "train",
        "--spec",
        str(spec),
        "--home",
        str(home),
        "--progress",
        str(progress),
    ]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=home,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        start_new_session=True,
    )


def wait_until(what, proc: subprocess.Popen, label: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while not what():
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited {proc.returncode} before {label}: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < end, f"no {label} within {deadline_s}s"
        time.sleep(0.02)


def held_at(progress: Path, step: int):
    """True once the trainer's liveness shows it reached ``step`` (trainer.hold keeps it there)."""

    def check() -> bool:
        return any(
            ln.get("step") == step and ln.get("event") in (None, "progress") for ln in progress_lines(progress)
        ) or any(ln.get("step", -1) >= step for ln in progress_lines(progress) if "checkpoint" in ln)

    return check


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_the_stop_signal_from_the_environment_checkpoints_the_step_it_is_at_and_the_rerun_resumes_there(home: Path):
    progress = home / "progress.jsonl"
    proc = start(home, progress, {"DURABLE_STOP_SIGNAL": "USR1", "TINYLLM_FAULT": "trainer.hold@13"})
    run_dir = home / "runs/stop"
    wait_until(
        lambda: (
            (run_dir / "ckpt/step-000010").is_dir()
            and any(ln.get("event") == "progress" and ln.get("step") == 13 for ln in progress_lines(progress))
        ),
        proc,
        "step 13",
        deadline_s=180,
    )
    os.kill(proc.pid, signal.SIGUSR1)
    code, out, err = finish(proc)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err
    lines = progress_lines(progress)
    stopping = [i for i, ln in enumerate(lines) if ln.get("event") == "stopping"]
    assert len(stopping) == 1, lines
    assert lines[stopping[0]]["step"] == 13 and lines[stopping[0]]["signal"] == "SIGUSR1"
    after = [ln for ln in lines[stopping[0] + 1 :] if "checkpoint" in ln and "event" not in ln]
    assert [ln["step"] for ln in after] == [13] and after[0]["checkpoint"] == "runs/stop/ckpt/step-000013"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] and result["steps"] == 13 and result["checkpoint"] == "runs/stop/ckpt/step-000013"
    verify_checkpoint(run_dir / "ckpt/step-000013")
    again = home / "again.jsonl"
    proc = start(home, again, {})
    code, out, err = finish(proc)
    assert code == 0, err[-2000:]
    resume = [ln for ln in progress_lines(again) if ln.get("event") == "resume"]
    assert resume and resume[0]["checkpoint"] == "runs/stop/ckpt/step-000013"  # 0 steps lost


@pytest.mark.parametrize("value", ["NOPE", "SIGKILL", "9"])
def test_a_bad_stop_signal_name_is_one_line_exit_2_nothing_written(home: Path, value: str):
    progress = home / "progress.jsonl"
    proc = start(home, progress, {"DURABLE_STOP_SIGNAL": value})
    code, out, err = finish(proc)
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "DURABLE_STOP_SIGNAL" in err and "Traceback" not in err, err
    assert out == "" and not progress.exists() and not (home / "runs").exists()


def test_more_stop_signals_during_the_stop_checkpoint_write_do_not_interrupt_it(home: Path):
    """The first SIGTERM at step 13 (held there); the stop checkpoint's write holds after its first file
    while a second and third SIGTERM, a SIGINT, the stop signal and a group SIGTERM arrive; then it finishes.
    Seen red with a handler that puts the default action back after the first signal (the classic
    "second Ctrl-C kills" pattern): the trainer died inside the write (-15) and left a torn temporary."""
    progress = home / "progress.jsonl"
    proc = start(
        home, progress, {"DURABLE_STOP_SIGNAL": "SIGUSR2", "TINYLLM_FAULT": "trainer.hold@13,checkpoint.hold_write@13"}
    )
    ckpt_root = home / "runs/stop/ckpt"
    wait_until(
        lambda: any(ln.get("event") == "progress" and ln.get("step") == 13 for ln in progress_lines(progress)),
        proc,
        "step 13",
        deadline_s=180,
    )
    os.kill(proc.pid, signal.SIGTERM)
    held = ckpt_root / "write-held"
    wait_until(held.exists, proc, "the stop checkpoint's write")
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        os.kill(proc.pid, sig)
        time.sleep(0.05)  # separate deliveries (not merged into one pending signal)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert proc.poll() is None, f"the trainer died in its checkpoint write: {proc.returncode}"
    held.unlink()
    code, out, err = finish(proc)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] and result["checkpoint"] == "runs/stop/ckpt/step-000013"
    verify_checkpoint(ckpt_root / "step-000013")
    assert (ckpt_root / "LATEST").read_text().strip() == "step-000013"
    assert not list(ckpt_root.glob(".tmp-*"))
    lines = progress_lines(progress)
    assert [ln["step"] for ln in lines if ln.get("event") == "stopping"] == [13]
