"""Two real worker processes on one database never run the same attempt at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from eng_helpers import python_cmd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eng_worker  # noqa: E402

pytestmark = pytest.mark.slow  # two worker processes


def wait_for(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_worker_processes_share_one_database(tmp_path):
    db = str(tmp_path / "engine.db")
    starter = eng_worker.make(db)  # creates the database before the workers open it
    workers = [subprocess.Popen(python_cmd("eng_worker.py", db, "log", str(tmp_path))) for _ in range(2)]
    try:
        wait_for(lambda: len([p for p in os.listdir(tmp_path) if p.startswith("ready-")]) == 2, 30, "workers")
        ids = [f"batch/{i:02d}" for i in range(12)]
        for wid in ids:
            starter.start("three", wid, None)
        wait_for(lambda: all(starter.status(w).state == "completed" for w in ids), 60, "all workflows")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=20)
    for wid in ids:
        assert starter.result(wid) == [0, 1, 2]
    spans: dict[tuple[str, str], list] = defaultdict(list)
    pids = set()
    with open(tmp_path / "log") as f:
        for line in f:
            what, wid, aid, attempt, pid, t = line.split()
            pids.add(pid)
            spans[(wid, aid)].append((what, int(attempt), pid, float(t)))
    assert len(spans) == 36
    for key, evs in spans.items():
        # exactly one attempt ran, start then end, in one process: never two at once, never repeated
        assert [(w, a) for w, a, _, _ in evs] == [("start", 1), ("end", 1)], key
        assert evs[0][2] == evs[1][2]
    assert len(pids) == 2  # both processes took work
    for wid in ids:
        started = [e for e in starter.history(wid) if e.type == "activity_started"]
        assert [e.attrs["attempt"] for e in started] == [1, 1, 1]
