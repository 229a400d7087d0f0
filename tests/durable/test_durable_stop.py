"""The helper (tinyllm.durable, examples/durable_train.py) under a polite stop, with real processes and
real signals (issue 39):

- a SIGTERM to the whole process group (Slurm, a terminal's Ctrl-C, ``kill -- -PGID``) with 2 DataLoader
  worker processes checkpoints like one without workers: the workers ignore it, the main process writes
  the ``stopping`` line, the checkpoint AT that step, the result line, exit 130 -- three times in one run,
  and the run ends with the bits of an uninterrupted run without workers. Seen red without the workers'
  guard (``stopping.quiet_workers``): ``RuntimeError: DataLoader worker (pid ...) is killed by signal:
  Terminated``, exit 1, no checkpoint;
- ``DURABLE_STOP_SIGNAL=USR1`` is a stop like SIGTERM, and more signals while its checkpoint is being
  written (SIGTERM twice, SIGINT, USR1, a group SIGTERM; the write held open by
  ``checkpoint.hold_write``) change nothing; a bad name is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EXAMPLES, ROOT, example_spec, lines, wait_for, write_spec

pytestmark = pytest.mark.slow  # 6 example processes, each imports torch (~40 s on 2 loaded cores)


def start(spec_path: Path, home: Path, progress: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "durable_train.py"),
            "--spec",
            str(spec_path),
            "--home",
            str(home),
            "--progress",
            str(progress),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def held(progress: Path, step: int):
    return lambda: any(ln.get("step") == step and ln.get("event") in ("step", "checkpoint") for ln in lines(progress))


def more_signals_during_the_write(proc: subprocess.Popen, ckpt_root: Path, stop_signal: int) -> None:
    """The stop checkpoint's write is held open (checkpoint.hold_write): SIGTERM twice, SIGINT, the stop
    signal and a group SIGTERM arrive meanwhile; the trainer must still be alive, then the write goes on."""
    import time

    held = ckpt_root / "write-held"
    deadline = time.monotonic() + 300
    while not held.exists():
        assert proc.poll() is None, f"exit {proc.returncode} before the stop checkpoint's write"
        assert time.monotonic() < deadline, "no stop checkpoint write"
        time.sleep(0.02)
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, stop_signal):
        os.kill(proc.pid, sig)
        time.sleep(0.05)  # separate deliveries
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert proc.poll() is None, f"the trainer died in its checkpoint write: {proc.returncode}"
    held.unlink()


def stopped_at(home: Path, spec: dict, step: int, sig: int, group: bool, env: dict, n: int, more: bool = False) -> dict:
    """One attempt held at ``step`` (trainer.hold) and stopped there by ``sig``; checks the stop; its result."""
    progress = home / f"progress-{n}.jsonl"
    fault = f"trainer.hold@{step}" + (f",checkpoint.hold_write@{step}" if more else "")
    proc = start(write_spec(home, spec), home, progress, {"TINYLLM_FAULT": fault, **env})
    wait_for(held(progress, step), f"step {step}", proc)
    (os.killpg if group else os.kill)(proc.pid, sig)
    if more:
        more_signals_during_the_write(proc, home / f"runs/{spec['name']}/ckpt", sig)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "killed by signal" not in err, err[-3000:]
    got = lines(progress)
    i = [k for k, ln in enumerate(got) if ln.get("event") == "stopping"]
    assert len(i) == 1 and got[i[0]]["step"] == step, got
    assert [ln["step"] for ln in got[i[0] :] if ln.get("event") == "checkpoint"] == [step]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] and result["steps"] == step
    assert result["checkpoint"] == f"runs/{spec['name']}/ckpt/step-{step:06d}"
    return {"signal": got[i[0]]["signal"], "resumed_from": result["resumed_from"]}


def test_a_group_sigterm_with_two_loader_workers_checkpoints_the_step_three_times_and_ends_exact(tmp_path: Path):
    ref_home, home = tmp_path / "ref", tmp_path / "home"
    ref_home.mkdir()
    home.mkdir()
    spec = example_spec(eval_every=0)  # checkpoint_every 5, 40 steps
    ref = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "durable_train.py"),
            "--spec",
            str(write_spec(ref_home, spec)),
            "--home",
            str(ref_home),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    workers = {**spec, "config": {**spec["config"], "workers": 2}}
    seen = [stopped_at(home, workers, step, signal.SIGTERM, True, {}, n) for n, step in enumerate((7, 16, 23))]
    assert [s["signal"] for s in seen] == ["SIGTERM"] * 3
    assert [s["resumed_from"] for s in seen] == [None, "runs/spirals/ckpt/step-000007", "runs/spirals/ckpt/step-000016"]
    last = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "durable_train.py"),
            "--spec",
            str(write_spec(home, workers)),
            "--home",
            str(home),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert last.returncode == 0, last.stderr[-2000:]
    a, b = json.loads(ref.stdout.strip().splitlines()[-1]), json.loads(last.stdout.strip().splitlines()[-1])
    assert b["resumed_from"] == "runs/spirals/ckpt/step-000023"
    assert (a["final_loss_hex"], a["digest"]) == (b["final_loss_hex"], b["digest"])


def test_the_stop_signal_from_the_environment_stops_the_helper_and_a_bad_name_is_refused(tmp_path: Path):
    spec = example_spec(eval_every=0)
    seen = stopped_at(tmp_path, spec, 8, signal.SIGUSR1, False, {"DURABLE_STOP_SIGNAL": "USR1"}, 0, more=True)
    assert seen["signal"] == "SIGUSR1"
    progress = tmp_path / "bad.jsonl"
    proc = start(
        write_spec(tmp_path, {**spec, "name": "other"}), tmp_path, progress, {"DURABLE_STOP_SIGNAL": "SIGNOPE"}
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "" and err.count("\n") == 1 and "DURABLE_STOP_SIGNAL" in err, err
    assert not progress.exists() and not (tmp_path / "runs/other").exists()
