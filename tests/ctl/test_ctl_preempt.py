"""A polite stop loses no work (issue 39): SIGTERM, SIGINT or the preemption signal to `ctl train`, to
its whole job (every process, as Slurm and a terminal do) or to `ctl worker` saves the step the trainer
is at, records the attempt as preempted and exits 143; the same command then ends with the bits of a run
never interrupted.

Real ctl and trainer processes and real signals. `checkpoint_every` is larger than the run, so only the
stop's own checkpoint can save the steps trained: "0 steps lost" is checked against the trainer's own
per-step records (metrics.jsonl, one frame a step), independently of what ctl recorded. Waits are
bounded polls; nothing asserts a wall-clock time.
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

from simulator.proving import procs

pytestmark = pytest.mark.slow  # real ctl/trainer processes and signals

BOUND_S = 180
SPEC = {
    "name": "pre",
    "steps": 1500,
    "seed": 7,
    "eval_every": 0,
    "checkpoint_every": 100000,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 1500,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}


def _spec(tmp: Path, **over) -> Path:
    path = tmp / f"{over.get('name', SPEC['name'])}.json"
    path.write_text(json.dumps({**SPEC, **over}))
    return path


def _frames_step(home: Path, name: str = "pre") -> int:
    """The last step the trainer recorded (metrics.jsonl: one frame a step, written as the step ends)."""
    path = home / "runs" / name / "metrics.jsonl"
    last = 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                last = max(last, int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
    return last


def _trainers(home: Path) -> list:
    return [p for p in procs.processes_in(home) if "tinyllm" in p[1] or "stubborn" in p[1]]


def _preempted(home: Path, wid: str = "train/pre") -> list[dict]:
    return [e["attrs"] for e in procs.history(home, wid) or [] if e["type"] == "activity_preempted"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """The final loss bits of the spec run once, never interrupted."""
    tmp = tmp_path_factory.mktemp("ref")
    p = procs.run(tmp / "home", "train", "--spec", str(_spec(tmp)), "--no-eval", "--json", timeout_s=BOUND_S * 2)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["result"]["final_loss_hex"]


def _start(home: Path, spec: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*procs.CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env or procs.env(),
    )


def _training(home: Path, p: subprocess.Popen, at_least: int = 30) -> None:
    procs.wait_for(
        f"training past step {at_least}",
        lambda: _frames_step(home) >= at_least and _trainers(home),
        timeout_s=BOUND_S,
        alive=p,
    )


def _check_saved(home: Path, err: str) -> dict:
    """The stop saved the step the trainer was at: its checkpoint is at the last step it recorded."""
    reached = _frames_step(home)
    [pre] = _preempted(home)
    assert pre["step"] is not None and pre["step"] >= reached > 0, (pre, reached, err[-1500:])
    assert pre["steps_lost"] == 0 and not pre["killed_at_grace"], pre
    latest = (home / "runs" / "pre" / "ckpt" / "LATEST").read_text().strip()
    assert latest == f"step-{pre['step']:06d}", (latest, pre)
    assert "Traceback" not in err
    return pre


def _finish(home: Path, spec: Path, reference: str) -> None:
    p = procs.run(home, "train", "--spec", str(spec), "--no-eval", "--json", timeout_s=BOUND_S * 2)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["result"]["final_loss_hex"] == reference


@pytest.mark.parametrize("how", ["ctl", "job"])
def test_sigterm_saves_the_step_it_is_at_and_the_rerun_is_exact(tmp_path: Path, reference: str, how: str) -> None:
    """`kill -TERM <ctl>` (Kubernetes, docker, systemd) and SIGTERM to every process of the job (Slurm: ctl's
    group and the trainer's, which runs in its own): exit 143, 0 steps lost, status says preempted, and the
    same command ends bitwise equal to the uninterrupted run."""
    home, spec = tmp_path / "home", _spec(tmp_path)
    p = _start(home, spec)
    try:
        _training(home, p)
        if how == "ctl":
            p.send_signal(signal.SIGTERM)
        else:
            groups = {os.getpgid(pid) for pid, _ in _trainers(home)} | {p.pid}
            for g in groups:
                os.killpg(g, signal.SIGTERM)
        _, err = p.communicate(timeout=BOUND_S)
    finally:
        if p.poll() is None:
            procs.killpg(p)
    assert p.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err and "0 steps lost" in err, err[-2000:]
    _check_saved(home, err)
    procs.wait_for("no trainer left", lambda: not _trainers(home), timeout_s=BOUND_S)
    st = procs.run(home, "status", "train/pre")
    assert "preempted: stopped by SIGTERM" in st.stdout, st.stdout
    _finish(home, spec, reference)


def test_the_preemption_signal_is_a_polite_stop_too(tmp_path: Path, reference: str) -> None:
    """`--stop-signal` from the environment (Slurm's --signal=B:USR1@N): USR1 to ctl saves the step."""
    home, spec = tmp_path / "home", _spec(tmp_path)
    p = _start(home, spec, env={**procs.env(), "CTL_STOP_SIGNAL": "USR1"})
    try:
        _training(home, p)
        p.send_signal(signal.SIGUSR1)
        _, err = p.communicate(timeout=BOUND_S)
    finally:
        if p.poll() is None:
            procs.killpg(p)
    assert p.returncode == 143, err[-2000:]
    assert "stopped by SIGUSR1" in err
    _check_saved(home, err)
    _finish(home, spec, reference)


def test_a_bad_stop_signal_is_bad_input_before_any_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    p = procs.run(home, "train", "--spec", str(_spec(tmp_path)), "--stop-signal", "NOSUCH")
    assert p.returncode == 2 and "not a signal name" in p.stderr and "Traceback" not in p.stderr
    assert not (home / "runs").exists()


def test_a_worker_stopped_with_a_run_in_flight_saves_it_and_exits_non_zero(tmp_path: Path, reference: str) -> None:
    """`kill -TERM <ctl worker>`: the run in flight is saved at its step and the worker exits 143 (a Job or a
    batch script reads "come back", not "done"); a worker with nothing in flight still exits 0."""
    home, spec = tmp_path / "home", _spec(tmp_path)
    assert procs.run(home, "train", "--spec", str(spec), "--no-eval", "--detach").returncode == 0
    w = procs.spawn(home, "worker")
    try:
        _training(home, w)
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=BOUND_S)
    finally:
        if w.poll() is None:
            procs.killpg(w)
    assert w.returncode == 143, err[-2000:]
    _check_saved(home, err)
    _finish(home, spec, reference)
    idle = procs.spawn(home, "worker")
    procs.wait_for("the idle worker's first line", lambda: idle.poll() is None, timeout_s=BOUND_S)
    try:
        time.sleep(2)  # (its serving line is out; nothing is in flight)
        idle.send_signal(signal.SIGTERM)
        _, err = idle.communicate(timeout=BOUND_S)
    finally:
        if idle.poll() is None:
            procs.killpg(idle)
    assert idle.returncode == 0, err[-2000:]


STUBBORN = """\
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignores the contract's stop request
progress = sys.argv[sys.argv.index("--progress") + 1]
for step in range(1, 10**6):
    with open(progress, "a") as f:
        f.write(json.dumps({"event": "progress", "step": step, "time": time.time()}) + "\\n")
    time.sleep(0.2)
"""


def _stubborn_spec(tmp: Path) -> Path:
    """A spec whose own trainer ignores SIGTERM and reports a step every 0.2 s."""
    (tmp / "stubborn.py").write_text(STUBBORN)
    spec = tmp / "stub.json"
    spec.write_text(
        json.dumps(
            {
                "name": "stub",
                "steps": 100,
                "checkpoint_every": 10,
                "trainer": {"command": [sys.executable, str(tmp / "stubborn.py")]},
            }
        )
    )
    return spec


def test_a_trainer_that_ignores_the_stop_is_killed_at_the_grace_and_its_attempt_says_so(tmp_path: Path) -> None:
    """ctl never outlives its grace: the stubborn trainer is killed, the attempt is recorded preempted with
    killed_at_grace and its steps lost, ctl exits 143 before the grace has passed twice over."""
    home, spec = tmp_path / "home", _stubborn_spec(tmp_path)
    p = subprocess.Popen(
        [*procs.CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home), "--stop-grace", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=procs.env(),
    )
    try:
        procs.wait_for("the stubborn trainer", lambda: _trainers(home), timeout_s=BOUND_S, alive=p)
        procs.wait_for(
            "its progress", lambda: list(home.glob("runs/stub/activity/*/progress-1.jsonl")), timeout_s=BOUND_S, alive=p
        )
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=BOUND_S)
    finally:
        if p.poll() is None:
            procs.killpg(p)
    assert p.returncode == 143, err[-2000:]
    assert "killed at the grace" in err, err[-2000:]
    [pre] = _preempted(home, "train/stub")
    assert pre["killed_at_grace"] and pre["steps_lost"] > 0, pre
    procs.wait_for("the stubborn trainer gone", lambda: not _trainers(home), timeout_s=BOUND_S)


