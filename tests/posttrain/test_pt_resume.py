"""Exact resume of every objective after a real SIGKILL, with dropout and sampling on; validation
that never changes training; the weight-version, schema, non-finite and identity checks firing.

The kills are real: a ``tinyllm train`` process per objective (all started at once, so their torch
imports overlap) is SIGKILLed as soon as its progress file shows a checkpoint at step >= 2, wherever
it then is; the resume runs in process and must equal an uninterrupted run bit for bit: final loss,
weights digest, every step's loss (float.hex) and every validation frame."""

import json
import shutil
import signal
import time

import pytest

from pt_helpers import (
    BASE,
    SPECS,
    VALIDATION,
    copy_home,
    frames,
    spec,
    tinyllm_popen,
    train_inprocess,
    train_losses,
    val_frames,
    without_timers,
)
from tinyllm.spec import SpecError
from tinyllm.trainer import TrainerHooks
from tinyllm.validation.errors import NonFiniteMetricError

KILL_SPECS = {
    "dpo": spec("dpo", VALIDATION["dpo"], steps=12, checkpoint_every=1),
    "grpo": spec("grpo", VALIDATION["grpo"], steps=8, checkpoint_every=1),
    "opd": spec("opd", VALIDATION["opd"], steps=8, checkpoint_every=1),
    # a durable validation (save_checkpoint) killed during its evaluation at trainer step 2 (model step 4)
    "grpo-pending": spec("grpo", {**VALIDATION["grpo"], "save_checkpoint": True}, name="grpo-pending", steps=3),
    # killed after its durable validation at trainer step 2 recorded completion, before the frame was emitted
    "grpo-unframed": spec("grpo", {**VALIDATION["grpo"], "save_checkpoint": True}, name="grpo-unframed", steps=3),
}
KILL_ENV = {
    "grpo-pending": {"TINYLLM_FAULT": "validation.during_evaluation@2"},
    "grpo-unframed": {"TINYLLM_FAULT": "validation.before_frame@2"},
}
# The others are SIGKILLed by the poller below wherever they are once a checkpoint >= 2 shows; they hold
# (TINYLLM_FAULT=trainer.hold) two steps before their end so that a starved poller cannot let one finish first (a CI
# run on a contended machine had grpo and opd end before their kill). The hold is not a kill point: the kill
# lands anywhere from checkpoint 2 to the hold.
HOLD_ENV = {
    kind: {"TINYLLM_FAULT": f"trainer.hold@{s['steps'] - 2}"} for kind, s in KILL_SPECS.items() if kind not in KILL_ENV
}


def _progress_step(path) -> int:
    try:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return max((x["step"] for x in lines if "checkpoint" in x), default=-1)  # checkpoint lines only
    except (OSError, ValueError):
        return -1


def _undelivered(home, name: str, pid: int) -> set[int]:
    """Steps whose validation the killed process recorded as completed in a full checkpoint but whose
    frame it never wrote: the kill fell between the two. The seed makes that delivery at-most-once (the
    checkpoint is authoritative; a resume does not repeat a completed validation), so such a frame is
    legitimately missing; anything else missing is a bug."""
    from tinyllm.validation.transaction import read_journal

    written = {f["step"] for f in frames(home, name)}
    out = set()
    for d in sorted((home / "runs" / name / "ckpt").glob("step-*")):
        journal = read_journal(d, None)
        if (
            journal is not None
            and journal.phase == "completed"
            and journal.completed_pid == pid
            and journal.step not in written
        ):
            out.add(journal.step)
    return out


@pytest.fixture(scope="module")
def killed(pt_home, tmp_path_factory):
    procs = {}
    for kind, s in KILL_SPECS.items():
        home = copy_home(pt_home, tmp_path_factory.mktemp(f"kill-{kind}") / "home")
        progress = home / "progress.jsonl"
        # niced: four trainers on two CPUs must not starve the poller below past the kill point (a CI run
        # had two of them finish before their kill)
        procs[kind] = (
            home,
            progress,
            tinyllm_popen(home, s, progress, env=KILL_ENV.get(kind) or HOLD_ENV[kind], nice=10),
        )
    deadline = time.monotonic() + 300
    out = {}
    while procs and time.monotonic() < deadline:
        for kind, (home, progress, p) in list(procs.items()):
            # one read of the progress file decides both (read twice, a checkpoint line landing in between
            # meant a wait for a trainer never killed: it held at its hold point past the wait's 60 s)
            kill = kind not in KILL_ENV and _progress_step(progress) >= 2
            if kill:
                p.send_signal(signal.SIGKILL)
            if kill or p.poll() is not None:
                p.wait(timeout=60)
                out[kind] = (
                    home,
                    p.returncode,
                    p.stderr.read(),
                    _progress_step(progress),
                    _undelivered(home, KILL_SPECS[kind]["name"], p.pid),
                )
                del procs[kind]
        time.sleep(0.01)
    assert not procs, f"not killed in time: {sorted(procs)}"
    return out


@pytest.fixture(scope="module")
def baselines(pt_home, tmp_path_factory):
    home = copy_home(pt_home, tmp_path_factory.mktemp("baselines") / "home")
    return home, {kind: train_inprocess(home, s) for kind, s in KILL_SPECS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KILL_SPECS))
