"""Validation inside the real trainer (in process): frames, isolation, planning, failures, SIGTERM."""

import io
import json
import warnings

import pytest

from tinyllm.errors import STOP
from tinyllm.validation.errors import ArchiveError, NonFiniteMetricError, ValidationDataError
from tinyllm.validation.planning import PartialCheckpointWarning
from val_helpers import GEN, LM, frames, journal, spec_dict, tinyllm_cli, train_inprocess, val_frames


@pytest.fixture(autouse=True)
def clear_stop_flag():
    """The trainer's SIGTERM flag is process-global; no test may leave it set."""
    STOP.update(requested=False, signal=None)
    yield
    STOP.update(requested=False, signal=None)


def train_losses(home, name="v"):
    return [(f["step"], f["train/loss"].hex()) for f in frames(home, name) if "train/loss" in f]


@pytest.mark.parametrize("validation, accum", [(LM, 1), (GEN, 1), (LM, 2)])
def test_validation_does_not_perturb_training_bitwise(home, validation, accum):
    """Dropout is on, so a validation pass that touched the RNG or the mode would change the losses."""
    off = train_inprocess(home, spec_dict(name="off", grad_accum_steps=accum))
    on = train_inprocess(
        home, spec_dict({**validation, "before_training": True, "every_steps": 2}, name="on", grad_accum_steps=accum)
    )
    assert (on["final_loss_hex"], on["digest"]) == (off["final_loss_hex"], off["digest"])
    assert train_losses(home, "on") == train_losses(home, "off") and len(train_losses(home, "off")) == 6
    assert sorted(val_frames(home, "on")) == [0, 2, 4, 6]


@pytest.mark.parametrize("steps, expected", [(4, [0, 2, 4]), (3, [0, 2, 3])])
def test_seed_schedule_examples_in_the_trainer(home, steps, expected):
    train_inprocess(home, spec_dict({**LM, "before_training": True, "every_steps": 2}, steps=steps))
    fs = frames(home)
    assert [f["step"] for f in fs] == list(range(0, steps + 1))  # one frame per step, step 0 = validation only
    assert sorted(val_frames(home)) == expected
    assert not any(k.startswith("train/") for k in fs[0])


def test_lm_frame_keys_and_counts(home):
    train_inprocess(home, spec_dict({**LM, "every_steps": 0, "max_samples": 2}, steps=2))
    f = val_frames(home)[2]
    assert {"train/loss", "val/loss", "val/ppl", "val/token_count", "val/batch_count", "timer/validation_s"} <= set(f)
    assert (f["val/token_count"], f["val/batch_count"]) == (2 * 16, 1)  # 2 windows x block_size, batch 4


def test_generation_frame_keys(home):
    train_inprocess(home, spec_dict({**GEN, "every_steps": 0}, steps=2))
    f = val_frames(home)[2]
    for k in (
        "val/reward_avg",
        "val/reward_std",
        "val/reward_min",
        "val/reward_max",
        "val/exact_match",
        "val/exact_match_count",
        "val/contains",
        "val/nonempty_count",
        "timer/validation_s",
    ):
        assert k in f, k
    assert (f["val/rollout_count"], f["val/step"], f["val/train_total_steps"]) == (8 * 2, 2, 2)


def test_coincident_regular_save_is_durable_and_completed(home):
    train_inprocess(home, spec_dict({**LM, "every_steps": 2}, checkpoint_every=4))
    ckpts = sorted(p.name for p in (home / "runs/v/ckpt").iterdir() if p.name.startswith("step-"))
    assert ckpts == ["step-000004", "step-000006"]  # save_checkpoint false: step 2 stays ephemeral
    assert journal(home, 4)["phase"] == "completed" and journal(home, 6)["phase"] == "completed"
    assert float.fromhex(journal(home, 4)["metrics_hex"]["val/loss"]) == val_frames(home)[4]["val/loss"]


def test_full_save_checkpoint_and_before_training_writes_no_step_zero(home):
    train_inprocess(home, spec_dict({**LM, "every_steps": 2, "save_checkpoint": True, "before_training": True}))
    ckpts = sorted(p.name for p in (home / "runs/v/ckpt").iterdir() if p.name.startswith("step-"))
    assert ckpts == ["step-000002", "step-000004", "step-000006"]
    assert 0 in val_frames(home)


