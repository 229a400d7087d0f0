"""The trainer contract's rules: a trainer that breaks one gets a clear error naming the rule.

Unit checks of workflows/trainer_command.py, and the real path: ``ctl train`` of specs whose
trainer is a small stdlib-only script that breaks one rule each (no torch, so these are quick).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import NonRetryableError
from workflows.trainer_command import check_progress, check_train_result, invocation

# A trainer that follows the contract except where its config's "break" says otherwise.
BAD_TRAINER = r"""
import argparse, json, os, sys
p = argparse.ArgumentParser()
for a in ("--spec", "--home", "--progress", "--resume"):
    p.add_argument(a)
args = p.parse_args()
spec = json.load(open(args.spec))
brk = spec["config"]["break"]
ckpt_root = os.path.join(args.home, "runs", spec["name"], "ckpt")
step_dir = os.path.join(ckpt_root, "step-%06d" % spec["steps"])
if brk != "checkpoint":
    os.makedirs(step_dir, exist_ok=True)
    open(os.path.join(step_dir, "manifest.json"), "w").write("{}")
    open(os.path.join(ckpt_root, "LATEST"), "w").write("step-%06d\n" % spec["steps"])
with open(args.progress, "a") as f:
    f.write("loss is going down\n" if brk == "progress" else json.dumps({"step": spec["steps"]}) + "\n")
if brk == "result":
    print("done!")
    sys.exit(0)
loss = 0.5
print(json.dumps({"name": spec["name"], "steps": spec["steps"], "checkpoint": "runs/%s/ckpt/step-%06d" % (spec["name"], spec["steps"]),
                  "final_loss": loss, "final_loss_hex": loss.hex(), "digest": "d", "resumed_from": None, "canceled": False}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule, message",
    [
        (
            "result",
            "trainer broke the contract (result line): it exited 0, but its last stdout line is not a JSON object",
        ),
        ("progress", "trainer broke the contract (progress lines): line 1 of progress-1.jsonl is not JSON"),
        (
            "checkpoint",
            "trainer broke the contract (checkpoint layout): the result's checkpoint runs/bad-checkpoint/ckpt/step-000002 is not there",
        ),
    ],
)
def test_ctl_train_names_the_rule_a_trainer_broke(tmp_path: Path, rule: str, message: str) -> None:
    (tmp_path / "bad_trainer.py").write_text(BAD_TRAINER)
    spec = {
        "name": f"bad-{rule}",
        "steps": 2,
        "trainer": {"command": ["python", "bad_trainer.py"]},
        "config": {"break": rule},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    p = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "train", "--spec", "spec.json", "--home", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert message in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def result(home: Path, **changes) -> dict:
    ckpt = home / "runs/r/ckpt/step-000002"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "manifest.json").write_text("{}")
    (home / "runs/r/ckpt/LATEST").write_text("step-000002\n")
    out = {
        "name": "r",
        "steps": 2,
        "checkpoint": "runs/r/ckpt/step-000002",
        "final_loss": 0.25,
        "final_loss_hex": (0.25).hex(),
        "digest": "d",
    }
    return {**out, **changes}


def rule_of(fn, *args, **kwargs) -> str:
    with pytest.raises(NonRetryableError) as e:
        fn(*args, **kwargs)
    assert e.value.type == "ContractViolation"
    return e.value.details["rule"]


def test_result_line_rules(tmp_path: Path) -> None:
    assert check_train_result(result(tmp_path), home=tmp_path, name="r")["steps"] == 2
    assert rule_of(check_train_result, None, home=tmp_path, name="r") == "result line"
    assert (
        rule_of(check_train_result, result(tmp_path, final_loss_hex="0x1p-1"), home=tmp_path, name="r") == "result line"
    )
    assert rule_of(check_train_result, result(tmp_path, digest=None), home=tmp_path, name="r") == "result line"
    assert rule_of(check_train_result, result(tmp_path, name="other"), home=tmp_path, name="r") == "result line"
    assert (
        rule_of(check_train_result, result(tmp_path, checkpoint="runs/r/ckpt/step-000009"), home=tmp_path, name="r")
        == "checkpoint layout"
    )
    (tmp_path / "runs/r/ckpt/LATEST").unlink()
    good = {k: v for k, v in result(tmp_path).items()}
    (tmp_path / "runs/r/ckpt/LATEST").write_text("step-000001\n")
    assert rule_of(check_train_result, good, home=tmp_path, name="r") == "LATEST"


def test_progress_line_rules(tmp_path: Path) -> None:
    p = tmp_path / "progress-1.jsonl"
    p.write_text('{"step": 1, "checkpoint": null}\n')
    check_progress(p, home=tmp_path)
    p.write_text('{"event": "starting"}\n{"step": 1}\n')  # a liveness line may omit the step
    check_progress(p, home=tmp_path)
    p.write_text('{"step": "one"}\n')
    assert rule_of(check_progress, p, home=tmp_path) == "progress lines"
    p.write_text('{"loss": 1.0}\n')
    assert rule_of(check_progress, p, home=tmp_path) == "progress lines"
    p.write_text('{"step": 1, "checkpoint": "runs/r/ckpt/step-000001"}\n')
    assert rule_of(check_progress, p, home=tmp_path) == "progress lines"


def test_invocation_of_a_spec_trainer(tmp_path: Path) -> None:
    spec = {"trainer": {"command": ["python", "train.py", "--fast"], "cwd": "sub", "env": {"A": "1"}}}
    (tmp_path / "sub").mkdir()
    how = invocation(spec, "train", home=tmp_path, python="/py", env={"B": "2"}, default=["tinyllm"])
    assert how.custom and how.argv == ["/py", "train.py", "--fast"] and how.cwd == str(tmp_path / "sub")
    assert how.env == {"B": "2", "A": "1"}
    seg = invocation({**spec, "steps": 20}, "train", home=tmp_path, python="/py", env={}, default=[], run_steps=60)
    assert seg.env == {"A": "1", "CTL_RUN_STEPS": "60"}  # a segment's trainer learns the run's full length
    assert invocation({**spec, "steps": 20}, "train", home=tmp_path, python="/py", env={}, default=[]).env == {
        "A": "1",
        "CTL_RUN_STEPS": "20",
    }
    assert invocation({}, "train", home=tmp_path, python="/py", env=None, default=["tinyllm"]).argv == ["tinyllm"]
    with pytest.raises(NonRetryableError):
        invocation(spec, "eval", home=tmp_path, python="/py", env=None, default=["tinyllm"])  # no eval_command
