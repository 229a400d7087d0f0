"""ValidationTransaction phases on disk, and the five resume rules as a decision table."""

import json
import math

import pytest

from tinyllm.validation.errors import NonFiniteMetricError, ValidationIdentityError
from tinyllm.validation.transaction import (
    PHASE_FILE,
    Journal,
    ValidationTransaction,
    check_identity,
    read_journal,
    resume_action,
)

ID = {"config": {"seed": 0}, "source": {"sha256": "ab"}, "model": {"n": 1}, "weights_digest": "d"}


def test_in_memory_pass_persists_nothing(tmp_path):
    tx = ValidationTransaction(3, ID)
    tx.begin()
    tx.evaluated({"val/loss": 1.5, "val/token_count": 7})
    tx.completed()
    assert tx.state == "completed" and tx.journal.metrics() == {"val/loss": 1.5, "val/token_count": 7}
    assert list(tmp_path.iterdir()) == []


def test_durable_phases_and_exact_metrics(tmp_path):
    tx = ValidationTransaction(5, ID, tmp_path, frame={"train/loss": 2.0})
    marker = tx.marker()
    assert read_journal(tmp_path, marker).phase == "pending_evaluation"
    tx.begin()
    x = 1 / 3
    tx.evaluated({"val/loss": x, "val/batch_count": 2})
    j = read_journal(tmp_path, marker)  # the phase file wins over the marker
    assert j.phase == "publication_pending" and j.metrics()["val/loss"].hex() == x.hex()
    assert j.frame == {"train/loss": 2.0} and isinstance(j.metrics()["val/batch_count"], int)
    tx.completed(archive="/a")
    j = read_journal(tmp_path, marker)
    assert (j.phase, j.archive) == ("completed", "/a")
    assert not [p for p in tmp_path.iterdir() if p.name != PHASE_FILE]  # no temporaries left


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_metric_is_fatal_and_records_nothing(tmp_path, bad):
    tx = ValidationTransaction(5, ID, tmp_path)
    marker = tx.marker()
    tx.begin()
    with pytest.raises(NonFiniteMetricError, match="non-finite val/loss"):
        tx.evaluated({"val/loss": bad, "val/ppl": 2.0})
    assert read_journal(tmp_path, marker).phase == "pending_evaluation"


def j(phase, step=4):
    return Journal(step=step, phase=phase, identity=ID)


def test_resume_rules():
    # 1. completed validation in a full checkpoint is not repeated
    assert resume_action(j("completed"), ckpt_step=4, due=True) == "none"
    # 2. a fresh start (no checkpoint) runs the schedule, step 0 included, from scratch
    assert resume_action(None, ckpt_step=None, due=True) == "none"
    # 3. init_from: a new run at step 0, whatever the checkpoint's journal says
    assert resume_action(j("pending_evaluation"), ckpt_step=4, due=True, init_from=True) == "none"
    # 4. an interrupted evaluation backed by the full pending checkpoint reruns before the next update
    assert resume_action(j("pending_evaluation"), ckpt_step=4, due=True) == "evaluate"
    # 5. evaluation done, publication interrupted: retry only the publication
    assert resume_action(j("publication_pending"), ckpt_step=4, due=True) == "publish"
    # a due step whose checkpoint carries no marker never validated: run it; not due: nothing
    assert resume_action(None, ckpt_step=4, due=True) == "evaluate"
    assert resume_action(None, ckpt_step=4, due=False) == "none"


def test_journal_of_another_step_is_refused():
    with pytest.raises(ValidationIdentityError, match="journal for step 3"):
        resume_action(j("completed", step=3), ckpt_step=4, due=True)


@pytest.mark.parametrize("key", ["config", "source", "model", "weights_digest"])
def test_identity_mismatch_is_fatal(key):
    other = json.loads(json.dumps(ID))
    other[key] = "changed"
    check_identity(ID, dict(ID), 4)
    with pytest.raises(ValidationIdentityError, match=f"another {key}"):
        check_identity(ID, other, 4)