def test_a_second_signal_later_stops_at_once(tmp_path: Path) -> None:
    """The first SIGTERM starts the polite stop; a second one more than a moment later (the user's second
    Ctrl-C) stops now: exit 130, nothing of the attempt left."""
    home, spec = tmp_path / "home", _stubborn_spec(tmp_path)
    p = subprocess.Popen(
        [*procs.CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=procs.env(),
    )
    try:
        procs.wait_for(
            "its progress", lambda: list(home.glob("runs/stub/activity/*/progress-1.jsonl")), timeout_s=BOUND_S, alive=p
        )
        p.send_signal(signal.SIGINT)
        time.sleep(2.5)  # more than SAME_SIGNAL_S after the first: a second signal, not a copy
        assert p.poll() is None  # the stubborn trainer holds the polite stop (grace 25 s)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=BOUND_S)
    finally:
        if p.poll() is None:
            procs.killpg(p)
    assert p.returncode == 130, err[-2000:]
    assert "second signal" in err and "Traceback" not in err
    procs.wait_for("the stubborn trainer gone", lambda: not _trainers(home), timeout_s=BOUND_S)


def test_a_stop_during_a_durable_wait_is_recorded_and_the_rest_is_waited_later(tmp_path: Path) -> None:
    """SIGTERM while the run waits between segments: exit 143, a `preempted` event naming the wait; the same
    command waits only the remainder and evaluates nothing twice."""
    home = tmp_path / "home"
    spec = _spec(tmp_path, name="wait", steps=40, eval_every=20, eval_interval_seconds=20, lr_decay_steps=40)
    p = _start(home, spec)
    try:
        procs.wait_for(
            "the wait",
            lambda: any(e["type"] == "timer_started" for e in procs.history(home, "train/wait") or []),
            timeout_s=BOUND_S,
            alive=p,
        )
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=BOUND_S)
    finally:
        if p.poll() is None:
            procs.killpg(p)
    assert p.returncode == 143, err[-2000:]
    events = procs.history(home, "train/wait")
    stops = [e for e in events if e["type"] == "preempted"]
    assert len(stops) == 1 and "timer" in str(stops[0]["attrs"].get("waiting_on")), stops
    p = procs.run(home, "train", "--spec", str(spec), "--no-eval", "--json", timeout_s=BOUND_S * 2)
    assert p.returncode == 0, p.stderr[-2000:]
    events = procs.history(home, "train/wait")
    assert sum(e["type"] == "timer_fired" for e in events) == 1
    done = [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_completed"]
    assert len(done) == len(set(done))  # nothing done twice
