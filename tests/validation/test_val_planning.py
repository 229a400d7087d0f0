"""Checkpoint component planning: union with a regular save, full/partial/none, and the exceptions."""

import warnings

import pytest

from tinyllm.validation_config import ValidationConfig
from tinyllm.validation.planning import FULL, PartialCheckpointWarning, plan_step

D = {"path": "h.txt"}


def cfg(**kw):
    return ValidationConfig(enabled=True, data=D, **kw)


def plan(step=4, total=8, **kw):
    kw.setdefault("validation_due", True)
    kw.setdefault("regular_due", False)
    kw.setdefault("fresh", True)
    return plan_step(step, total, **kw)


def test_no_save_no_regular_is_ephemeral():
    p = plan(cfg=cfg())
    assert (p.validate, p.kind, p.durable) == (True, "none", False)


def test_coincident_regular_save_makes_validation_durable_and_writes_once():
    p = plan(cfg=cfg(), regular_due=True)
    assert (p.kind, p.components, p.durable) == ("full", FULL, True)
    p2 = plan(cfg=cfg(save_checkpoint=True), regular_due=True)
    assert p2.components == FULL and p2.durable


def test_full_request_alone_is_durable():
    p = plan(cfg=cfg(save_checkpoint=True))
    assert p.kind == "full" and p.durable


def test_proper_subset_warns_and_is_a_partial_artifact_after_validation():
    with pytest.warns(PartialCheckpointWarning, match="non-resumable"):
        p = plan(cfg=cfg(save_checkpoint=True, checkpoint_components=["model"]))
    assert (p.kind, p.components, p.durable) == ("partial", frozenset({"model"}), False)


def test_subset_unioned_with_regular_is_full_and_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = plan(cfg=cfg(save_checkpoint=True, checkpoint_components=["model"]), regular_due=True)
    assert p.kind == "full"


def test_inactive_subset_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan(cfg=cfg(checkpoint_components=["model"]))  # save_checkpoint false
        plan(cfg=cfg(save_checkpoint=True, checkpoint_components=["model"]), validation_due=False)


def test_pure_before_training_pass_writes_nothing_even_with_save_checkpoint():
    p = plan(step=0, cfg=cfg(save_checkpoint=True, before_training=True))
    assert (p.validate, p.kind, p.durable) == (True, "none", False)


def test_termination_at_fresh_step_zero_exits_without_evaluating_or_saving():
    p = plan(step=0, cfg=cfg(save_checkpoint=True, before_training=True), termination_requested=True)
    assert (p.validate, p.kind, p.exit_before_validation) == (False, "none", True)


def test_termination_at_post_update_boundary_forces_full_pending_checkpoint():
    for c in (cfg(), cfg(save_checkpoint=True, checkpoint_components=["model"])):
        p = plan(cfg=c, termination_requested=True)
        assert (p.validate, p.kind, p.durable, p.exit_before_validation) == (False, "full", True, True)


def test_zero_step_final_is_checkpoint_free_unless_save_checkpoint():
    assert plan(step=0, total=0, cfg=cfg()).kind == "none"
    assert plan(step=0, total=0, cfg=cfg(save_checkpoint=True)).kind == "full"


def test_no_validation_due_keeps_the_regular_plan():
    assert plan(cfg=cfg(), validation_due=False, regular_due=True).components == FULL
    assert plan(cfg=cfg(), validation_due=False).kind == "none"
