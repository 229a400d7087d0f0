"""A real ``tinyllm train`` process SIGKILLed at every phase of a durable validation, then resumed.

The kill is real (SIGKILL, uncatchable) and deterministic: the fault-injection point
``TINYLLM_FAULT=validation.<phase>@<step>`` (tinyllm/faults.py) makes the process kill
itself when validation at that step reaches that phase. The resume runs in process (same code as
``tinyllm train``, without a second torch import). Spec: 6 steps, regular checkpoints every 3,
validation every 2 with save_checkpoint (durable at 2, 4, 6); the kill is at step 4.
"""

import signal

import pytest

from tinyllm.validation.errors import ValidationFailure
from val_helpers import LM, frames, journal, spec_dict, tinyllm_popen, train_inprocess, val_frames

pytestmark = pytest.mark.slow  # kills real tinyllm trainers at every phase

SPEC = spec_dict({**LM, "every_steps": 2, "save_checkpoint": True}, checkpoint_every=3)

# phase -> (checkpoint the resume starts from, journal phase left at step 4 by the kill)
EXPECT = {
    "before_marker": ("step-000003", None),
    "after_marker": ("step-000004", "pending_evaluation"),
    "during_evaluation": ("step-000004", "pending_evaluation"),
    "after_evaluation": ("step-000004", "publication_pending"),
    "after_publication": ("step-000004", "completed"),
}


@pytest.fixture(scope="module")
def baseline(corpus_home, tmp_path_factory):
    from val_helpers import make_home

    home = make_home(corpus_home, tmp_path_factory.mktemp("baseline"))
    result = train_inprocess(home, {**SPEC, "name": "base"})
    return result, val_frames(home, "base")


EPHEMERAL = spec_dict({**LM, "every_steps": 2}, checkpoint_every=3)  # save_checkpoint false: step 4 ephemeral
FRESH = spec_dict({**LM, "every_steps": 2, "before_training": True}, checkpoint_every=3)  # killed before any checkpoint
CHANGED_DATA = "An original held-out line, written for this test only.\nAnd a second one for good measure.\n"


def changed_spec(home):
    return spec_dict(
        {**LM, "data": {"path": str(home / "h.txt")}, "every_steps": 2, "save_checkpoint": True}, checkpoint_every=3
    )


@pytest.fixture(scope="module")
def killed(corpus_home, tmp_path_factory):
    """Every real ``tinyllm train`` process of this module, started at once (their torch imports
    overlap): one per phase, SIGKILLed at it; one killed after the marker of step 2 with its own
    held-out file; one with a missing held-out file. name -> (home, returncode, stderr)."""
    from val_helpers import make_home

    procs = {}
    for phase in EXPECT:
        home = make_home(corpus_home, tmp_path_factory.mktemp(phase))
        procs[phase] = (home, tinyllm_popen(home, SPEC, env={"TINYLLM_FAULT": f"validation.{phase}@4"}))
    home = make_home(corpus_home, tmp_path_factory.mktemp("changed"))
    (home / "h.txt").write_text(CHANGED_DATA)
    procs["changed"] = (
        home,
        tinyllm_popen(home, changed_spec(home), env={"TINYLLM_FAULT": "validation.after_marker@2"}),
    )
    home = make_home(corpus_home, tmp_path_factory.mktemp("ephemeral"))
    procs["ephemeral"] = (home, tinyllm_popen(home, EPHEMERAL, env={"TINYLLM_FAULT": "validation.during_evaluation@4"}))
    home = make_home(corpus_home, tmp_path_factory.mktemp("fresh"))
    procs["fresh"] = (home, tinyllm_popen(home, FRESH, env={"TINYLLM_FAULT": "validation.during_evaluation@2"}))
    home = make_home(corpus_home, tmp_path_factory.mktemp("missing"))
    procs["missing"] = (home, tinyllm_popen(home, spec_dict({**LM, "data": {"path": "missing.txt"}})))
    return {name: (home, p.wait(timeout=300), p.stderr.read()) for name, (home, p) in procs.items()}


