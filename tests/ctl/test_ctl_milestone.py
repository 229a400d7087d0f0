"""MS-durable end to end with real processes: ``ctl train`` killed with SIGKILL in the middle
of its second segment, run again, ends with the final loss and model digest of an
uninterrupted run (another home), each checkpoint evaluated exactly once, and only the
steps since the last checkpoint redone. A ``ctl cancel`` during a segment ends the run
canceled (exit 130) with its checkpoints in place; the same command later finishes it,
without evaluating again what the canceled workflow evaluated.

Nothing is faked: ctl, the engine, the subprocess runner and tinyllm (torch) all run.
Waits poll files with a generous deadline; nothing sleeps and hopes.
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

from tinyllm import runlock

pytestmark = pytest.mark.slow  # real ctl train runs, killed and canceled (~25 s each)

SPEC = {
    "name": "mini",
    "steps": 24,
    "seed": 5,
    "eval_every": 12,
    "eval_interval_seconds": 0,
    "checkpoint_every": 3,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 3,
    "lr_decay_steps": 24,
    "threads": 1,
    "log_every": 6,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
}
DEADLINE_S = 120


def ctl(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"ctl {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
    return p


def train_args(spec_path: Path, evals: bool = True) -> list[str]:
    """The ctl train command line; evaluations (the default suite, ppl, on 4 windows) only where
    the test counts them."""
    return ["train", "--spec", str(spec_path)] + (["--eval-max-items", "4"] if evals else ["--no-eval"])


def spawn_train(home: Path, spec_path: Path, evals: bool = True, hold_at: int | None = None) -> subprocess.Popen:
    """``hold_at``: the trainer holds at that step until stopped (TINYLLM_FAULT=trainer.hold, tinyllm/faults.py), so
    a kill or cancel after a checkpoint of the segment lands inside it however fast the machine."""
    env = {**os.environ, **({"TINYLLM_FAULT": f"trainer.hold@{hold_at}"} if hold_at is not None else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", *train_args(spec_path, evals), "--json", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(cond, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ctl ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)  # a poll interval, not a wait for the outcome
    raise AssertionError(f"timed out waiting for {what}")


def checkpoint_in_segment_2(home: Path) -> int | None:
    """The step of a checkpoint the second segment's first attempt wrote (progress file), if any."""
    progress = home / "runs/mini/activity/train-000024/progress-1.jsonl"
    try:
        lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return None
    steps = [x["step"] for x in lines if "checkpoint" in x and "event" not in x and 12 < x["step"] < 24]
    return max(steps) if steps else None


def history(home: Path, wid: str) -> list[dict]:
    return json.loads(ctl(home, "history", wid, "--json").stdout)["events"]


def completed_ids(home: Path, *wids: str) -> list[str]:
    """Activity ids completed in the given workflows (`ctl history --json`), sorted, repeats kept."""
    return sorted(
        e["attrs"]["activity_id"] for w in wids for e in history(home, w) if e["type"] == "activity_completed"
    )


def make_home(tmp_path_factory, label: str) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp(label)
    spec_path = home / "mini.json"
    spec_path.write_text(json.dumps(SPEC))
    return home, spec_path


def trainer_gone(home: Path) -> bool:
    """True once no trainer holds the run's lock (the killed ctl's trainer died with it)."""
    return not runlock.is_locked(home / "runs/mini")


class Reference:
    """An uninterrupted run in its own home, started at once and read when first needed
    (it runs alongside the kill test, and without evaluations, to keep this module's time down;
    evaluations do not change the training)."""

    def __init__(self, home: Path, spec_path: Path):
        self.proc = spawn_train(home, spec_path, evals=False)
        self._result: dict | None = None

    def result(self) -> dict:
        if self._result is None:
            stdout, stderr = self.proc.communicate(timeout=DEADLINE_S * 2)
            assert self.proc.returncode == 0, stderr[-2000:]
            out = json.loads(stdout)
            assert out["state"] == "completed"
            self._result = out["result"]
        return self._result


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = Reference(*make_home(tmp_path_factory, "ref"))
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.wait()


