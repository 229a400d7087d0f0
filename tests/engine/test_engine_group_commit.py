"""Group commit: the threaded worker records the outcomes waiting for it in one COMMIT, and nothing a
member transaction did is acted on before that COMMIT returned.

A ledger outside the engine notes every attempt an activity function really ran (workflow, activity,
attempt). After a failed or crashed group commit and a recovery by a fresh Engine, every attempt in the
ledger must be in the history (its ``activity_started`` was durable before it ran), and no attempt number
may have run twice (a lease acted on before its commit, then lost with it, is handed out again with the
same number).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter

import pytest

from engine import StepOptions, Store, VirtualClock

from eng_helpers import HERE, Crash, make_engine, python_cmd

ROOT = os.path.dirname(os.path.dirname(HERE))

WORKFLOWS, STEPS = 6, 4


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.ran: list[tuple[str, str, int]] = []
        self.barrier = threading.Barrier(WORKFLOWS, timeout=20)  # first steps finish together: a group

    def step(self, ctx, x):
        with self.lock:
            self.ran.append((ctx.workflow_id, ctx.activity_id, ctx.attempt))
        if ctx.activity_id == "s0" and ctx.attempt == 1:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                pass
        return x * 2


async def steps(rt, n):
    return [await rt.execute_activity("step", i, StepOptions(id=f"s{i}")) for i in range(n)]


class FailingGroupStore(Store):
    """The ``fail_at``-th group COMMIT fails: with ``exc`` an error (the engine lives on), or a crash."""

    def __init__(self, path, fail_at, exc):
        self.fail_at, self.exc, self.groups = fail_at, exc, 0
        super().__init__(path)

    def before_commit(self, label):
        if label == "group":
            self.groups += 1
            if self.groups == self.fail_at:
                raise self.exc


def _engine(path, ledger, store=None, inline=False):
    return make_engine(
        path,
        VirtualClock(),
        workflows=[("steps", steps)],
        activities=[("step", ledger.step)],
        store=store,
        inline=inline,
        max_concurrent_activities=WORKFLOWS,
        poll_interval_s=0.01,
    )


def _run_all(eng):
    for w in range(WORKFLOWS):
        eng.start("steps", f"wf/{w}", STEPS)
    for w in range(WORKFLOWS):
        eng.run_until_complete(f"wf/{w}", timeout_s=120)


def _check(eng, ledger):
    started = Counter()
    for w in range(WORKFLOWS):
        wid = f"wf/{w}"
        assert eng.result(wid) == [2 * i for i in range(STEPS)]
        for e in eng.history(wid):
            if e.type == "activity_started":
                started[(wid, e.attrs["activity_id"], e.attrs["attempt"])] += 1
    ran = Counter(ledger.ran)
    twice = [k for k, n in ran.items() if n > 1]
    assert not twice, f"attempts that ran twice under one number (acted on before their commit): {twice}"
    unrecorded = [k for k in ran if k not in started]
    assert not unrecorded, f"attempts that ran but whose start is not in the history: {unrecorded}"


def test_concurrent_outcomes_share_commits(tmp_path):
    ledger = Ledger()
    eng = _engine(str(tmp_path / "e.db"), ledger)
    _run_all(eng)
    _check(eng, ledger)
    assert eng.store.members >= 2  # some outcomes were made durable by one group COMMIT
    assert eng.store.commits < WORKFLOWS * (STEPS + 1) + WORKFLOWS  # fewer COMMITs than transitions


@pytest.mark.parametrize("kind", ["error", "crash"])
def test_a_failed_group_commit_loses_no_acknowledged_transition(tmp_path, kind):
    """The 1st, 2nd, ... group COMMIT fails (an SQLite error: the engine lives on; or a crash), until a
    run has no group commit left to fail."""
    for fail_at in range(1, 41):
        path = str(tmp_path / f"{kind}{fail_at}.db")
        ledger = Ledger()
        exc = sqlite3.OperationalError("disk I/O error") if kind == "error" else Crash("group commit")
        store = FailingGroupStore(path, fail_at, exc)
        eng = _engine(path, ledger, store=store)
        try:
            _run_all(eng)
        except (sqlite3.OperationalError, Crash):
            pass
        else:
            eng.close()
            assert fail_at > 1, "no group commit happened"
            return
        if kind == "error":
            eng.run_until_idle()  # the same engine goes on: it must not run what the failed group held
        eng.close()
        ledger.barrier.abort()
        eng2 = _engine(path, ledger, inline=True)
        for w in range(WORKFLOWS):
            eng2.run_until_complete(f"wf/{w}", timeout_s=120)
        _check(eng2, ledger)
        eng2.close()
    raise AssertionError("more than 40 group commits for 24 activities")


@pytest.mark.slow
def test_sigkill_under_group_commit_loses_no_acknowledged_transition(tmp_path):
    """A real worker process (threaded, group commit) SIGKILLed three times mid-run, then run to the end."""
    db, ledger_path = str(tmp_path / "engine.db"), str(tmp_path / "ledger")
    workflows, n = 8, 25
    cmd = python_cmd("eng_group_child.py", db, ledger_path, str(workflows), str(n))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}

    def lines() -> int:
        try:
            with open(ledger_path, "rb") as f:
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0

    for target in (15, 60, 110):  # activities run before each kill
        proc = subprocess.Popen(cmd, env=env)
        deadline = time.monotonic() + 120
        while lines() < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, f"the worker ended (rc {proc.returncode}) before {target} activities ran"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert subprocess.run(cmd, env=env, timeout=300).returncode == 0
    with open(ledger_path) as f:
        ran = Counter(tuple(ln.split()[:2]) + (int(ln.split()[2]),) for ln in f if ln.strip())
    eng = make_engine(db, VirtualClock())
    started = set()
    for w in range(workflows):
        assert eng.result(f"g/{w}") == n
        for e in eng.history(f"g/{w}"):
            if e.type == "activity_started":
                started.add((f"g/{w}", e.attrs["activity_id"], e.attrs["attempt"]))
    eng.close()
    assert not [k for k, c in ran.items() if c > 1], "an attempt number ran twice"
    assert not [k for k in ran if k not in started], "an attempt ran whose start was never durable"
    assert sum(ran.values()) >= workflows * n
