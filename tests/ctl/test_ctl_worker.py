"""``ctl train --detach`` then a separate ``ctl worker`` process runs the run to its end, on a
user's own text corpus (``--corpus-spec``), evaluating with the default suite (ppl); SIGTERM
then stops the idle worker cleanly (exit 0, as `ctl worker --help` documents).

Real processes: ctl, the engine, the subprocess runner, tinyllm. The smallest spec that shows
it: one segment of 6 steps. Waits poll with a generous deadline.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real ctl train --detach and ctl worker

DEADLINE_S = 120
SPEC = {
    "name": "own",
    "corpus": "mine",
    "steps": 6,
    "seed": 3,
    "eval_every": 0,
    "checkpoint_every": 3,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 6,
    "threads": 1,
    "log_every": 3,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}


def ctl(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def user_text() -> str:
    """A user's own text file: deterministic lines no built-in corpus contains."""
    return "".join(f"line {i}: the quick brown fox number {i * 7 % 13} jumps over fence {i % 5}.\n" for i in range(300))


def test_detached_run_served_by_a_worker_on_a_user_corpus(tmp_path: Path) -> None:
    home = tmp_path
    text = home / "my.txt"
    text.write_text(user_text())
    (home / "own.json").write_text(json.dumps(SPEC))
    (home / "mine.json").write_text(json.dumps({"name": "mine", "sources": [str(text)]}))

    started = ctl(
        home,
        "train",
        "--spec",
        str(home / "own.json"),
        "--corpus-spec",
        str(home / "mine.json"),
        "--eval-max-items",
        "2",
        "--detach",
        "--json",
    )
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["state"] == "running"
    assert not (home / "runs").exists()  # detached: nothing ran yet

    worker = subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "worker", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        summary = home / "evals/ppl/own-000006/summary.json"
        while not summary.exists():  # cheap: the last activity's output, then ask ctl
            assert worker.poll() is None, f"worker exited {worker.returncode}: {worker.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "timed out waiting for the worker's evaluation"
            time.sleep(0.1)  # a poll interval, not a wait for the outcome
        while True:
            st = ctl(home, "status", "train/own", "--json")
            out = json.loads(st.stdout)
            if out["state"] != "running":
                break
            assert worker.poll() is None, f"worker exited {worker.returncode}: {worker.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "timed out waiting for the worker to finish train/own"
            time.sleep(0.5)  # a poll interval, not a wait for the outcome
        assert st.returncode == 0 and out["state"] == "completed", out
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=DEADLINE_S)
        assert worker.returncode == 0, err[-2000:]
        assert "Traceback" not in err
        # its log: each attempt it started and ended (id#attempt, duration, outcome, figures), the workflow's end
        iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
        for aid in ("corpus-mine", "train-000006", "eval-000006-ppl"):
            assert re.search(rf"^{iso} start  train/own {aid}#1$", err, re.M), err
            assert re.search(rf"^{iso} end    train/own {aid}#1 completed in \d+:\d\d", err, re.M), err
        assert re.search(r"train-000006#1 completed in \d+:\d\d: step 6 loss \d+\.\d{4} checkpoint runs/own", err)
        assert re.search(r"eval-000006-ppl#1 completed in \d+:\d\d: ppl: heldout/bpb=", err)
        assert re.search(rf"^{iso} workflow train/own completed in \d+:\d\d", err, re.M), err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    res = out["result"]
    assert res["steps"] == 6 and res["checkpoint"] == "runs/own/ckpt/step-000006"
    assert res["corpus"]["name"] == "mine" and (home / "corpora/mine").is_dir()
    assert res["corpus"]["tokens"] + res["corpus"]["heldout_tokens"] == len(user_text().encode())  # byte tokens
    [seg] = res["segments"]
    assert [s["suite"] for s in seg["evals"]["suites"]] == ["ppl"]  # the default suite
    assert (home / seg["evals"]["suites"][0]["summary_path"]).is_file()
    events = json.loads(ctl(home, "history", "train/own", "--json").stdout)["events"]
    evals = [
        e["attrs"]["input"]["spec"]
        for e in events
        if e["type"] == "activity_scheduled" and e["attrs"]["activity_id"] == "eval-000006-ppl"
    ]
    assert [e["corpus"] for e in evals] == ["mine"]  # ppl read the user's held-out text
