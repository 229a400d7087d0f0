"""examples/slurm/train.sbatch on a real one-node Slurm: requeued, timed out, preempted; no step lost.

Issue 39 item 6. Each test submits the example batch script unchanged (its settings through the
environment, as a user would) to the private cluster of conftest.py, interrupts the job the way a
cluster does, and then demands:

- the job ends COMPLETED after at least one restart (``scontrol show job``: no slurmdbd here);
- the run's final loss bits and digest equal an uninterrupted ``ctl train`` of the same spec
  (``reference``, once per module, in another home);
- 0 steps lost at every interruption (COMMON.md's definition): the stopped attempt wrote a
  ``stopping`` line at step S and a checkpoint at a step >= S, the next attempt's ``resume`` line
  names that checkpoint, and ctl recorded the attempt as ``activity_preempted``;
- one trace across the restarts (``--trace-file`` in the home: every span has one trace id).

The spec is tiny and ``checkpoint_every`` exceeds ``steps``: only the stop's own checkpoint can save
work, so a stop that is not polite shows as steps lost. (b) and (c) hold the job's FIRST run at step
``HOLD_AT`` (``TINYLLM_FAULT=trainer.hold``, armed by a wrapper in ``CTL_COMMAND`` when
``SLURM_RESTART_COUNT`` is unset): the hold stands in for a run longer than the time limit or than the
preemption grace, which would otherwise cost minutes of CPU; it sleeps, writing liveness lines, until
the stop arrives, and changes no bit. (a) is interrupted while it trains. Scheduler, signals,
processes and files are all real; waits are bounded polls, never timing assertions.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from simulator import procs

pytestmark = pytest.mark.slow  # a real Slurm cluster, real ctl/trainer processes and signals

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
NAME = "slq"
STEPS = 800
SPEC = {
    "name": NAME, "steps": STEPS, "seed": 5, "eval_every": 0, "checkpoint_every": 100000,
    "batch_size": 2, "warmup_steps": 1, "lr_decay_steps": STEPS, "threads": 1, "log_every": 50,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
HOLD_AT = 50          # (b), (c): the first run holds at this step until it is stopped
STOP_GRACE_S = 8      # ctl's --stop-grace (CTL_STOP_GRACE): below the cluster's KillWait (10 s)
BOUND_S = 240.0       # the most any wait here may take (a loaded machine); never asserted as a time
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run of SPEC (ctl train, no Slurm): its final_loss_hex and digest."""
    d = tmp_path_factory.mktemp("reference")
    (d / "spec.json").write_text(json.dumps(SPEC))
    p = procs.run(d / "home", "train", "--spec", str(d / "spec.json"), "--no-eval", "--json", timeout_s=BOUND_S)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)["result"]
    return {"final_loss_hex": result["final_loss_hex"], "digest": result["digest"]}


class Run:
    """One submission of examples/slurm/train.sbatch with its own home, spec and output file."""

    def __init__(self, cluster, tmp_path: Path, *, hold: bool = False) -> None:
        self.cluster = cluster
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.spec = tmp_path / "spec.json"
        self.spec.write_text(json.dumps(SPEC))
        self.trace = self.home / "trace.jsonl"
        command = f"{sys.executable} -m ctl.cli"
        if hold:  # test only: the first run (no SLURM_RESTART_COUNT yet) holds at HOLD_AT; see the docstring
            wrapper = tmp_path / "ctl-holding-first-run"
            wrapper.write_text("#!/bin/bash\n"
                               f'[ -n "${{SLURM_RESTART_COUNT:-}}" ] || export TINYLLM_FAULT=trainer.hold@{HOLD_AT}\n'
                               f'exec {command} "$@"\n')
            wrapper.chmod(0o755)
            command = str(wrapper)
        self.env = {**procs.env(), "CTL_HOME": str(self.home), "CTL_SPEC": str(self.spec), "CTL_COMMAND": command,
                    "CTL_TRAIN_ARGS": f"--no-eval --trace-file {self.trace}", "CTL_STOP_GRACE": str(STOP_GRACE_S)}

    def submit(self, *args: str) -> str:
        return self.cluster.sbatch(f"--output={self.dir}/job-%j.out", f"--chdir={self.dir}", *args, str(SBATCH),
                                   env=self.env)

    def output(self) -> str:
        return "\n".join(f.read_text(errors="replace") for f in sorted(self.dir.glob("job-*.out")))

    # -- what the trainer wrote ------------------------------------------------------------

    def attempts(self) -> list[tuple[int, list[dict]]]:
        """The training activity's attempts in order: (attempt, its progress lines)."""
        out = []
        for f in self.home.glob(f"runs/{NAME}/activity/train-*/progress-*.jsonl"):
            lines = []
            for line in f.read_text(errors="replace").splitlines():
                try:
                    x = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if isinstance(x, dict):
                    lines.append(x)
            out.append((int(f.stem.rsplit("-", 1)[1]), lines))
        return sorted(out, key=lambda a: a[0])

    def step(self) -> int:
        """The furthest step seen so far: progress lines, and the per-step frames of metrics.jsonl."""
        steps = [x.get("step") or 0 for _, lines in self.attempts() for x in lines]
        try:
            for line in (self.home / "runs" / NAME / "metrics.jsonl").read_text(errors="replace").splitlines():
                try:
                    steps.append(json.loads(line).get("step") or 0)
                except ValueError:
                    pass
        except OSError:
            pass
        return max(steps, default=0)

    # -- the job ---------------------------------------------------------------------------

    def wait_job(self, job: str, state: str) -> dict:
        """Poll ``scontrol show job`` until the job is in ``state``; fail at once if it ended otherwise."""
        def seen():
            info = self.cluster.job(job)
            got = info.get("JobState")
            if got != state and got in ENDED:
                raise AssertionError(f"job {job} ended {got} (waiting for {state}): {info}\n{self.output()[-3000:]}")
            return info if got == state else None
        return procs.wait_for(f"job {job} {state}", seen, timeout_s=BOUND_S, poll_s=0.3)

    def check_finished(self, job: str, reference: dict, *, interruptions: int) -> None:
        """The end every test demands (see the module docstring)."""
        info = self.wait_job(job, "COMPLETED")
        assert int(info["Restarts"]) >= interruptions and info["ExitCode"] == "0:0", info
        out = self.output()
        assert out.count("train.sbatch: job") == int(info["Restarts"]) + 1, out[-3000:]  # one line per start
        attempts = self.attempts()
        assert len(attempts) >= interruptions + 1, attempts  # each interruption stopped an attempt in flight
        history = procs.history(self.home, f"train/{NAME}")
        assert history is not None
        done = [e for e in history if e["type"] == "workflow_completed"]
        assert done, [e["type"] for e in history]
        result = done[-1]["attrs"]["result"]
        assert (result["final_loss_hex"], result["digest"]) == (reference["final_loss_hex"], reference["digest"])
        spans = [json.loads(line) for line in self.trace.read_text().splitlines() if line.strip()]
        assert spans and len({_trace_id(s) for s in spans}) == 1, {_trace_id(s) for s in spans}
        # the contract of issue 39 (COMMON.md): 0 steps lost at every interruption
        lost = steps_lost(attempts)
        assert not lost, "steps lost:\n" + "\n".join(lost)
        preempted = [e for e in history if e["type"] == "activity_preempted"]
        assert len(preempted) >= interruptions, [e["type"] for e in history]