def test_kill_in_second_segment_resumes_bitwise(tmp_path_factory, reference: Reference) -> None:
    home, spec_path = make_home(tmp_path_factory, "kill")
    proc = spawn_train(home, spec_path, hold_at=18)
    killed_after = wait_for(lambda: checkpoint_in_segment_2(home), "a checkpoint in segment 2", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    wait_for(lambda: trainer_gone(home), "the orphaned trainer to die")
    latest_at_kill = (home / "runs/mini/ckpt/LATEST").read_text().strip()

    again = ctl(home, *train_args(spec_path), "--json")  # the same command
    out = json.loads(again.stdout)
    assert out["state"] == "completed" and out["workflow_id"] == "train/mini"
    res = out["result"]
    reference = reference.result()
    assert res["final_loss_hex"] == reference["final_loss_hex"]
    assert res["digest"] == reference["digest"]
    assert [s["train"]["digest"] for s in res["segments"]] == [s["train"]["digest"] for s in reference["segments"]]

    events = history(home, "train/mini")
    completed = [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_completed"]
    assert sorted(a for a in completed if a.startswith("eval-")) == ["eval-000012-ppl", "eval-000024-ppl"]
    assert completed.count("train-000012") == 1 and completed.count("train-000024") == 1
    starts = [(e["attrs"]["activity_id"], e["attrs"]["attempt"]) for e in events if e["type"] == "activity_started"]
    assert ("train-000024", 2) in starts and ("train-000012", 2) not in starts and ("eval-000012-ppl", 2) not in starts
    # only the steps since the last checkpoint were redone: attempt 2 resumed from it
    assert int(latest_at_kill.split("-")[1]) >= killed_after > 12
    assert res["segments"][1]["train"]["resumed_from"] == f"runs/mini/ckpt/{latest_at_kill}"

    # a finished run: the same command prints its result and trains nothing
    third = json.loads(ctl(home, *train_args(spec_path), "--json").stdout)
    assert third["result"] == res and len(history(home, "train/mini")) == len(events)

    # ctl eval of the final checkpoint: an EvalSuite workflow writing the suite's files
    ev = json.loads(
        ctl(
            home,
            "eval",
            "--suite",
            "ppl",
            "--subject",
            "final=runs/mini/ckpt/step-000024",
            "--max-items",
            "2",
            "--name",
            "check",
            "--json",
        ).stdout
    )
    assert ev["state"] == "completed" and ev["workflow_id"] == "eval/check"
    assert [s["suite"] for s in ev["result"]["suites"]] == ["ppl"]
    assert (home / ev["result"]["suites"][0]["summary_path"]).is_file()


def test_cancel_during_a_segment_then_same_command_finishes(tmp_path_factory, reference: Reference) -> None:
    """Canceled during segment 2 (after eval-000012-ppl): the same command continues as
    train/mini/2, which trains only what is missing and evaluates only step 24: across the two
    workflows each segment and each evaluation completed exactly once."""
    home, spec_path = make_home(tmp_path_factory, "cancel")
    proc = spawn_train(home, spec_path, hold_at=18)
    wait_for(lambda: checkpoint_in_segment_2(home), "a checkpoint in segment 2", proc)
    ctl(home, "cancel", "train/mini")
    stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, stderr[-2000:]
    out = json.loads(stdout)
    assert out["state"] == "canceled" and out["error"]["type"] == "Canceled"
    ckpts = home / "runs/mini/ckpt"
    latest = (ckpts / "LATEST").read_text().strip()
    assert (ckpts / "step-000012").is_dir() and (ckpts / latest).is_dir()
    kept = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-"))
    st = ctl(home, "status", "train/mini", "--json", check=False)
    assert st.returncode == 130 and json.loads(st.stdout)["state"] == "canceled"
    scheduled = [e["attrs"]["activity_id"] for e in history(home, "train/mini") if e["type"] == "activity_scheduled"]
    # nothing after the canceled segment
    assert scheduled == ["corpus-default", "train-000012", "eval-000012-ppl", "train-000024"]

    again = json.loads(ctl(home, *train_args(spec_path), "--json").stdout)
    assert again["state"] == "completed" and again["workflow_id"] == "train/mini/2"
    res, ref = again["result"], reference.result()
    assert res["final_loss_hex"] == ref["final_loss_hex"] and res["digest"] == ref["digest"]
    assert [(s["until"], s["train"]["final_loss_hex"], s["train"]["digest"]) for s in res["segments"]] == [
        (s["until"], s["train"]["final_loss_hex"], s["train"]["digest"]) for s in ref["segments"]
    ]
    # every segment listed with its evaluation, as an uninterrupted run lists them
    assert [[(e["suite"], e["run"]) for e in s["evals"]["suites"]] for s in res["segments"]] == [
        [("ppl", "mini-000012")],
        [("ppl", "mini-000024")],
    ]
    assert completed_ids(home, "train/mini/1", "train/mini/2") == [
        "corpus-default",
        "corpus-default",
        "eval-000012-ppl",
        "eval-000024-ppl",
        "train-000012",
        "train-000024",
    ]
    scheduled_2 = [
        e["attrs"]["activity_id"] for e in history(home, "train/mini/2") if e["type"] == "activity_scheduled"
    ]
    assert scheduled_2 == ["corpus-default", "train-000024", "eval-000024-ppl"]  # held: canceled mid-segment
    assert set(kept) <= {p.name for p in ckpts.iterdir()}  # nothing deleted
