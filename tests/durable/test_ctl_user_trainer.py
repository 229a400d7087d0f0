"""``ctl train`` of a spec naming its own trainer (the durable example, evaluated by its eval_command
in the reference run, and again by ``ctl eval --spec``): killed with SIGKILL and
run again, it ends bitwise equal to an uninterrupted run; canceled, it stops after a checkpoint
(exit 130) and the same command finishes it, bitwise equal too. Real ctl, engine, runner, trainer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, example_spec, lines, wait_for

from tinyllm import runlock

pytestmark = pytest.mark.slow  # real ctl train/eval of the example trainer

NAME = "usr"
SPEC = example_spec(
    name=NAME, steps=60, checkpoint_every=5, eval_every=0, config={**example_spec()["config"], "step_sleep_s": 0.05}
)


def ctl(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"ctl {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
    return p


def spawn(home: Path, spec_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec_path), "--json", "--home", str(home)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def checkpointed(home: Path) -> int | None:
    """A checkpoint step between 10 and the end, from the attempt's progress file."""
    steps = [
        ln["step"]
        for ln in lines(home / f"runs/{NAME}/activity/train-000060/progress-1.jsonl")
        if ln.get("event") == "checkpoint" and 10 <= ln["step"] < 60
    ]
    return max(steps) if steps else None


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> tuple[Path, dict]:
    """An uninterrupted run, in two segments each evaluated by the trainer's eval_command (suite acc):
    segments and evaluations do not change the training, so its final loss and digest are the reference."""
    home = tmp_path_factory.mktemp("ref")
    (home / "spec.json").write_text(json.dumps({**SPEC, "eval_every": 30}))
    out = json.loads(ctl(home, "train", "--spec", str(home / "spec.json"), "--suite", "acc", "--json").stdout)
    assert out["state"] == "completed"
    evals = [s["evals"]["suites"][0] for s in out["result"]["segments"]]
    assert [(e["suite"], e["run"]) for e in evals] == [("acc", f"{NAME}-000030"), ("acc", f"{NAME}-000060")]
    assert all(0.0 <= e["summary"]["metrics"][f"{NAME}-{e['run'][-6:]}"]["spirals/acc"] <= 1.0 for e in evals)
    assert (home / evals[1]["summary_path"]).is_file()
    return home, out["result"]


@pytest.fixture(scope="module")
def reference(reference_run) -> dict:
    return reference_run[1]


def test_ctl_eval_runs_the_trainers_eval_command_on_any_checkpoint(reference_run) -> None:
    """EvalSuite on its own (`ctl eval --spec`): the same figures as TrainRun's evaluation of that checkpoint."""
    home, res = reference_run
    out = json.loads(
        ctl(
            home,
            "eval",
            "--spec",
            str(home / "spec.json"),
            "--suite",
            "acc",
            "--subject",
            f"final={res['checkpoint']}",
            "--name",
            "again",
            "--json",
        ).stdout
    )
    assert out["state"] == "completed" and out["workflow_id"] == "eval/again"
    suite = out["result"]["suites"][0]
    assert (suite["suite"], suite["run"]) == ("acc", "again")
    in_train = res["segments"][-1]["evals"]["suites"][0]["summary"]["metrics"][f"{NAME}-000060"]
    assert suite["summary"]["metrics"]["final"] == in_train
    assert (home / "evals/acc/again/summary.json").is_file()


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "tiny", "steps": 2}, "names no trainer of its own"),
        ({**SPEC, "trainer": {"command": SPEC["trainer"]["command"]}}, "the spec's trainer has no eval_command"),
    ],
)
def test_ctl_eval_refuses_a_spec_without_an_eval_command(tmp_path: Path, spec: dict, message: str) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "ckpt").mkdir()
    p = ctl(
        tmp_path, "eval", "--spec", str(tmp_path / "spec.json"), "--suite", "acc", "--subject", "a=ckpt", check=False
    )
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "engine.db").exists()  # nothing started


def test_killed_then_run_again_ends_bitwise_equal(tmp_path: Path, reference: dict) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    proc = spawn(tmp_path, tmp_path / "spec.json")
    wait_for(lambda: checkpointed(tmp_path), "a checkpoint", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    wait_for(lambda: not runlock.is_locked(tmp_path / "runs" / NAME), "the trainer to die with its worker")
    out = json.loads(ctl(tmp_path, "train", "--spec", str(tmp_path / "spec.json"), "--json").stdout)
    assert out["state"] == "completed"
    res = out["result"]
    assert (res["final_loss_hex"], res["digest"]) == (reference["final_loss_hex"], reference["digest"])
    assert res["segments"][0]["train"]["resumed_from"] is not None  # it resumed, it did not start over


def test_canceled_then_the_same_command_finishes_it(tmp_path: Path, reference: dict) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    proc = spawn(tmp_path, tmp_path / "spec.json")
    wait_for(lambda: checkpointed(tmp_path), "a checkpoint", proc)
    ctl(tmp_path, "cancel", f"train/{NAME}")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert json.loads(stdout)["state"] == "canceled"
    latest = (tmp_path / f"runs/{NAME}/ckpt/LATEST").read_text().strip()
    assert (tmp_path / f"runs/{NAME}/ckpt" / latest / "manifest.json").is_file()
    last = lines(tmp_path / f"runs/{NAME}/activity/train-000060/progress-1.jsonl")[-1]
    assert last["event"] == "checkpoint" and f"step-{last['step']:06d}" == latest  # SIGTERM: checkpoint, exit 130
    out = json.loads(ctl(tmp_path, "train", "--spec", str(tmp_path / "spec.json"), "--json").stdout)
    assert out["state"] == "completed" and out["workflow_id"] == f"train/{NAME}/2"
    assert (out["result"]["final_loss_hex"], out["result"]["digest"]) == (
        reference["final_loss_hex"],
        reference["digest"],
    )
