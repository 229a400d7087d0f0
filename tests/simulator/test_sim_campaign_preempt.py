"""The campaign's graceful preemption faults (simulator/proving/campaign_preempt.py; issue 39 item 7).

``preempt`` SIGTERMs ``ctl train`` (or the worker) alone, as Kubernetes, docker and systemd do;
``preempt-group`` every process of the job, ctl's group and the trainer, as Slurm does. The oracle
demands ctl's exit 143 within the grace, no trainer left, 0 steps lost (every step the attempt did is
in its checkpoint, and the next attempt resumed from that very checkpoint), and the final bits equal
to the uninterrupted run's. The real run: real ctl and tinyllm processes, real signals; the first
trainer holds at the fault's step (``TINYLLM_FAULT=trainer.hold@5``, test-only, in the environment of
the ctl processes started before the first preemption only: a trainer resumed at step 5 would hold
again) so that the stop lands there whatever the machine's speed. The oracle's checks are also fed violations directly.
"""

from __future__ import annotations

import random

import pytest

from simulator.__main__ import main
from simulator.proving.campaign import campaign
from simulator.proving.campaign_preempt import resume_violations, steps_lost
from simulator.proving.campaign_progress import fault_points
from simulator.proving.campaign_reference import uninterrupted
from simulator.proving.campaign_targets import FAULTS, PREEMPT_FAULTS, TINYLLM

KINDS = "preempt,preempt-group"


@pytest.mark.slow
def test_a_graceful_preemption_of_the_whole_job_at_step_5_loses_none_and_resumes_there(monkeypatch):
    """Seed 26 (ctl train): a SIGTERM of the whole job at step 5 (held there), then one of ctl alone at
    step 15. Both end with exit 143, the first saved step 5 (off the checkpoint cadence of 2: the stop's
    own checkpoint), the next attempts resumed from what was saved, and the bits equal the reference."""
    import simulator.proving.campaign_preempt as cp
    from simulator.proving import procs

    want = uninterrupted()  # (without the hold: the reference is never signalled)
    held = {"on": True}
    plain_env, plain_preempt = procs.env, cp.preempt

    def env():
        return {**plain_env(), **({"TINYLLM_FAULT": "trainer.hold@5"} if held["on"] else {})}

    def preempt(*args, **kw):
        held["on"] = False  # ctl started again after this preemption: no hold
        return plain_preempt(*args, **kw)

    monkeypatch.setattr(procs, "env", env)
    monkeypatch.setattr(cp, "preempt", preempt)
    target = TINYLLM.__class__(**{**TINYLLM.__dict__, "faults": PREEMPT_FAULTS})
    lines: list[str] = []
    rc = campaign(26, 1, faults_per_run=2, want=want, log=lines.append, target=target)
    out = "\n".join(lines)
    assert rc == 0, out  # passed and tested: a preemption made a trainer resume inside a segment
    assert (
        "preempt-group at step 5: SIGTERM of the whole job: ctl train (exit 143; train-000010 saved at step 5)" in out
    ), out
    assert "preempt at step 15: SIGTERM of ctl train (exit 143; " in out, out
    assert "2 faults injected, 2 survived" in out, out
    rng = random.Random("26:0")
    assert rng.random() >= 0.3 and [rng.choice(PREEMPT_FAULTS) for _ in range(2)] == ["preempt-group", "preempt"]
    assert fault_points(rng, 2, 20, 2, 10) == [("step", 5), ("step", 15)]


def _started(seq, aid, attempt):
    return {"seq": seq, "time": seq, "type": "activity_started", "attrs": {"activity_id": aid, "attempt": attempt}}


def _preempted(seq, aid, attempt, step):
    return {
        "seq": seq,
        "time": seq,
        "type": "activity_preempted",
        "attrs": {"activity_id": aid, "attempt": attempt, "step": step, "steps_lost": 0},
    }


def _resume(seq, aid, attempt, ckpt):
    return {
        "seq": seq,
        "time": seq,
        "type": "activity_heartbeat",
        "attrs": {
            "activity_id": aid,
            "attempt": attempt,
            "details": {"event": "resume", "resumed_from": ckpt, "step": int(ckpt[-6:])},
        },
    }


def test_the_oracle_sees_an_attempt_that_did_not_resume_from_the_preemption_s_checkpoint():
    ok = {
        "train/camp/1": [
            _started(1, "train-000010", 1),
            _preempted(2, "train-000010", 1, 5),
            _started(3, "train-000010", 2),
            _resume(4, "train-000010", 2, "runs/camp/ckpt/step-000005"),
        ]
    }
    assert resume_violations(ok) == []
    bad = {"train/camp/1": [*ok["train/camp/1"][:3], _resume(4, "train-000010", 2, "runs/camp/ckpt/step-000004")]}
    (line,) = resume_violations(bad)
    assert "preempted with its checkpoint at step 5, attempt 2 resumed from step 4: 1 step(s) lost" in line, line
    stale = {"train/camp/1": [*ok["train/camp/1"][:3], _resume(4, "train-000010", 2, "runs/camp/ckpt/step-000006")]}
    (line,) = resume_violations(stale)
    assert "resumed from step 6: the preempted event names a stale checkpoint" in line, line


def test_steps_lost_reads_the_stopping_line_the_step_records_and_the_runner_s_count():
    assert steps_lost({"step": 6, "stopping_step": 6, "steps_lost": 0}, 6) == (0, 6, 6)
    assert steps_lost({"step": 6, "stopping_step": None, "steps_lost": 0}, 8) == (2, 8, 6)  # trained on after it
    assert steps_lost({"step": 6, "stopping_step": 7, "steps_lost": 0}, None) == (1, 7, 6)
    assert steps_lost({"step": 4, "stopping_step": None, "steps_lost": 3}, None) == (3, None, 4)
    assert steps_lost({"step": None, "stopping_step": None, "steps_lost": None}, None) == (0, None, 0)


def test_the_preemptions_are_tinyllm_campaign_faults_and_kinds_are_checked(capsys):
    assert set(PREEMPT_FAULTS) <= set(FAULTS)
    with pytest.raises(SystemExit) as e:
        main(["campaign", "--kinds", "preempt,sigquit"])
    assert e.value.code == 2 and "unknown fault kind(s) sigquit" in capsys.readouterr().err