def test_partial_components_warn_and_make_a_non_resumable_artifact(home):
    v = {**LM, "every_steps": 2, "save_checkpoint": True, "checkpoint_components": ["model"]}
    with pytest.warns(PartialCheckpointWarning):
        train_inprocess(home, spec_dict(v, steps=4, checkpoint_every=3))
    art = home / "runs/v/checkpoint_artifacts"
    assert sorted(p.name for p in art.iterdir()) == ["iter_000002"]  # step 4 is final: unioned to full
    assert json.loads((art / "iter_000002/manifest.json").read_text())["components"] == ["model"]
    assert (home / "runs/v/ckpt/LATEST").read_text().strip() == "step-000004"
    assert sorted(p.name for p in (home / "runs/v/ckpt").iterdir() if p.name.startswith("step-")) == [
        "step-000003",
        "step-000004",
    ]


def test_inactive_subset_does_not_warn(home):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialCheckpointWarning)
        train_inprocess(home, spec_dict({**LM, "checkpoint_components": ["model"]}, steps=2))


def test_overlapping_heldout_source_is_refused_before_any_work(home):
    from tinyllm.builtin_text import builtin_text

    (home / "leak.txt").write_text(builtin_text()[:400])
    with pytest.raises(ValidationDataError, match="overlaps"):
        train_inprocess(home, spec_dict({**LM, "data": {"path": "leak.txt"}}))
    assert not (home / "runs").exists()


def test_non_finite_metric_is_fatal_no_frame_no_update(home, monkeypatch):
    """Fake: evaluate_lm is replaced to return NaN (a real model does not produce one on demand)."""
    import tinyllm.validation.runner as runner

    real = runner.evaluate_lm
    monkeypatch.setattr(runner, "evaluate_lm", lambda *a, **k: {**real(*a, **k), "val/loss": float("nan")})
    with pytest.raises(NonFiniteMetricError, match="non-finite val/loss"):
        train_inprocess(home, spec_dict({**LM, "every_steps": 2}, checkpoint_every=2))
    assert [f["step"] for f in frames(home)] == [1]  # no frame at 2, no update 3
    assert journal(home, 2)["phase"] == "pending_evaluation"  # the durable journal stays pending


def test_sigterm_at_a_validation_boundary_writes_full_pending_checkpoint(home):
    """The trainer's SIGTERM flag is set during update 4 (as its signal handler does)."""
    from tinyllm.trainer import TrainerHooks

    class StopAt(TrainerHooks):
        def after_step(self, trainer, step, frame):
            if step == 4:
                STOP["requested"] = True

    v = {**LM, "every_steps": 2}
    base = train_inprocess(home, spec_dict(v, name="base"))
    r = train_inprocess(home, spec_dict(v), hooks=StopAt())
    STOP["requested"] = False
    assert r["canceled"] and r["steps"] == 4
    assert journal(home, 4)["phase"] == "pending_evaluation" and 4 not in val_frames(home)
    r2 = train_inprocess(home, spec_dict(v))  # resume: evaluate step 4 before update 5
    assert (r2["final_loss_hex"], r2["digest"]) == (base["final_loss_hex"], base["digest"])
    assert val_frames(home)[4]["val/loss"].hex() == val_frames(home, "base")[4]["val/loss"].hex()
    assert [f["step"] for f in frames(home)] == [1, 2, 3, 4, 5, 6]


def test_sigterm_before_the_fresh_before_training_pass_exits_without_evaluating(home):
    from tinyllm.trainer import TrainerHooks

    class StopNow(TrainerHooks):
        def on_start(self, trainer):
            STOP["requested"] = True

    r = train_inprocess(home, spec_dict({**LM, "before_training": True, "save_checkpoint": True}), hooks=StopNow())
    STOP["requested"] = False
    assert r["canceled"] and r["steps"] == 0
    assert frames(home) == [] and not (home / "runs/v/ckpt/LATEST").exists()
    train_inprocess(home, spec_dict({**LM, "before_training": True}))  # a fresh start retries it
    assert 0 in val_frames(home)


