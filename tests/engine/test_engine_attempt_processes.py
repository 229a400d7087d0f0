"""Every process an attempt started is gone before another attempt of it starts, and heartbeats mean
progress. Real processes (eng_child.py): a launcher whose rank calls setsid (as torchrun's ranks may),
a silent child, a trainer-like child holding the run lock through a slow SIGTERM checkpoint; real
SIGKILL of a worker process. Short heartbeat timeouts, set in the tests; waits are bounded polls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from engine import RetryPolicy, StepOptions, SystemClock
from engine._leases import proc_start
from engine._subprocess_runner import run_subprocess

from eng_helpers import make_engine, python_cmd
from test_engine_subprocess import wait_for

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eng_worker  # noqa: E402

pytestmark = pytest.mark.slow  # real launcher and rank processes

HEARTBEAT_S = 5.0  # short, so the tests are quick; a loaded host may time out a later attempt as well
DEADLINE_S = 120


def rank_of(pidfile: str) -> tuple[int, str]:
    pid, start = open(pidfile).read().split()
    return int(pid), start


def alive(pidfile: str) -> bool:
    pid, start = rank_of(pidfile)
    return proc_start(pid) == start


def kill_rank(pidfile: str) -> None:
    """Test hygiene only: a failing test must not leave its rank running."""
    if os.path.exists(pidfile) and alive(pidfile):
        os.kill(rank_of(pidfile)[0], 9)


def workflow(max_attempts: int = 5):
    async def wf(rt, _):
        opts = StepOptions(
            id="train-000010",
            heartbeat_timeout_s=HEARTBEAT_S,
            retry=RetryPolicy(max_attempts=max_attempts, initial_interval_s=0.05),
        )
        return await rt.execute_activity("run", None, opts)

    return wf


def run_in_thread(eng, wid):
    out: dict = {}

    def main():
        try:
            out["st"] = eng.run_until_complete(wid, timeout_s=DEADLINE_S)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            out["error"] = e

    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t, out


def join(t: threading.Thread) -> None:
    t.join(DEADLINE_S + 10)
    assert not t.is_alive(), "the run did not end in time (a hung attempt that is never timed out?)"


def launcher_then_check(tmp_path, n_lines: int, silence_s: float | None = None):
    """Attempt 1: the launcher (n progress lines, then silent); later attempts: is the rank gone?
    ``silence_s``: the runner's own no-progress limit (None: the heartbeat timeout, 0: none)."""
    out, pidfile, report = str(tmp_path / "out"), str(tmp_path / "rank.pid"), str(tmp_path / "report")

    def act(ctx, _):
        progress = str(tmp_path / f"progress-{ctx.attempt}")
        if ctx.attempt == 1:
            argv = python_cmd("eng_child.py", "launcher", progress, out, pidfile, str(n_lines))
        else:
            argv = python_cmd("eng_child.py", "check", pidfile, report)
        res = run_subprocess(
            ctx, argv, progress_path=progress, poll_interval_s=0.05, term_grace_s=10, heartbeat_timeout_s=silence_s
        )
        return {
            "attempt": ctx.attempt,
            "report": open(report).read() if ctx.attempt > 1 else None,
            "result": res.result,
        }

    return act, pidfile


@pytest.mark.parametrize("who", ["lease-expiry", "runner-silence"])
def test_a_silent_launcher_is_stopped_with_its_rank_and_redelivered(tmp_path, db, who):
    """Defect 2 and 3: the launcher falls silent (its rank still writes: the process exists, no progress);
    past the heartbeat timeout its whole tree is stopped and attempt 2 finds the rank gone.
    lease-expiry: the runner heartbeats only on progress, so the live worker's loop expires the lease
    and the runner, seeing its lease lost, stops the tree (the runner's own limit is off).
    runner-silence: an inline worker (its loop is busy running the attempt) relies on the runner's limit."""
    act, pidfile = launcher_then_check(tmp_path, n_lines=3, silence_s=0 if who == "lease-expiry" else None)
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", workflow())],
        activities=[("run", act)],
        inline=who == "runner-silence",
        poll_interval_s=0.05,
    )
    eng.start("w", "w", None)
    try:
        t, out = run_in_thread(eng, "w")
        join(t)
        assert "error" not in out, out
        assert out["st"].state == "completed"
        res = eng.result("w")
        assert res["attempt"] >= 2 and res["report"] == "gone"  # nothing of attempt 1 when a later one started
        ended = [e for e in eng.history("w") if e.type in ("activity_timed_out", "activity_failed")]
        assert ended and ended[0].attrs["attempt"] == 1
        kind = ended[0].attrs.get("kind") or ended[0].attrs["error"]["type"]
        assert kind in ("heartbeat timeout", "ProgressTimeout"), ended[0].attrs
    finally:
        kill_rank(pidfile)


