"""Starting a run over (issue 40 item 9): ``ctl train --spec FILE --restart``. A different spec under the same
name is refused with a pointer to it; the restart keeps every earlier workflow's history under its id, moves
``runs/<name>`` (and the run's evaluation outputs) to ``runs/<name>.restart-<n>`` (nothing deleted, bytes
unchanged), says so in one line and trains from scratch. It refuses a run a live worker runs (nothing
changed) and ends a dead one itself; a continuation after a restart reuses only work done since it. Real
``ctl train`` processes, a trainer held at a step (TINYLLM_FAULT=trainer.hold), a real SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bi_helpers import ctl, env, one_line_error, write_json

pytestmark = pytest.mark.slow

SPEC = {
    "name": "mini",
    "steps": 6,
    "eval_every": 3,
    "checkpoint_every": 3,
    "batch_size": 2,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}
DEADLINE_S = 240.0


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "ckpt" in p.parts
    }


def _train(home: Path, spec: str, *args: str, hold: int | None = None) -> subprocess.Popen:
    e = {**env(), **({"TINYLLM_FAULT": f"trainer.hold@{hold}"} if hold else {})}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "train",
            "--spec",
            str(home / spec),
            "--no-eval",
            "--quiet",
            "--json",
            *args,
            "--home",
            str(home),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=e,
    )


def _held(home: Path, proc: subprocess.Popen, gen: int, step: int) -> None:
    log = home / f"runs/mini/activity/train-000006/logs/g{gen}-a1/stderr.log"
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if log.is_file() and f"step      {step}/6" in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"no step {step} in {log}")


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)["result"], err


def _segment_digests(home: Path, wid: str) -> dict[str, str]:
    events = json.loads(ctl(home, "history", wid, "--json").stdout)["events"]
    return {
        e["attrs"]["activity_id"]: e["attrs"]["result"]["digest"]
        for e in events
        if e["type"] == "activity_completed" and e["attrs"]["activity_id"].startswith("train-")
    }


def test_restart_keeps_the_old_run_aside_and_trains_the_corrected_spec_from_scratch(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    write_json(home / "a.json", SPEC)
    write_json(home / "b.json", {**SPEC, "lr": 0.01})  # the corrected spec
    write_json(home / "c.json", {**SPEC, "seed": 7})
    first = ctl(home, "train", "--spec", str(home / "a.json"), "--eval-max-items", "2", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    old = json.loads(first.stdout)["result"]
    before = _files(home / "runs/mini")
    one_line_error(
        ctl(home, "train", "--spec", str(home / "b.json"), "--eval-max-items", "2"),
        2,
        "started with a different request (spec.lr)",
        "ctl train --spec FILE --restart",
    )
    again = ctl(home, "train", "--spec", str(home / "b.json"), "--eval-max-items", "2", "--restart", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    lines = [x for x in again.stderr.splitlines() if x.startswith("ctl: restarted")]
    assert lines == [
        "ctl: restarted train/mini as train/mini/2 from scratch: kept train/mini (completed) with its "
        "history; moved runs/mini to runs/mini.restart-1 (2 checkpoint(s)); 2 evaluation output(s) to "
        "runs/mini.restart-1/evals/"
    ], again.stderr
    new = json.loads(again.stdout)["result"]
    assert all(s["train"]["resumed_from"] in (None, "runs/mini/ckpt/step-000003") for s in new["segments"])
    assert new["segments"][0]["train"]["resumed_from"] is None and new["digest"] != old["digest"]
    assert _files(home / "runs/mini.restart-1") == before  # the old checkpoints, moved, bytes unchanged
    assert (home / "runs/mini.restart-1/evals/ppl/mini-000006/summary.json").is_file()
    assert json.loads((home / "runs/mini.restart-1/RESTARTED.json").read_text())["workflows"] == ["train/mini"]
    hist = ctl(home, "history", "train/mini/1")  # the old history, readable under its id
    assert hist.returncode == 0 and "workflow_completed" in hist.stdout
    assert json.loads(ctl(home, "status", "train/mini/1", "--json").stdout)["result"]["digest"] == old["digest"]
    same = ctl(
        home, "train", "--spec", str(home / "b.json"), "--eval-max-items", "2", "--json"
    )  # attaches, trains nothing
    assert same.returncode == 0 and json.loads(same.stdout)["workflow_id"] == "train/mini/2"
    one_line_error(ctl(home, "train", "--spec", str(home / "b.json"), "--no-eval"), 2, "--suite/--no-eval")
    write_json(home / "aside.json", {**SPEC, "name": "mini.restart-1"})
    one_line_error(
        ctl(home, "train", "--spec", str(home / "aside.json"), "--no-eval"),
        2,
        "runs/mini.restart-1 holds the folder of a restarted run moved aside",
    )

    # a live run is not restarted under it: refused in one line, nothing moved
    held = _train(home, "c.json", "--restart", hold=4)  # train/mini/3, held in its second segment
    try:
        _held(home, held, 3, 4)
        one_line_error(
            ctl(home, "train", "--spec", str(home / "a.json"), "--no-eval", "--restart"),
            2,
            "cannot restart train/mini/3: a live worker runs it",
        )
        assert not (home / "runs/mini.restart-3").exists() and (home / "runs/mini.restart-2").is_dir()
        assert ctl(home, "cancel", "train/mini").returncode == 0
        held.communicate(timeout=DEADLINE_S)
        assert held.returncode == 130
    finally:
        if held.poll() is None:
            held.kill()
    # its continuation (train/mini/4) reuses the segment train/mini/3 finished, not those of before the restarts
    gen3 = _segment_digests(home, "train/mini/3")
    assert list(gen3) == ["train-000003"]
    cont = _train(home, "c.json", hold=5)
    _held(home, cont, 4, 5)
    os.kill(cont.pid, signal.SIGKILL)  # ctl dies; its trainer dies with it: a running workflow nobody runs
    cont.wait()
    st = json.loads(ctl(home, "status", "train/mini", "--json").stdout)
    assert st["workflow_id"] == "train/mini/4" and st["state"] == "running" and st["worker"]["live"] is False
    events = json.loads(ctl(home, "history", "train/mini/4", "--json").stdout)["events"]
    prior = events[0]["attrs"]["input"]["prior"]["train"]
    assert {k: v["digest"] for k, v in prior.items()} == gen3 and events[0]["attrs"]["input"]["restart"] == 2
    # a dead run is restarted: ended here (canceled, never redelivered), moved aside, trained anew
    last = _train(home, "a.json", "--restart")
    res, err = _result(last)
    assert "kept train/mini/4 (running, now canceled) with its history; moved runs/mini to runs/mini.restart-3" in err
    assert res["digest"] == json.loads(ctl(home, "status", "train/mini/1", "--json").stdout)["result"]["digest"]
    assert json.loads(ctl(home, "status", "train/mini/4", "--json").stdout)["state"] == "canceled"
    assert not list((home / "runs/mini.restart-3/activity/train-000006/logs").glob("g4-a2"))  # never redelivered