def test_strict_archive_failure_stops_and_resume_retries_only_publication(home):
    v = {**LM, "every_steps": 0, "checkpoint": {"archive_dir": "archive"}}
    (home / "archive").write_text("a file where the archive directory should be")
    with pytest.raises(ArchiveError):
        train_inprocess(home, spec_dict(v, steps=2))
    j = journal(home, 2)
    assert j["phase"] == "publication_pending" and 2 not in val_frames(home)
    (home / "archive").unlink()
    train_inprocess(home, spec_dict(v, steps=2))
    j2 = journal(home, 2)
    assert j2["phase"] == "completed" and j2["metrics_hex"] == j["metrics_hex"]
    assert (home / "archive/v/step-000002/model.pt").exists()
    assert val_frames(home)[2]["val/loss"].hex() == j["metrics_hex"]["val/loss"]


def test_partial_artifact_archive_is_best_effort_full_one_strict(home):
    """Archive copies always fail here: step 2 (partial artifact) warns and goes on; step 4 (final,
    full) stops before completing, with the publication pending."""
    v = {
        **LM,
        "every_steps": 2,
        "save_checkpoint": True,
        "checkpoint_components": ["model", "optimizer"],
        "checkpoint": {"archive_dir": "archive"},
    }
    (home / "archive").write_text("a file: every archive copy fails")
    log = io.StringIO()
    with pytest.warns(PartialCheckpointWarning), pytest.raises(ArchiveError, match="strict archive copy"):
        train_inprocess(home, spec_dict(v, steps=4, checkpoint_every=100), log=log)
    assert "best-effort for partial artifacts" in log.getvalue()
    assert sorted(val_frames(home)) == [2] and [f["step"] for f in frames(home)] == [1, 2, 3]
    assert (home / "runs/v/checkpoint_artifacts/iter_000002/manifest.json").exists()
    assert journal(home, 4)["phase"] == "publication_pending"


def test_console_prints_every_validation_frame(home, capsys):
    train_inprocess(home, spec_dict({**LM, "every_steps": 2}, steps=4, log_every=1000))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "val/loss" in ln]
    assert [ln.split("|")[0].split()[1] for ln in lines] == ["2/4", "4/4"]


def test_sigterm_during_an_ephemeral_validation_abandons_it_and_the_resume_runs_it_once(home, monkeypatch):
    """SIGTERM (the flag its handler sets) arrives while step 2's ephemeral validation runs: the pass is
    abandoned after its batch in flight (no val figure, and the step's frame waits with it), the stop
    checkpoint at 2 carries the validation pending, and the resume evaluates it once, before update 3,
    with the uninterrupted run's bits."""
    import tinyllm.validation.runner as runner

    real = runner.evaluate_lm

    def evaluate_then_signal(*a, **k):
        STOP["requested"] = True
        return real(*a, **k)

    v = {**LM, "every_steps": 2}
    base = train_inprocess(home, spec_dict(v, name="base"))
    monkeypatch.setattr(runner, "evaluate_lm", evaluate_then_signal)
    r = train_inprocess(home, spec_dict(v))
    monkeypatch.setattr(runner, "evaluate_lm", real)
    STOP["requested"] = False
    assert r["canceled"] and r["steps"] == 2 and r["checkpoint"] == "runs/v/ckpt/step-000002"
    assert journal(home, 2)["phase"] == "pending_evaluation"  # seen red without the abandon: completed
    assert [f["step"] for f in frames(home)] == [1] and val_frames(home) == {}  # no partial figure
    r2 = train_inprocess(home, spec_dict(v))
    assert [f["step"] for f in frames(home)] == [1, 2, 3, 4, 5, 6] and sorted(val_frames(home)) == [2, 4, 6]
    assert (r2["final_loss_hex"], r2["digest"]) == (base["final_loss_hex"], base["digest"])
    assert {s: f["val/loss"].hex() for s, f in val_frames(home).items()} == {
        s: f["val/loss"].hex() for s, f in val_frames(home, "base").items()
    }


@pytest.mark.slow
def test_cli_strict_archive_failure_is_one_line_exit_1(home):
    """The real ``tinyllm train``: a failed strict archive copy is retryable (exit 1), one clear line, no traceback."""
    v = {**LM, "every_steps": 0, "checkpoint": {"archive_dir": "archive"}}
    (home / "archive").write_text("a file where the archive directory should be")
    r = tinyllm_cli(home, spec_dict(v, steps=2))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "strict archive copy" in r.stderr.strip().splitlines()[-1]
