"""HF ``DurableTrainer`` and Lightning ``DurableCallback`` under a polite stop, with the real libraries, real
processes and real signals (issue 39):

- a SIGTERM to the whole process group (Slurm, a terminal's Ctrl-C, ``kill -- -PGID``) with 2 DataLoader
  worker processes (HF ``dataloader_num_workers=2``, Lightning ``num_workers=2``) checkpoints like one
  without workers: the ``stopping`` line at the step, the checkpoint AT it (not a multiple of
  checkpoint_every), exit 130, no traceback; the rerun ends with the uninterrupted run's bits. CI's lane
  stops each once; the soak lane three times in one run. Seen red before the workers' guard
  (``stopping.quiet_workers``): ``RuntimeError: DataLoader worker (pid ...) is killed by signal:
  Terminated``, exit 1;
- HF: a SIGTERM during HF's own evaluation loop (held after its first batch, TINYLLM_FAULT=validation.hold@S)
  abandons it: no figure in the log history, the checkpoint at that step carries the evaluation pending,
  exit 130; the rerun evaluates that step once, from the same RNG, and ends with the uninterrupted run's
  bits and evaluation figures;
- Lightning: a SIGTERM during Lightning's own validation loop (``val_check_interval``, held after its first
  batch), or at the end of a step it validates after, abandons it: no ``val_loss`` in its logger's ``metrics.csv``, the checkpoint at that step carries the
  validation pending, exit 130; the rerun validates that step once (Lightning's restart from a step's end
  would skip it), from the same RNG, and ends with the uninterrupted run's bits and ``val_loss`` rows (values
  and logger steps);
- Lightning: a checkpoint written at the end of a step it validates after (every 4 steps here) is before
  that validation, and Lightning's own restart from it skips it: after a SIGKILL in that validation, or at a
  segment's end (spec ``steps`` 8 of ``CTL_RUN_STEPS`` 12, as ``ctl train`` runs it), the rerun ran neither
  the validation nor its RNG draws (seen: step 8's ``val_loss`` missing and other final bits). Now the
  checkpoint marks it pending and the run ends with the uninterrupted run's bits and ``val_loss`` rows;
- ``DURABLE_STOP_SIGNAL=USR1`` stops them like SIGTERM, and more signals while the stop checkpoint is
  being written (SIGTERM twice, SIGINT, USR1, a group SIGTERM) never interrupt it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_frameworks import ENV, ROOT, spec_of, write
from tinyllm import checkpoint as ckpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # ~1 min per framework on 2 loaded cores

SCRIPTS = {"hf": "examples/hf_trainer.py", "lightning": "examples/lightning_train.py"}
DEADLINE_S = 300


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def run_to_end(example: str, home: Path, spec: dict) -> dict:
    done = subprocess.run(
        [sys.executable, SCRIPTS[example], "--spec", str(write(home, spec)), "--home", str(home)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def stopped_at(
    example: str,
    home: Path,
    spec: dict,
    step: int,
    *,
    n: int,
    sig: int = signal.SIGTERM,
    group: bool = True,
    fault: str = "trainer.hold",
    env: dict | None = None,
    more: bool = False,
) -> dict:
    """One attempt held at ``step`` and stopped there by ``sig`` (to the group, or the main process); checks
    the stop (stopping line, checkpoint at the step, exit 130); returns the stopping line and the result."""
    import time

    progress = home / f"progress-{n}.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            SCRIPTS[example],
            "--spec",
            str(write(home, spec)),
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
        env={
            **ENV,
            **(env or {}),
            "TINYLLM_FAULT": f"{fault}@{step}" + (f",checkpoint.hold_write@{step}" if more else ""),
        },
    )
    deadline = time.monotonic() + DEADLINE_S
    frames = home / f"runs/{spec['name']}/metrics.jsonl"  # the step's frame (written before its evaluation)
    seen = lambda: any(ln.get("step") == step for ln in lines(progress) + lines(frames))  # noqa: E731
    while not seen():
        assert proc.poll() is None, f"exit {proc.returncode} before step {step}: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {step}"
        time.sleep(0.05)
    if fault == "validation.hold":
        time.sleep(1.0)  # into the evaluation (it holds there); a signal landing earlier stops at the step too
    (os.killpg if group else os.kill)(proc.pid, sig)
    if more:
        more_signals_during_the_write(proc, home / f"runs/{spec['name']}/ckpt", sig)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "killed by signal" not in err, err[-3000:]
    got = lines(progress)
    i = [k for k, ln in enumerate(got) if ln.get("event") == "stopping"]
    assert len(i) == 1 and got[i[0]]["step"] == step, got
    assert [ln["step"] for ln in got[i[0] :] if ln.get("event") == "checkpoint"] == [step]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] and result["steps"] == step
    assert result["checkpoint"] == f"runs/{spec['name']}/ckpt/step-{step:06d}"
    return {"stopping": got[i[0]], "result": result}


def with_workers(example: str) -> dict:
    spec = spec_of(example)
    return {**spec, "config": {**spec["config"], "workers": 2}}


@pytest.mark.parametrize(
    "example,steps",
    [
        ("hf", (7,)),
        pytest.param("hf", (3, 9, 14), marks=pytest.mark.soak, id="hf-three-times"),
        ("lightning", (7,)),
        pytest.param("lightning", (7, 16, 23), marks=pytest.mark.soak, id="lightning-three-times"),
    ],
)
def test_a_group_sigterm_with_two_loader_workers_checkpoints_the_step_and_the_run_ends_exact(
    tmp_path: Path, example: str, steps: tuple[int, ...]
) -> None:
    spec = with_workers(example)
    (tmp_path / "ref").mkdir()
    (tmp_path / "home").mkdir()
    ref = run_to_end(example, tmp_path / "ref", spec)
    resumed = [
        stopped_at(example, tmp_path / "home", spec, s, n=n)["result"]["resumed_from"] for n, s in enumerate(steps)
    ]
    name = spec["name"]
    assert resumed == [None] + [f"runs/{name}/ckpt/step-{s:06d}" for s in steps[:-1]]
    end = run_to_end(example, tmp_path / "home", spec)
    assert end["resumed_from"] == f"runs/{name}/ckpt/step-{steps[-1]:06d}"
    assert (end["final_loss_hex"], end["digest"]) == (ref["final_loss_hex"], ref["digest"])


def hf_log(home: Path, name: str, step: int) -> list[dict]:
    comps, _ = ckpt.load_checkpoint(home / f"runs/{name}/ckpt/step-{step:06d}")
    return json.loads(comps["training_state"]["files"]["trainer_state.json"])["log_history"], comps


def evals(log: list[dict]) -> dict[int, str]:
    return {e["step"]: float(e["eval_loss"]).hex() for e in log if "eval_loss" in e}


def test_hf_a_sigterm_during_its_evaluation_abandons_it_and_the_rerun_evaluates_that_step_once(tmp_path: Path):
    base = spec_of("hf", steps=12)
    spec = {**base, "config": {**base["config"], "eval_steps": 3, "schedule_steps": 12}}
    (tmp_path / "ref").mkdir()
    (tmp_path / "home").mkdir()
    ref = run_to_end("hf", tmp_path / "ref", spec)
    seen = stopped_at("hf", tmp_path / "home", spec, 6, n=0, group=False, fault="validation.hold")
    assert seen["stopping"]["signal"] == "SIGTERM"
    log, comps = hf_log(tmp_path / "home", spec["name"], 6)
    assert sorted(evals(log)) == [3]  # nothing of step 6's abandoned evaluation (seen red without the abandon: [3, 6])
    assert comps["training_state"]["eval_pending"] == 6
    end = run_to_end("hf", tmp_path / "home", spec)
    assert end["resumed_from"] == f"runs/{spec['name']}/ckpt/step-000006"
    log, _ = hf_log(tmp_path / "home", spec["name"], 12)
    ref_log, _ = hf_log(tmp_path / "ref", spec["name"], 12)
    assert sorted(evals(log)) == sorted(evals(ref_log)) == [3, 6, 9, 12]  # step 6 once, nothing skipped
    assert evals(log) == evals(ref_log)
    assert (end["final_loss_hex"], end["digest"]) == (ref["final_loss_hex"], ref["digest"])


def val_rows(home: Path, name: str) -> list[tuple[int, str]]:
    """The ``(logger step, val_loss bits)`` rows of every attempt's ``metrics.csv`` (Lightning's CSVLogger)."""
    import csv

    rows = []
    for path in sorted((home / f"runs/{name}/lightning_logs").glob("version_*/metrics.csv")):
        with path.open() as f:
            rows += [(int(r["step"]), float(r["val_loss"]).hex()) for r in csv.DictReader(f) if r.get("val_loss")]
    return rows


@pytest.mark.parametrize("fault", ["validation.hold", "trainer.hold"])
def test_lightning_a_sigterm_during_its_validation_abandons_it_and_the_rerun_validates_that_step_once(
    tmp_path: Path, fault: str
):
    """``validation.hold``: the signal lands in the validation after step 8; ``trainer.hold``: at step 8's end,
    before it (the stop checkpoint is written first, marked pending; the validation is not run)."""
    base = spec_of("lightning", steps=12)
    spec = {**base, "config": {**base["config"], "val_every": 4, "schedule_steps": 12}}
    (tmp_path / "ref").mkdir()
    (tmp_path / "home").mkdir()
    ref = run_to_end("lightning", tmp_path / "ref", spec)
    ref_rows = val_rows(tmp_path / "ref", spec["name"])
    assert [step for step, _ in ref_rows] == [3, 7, 11]  # after steps 4, 8, 12 (the logger counts from 0)
    seen = stopped_at("lightning", tmp_path / "home", spec, 8, n=0, group=False, fault=fault)
    assert seen["stopping"]["signal"] == "SIGTERM"
    assert val_rows(tmp_path / "home", spec["name"]) == ref_rows[:1]  # nothing of step 8's abandoned validation
    comps, _ = ckpt.load_checkpoint(tmp_path / f"home/runs/{spec['name']}/ckpt/step-000008")
    assert comps["training_state"]["eval_pending"] == 8
    end = run_to_end("lightning", tmp_path / "home", spec)
    assert end["resumed_from"] == f"runs/{spec['name']}/ckpt/step-000008"
    assert val_rows(tmp_path / "home", spec["name"]) == ref_rows  # step 8's once, nothing skipped, same bits
    assert (end["final_loss_hex"], end["digest"]) == (ref["final_loss_hex"], ref["digest"])


def test_lightning_a_validation_after_a_checkpoint_at_its_step_survives_a_kill_and_a_segment_end(tmp_path: Path):
    import time

    base = spec_of("lightning", steps=12, checkpoint_every=4)
    spec = {**base, "config": {**base["config"], "val_every": 4, "schedule_steps": 12}}
    name = spec["name"]
    for folder in ("ref", "killed", "segments"):
        (tmp_path / folder).mkdir()
    ref = run_to_end("lightning", tmp_path / "ref", spec)
    ref_rows = val_rows(tmp_path / "ref", name)
    assert [step for step, _ in ref_rows] == [3, 7, 11]
    home = tmp_path / "killed"  # SIGKILLed in step 8's validation (held after its first batch), after step 8's save
    proc = subprocess.Popen(
        [sys.executable, SCRIPTS["lightning"], "--spec", str(write(home, spec)), "--home", str(home)],
        cwd=ROOT,
        env={**ENV, "TINYLLM_FAULT": "validation.hold@8"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + DEADLINE_S
    while not (home / f"runs/{name}/ckpt/step-000008/manifest.json").exists():  # (written whole, then renamed)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint at step 8"
        time.sleep(0.05)
    time.sleep(1.0)  # into the validation (it holds there)
    proc.kill()
    proc.communicate(timeout=DEADLINE_S)
    end = run_to_end("lightning", home, spec)
    assert end["resumed_from"] == f"runs/{name}/ckpt/step-000008"
    assert val_rows(home, name) == ref_rows  # (seen red: [3, 11], other bits)
    assert (end["final_loss_hex"], end["digest"]) == (ref["final_loss_hex"], ref["digest"])
    home = tmp_path / "segments"
    segment = subprocess.run(
        [sys.executable, SCRIPTS["lightning"], "--spec", str(write(home, {**spec, "steps": 8})), "--home", str(home)],
        cwd=ROOT,
        env={**ENV, "CTL_RUN_STEPS": "12"},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert segment.returncode == 0, segment.stderr[-3000:]
    assert val_rows(home, name) == ref_rows[:1]  # step 8's is the next segment's
    done = subprocess.run(
        [sys.executable, SCRIPTS["lightning"], "--spec", str(write(home, spec)), "--home", str(home)],
        cwd=ROOT,
        env={**ENV, "CTL_RUN_STEPS": "12"},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    end = json.loads(done.stdout.strip().splitlines()[-1])
    assert val_rows(home, name) == ref_rows
    assert (end["final_loss_hex"], end["digest"]) == (ref["final_loss_hex"], ref["digest"])


@pytest.mark.parametrize("example", ["hf", "lightning"])
def test_the_stop_signal_from_the_environment_stops_the_framework_trainer_at_the_step(tmp_path: Path, example: str):
    seen = stopped_at(
        example,
        tmp_path,
        spec_of(example),
        5,
        n=0,
        sig=signal.SIGUSR1,
        group=False,
        env={"DURABLE_STOP_SIGNAL": "USR1"},
        more=True,
    )
    assert seen["stopping"]["signal"] == "SIGUSR1"
