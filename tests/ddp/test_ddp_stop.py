"""A polite stop of a torchrun run loses no step, wherever the signal lands (issue 39 item 4).

Real processes and real signals: ``tinyllm train`` of a 2-rank gloo spec (the launcher, the torchrun
agent ``tinyllm.distributed.agent``, two ranks). One run is stopped in turn by SIGTERM to rank 1 alone, to the
torchrun agent alone, to the launcher's whole process group (what a terminal and ``kill -- -PGID``
do; torchrun's ranks sit in sessions of their own, so only the launcher and the agent get it), by
``DURABLE_STOP_SIGNAL=SIGUSR1`` sent to rank 1 alone, by SIGUSR1 to the whole group, by SIGTERM
to the launcher alone, and by SIGTERM to every process of the attempt (what Slurm does). After each: exit 130; rank 0's ``stopping`` line names a step S and the
signal; exactly one new checkpoint, at S (``checkpoint_every`` is larger than the run, so only the
stop can save the work: 0 steps lost); LATEST names it; no process of the attempt is left; the next
attempt's ``resume`` line resumes from it. The last attempt runs to the end: its loss bits and digest
equal an uninterrupted run's, and so does every step's loss.

The signal is sent once rank 0 has reported a few steps past the resume point, so it lands mid-run, at
no chosen step; ``trainer.hold`` (tinyllm/faults.py) at a later step is only a net for a fast machine
(the ranks wait there, still agreeing on the stop flag each time round, until the stop comes), so no
test races the run's end. Waits are bounded polls of files and pids, never timings.

The 2-node test runs two torchrun agents on this machine (``TINYLLM_NNODES=2``, c10d rendezvous on
loopback, one rank each), SIGTERMs the agent of the node that does not hold rank 0, and reruns both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # torchrun with 2 gloo ranks, real signals

DEADLINE_S = 240
STOP_WAIT_S = 120  # from the signal to the attempt's end (a step, a tiny checkpoint, exits): generous
STEPS = 80
SPEC = {
    "name": "stop",
    "steps": STEPS,
    "seed": 7,
    "checkpoint_every": 1000,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 4,
    "lr_decay_steps": STEPS,
    "threads": 1,
    "log_every": 1000,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1},
    "distributed": {"world_size": 2},
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SIGNAL_AFTER = 2  # steps past the resume point before the signal is sent
HOLD_AFTER = 8  # the net: the ranks hold at this many steps past the resume point until the stop


def make_home(root: Path) -> tuple[Path, Path]:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    root.mkdir(parents=True, exist_ok=True)
    build_corpus(CorpusSpec(), root)
    path = root / "stop.json"
    path.write_text(json.dumps(SPEC))
    return root, path


def train_cmd(home: Path, spec_path: Path, progress: Path | None = None) -> list[str]:
    extra = ["--progress", str(progress)] if progress else []
    return [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec_path), "--home", str(home), *extra]


def lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def poll(cond, what: str, procs: list[subprocess.Popen] = (), bound_s: float = DEADLINE_S):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"exited {p.returncode} before {what}: {p.stderr.read()[-3000:]}")
        time.sleep(0.02)
    said = []
    for p in procs:  # what they said so far (they are stopped for it: the test fails anyway)
        p.kill()
        said.append(p.communicate()[1][-3000:])
    raise AssertionError(f"timed out waiting for {what}; stderr: {said}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def agent_of(launcher: int) -> int:
    [agent] = children(launcher)
    assert b"tinyllm.distributed.agent" in Path(f"/proc/{agent}/cmdline").read_bytes()
    return agent


def event(progress: Path, name: str) -> dict | None:
    return next((x for x in lines(progress) if x.get("event") == name), None)


def last_step(home: Path) -> int:
    return max((x.get("step", 0) for x in lines(home / "runs" / "stop" / "metrics.jsonl")), default=0)


def checkpoints(home: Path) -> set[str]:
    root = home / "runs" / "stop" / "ckpt"
    return {p.name for p in root.glob("step-*")} if root.is_dir() else set()


def launch(home: Path, spec_path: Path, progress: Path, env: dict) -> subprocess.Popen:
    """A launcher in a session of its own, so that a group signal reaches this attempt only."""
    return subprocess.Popen(
        train_cmd(home, spec_path, progress),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    home, spec_path = make_home(tmp_path_factory.mktemp("ref"))
    done = subprocess.run(train_cmd(home, spec_path), capture_output=True, text=True, timeout=DEADLINE_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = {x["step"]: float(x["train/loss"]).hex() for x in lines(home / "runs" / "stop" / "metrics.jsonl")}
    assert sorted(losses) == list(range(1, STEPS + 1))
    return {"result": json.loads(done.stdout.strip().splitlines()[-1]), "losses": losses}


@pytest.fixture
def started():
    """Every process a test started: none outlives it, whatever it asserted."""
    procs: list = []
    yield procs
    for p in procs:
        try:
            p.kill() if isinstance(p, subprocess.Popen) else os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass


def assert_stopped(out: str, err: str, rc: int, progress: Path, home: Path, before: set[str], signame: str) -> int:
    """Exit 130, the stopping line, one new checkpoint at its step (0 steps lost); the stop step."""
    assert rc == 130, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    stopping = [x for x in lines(progress) if x.get("event") == "stopping"]
    assert len(stopping) == 1 and stopping[0]["signal"] == signame, stopping  # rank 0 only, once
    step = stopping[0]["step"]
    assert result["canceled"] is True and result["steps"] == step < STEPS, (result, stopping)
    name = f"step-{step:06d}"
    assert checkpoints(home) - before == {name}, (sorted(before), sorted(checkpoints(home)))  # one, at S
    assert result["checkpoint"] == f"runs/stop/ckpt/{name}"
    assert (home / "runs" / "stop" / "ckpt" / "LATEST").read_text().strip() == name
    saved = [x for x in lines(progress) if "checkpoint" in x and "event" not in x]
    assert [x["step"] for x in saved] == [step], saved  # its progress checkpoint line, the only one
    return step


# what each attempt's signal goes to, the signal, and $DURABLE_STOP_SIGNAL
ATTEMPTS = [
    ("rank 1", signal.SIGTERM, None),
    ("agent", signal.SIGTERM, None),
    ("group", signal.SIGTERM, None),
    ("rank 1", signal.SIGUSR1, "SIGUSR1"),
    ("group", signal.SIGUSR1, "SIGUSR1"),
    ("launcher", signal.SIGTERM, None),
    ("every process", signal.SIGTERM, None),
]


@pytest.mark.timeout(600)  # 8 torchrun runs: 111 to 201 s on the loaded 2-core machine
def test_a_stop_reaching_one_rank_the_agent_the_group_or_the_launcher_stops_every_rank_at_one_step(
    tmp_path, reference, started
) -> None:
    home, spec_path = make_home(tmp_path / "h")
    at, resumed_from = 0, None
    for n, (target, sig, stop_env) in enumerate(ATTEMPTS, 1):
        progress = tmp_path / f"p{n}.jsonl"
        env = {**ENV, "TINYLLM_FAULT": f"trainer.hold@{at + HOLD_AFTER}"}
        if stop_env:
            env["DURABLE_STOP_SIGNAL"] = stop_env
        before = checkpoints(home)
        proc = launch(home, spec_path, progress, env)
        started.append(proc)
        ranks = poll(lambda: (event(progress, "ranks") or {}).get("pids"), "the ranks' pids", [proc])
        started.extend(ranks)
        poll(lambda: event(progress, "ready"), "the ready line", [proc])
        resume = event(progress, "resume")
        assert (resume or {}).get("resumed_from") == resumed_from, resume  # from the last stop's checkpoint
        poll(lambda: last_step(home) >= at + SIGNAL_AFTER, "a few steps", [proc])
        agent = agent_of(proc.pid)
        last_signal_step = last_step(home)
        if target == "group":
            os.killpg(proc.pid, sig)  # the launcher and the agent (the ranks are in their own sessions)
        else:  # "every process": what Slurm does (the job step's cgroup), and the engine's attempt sweep
            for pid in {"rank 1": [ranks[1]], "agent": [agent], "launcher": [proc.pid]}.get(
                target, [proc.pid, agent, *ranks]
            ):
                os.kill(pid, sig)
        poll(
            lambda: proc.poll() is not None,
            f"the attempt to stop after {sig.name} to {target} (the ranks hold at "
            f"step {at + HOLD_AFTER} until they agree on a stop)",
            bound_s=STOP_WAIT_S,
        )
        out, err = proc.communicate(timeout=DEADLINE_S)
        at = assert_stopped(out, err, proc.returncode, progress, home, before, sig.name)
        print(f"attempt {n}: {sig.name} to {target} after step {last_signal_step}: stopped at step {at}")
        assert at >= last_signal_step  # every step done when the signal was sent is in the checkpoint
        for p in (*ranks, agent):
            poll(lambda: not alive(p), f"process {p} to end")
        resumed_from = f"runs/stop/ckpt/step-{at:06d}"

    done = subprocess.run(
        train_cmd(home, spec_path, tmp_path / "last.jsonl"), capture_output=True, text=True, timeout=DEADLINE_S, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    final, ref = json.loads(done.stdout.strip().splitlines()[-1]), reference["result"]
    assert final["resumed_from"] == resumed_from
    assert (final["final_loss_hex"], final["digest"]) == (ref["final_loss_hex"], ref["digest"])
    losses = {x["step"]: float(x["train/loss"]).hex() for x in lines(home / "runs" / "stop" / "metrics.jsonl")}
    assert losses == reference["losses"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.soak  # two nodes' torchrun agents, twice: over a minute on a loaded 2-core machine
def test_two_nodes_one_agent_sigtermed_stop_at_one_step_and_resume_bitwise(tmp_path, reference, started) -> None:
    home, spec_path = make_home(tmp_path / "h")

    def nodes(n: int, hold: bool) -> tuple[list[subprocess.Popen], list[Path]]:
        env = {
            **ENV,
            "TINYLLM_NNODES": "2",
            "TINYLLM_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
            "TINYLLM_RDZV_ID": f"stop-{n}",
        }
        if hold:
            env["TINYLLM_FAULT"] = f"trainer.hold@{HOLD_AFTER}"
        progress = [tmp_path / f"n{n}-node{r}.jsonl" for r in (0, 1)]
        procs = [launch(home, spec_path, progress[r], {**env, "TINYLLM_NODE_RANK": str(r)}) for r in (0, 1)]
        started.extend(procs)
        return procs, progress

    procs, progress = nodes(1, hold=True)
    [lead] = poll(lambda: [i for i in (0, 1) if event(progress[i], "ranks")], "the ranks' pids", procs)  # rank 0's node
    ranks = event(progress[lead], "ranks")["pids"]
    started.extend(ranks)
    poll(lambda: last_step(home) >= SIGNAL_AFTER, "a few steps", procs)
    other = 1 - lead  # the node without rank 0: its agent's stop reaches rank 0 through the agreement
    agent = agent_of(procs[other].pid)
    assert children(agent) == [ranks[1]]
    os.kill(agent, signal.SIGTERM)
    poll(
        lambda: all(p.poll() is not None for p in procs),
        "both nodes to stop after SIGTERM to an agent",
        bound_s=STOP_WAIT_S,
    )
    ended = [p.communicate(timeout=DEADLINE_S) for p in procs]
    step = assert_stopped(*ended[lead], procs[lead].returncode, progress[lead], home, set(), "SIGTERM")
    assert procs[other].returncode == 130, ended[other][1][-3000:]
    assert json.loads(ended[other][0].strip().splitlines()[-1])["steps"] == step  # rank 1 stopped at S too
    assert not [x for x in lines(progress[other]) if x.get("event") == "stopping"]
    for p in ranks:
        poll(lambda: not alive(p), f"rank {p} to end")

    procs, progress = nodes(2, hold=False)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=DEADLINE_S)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    ref = reference["result"]
    for r in results:
        assert r["resumed_from"] == f"runs/stop/ckpt/step-{step:06d}"
        assert (r["final_loss_hex"], r["digest"]) == (ref["final_loss_hex"], ref["digest"])


@pytest.mark.soak  # ~35 s of MLflow flush on top of a torchrun run
def test_rank_0_slow_to_close_its_sinks_after_a_stop_is_not_killed_by_torchrun(tmp_path, started) -> None:
    """Rank 0's MLflow delivery hangs on a tracking server that never answers (a listening socket that
    accepts nothing), so closing the sink after the stop's checkpoint waits its whole flush_timeout_s
    (35 s). Rank 1 waits for rank 0 at a last barrier (tinyllm/distributed/trainer.py): a rank that exits 130 first
    makes torchrun SIGKILL the others 30 s later, and the stop would read as a failure (exit 1, rank 0
    without a verdict). Seen red with the barrier removed and the result's stop flag no longer a
    collective (today the result's all-reduce of the stop flag also holds rank 1 back)."""
    pytest.importorskip("mlflow")
    home, spec_path = make_home(tmp_path / "h")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        spec_path.write_text(json.dumps({**SPEC, "sinks": {"mlflow": {"tracking_uri": uri, "flush_timeout_s": 35}}}))
        progress = tmp_path / "p.jsonl"
        proc = launch(home, spec_path, progress, {**ENV, "TINYLLM_FAULT": f"trainer.hold@{HOLD_AFTER}"})
        started.append(proc)
        ranks = poll(lambda: (event(progress, "ranks") or {}).get("pids"), "the ranks' pids", [proc])
        started.extend(ranks)
        poll(lambda: last_step(home) >= SIGNAL_AFTER, "a few steps", [proc])
        os.kill(ranks[1], signal.SIGTERM)
        out, err = proc.communicate(timeout=DEADLINE_S)
    assert_stopped(out, err, proc.returncode, progress, home, set(), "SIGTERM")
