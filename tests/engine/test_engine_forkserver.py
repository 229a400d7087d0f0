"""The fork server (engine/_forkserver.py) under the subprocess runner, with real processes and signals: a warm
child is a fresh process the runner treats like a cold one (own session, tag, command line, stop, nothing left),
and any doubt or crash starts the command the ordinary way. The child is tests/engine/eng_child.py run as
``python -m eng_child`` (no tinyllm: the engine's part; tests/workflows/test_warm_start.py runs real trainers)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
from eng_helpers import HERE, make_engine

from engine import ForkServer, RetryPolicy, StepOptions, SystemClock
from engine import _proctree as proctree
from engine._subprocess_runner import run_subprocess

MODULE = [sys.executable, "-m", "eng_child"]


def wait_for(cond, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def server():
    srv = ForkServer(["eng_child"], ["eng_child"], cwd=HERE).start()
    assert srv.wait_ready(60), srv.error
    yield srv
    srv.close()


def activity(tmp_path, launcher, argv_of):
    def act(ctx, _):
        res = run_subprocess(
            ctx,
            [*MODULE, *argv_of(ctx)],
            progress_path=str(tmp_path / f"p-{ctx.attempt}.jsonl"),
            cwd=HERE,
            env=launcher.env,
            poll_interval_s=0.02,
            launcher=launcher,
        )  # not
        # os.environ: pytest changes PYTEST_CURRENT_TEST between the fixture and the test (the server declines that)
        return res.result

    return act


async def one(rt, _):
    return await rt.execute_activity(
        "run",
        None,
        StepOptions(
            id="train-000030", heartbeat_timeout_s=300, retry=RetryPolicy(max_attempts=2, initial_interval_s=0.01)
        ),
    )


@pytest.mark.slow
def test_a_warm_child_is_a_fresh_tagged_process_in_its_own_session(tmp_path, server, db) -> None:
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        activities=[("run", activity(tmp_path, server, lambda ctx: ["whoami"]))],
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=60)
    me = eng.result("w")
    assert me["ppid"] == server._proc.pid  # forked by the server: warm
    assert me["sid"] == me["pid"]  # its own session and process group, as start_new_session gives a cold one
    assert me["proc_tag"] == me["env_tag"] and me["env_tag"].endswith("|w|train-000030#1")  # /proc shows its tag
    assert me["cmdline"] == [*MODULE, "whoami"] and me["cwd"] == HERE  # ps shows what runs, where
    assert not alive(me["pid"]) and proctree.of_attempt(me["env_tag"]) == {}


@pytest.mark.slow
def test_a_stop_reaches_the_warm_child_which_exits_130(tmp_path, server, db) -> None:
    """The runner's SIGTERM goes to the warm child's pid; it exits 130 (its "checkpoint"): Canceled. A stop signal
    to every process of the job (Slurm's) does not end the server under it: the server blocks them."""
    pidfile = str(tmp_path / "child.pid")
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        activities=[("run", activity(tmp_path, server, lambda ctx: ["term", pidfile]))],
        inline=False,
        poll_interval_s=0.02,
    )
    eng.start("w", "w", None)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("st", eng.run_until_complete("w", timeout_s=60)))
    t.start()
    pid = int(wait_for(lambda: _read(pidfile), what="the child to start"))
    assert _ppid(pid) == server._proc.pid
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        os.kill(server._proc.pid, sig)
    make_engine(db, SystemClock(), workflows=[("w", one)]).cancel("w")
    t.join(60)
    assert server._proc.poll() is None
    assert out["st"].state == "canceled"
    assert [e.attrs["error"]["type"] for e in eng.history("w") if e.type == "activity_canceled"] == ["Canceled"]
    assert not alive(pid)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
def test_a_crashed_server_runs_commands_cold(tmp_path, server, db) -> None:
    server._proc.kill()
    wait_for(lambda: server._proc.poll() is not None, what="the server to die")
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        activities=[("run", activity(tmp_path, server, lambda ctx: ["whoami"]))],
    )
    eng.start("w", "w", None)
    eng.run_until_complete("w", timeout_s=60)
    me = eng.result("w")
    assert me["ppid"] == os.getpid() and me["sid"] == me["pid"]  # started the ordinary way, by this process
    assert server.error


@pytest.mark.slow
def test_a_server_dying_under_its_child_takes_it_along_and_the_retry_runs_cold(tmp_path, server, db) -> None:
    """The server is killed while its child runs: the child dies too (parent-death signal), the attempt fails
    retryably, and attempt 2 starts cold (a redelivery never needs the server)."""
    pidfile = str(tmp_path / "child.pid")
    eng = make_engine(
        db,
        SystemClock(),
        workflows=[("w", one)],
        inline=False,
        poll_interval_s=0.02,
        activities=[
            ("run", activity(tmp_path, server, lambda ctx: ["term", pidfile] if ctx.attempt == 1 else ["whoami"]))
        ],
    )
    eng.start("w", "w", None)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("st", eng.run_until_complete("w", timeout_s=60)))
    t.start()
    pid = int(wait_for(lambda: _read(pidfile), what="the child to start"))
    os.kill(server._proc.pid, signal.SIGKILL)
    t.join(60)
    assert out["st"].state == "completed"
    assert not alive(pid)
    failed = [e.attrs["error"] for e in eng.history("w") if e.type == "activity_failed"]
    assert len(failed) == 1 and failed[0]["type"] == "SubprocessFailed", failed
    assert eng.result("w")["ppid"] == os.getpid()


def test_any_doubt_is_a_cold_start() -> None:
    """What the server declines before forking (no process started: a fake-free check of the rule)."""
    srv = ForkServer(["eng_child"], ["eng_child"], cwd=HERE, env={"A": "1", "PATH": "/bin"})
    env = {"A": "1", "PATH": "/bin", "DURABLE_ATTEMPT": "s|w|train-000030#1", "TRACEPARENT": "00-x"}
    assert srv.refusal([*MODULE, "whoami"], HERE, env) is None  # per-attempt variables may differ
    assert "module" in srv.refusal([sys.executable, "-m", "other", "x"], HERE, env)
    assert "module" in srv.refusal(["/usr/bin/other", "-m", "eng_child"], HERE, env)
    assert "working directory" in srv.refusal([*MODULE, "whoami"], "/", env)
    assert "OMP_NUM_THREADS" in srv.refusal([*MODULE, "whoami"], HERE, {**env, "OMP_NUM_THREADS": "1"})
    assert "tag" in srv.refusal([*MODULE, "whoami"], HERE, {**env, "DURABLE_ATTEMPT": "x" * 2000})
    assert "command line" in srv.refusal([*MODULE, "x" * 9000], HERE, env)
    assert srv.spawn([sys.executable, "-m", "other"], cwd=HERE, env=env, stdout=None, stderr=None) is None