def _trace_id(span: dict) -> str:
    return span.get("trace_id") or span.get("context", {}).get("trace_id")


def steps_lost(attempts: list[tuple[int, list[dict]]]) -> list[str]:
    """One line per interrupted attempt that lost steps (empty: none lost). The definition (COMMON.md): the
    attempt's `stopping` line is at step S, it wrote a checkpoint at a step >= S, and the next attempt's
    `resume` line names that checkpoint."""
    out = []
    for (n, lines), (n2, nxt) in zip(attempts, attempts[1:]):
        reached = max((x.get("step") or 0 for x in lines), default=0)
        resume = next((x for x in nxt if x.get("event") == "resume" and x.get("checkpoint")), None)
        resumed = resume["step"] if resume else 0
        stopping = [x for x in lines if x.get("event") == "stopping"]
        if not stopping:
            out.append(f"attempt {n}: no 'stopping' line (it reached step {reached} or later); attempt {n2} "
                       f"started from step {resumed}: at least {reached - resumed} steps lost")
            continue
        s = stopping[-1]["step"]
        saved = [x for x in lines if "checkpoint" in x and "event" not in x and x.get("step", -1) >= s]
        if not saved:
            out.append(f"attempt {n}: stopping at step {s}, but no checkpoint at or after it; attempt {n2} started "
                       f"from step {resumed}: {s - resumed} steps lost")
        elif resume is None or resume["checkpoint"] != saved[-1]["checkpoint"]:
            out.append(f"attempt {n}: checkpoint {saved[-1]['checkpoint']} at the stop, but attempt {n2} resumed from "
                       f"{resume and resume['checkpoint']}: {saved[-1]['step'] - resumed} steps lost")
    return out


def test_scontrol_requeue_mid_segment_loses_no_step(cluster, reference, tmp_path: Path) -> None:
    """(a) `scontrol requeue` while the job trains: CONT + TERM to every process of the job, KillWait, back to
    the queue with its id; the script's next start resumes from the stop's checkpoint."""
    run = Run(cluster, tmp_path)
    job = run.submit()
    procs.wait_for("training past step 20", lambda: run.step() >= 20, timeout_s=BOUND_S)
    assert run.step() < STEPS  # mid-segment: the requeue lands while it trains
    cluster.cmd("scontrol", "requeue", job)
    run.check_finished(job, reference, interruptions=1)
    assert "DUE TO JOB REQUEUE" in run.output()


def test_a_time_limit_never_ends_the_run(cluster, reference, tmp_path: Path) -> None:
    """(b) `--time=1` (a minute) with `--signal=B:USR1@50`: the warning reaches the batch shell 10-40 s into
    the run (Slurm checks limits about every 30 s), the script requeues its own job, and the run finishes
    in the next start instead of ending TIMEOUT."""
    run = Run(cluster, tmp_path, hold=True)
    job = run.submit("--time=1", "--signal=B:USR1@50")
    run.check_finished(job, reference, interruptions=1)
    assert "time limit near (USR1): requeueing job" in run.output()


def test_partition_preemption_requeues_and_resumes(cluster, reference, tmp_path: Path) -> None:
    """(c) The job runs in partition `low` (PreemptMode=REQUEUE, GraceTime 5 s); a job submitted to `high`
    (a higher PriorityTier) needs the node's one CPU: the low job gets TERM when the grace ends, goes back to
    the queue, the high job runs, then the low job resumes and completes."""
    run = Run(cluster, tmp_path, hold=True)
    job = run.submit()
    procs.wait_for(f"the first run at step {HOLD_AT}", lambda: run.step() >= HOLD_AT, timeout_s=BOUND_S)
    high = cluster.sbatch("--partition=high", f"--output={tmp_path}/high-%j.out", "--wrap", "echo high ran",
                          env=procs.env())
    run.check_finished(job, reference, interruptions=1)
    assert cluster.job(high).get("JobState") == "COMPLETED"
    assert "DUE TO PREEMPTION" in run.output()