@pytest.mark.parametrize("phase", list(EXPECT))
def test_kill_at_every_phase_of_a_durable_validation(killed, baseline, phase):
    base, base_val = baseline
    home, returncode, stderr = killed[phase]
    assert returncode == -signal.SIGKILL, stderr
    resume_from, left = EXPECT[phase]
    assert (home / "runs/v/ckpt/LATEST").read_text().strip() == resume_from
    before = journal(home, 4)
    assert (before or {}).get("phase") == left
    frames_before = frames(home)
    assert (4 in val_frames(home)) == (phase == "after_publication")

    result = train_inprocess(home, SPEC)

    # the run ends exactly as the uninterrupted one, with one validation frame per validated step
    assert (result["final_loss_hex"], result["digest"]) == (base["final_loss_hex"], base["digest"])
    assert [f["step"] for f in frames(home)] == [1, 2, 3, 4, 5, 6]
    vals = val_frames(home)
    assert sorted(vals) == [2, 4, 6]
    for s in (2, 4, 6):
        assert vals[s]["val/loss"].hex() == base_val[s]["val/loss"].hex()
    after = journal(home, 4)
    assert after["phase"] == "completed"
    if phase == "after_evaluation":  # publication retried only: the killed process's evaluation kept
        assert after["evaluated_pid"] == before["evaluated_pid"] and after["metrics_hex"] == before["metrics_hex"]
        assert after["completed_pid"] != before["evaluated_pid"]
    if phase == "after_publication":  # not repeated at all
        assert after == before and frames_before[-1]["step"] == 4
    if phase in ("after_marker", "during_evaluation"):  # re-evaluated, deterministically, before update 5
        assert before["evaluated_pid"] is None and after["evaluated_pid"] is not None


def test_kill_during_an_ephemeral_validation_resumes_from_the_latest_full_checkpoint(killed, baseline):
    """No journal for an ephemeral pass: the restart replays update 4 from step 3, then validates 4."""
    base, base_val = baseline
    home, returncode, stderr = killed["ephemeral"]
    assert returncode == -signal.SIGKILL, stderr
    assert (home / "runs/v/ckpt/LATEST").read_text().strip() == "step-000003" and journal(home, 4) is None
    result = train_inprocess(home, EPHEMERAL)
    assert (result["final_loss_hex"], result["digest"]) == (base["final_loss_hex"], base["digest"])
    assert [f["step"] for f in frames(home)] == [1, 2, 3, 4, 5, 6]
    assert {s: f["val/loss"].hex() for s, f in val_frames(home).items()} == {
        s: base_val[s]["val/loss"].hex() for s in (2, 4, 6)
    }


def test_kill_before_the_first_checkpoint_restarts_fresh_with_the_before_training_pass(killed, baseline):
    """Rule 2: a fresh restart reruns the ephemeral step-0 pass; the killed attempt's frames are dropped."""
    base, _ = baseline
    home, returncode, stderr = killed["fresh"]
    assert returncode == -signal.SIGKILL, stderr
    assert [f["step"] for f in frames(home)] == [0, 1] and not (home / "runs/v/ckpt/LATEST").exists()
    result = train_inprocess(home, FRESH)
    assert result["resumed_from"] is None and result["final_loss_hex"] == base["final_loss_hex"]
    assert [f["step"] for f in frames(home)] == [0, 1, 2, 3, 4, 5, 6] and sorted(val_frames(home)) == [0, 2, 4, 6]


def test_changed_heldout_file_refuses_the_pending_validation(killed):
    """A pending validation's source identity must match on resume; otherwise fatal (exit 2), nothing rerun."""
    home, returncode, stderr = killed["changed"]
    assert returncode == -signal.SIGKILL, stderr
    (home / "h.txt").write_text("Someone edited the held-out file between the kill and the resume.\n")
    with pytest.raises(ValidationFailure, match="pending validation at step 2 was recorded with another source") as e:
        train_inprocess(home, changed_spec(home))
    assert e.value.exit_code == 2
    assert journal(home, 2)["phase"] == "pending_evaluation"
    assert [f["step"] for f in frames(home)] == [1]  # no frame at 2, no update 3


def test_cli_bad_heldout_file_exit_2_nothing_written(killed):
    home, returncode, stderr = killed["missing"]
    assert returncode == 2 and "validation data file not found" in stderr and len(stderr.strip().splitlines()) == 1
    assert not (home / "runs").exists()