def test_sigkill_then_resume_is_bitwise_equal(killed, baselines, kind):
    home, returncode, stderr, at, undelivered = killed[kind]
    assert returncode == -signal.SIGKILL, stderr[-2000:]
    steps = KILL_SPECS[kind]["steps"]
    assert at < steps, "the run finished before the kill; the spec is too short"
    name = KILL_SPECS[kind]["name"]
    result = train_inprocess(home, KILL_SPECS[kind])
    assert result["resumed_from"] is not None
    base_home, base = baselines
    assert (result["final_loss_hex"], result["digest"]) == (base[kind]["final_loss_hex"], base[kind]["digest"])
    resumed_at = int(result["resumed_from"].rstrip("/").rsplit("step-", 1)[1])
    assert undelivered <= {resumed_at}, undelivered  # only the resume step's frame can be lost in that window
    if kind == "grpo-unframed":  # the window hit on purpose: lost once, the validation not repeated
        assert undelivered == {2} and resumed_at == 2
    want_losses = [x for x in train_losses(base_home, name) if x[0] not in undelivered]
    assert train_losses(home, name) == want_losses and len(want_losses) == steps - len(undelivered)
    got = {s: without_timers(f) for s, f in val_frames(home, name).items()}
    want = {s: without_timers(f) for s, f in val_frames(base_home, name).items() if s not in undelivered}
    assert got == want and steps in got


@pytest.mark.parametrize("kind", list(SPECS))
def test_validation_never_changes_training(home, kind):
    off = train_inprocess(home, spec(kind, name="off"))
    on = train_inprocess(home, spec(kind, {**VALIDATION[kind], "before_training": True}, name="on"))
    assert (on["final_loss_hex"], on["digest"]) == (off["final_loss_hex"], off["digest"])
    assert train_losses(home, "on") == train_losses(home, "off")
    assert val_frames(home, "on") and not val_frames(home, "off")


class StaleRollout(TrainerHooks):
    """After trainer step 1, the rollout module serves a weight version other than the model step."""

    def after_step(self, trainer, step, frame):
        if step == 1:
            trainer.objective.rollout.version -= 1


@pytest.mark.parametrize("kind", ["grpo", "opd"])
def test_weight_version_mismatch_is_fatal(home, kind):
    from tinyllm.objectives.rollout import WeightVersionError

    s = spec(kind, {**VALIDATION[kind], "every_steps": 2})  # model step 2 = trainer step 1
    with pytest.raises(WeightVersionError, match="weight version 1, but the request is pinned to model step 2"):
        train_inprocess(home, s, hooks=StaleRollout())
    assert 1 not in val_frames(home, kind)  # no frame
    assert all(f["step"] < 1 for f in frames(home, kind))  # step 1's frame was to carry val/*: none
    assert not (home / "runs" / kind / "ckpt" / "step-000002").exists()  # no further update


def test_metric_schema_mismatch_is_fatal(home, monkeypatch):
    from tinyllm.validation import runner
    from tinyllm.validation.metric_schema import MetricSchemaError

    real = runner.evaluate_generation

    def extra_key(*a, **k):
        metrics, rollouts = real(*a, **k)
        return {**metrics, "val/surprise": 1.0}, rollouts

    monkeypatch.setattr(runner, "evaluate_generation", extra_key)
    with pytest.raises(MetricSchemaError, match=r"unexpected \['val/surprise'\]"):
        train_inprocess(home, spec("grpo", VALIDATION["grpo"]))
    assert not val_frames(home, "grpo")

    def int_reward(*a, **k):
        metrics, rollouts = real(*a, **k)
        return {**metrics, "val/reward_avg": 0}, rollouts

    monkeypatch.setattr(runner, "evaluate_generation", int_reward)
    with pytest.raises(MetricSchemaError, match=r"wrong type \[\('val/reward_avg', 'int'\)\]"):
        train_inprocess(home, spec("grpo", VALIDATION["grpo"], name="g2"))


def test_non_finite_dpo_metric_is_fatal(home, monkeypatch):
    from tinyllm.objectives.dpo import DPOObjective

    real = DPOObjective.evaluate
    monkeypatch.setattr(DPOObjective, "evaluate", lambda *a, **k: {**real(*a, **k), "val/loss": float("nan")})
    with pytest.raises(NonFiniteMetricError, match="val/loss=nan"):
        train_inprocess(home, spec("dpo", VALIDATION["dpo"]))
    assert not val_frames(home, "dpo") and all(f["step"] < 2 for f in frames(home, "dpo"))


def test_changed_sampling_or_init_checkpoint_refuses_to_resume(home):
    train_inprocess(home, spec("grpo", steps=2))
    hotter = {**spec("grpo")["rl"], "sampling": {"max_tokens": 3, "temperature": 0.7}}
    with pytest.raises(SpecError, match=r"different spec \(fields: rl\)"):
        train_inprocess(home, spec("grpo", steps=3, rl=hotter))
    shutil.rmtree(home / "runs/base")
    train_inprocess(home, {**BASE, "seed": 11})  # another base checkpoint at the same place
    with pytest.raises(SpecError, match="another post-training identity.*init_digest"):
        train_inprocess(home, spec("grpo", steps=3))
