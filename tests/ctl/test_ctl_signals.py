"""SIGTERM and Ctrl-C (SIGINT) to `ctl` are honoured; a spec with too many segments is refused.

Defect 8 of issue 9: `steps: 1000000000, eval_every: 1` built a list of a billion segments
(24 GB, OOM-killed, SIGTERM ignored meanwhile, the workflow left "running"). Now the segment
count is bounded before any work (exit 2, one line naming the limit, nothing written), and a
`ctl train` or a busy `ctl worker` stops on SIGTERM/SIGINT, its trainer with it. Real
processes and signals; waits are bounded polls, never timing assertions (the time from the
signal to the exit is measured in the note: milliseconds).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

import workflows
from simulator.proving import procs

pytestmark = pytest.mark.slow  # real ctl/worker processes and signals

BOUND_S = 120
SPEC = {
    "name": "sig",
    "steps": 4000,
    "seed": 5,
    "eval_every": 0,
    "checkpoint_every": 5,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 4000,
    "threads": 1,
    "log_every": 50,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}


def _trainers(home: Path) -> list:
    return [p for p in procs.processes_in(home) if "tinyllm" in p[1]]


def _lines(home: Path):
    """Every progress line written so far by every attempt (a line being written is skipped)."""
    for f in home.glob("runs/sig/activity/*/progress-*.jsonl"):
        for line in f.read_text(errors="replace").splitlines():
            try:
                x = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(x, dict):
                yield x


def _checkpoints(home: Path) -> int:
    """Checkpoint lines written so far (a resume or liveness line has an "event" and is not one)."""
    return sum("checkpoint" in x and "event" not in x for x in _lines(home))


def _checkpointed(home: Path) -> bool:
    return _checkpoints(home) > 0


def _events(home: Path, event: str | None) -> int:
    """Progress lines of ``event`` (``starting``, ``resume``...) written so far by every attempt."""
    return sum(event is not None and x.get("event") == event for x in _lines(home))


def _ignoring_sigint() -> None:
    """Start as a non-interactive shell starts a background job (`ctl train ... &` in a script, CI, nohup
    wrappers): SIGINT inherited as ignored (Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctl_train_stops_on_sigterm_and_on_ctrl_c_with_its_trainer(tmp_path: Path) -> None:
    """Three runs of the same command, each stopped: Ctrl-C at the fresh trainer's first line (`starting`,
    before its torch import), SIGTERM after a checkpoint, Ctrl-C at the resumed trainer's `resume` line.
    The two Ctrl-C runs start with SIGINT inherited as ignored, as a non-interactive shell starts a
    background job: the hole seen in a full-suite run (run in the background), where ctl lost the
    SIGINT, trained to the end and exited 0."""
    home = tmp_path / "home"
    spec = tmp_path / "sig.json"
    spec.write_text(json.dumps(SPEC))
    plan = [(signal.SIGINT, "starting"), (signal.SIGTERM, None), (signal.SIGINT, "resume")]
    for sig, event in plan:
        before = _checkpoints(home)
        seen = _events(home, event)
        p = subprocess.Popen(
            [*procs.CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=procs.env(),
            preexec_fn=_ignoring_sigint if sig == signal.SIGINT else None,
        )
        try:
            if event is None:
                procs.wait_for(
                    "a checkpoint", lambda: _checkpoints(home) > before and _trainers(home), timeout_s=BOUND_S, alive=p
                )
            else:
                procs.wait_for(
                    f"the trainer's {event} line", lambda: _events(home, event) > seen, timeout_s=BOUND_S, alive=p
                )
            p.send_signal(sig)  # to ctl alone, as `kill` or Ctrl-C would (the trainer is in its own group)
            _, err = p.communicate(timeout=BOUND_S)
        finally:
            if p.poll() is None:
                procs.killpg(p)
        assert p.returncode == 143, (sig, event, err[-2000:])  # a polite stop: preempted, resumable
        assert f"stopped by {sig.name}" in err and "Traceback" not in err
        procs.wait_for("the trainer to die with ctl", lambda: not _trainers(home), timeout_s=BOUND_S)
        st = procs.run(home, "status", "train/sig", "--json")
        assert json.loads(st.stdout)["state"] == "running"  # resumable: the same command continues it


def test_a_busy_worker_stops_on_sigterm_with_its_trainer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "sig.json"
    spec.write_text(json.dumps(SPEC))
    assert procs.run(home, "train", "--spec", str(spec), "--no-eval", "--detach").returncode == 0
    w = procs.spawn(home, "worker")
    try:
        procs.wait_for("a checkpoint", lambda: _checkpointed(home) and _trainers(home), timeout_s=BOUND_S, alive=w)
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=BOUND_S)
    finally:
        if w.poll() is None:
            procs.killpg(w)
    assert w.returncode == 143, err[-2000:]  # stopped with a run in flight: a scheduler starts it again
    assert "preempted" in err
    procs.wait_for("the trainer to die with the worker", lambda: not _trainers(home), timeout_s=BOUND_S)


def test_too_many_segments_is_bad_input_before_any_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps({**SPEC, "name": "big", "steps": 1_000_000_000, "eval_every": 1}))
    p = procs.run(home, "train", "--spec", str(spec))
    assert p.returncode == 2
    [line] = p.stderr.splitlines()
    assert f"at most {workflows.MAX_SEGMENTS}" in line and "1000000000 segments" in line
    assert list(home.iterdir()) == []  # nothing written, not even the database
    ok = {**SPEC, "steps": workflows.MAX_SEGMENTS * 3, "eval_every": 3}  # exactly at the bound: accepted
    assert len(workflows.segments(ok["steps"], ok["eval_every"])) == workflows.MAX_SEGMENTS
    with pytest.raises(ValueError, match="at most"):
        workflows.segments(ok["steps"] + 1, 3)
