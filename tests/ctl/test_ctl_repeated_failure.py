"""Issue 40 item 11: a deterministic failure is not retried blindly. The same failure (type and message, which
ends with the trainer's last stderr line) at the same point (no new checkpoint) in two attempts in a row fails
the segment at once with one line saying so (workflows/repeats.py), instead of 5 attempts and a minute of
waits; a failure with another message is retried as before.

A spec's own trainer (a real subprocess of ``ctl train``) that writes a progress line and then raises: on its
first attempt with one message, on every later one with another (a counter file in the home)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bi_helpers import ctl, write_json

pytestmark = pytest.mark.slow  # real ctl train and trainer processes

TRAINER = """import argparse, json, pathlib
p = argparse.ArgumentParser()
for a in ("--spec", "--home", "--progress", "--resume", "--total-steps"):
    p.add_argument(a)
args = p.parse_args()
pathlib.Path(args.progress).write_text(json.dumps({"event": "starting", "step": 0}) + "\\n")
count = pathlib.Path(args.home) / "attempts"
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
if n == 1:
    raise ConnectionError("flaky: connection reset by peer")
raise ValueError("Tried to step 41 times. The specified number of total steps is 40")
"""


def test_the_same_failure_twice_in_a_row_is_not_retried_again(tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(TRAINER)
    write_json(
        tmp_path / "s.json",
        {
            "name": "det",
            "steps": 10,
            "trainer": {"command": ["python", str(tmp_path / "trainer.py")], "cwd": str(tmp_path)},
        },
    )
    proc = ctl(tmp_path, "train", "--spec", str(tmp_path / "s.json"))
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert (tmp_path / "attempts").read_text() == "3"  # 1: flaky (retried); 2 and 3: the same failure: stop
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train/det failed: ")]
    assert len(lines) == 1 and "not retried again" in lines[0], proc.stderr  # the run's one failure line says why
    assert "ValueError: Tried to step 41 times" in lines[0], lines[0]
    assert "the same failure before any checkpoint in attempts 2 and 3: not retried again" in lines[0], lines[0]
    events = json.loads(ctl(tmp_path, "history", "train/det", "--json").stdout)["events"]
    started = [
        e["attrs"]["attempt"]
        for e in events
        if e["type"] == "activity_started" and e["attrs"]["activity_id"] == "train-000010"
    ]
    assert started == [1, 2, 3]
    last = [e for e in events if e["type"] == "activity_failed"][-1]["attrs"]
    assert last["final"] is True and last["error"]["type"] == "RepeatedFailure", last
