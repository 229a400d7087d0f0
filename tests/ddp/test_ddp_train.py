"""tinyllm on torch.distributed (issue 12) with real processes: torchrun, 2 gloo ranks, real signals.

One uninterrupted 2-rank run (a module fixture) is the reference. Another 2-rank run is hit, in
turn, by SIGKILL of the launcher, SIGKILL of one rank and SIGTERM; after each, no process of it is
left, and the next invocation resumes from LATEST; the final loss bits, the digest and every step's
loss equal the reference's. A 1-rank distributed run equals the plain one-process run bit for bit.
Resuming at another world size is refused with one line, exit 2, nothing written.
Waits are bounded polls of files and pids, never timings.
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

pytestmark = pytest.mark.slow  # torchrun with 2 gloo ranks, real signals (up to ~40 s)

DEADLINE_S = 180
SPEC = {
    "name": "ddp",
    "steps": 120,
    "seed": 7,
    "checkpoint_every": 10,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 4,
    "lr_decay_steps": 120,
    "threads": 1,
    "log_every": 1000,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1},
    "distributed": {"world_size": 2},
    # held-out validation on every rank: 5 windows over 2 ranks (3 + 2 and one all-ignored pad window)
    "validation": {
        "enabled": True,
        "objective": "lm",
        "before_training": True,
        "every_steps": 30,
        "batch_size": 2,
        "max_samples": 5,
        "data": {"path": "builtin:heldout.txt", "shuffle": False},
    },
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def make_home(root: Path, spec: dict) -> tuple[Path, Path]:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    root.mkdir(parents=True, exist_ok=True)
    build_corpus(CorpusSpec(), root)
    path = root / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return root, path


def train_cmd(home: Path, spec_path: Path, progress: Path | None = None) -> list[str]:
    extra = ["--progress", str(progress)] if progress else []
    return [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec_path), "--home", str(home), *extra]


def train(home: Path, spec_path: Path) -> dict:
    done = subprocess.run(train_cmd(home, spec_path), capture_output=True, text=True, timeout=DEADLINE_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def lines(path: Path) -> list[dict]:
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def poll(cond, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def ranks_of(progress: Path) -> list[int]:
    return next((x["pids"] for x in lines(progress) if x.get("event") == "ranks"), [])


def checkpoint_after(progress: Path, step: int) -> dict | None:
    return next((x for x in lines(progress) if "checkpoint" in x and "event" not in x and x["step"] > step), None)


def step_losses(home: Path, name: str) -> dict[int, tuple]:
    """Each step's frame: train loss bits, and the held-out loss bits and token count where it validated."""
    return {
        x["step"]: (
            float(x.get("train/loss", "nan")).hex(),
            float(x.get("val/loss", "nan")).hex(),
            x.get("val/token_count"),
        )
        for x in lines(home / "runs" / name / "metrics.jsonl")
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    home, spec_path = make_home(tmp_path_factory.mktemp("ref"), SPEC)
    result = train(home, spec_path)
    return {"result": result, "losses": step_losses(home, SPEC["name"]), "home": home}


def _all_gone(pids: list[int]) -> None:
    poll(lambda: not any(alive(p) for p in pids), f"processes {pids} to end")


@pytest.fixture
def started():
    """Every process a test started (launchers, ranks): none outlives it, whatever it asserted."""
    procs: list = []
    yield procs
    for p in procs:
        try:
            p.kill() if isinstance(p, subprocess.Popen) else os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass


def test_two_ranks_resume_bitwise_after_sigkill_of_launcher_and_rank_and_sigterm(tmp_path, reference, started) -> None:
    home, spec_path = make_home(tmp_path / "faults", SPEC)

    def start(progress: Path) -> tuple[subprocess.Popen, list[int]]:
        proc = subprocess.Popen(
            train_cmd(home, spec_path, progress), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
        )
        started.append(proc)
        pids = poll(lambda: ranks_of(progress), "the ranks' pids", proc)
        started.extend(pids)
        assert len(pids) == 2 and proc.pid not in pids
        return proc, pids

    latest = home / "runs" / "ddp" / "ckpt" / "LATEST"

    # 1. SIGKILL of the launcher: torchrun and both ranks die with it (parent-death chain)
    proc, pids = start(tmp_path / "p1.jsonl")
    poll(lambda: checkpoint_after(tmp_path / "p1.jsonl", 0), "a first checkpoint", proc)
    proc.kill()
    proc.communicate(timeout=DEADLINE_S)
    _all_gone(pids)
    at_kill = latest.read_text().strip()

    # 2. SIGKILL of rank 1: the attempt ends (retryable exit 1, one line naming it), no rank left
    proc, pids = start(tmp_path / "p2.jsonl")
    resumed = poll(
        lambda: next((x for x in lines(tmp_path / "p2.jsonl") if x.get("event") == "resume"), None),
        "the resume line",
        proc,
    )
    assert resumed["resumed_from"] == f"runs/ddp/ckpt/{at_kill}"  # from LATEST
    first = int(at_kill.split("-")[1])
    poll(lambda: checkpoint_after(tmp_path / "p2.jsonl", first), "a checkpoint of attempt 2", proc)
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 1, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("tinyllm: distributed run failed"), err[-3000:]
    assert "rank 1 ended without a verdict" in err.strip().splitlines()[-1]
    _all_gone(pids)

    # 3. SIGTERM of the launcher: every rank stops after the same step, checkpoints, exit 130
    proc, pids = start(tmp_path / "p3.jsonl")
    before = int(latest.read_text().strip().split("-")[1])
    poll(lambda: checkpoint_after(tmp_path / "p3.jsonl", before), "a checkpoint of attempt 3", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err[-3000:]
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["canceled"] is True and stopped["steps"] < SPEC["steps"], stopped
    assert latest.read_text().strip() == f"step-{stopped['steps']:06d}"  # the stop's own checkpoint
    _all_gone(pids)

    # 4. the same command to the end: bitwise the uninterrupted run, step by step
    final = train(home, spec_path)
    assert final["resumed_from"] == f"runs/ddp/ckpt/step-{stopped['steps']:06d}"
    ref = reference["result"]
    assert (final["final_loss_hex"], final["digest"]) == (ref["final_loss_hex"], ref["digest"])
    assert step_losses(home, "ddp") == reference["losses"]
    assert len(reference["losses"]) == SPEC["steps"] + 1  # steps 1..120 and the validation frame of step 0
    assert [s for s, v in reference["losses"].items() if v[2] is not None] == [0, 30, 60, 90, 120]
    assert {v[2] for v in reference["losses"].values() if v[2] is not None} == {5 * 16}  # padding adds no weight


def test_one_rank_distributed_equals_the_plain_run_bitwise(tmp_path) -> None:
    """Training and held-out validation alike (SPEC validates at steps 0, 30)."""
    spec = {**SPEC, "name": "one", "steps": 40, "distributed": {"world_size": 1}}
    plain = {k: v for k, v in spec.items() if k != "distributed"}
    home, one_path = make_home(tmp_path / "h", spec)
    plain_path = home / "plain.json"
    plain_path.write_text(json.dumps({**plain, "name": "plain"}))
    procs = [
        subprocess.Popen(train_cmd(home, p), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for p in (one_path, plain_path)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=DEADLINE_S)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    one, base = results
    assert (one["final_loss_hex"], one["digest"]) == (base["final_loss_hex"], base["digest"])
    assert step_losses(home, "one") == step_losses(home, "plain")


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


@pytest.mark.parametrize("other", [{"world_size": 1}, None])
def test_resume_at_another_world_size_is_refused(reference, other) -> None:
    """Exit 2, one line naming both world sizes, before any process starts: nothing written."""
    home = reference["home"]
    spec = {k: v for k, v in SPEC.items() if k != "distributed"}
    if other is not None:
        spec["distributed"] = other
    spec_path = home / "other.json"
    spec_path.write_text(json.dumps({**spec, "steps": 300}))
    before = _tree(home / "runs")
    done = subprocess.run(train_cmd(home, spec_path), capture_output=True, text=True, timeout=DEADLINE_S, env=ENV)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    want = "world_size 1" if other else "one process (no distributed)"
    assert "trained at world_size 2" in line and f"asks for {want}" in line and "refused" in line, line
    assert _tree(home / "runs") == before


def test_nccl_is_refused_in_one_line_before_any_process(tmp_path) -> None:
    spec_path = tmp_path / "nccl.json"
    spec_path.write_text(json.dumps({**SPEC, "name": "nccl", "distributed": {"world_size": 2, "backend": "nccl"}}))
    done = subprocess.run(train_cmd(tmp_path, spec_path), capture_output=True, text=True, timeout=DEADLINE_S, env=ENV)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert "nccl needs CUDA devices" in line and "use gloo" in line, line
    assert not (tmp_path / "runs").exists()


def test_bad_distributed_specs_are_one_line() -> None:
    from tinyllm.spec import SpecError, parse_train_spec

    for bad, words in (
        ({"world_size": 3}, "not a multiple of world_size 3"),
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2, "backend": "mpi"}, "backend"),
        ({"world_size": 2, "nodes": 2}, "unknown field"),
    ):
        with pytest.raises(SpecError, match=words):
            parse_train_spec({**SPEC, "distributed": bad})


def ctl_train(home: Path, spec_path: Path, heartbeat_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "train",
            "--spec",
            str(spec_path),
            "--no-eval",
            "--json",
            "--heartbeat-timeout",
            str(heartbeat_s),
            "--home",
            str(home),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


@pytest.mark.soak  # ~50 s; the two-rank SIGKILL/SIGTERM resume test stays in CI
def test_ctl_train_of_two_ranks_killed_and_a_hung_rank_end_with_the_same_loss(tmp_path, reference, started) -> None:
    """`ctl train` SIGKILLed mid-segment: its launcher, torchrun and ranks die with it; the same command
    again resumes; rank 1 frozen by SIGSTOP there is noticed by the heartbeat rule (no progress line),
    the attempt is stopped and redelivered; the final loss bits and digest are the reference's."""
    heartbeat_s = 15.0  # covers the longest silent phase (torchrun and the ranks importing torch, ~3x over);
    # a startup that still times out on a busy host is only redelivered (the polls look at every attempt)
    home = tmp_path / "ctl"
    home.mkdir()
    spec_path = home / "ddp.json"
    spec_path.write_text(json.dumps({**SPEC, "eval_every": 0}))
    work = home / "runs" / "ddp" / "activity" / "train-000120"

    def attempt_with_checkpoint(after: int = 0) -> int | None:
        for n in range(after + 1, 12):
            if checkpoint_after(work / f"progress-{n}.jsonl", 0) and ranks_of(work / f"progress-{n}.jsonl"):
                return n
        return None

    proc = ctl_train(home, spec_path, heartbeat_s)
    started.append(proc)
    n = poll(attempt_with_checkpoint, "a checkpoint", proc)
    progress = lines(work / f"progress-{n}.jsonl")
    attempt = [
        next(x["pid"] for x in progress if x.get("event") == "starting"),
        *ranks_of(work / f"progress-{n}.jsonl"),
    ]
    started.extend(attempt)
    proc.kill()
    proc.communicate(timeout=DEADLINE_S)
    _all_gone(attempt)  # the launcher (parent-death signal of the runner's child) and both ranks

    proc = ctl_train(home, spec_path, heartbeat_s)
    started.append(proc)
    m = poll(lambda: attempt_with_checkpoint(n), "a checkpoint of the resumed run", proc)
    pids = ranks_of(work / f"progress-{m}.jsonl")
    started.extend(pids)
    os.kill(pids[1], signal.SIGSTOP)
    give_up = time.monotonic() + 4 * heartbeat_s + 120
    while alive(pids[1]):  # until the runner stopped the hung attempt; no other attempt beside it
        assert not (work / f"progress-{m + 1}.jsonl").exists(), "a new attempt started beside the hung rank"
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < give_up, "the hung rank was never noticed (heartbeats without progress?)"
        time.sleep(0.05)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["state"] == "completed"
    ref = reference["result"]
    assert (res["result"]["final_loss_hex"], res["result"]["digest"]) == (ref["final_loss_hex"], ref["digest"])
    events = json.loads(
        subprocess.run(
            [sys.executable, "-m", "ctl.cli", "history", "train/ddp", "--json", "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        ).stdout
    )["events"]
    ended = [
        e.get("attrs", {}).get("kind") or e["attrs"].get("error", {}).get("type")
        for e in events
        if e["type"] in ("activity_timed_out", "activity_failed") and e["attrs"].get("attempt") == m
    ]
    assert ended and ended[0] in ("heartbeat timeout", "ProgressTimeout"), ended
