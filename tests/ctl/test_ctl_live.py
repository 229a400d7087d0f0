"""The live display of `ctl train` on a real terminal (a pseudo-terminal): the whole run's
progress bar with step/total, ETA and the phase; `ctl status` naming the live worker; after a
SIGKILL, `ctl status` saying nobody runs it; the same command again printing one resume line
(the checkpoint it resumes from and how many steps are redone, both checked against the run's
files) instead of replaying the dead attempt's events."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from obs_helpers import Terminal, ctl, last_step, processes_with, wait_for, write_spec

pytestmark = pytest.mark.slow  # real ctl train runs, killed


def test_live_display_then_kill_then_one_resume_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = write_spec(home, name="slow", steps=4000, eval_every=2000, checkpoint_every=10, log_every=1000)
    argv = [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec), "--no-eval", "--home", str(home)]
    metrics = home / "runs/slow/metrics.jsonl"
    term = Terminal(argv)
    try:
        term.wait_text(r"train/slow: 4000 steps in 2 segment\(s\)", "the opening line")
        wait_for(lambda: last_step(metrics) >= 12, "a checkpoint and a few steps more")
        term.wait_text(
            r"train/slow\s+\S*━+.*step \d+/4000 \(\d+%\) \| ETA \d+:\d\d \| loss \d+\.\d{4} "
            r"\(last \d+\.\d{4}\) \| [\d.]+k? tok/s \| elapsed \d+:\d\d",
            "the whole-run bar with its ETA",
        )
        term.wait_text(r"training segment 1/2\s+\S*━+\S*\s+steps 1\.\.2000", "the phase row")
        term.wait_text(r"checkpoint step 10  loss \d+\.\d{4}  runs/slow/ckpt/step-000010", "a checkpoint line")
        status = ctl(home, "status", "train/slow").stdout
        assert re.search(rf"worker: live, pid {term.proc.pid} on \S+, train-002000 attempt 1", status), status
    finally:
        term.close()
    wait_for(lambda: not processes_with(str(home)), "the killed run's trainer to be gone", 120)
    status = ctl(home, "status", "train/slow").stdout
    assert "no live worker (train-002000 attempt 1: lease owner process is gone): run the same `ctl train`" in status
    lost_at = last_step(metrics)
    latest = int((home / "runs/slow/ckpt/LATEST").read_text().strip()[5:])
    assert latest < lost_at or latest == lost_at
    term = Terminal(argv)
    try:
        m = term.wait_text(
            r"train/slow: resumed train-002000 \(segment 1/2\) from step (\d+) "
            r"\(runs/slow/ckpt/step-(\d+)\); (\d+) step\(s\) since that checkpoint are redone",
            "the resume line",
        )
        assert int(m.group(1)) == int(m.group(2)) == latest and int(m.group(3)) == lost_at - latest
        term.wait_text(r"step \d+/4000", "the bar again")
        wait_for(lambda: last_step(metrics) > lost_at, "training past the lost steps")
        assert "timed_out" not in term.text and "worker lost" not in term.text and "is gone" not in term.text
        assert term.text.count("resumed") == 1
    finally:
        term.close()
    wait_for(lambda: not processes_with(str(home)), "the second trainer to be gone", 120)


STUB_EVAL = '''"""An eval_command (the contract's): suite "counted" writes done/of counts, suite "plain" none;
each waits for the test's release file, so the terminal can be read while it runs."""
import argparse, json, time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--spec"); p.add_argument("--home"); p.add_argument("--progress")
args = p.parse_args()
spec = json.loads(Path(args.spec).read_text())
suite = spec["suite"]


def line(**fields):
    with open(args.progress, "a") as f:
        f.write(json.dumps({**fields, "time": time.time()}) + "\\n")


line(event="starting")
if suite == "counted":
    line(event="ready", done=0, of=120, unit="windows")
    time.sleep(0.3)
    line(event="progress", done=37, of=120, unit="windows")
deadline = time.monotonic() + 120
while not (Path(args.home) / f"release-{suite}").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
line(event="progress", **({"done": 120, "of": 120, "unit": "windows"} if suite == "counted" else {}))
print(json.dumps({"suite": suite, "run": spec["name"], "summary": {"metrics": {}}}))
'''


def test_ctl_eval_shows_the_evaluations_own_count_else_the_time(tmp_path: Path) -> None:
    """`ctl eval` on a terminal: the phase row is the suite's own bar (done/of from its progress file,
    with an ETA) when the eval_command writes counts, and the time elapsed when it writes none."""
    import json

    home = tmp_path / "home"
    home.mkdir()
    (home / "stub_eval.py").write_text(STUB_EVAL)
    (home / "ckpt").mkdir()
    spec = home / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "name": "stub",
                "steps": 2,
                "trainer": {
                    "command": ["python", "-c", "pass"],
                    "eval_command": ["python", str(home / "stub_eval.py")],
                },
            }
        )
    )
    term = Terminal(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "eval",
            "--spec",
            str(spec),
            "--suite",
            "counted",
            "--suite",
            "plain",
            "--subject",
            "a=ckpt",
            "--home",
            str(home),
        ]
    )
    try:
        term.wait_text(r"evaluating counted \(1/2\)\s+\S*━+\S*\s+37/120 windows, ETA \d+:\d\d", "the suite's own count")
        (home / "release-counted").touch()
        term.wait_text(r"evaluating plain \(2/2\)\s+\S*━+\S*\s+0:0[1-9]\n", "the time elapsed")
        (home / "release-plain").touch()
        term.wait_text(r"eval/a completed", "the end")
        assert term.proc.wait(timeout=60) == 0
        assert not re.search(r"evaluating plain \(2/2\)\s+\S*\s+\d+/\d+", term.text)  # no counts it never wrote
    finally:
        term.close()