def test_cancel_stops_the_rank_in_its_own_session(tmp_path, db):
    """Defect 3: on cancel the launcher exits 130 at once; its rank (another session) is gone too by the
    time the cancel is recorded."""
    act, pidfile = launcher_then_check(tmp_path, n_lines=100_000)  # keeps making progress
    eng = make_engine(
        db, SystemClock(), workflows=[("w", workflow())], activities=[("run", act)], inline=False, poll_interval_s=0.05
    )
    eng.start("w", "w", None)
    try:
        t, out = run_in_thread(eng, "w")
        wait_for(lambda: os.path.exists(pidfile), timeout_s=DEADLINE_S, what="the rank to start")
        assert alive(pidfile)
        make_engine(db, SystemClock(), workflows=[("w", workflow())]).cancel("w")  # as `ctl cancel` would
        join(t)
        assert out["st"].state == "canceled"
        assert not alive(pidfile)
    finally:
        kill_rank(pidfile)


def test_sigkilled_worker_its_rank_is_gone_before_attempt_2(tmp_path):
    """Defect 3: SIGKILL the worker; the launcher dies by its parent-death signal, its rank (own
    session, re-parented to init) writes on; the next worker kills it before it starts attempt 2."""
    db = str(tmp_path / "engine.db")
    x = {"out": str(tmp_path / "out"), "pidfile": str(tmp_path / "rank.pid"), "progress": str(tmp_path / "progress")}
    starter = eng_worker.make(db)
    worker = subprocess.Popen(python_cmd("eng_worker.py", db, "launch", str(tmp_path)))
    worker2 = None
    try:
        starter.start("launch", "launch/one", x)
        wait_for(
            lambda: os.path.exists(x["pidfile"]) and os.path.exists(x["out"]),
            timeout_s=DEADLINE_S,
            what="the rank to write",
        )
        worker.kill()
        worker.wait(timeout=20)
        assert alive(x["pidfile"])  # the parent-death signal reaches the launcher only
        worker2 = subprocess.Popen(python_cmd("eng_worker.py", db, "launch", str(tmp_path)))
        wait_for(lambda: starter.status("launch/one").state != "running", timeout_s=DEADLINE_S, what="redelivery")
        res = starter.result("launch/one")
        assert res == {"attempt": 2, "rank": "gone"}
    finally:
        for w in (worker, worker2):
            if w is not None and w.poll() is None:
                w.terminate()
                w.wait(timeout=20)
        kill_rank(x["pidfile"])


def test_redelivered_attempt_waits_for_the_stale_trainer_it_never_burns_attempts_on_the_lock(tmp_path, db):
    """Defect 5: attempt 1 falls silent, is timed out and takes 3 s to checkpoint after SIGTERM with the
    run lock held. Attempt 2 (due after 0.05 s) waits for it, bounded, instead of starting a trainer
    that exits 75 and burning every attempt. No trainer ever starts while another holds the lock."""
    lock, log = str(tmp_path / "run.lock"), str(tmp_path / "log")

    def act(ctx, _):
        progress = str(tmp_path / f"progress-{ctx.attempt}")
        how = "hang" if ctx.attempt == 1 else "finish"
        res = run_subprocess(
            ctx,
            python_cmd("eng_child.py", "locker", progress, lock, log, how, "3"),
            progress_path=progress,
            poll_interval_s=0.05,
            term_grace_s=20,
        )
        return {"attempt": ctx.attempt, "result": res.result}

    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", workflow(max_attempts=4))],
        activities=[("run", act)],
        inline=False,
        poll_interval_s=0.05,
    )
    eng.start("w", "w", None)
    t, out = run_in_thread(eng, "w")
    join(t)
    assert "error" not in out, out
    failed = [e.attrs["error"]["message"] for e in eng.history("w") if e.type == "activity_failed"]
    assert not any("locked" in m for m in failed), failed
    assert out["st"].state == "completed" and eng.result("w")["attempt"] >= 2
    entries = [line.split() for line in open(log).read().splitlines()]
    assert [(what, pid) for what, pid, _ in entries][0][0] == "started"
    holder = None  # no trainer starts while another holds the lock
    for what, pid, _ in entries:
        if what == "started":
            assert holder is None, entries
        elif what == "locked":
            holder = pid
        elif what == "released":
            assert holder == pid
            holder = None
    assert [what for what, _, _ in entries].count("locked") >= 2
