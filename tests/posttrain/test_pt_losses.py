"""Losses and advantages on hand-computed tiny cases, and the step-0 identities inside the trainer."""

import math

import pytest
import torch

from pt_helpers import DPO_VAL, GEN_VAL, spec, train_inprocess, val_frames, frames
from tinyllm.objectives.dpo import dpo_loss
from tinyllm.objectives.grpo import clipped_objective, group_advantages, k3_kl
from tinyllm.objectives.common import pack
from tinyllm.objectives.opd import loo_baseline


def test_dpo_loss_by_hand():
    # policy/reference summed log-probs of (chosen, rejected) for two pairs
    pc, pr = torch.tensor([-2.0, -5.0]), torch.tensor([-4.0, -3.0])
    rc, rr = torch.tensor([-3.0, -4.0]), torch.tensor([-3.0, -4.0])
    loss, r_c, r_r = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # pair 1: r+ = 0.5*(1) = 0.5, r- = 0.5*(-1) = -0.5, margin 1 -> -log sigmoid(1)
    # pair 2: r+ = 0.5*(-1) = -0.5, r- = 0.5*(1) = 0.5, margin -1 -> -log sigmoid(-1)
    assert r_c.tolist() == [0.5, -0.5] and r_r.tolist() == [-0.5, 0.5]
    want = [math.log1p(math.exp(-1.0)), math.log1p(math.exp(1.0))]
    assert loss.tolist() == pytest.approx(want, rel=1e-6)
    same = dpo_loss(pc, pr, pc, pr, beta=0.1)[0]
    assert same.tolist() == [torch.tensor(math.log(2.0)).float().item()] * 2  # policy = reference: ln 2


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    adv = group_advantages(r, "group", eps=1e-4)  # group 1: mean 0.5, population std 0.5
    assert adv[0].tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001])
    assert adv[1].tolist() == [0.0] * 4  # zero std: no signal
    assert group_advantages(r, "none")[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_clipped_objective_by_hand():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.1]]))  # ratios 1, 1.5, 0.5, 1.1
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    loss, clip_ratio, ratio = clipped_objective(new, old, adv, mask, clip_eps=0.2)
    # per token -min(pA, clip(p)A): -1, -min(1.5, 1.2) = -1.2, -min(-0.5, -0.8) = 0.8, -min(-1.1, -1.1) = 1.1
    assert loss.item() == pytest.approx((-1.0 - 1.2 + 0.8 + 1.1) / 4, rel=1e-6)
    assert clip_ratio.item() == 0.5 and ratio.item() == pytest.approx((1 + 1.5 + 0.5 + 1.1) / 4, rel=1e-6)
    half = torch.tensor([[1.0, 1.0, 0.0, 0.0]])  # masked tokens carry no weight
    assert clipped_objective(new, old, adv, half, 0.2)[0].item() == pytest.approx((-1.0 - 1.2) / 2, rel=1e-6)


def test_k3_kl_by_hand():
    new, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # ref/pi = 0.5: 0.5 - log 0.5 - 1
    assert k3_kl(new, ref).item() == pytest.approx(0.5 + math.log(2.0) - 1.0, rel=1e-6)
    assert k3_kl(new, new).item() == 0.0


def test_opd_leave_one_out_baseline_by_hand():
    # two prompts x three rollouts; rollout 3 of prompt 1 is one token shorter (mask 0 at position 2)
    k = torch.tensor(
        [[1.0, 4.0, 2.0], [3.0, 0.0, 6.0], [5.0, 2.0, 9.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [6.0, 3.0, 0.0]]
    )
    mask = torch.tensor(
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    )
    b = loo_baseline(k * mask, mask, group=3)
    assert b[:3].tolist() == [[4.0, 1.0, 6.0], [3.0, 3.0, 2.0], [2.0, 2.0, 0.0]]  # position 2: others of row 3 absent
    # prompt 2, position 0: only row 6 has a token there, no other rollout -> baseline 0
    assert b[3:].tolist() == [[0.0, 2.5, 1.0], [0.0, 2.0, 0.5], [0.0, 1.5, 1.5]]
    # a rollout's own value never enters its own baseline
    k2 = k.clone()
    k2[0, 0] = 100.0
    assert loo_baseline(k2 * mask, mask, group=3)[0].tolist() == b[0].tolist()


def test_pack_masks_only_completion_targets():
    x, y, mask = pack([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]])
    assert x.tolist() == [[1, 2, 3, 5], [4, 7, 8, 0]] and y.tolist() == [[2, 3, 5, 6], [7, 8, 9, 0]]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]


def test_dpo_at_step_0_is_ln2_with_zero_margins(home):
    train_inprocess(home, spec("dpo", {**DPO_VAL, "before_training": True, "every_steps": 0}, steps=1))
    v = val_frames(home, "dpo")[0]
    assert v["val/loss"] == pytest.approx(math.log(2.0), abs=1e-7)
    assert (v["val/reward_margin"], v["val/reward_chosen"], v["val/reward_rejected"]) == (0.0, 0.0, 0.0)
    assert v["val/policy_err_chosen"] == v["val/ref_err_chosen"] and v["val/pair_count"] == 7
    assert v["val/batch_count"] == 3  # 7 pairs, batches of 3: 3 + 3 + 1 (the short one is not dropped)


def test_grpo_one_update_per_batch_has_ratio_1_and_no_clipping(home):
    s = spec("grpo", steps=2, model={**spec("grpo")["model"], "dropout": 0.0}, rl={**spec("grpo")["rl"], "n_mini": 1})
    train_inprocess(home, s)
    for f in frames(home, "grpo"):
        assert f["train/clip_ratio"] == 0.0
        assert f["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert f["rollout/count"] == 2 * 3 and f["train/model_step"] == f["step"]


def test_grpo_frame_and_generation_validation_counts(home):
    train_inprocess(home, spec("grpo", {**GEN_VAL, "before_training": True}))
    f = frames(home, "grpo")[-1]
    for k in (
        "train/reward_mean",
        "train/reward_std",
        "train/frac_reward_zero_std",
        "train/kl",
        "train/clip_ratio",
        "rollout/mean_length",
        "rollout/count",
        "val/reward_avg",
        "val/exact_match",
        "val/numeric_count",
    ):
        assert k in f, k
    v = val_frames(home, "grpo")
    # 3 batches x n_mini 2 = 6 model steps; every_steps 2 -> model steps 0, 2, 4, 6 (trainer steps 0..3)
    assert sorted(v) == [0, 1, 2, 3] and [v[s]["val/step"] for s in sorted(v)] == [0, 2, 4, 6]
    assert v[3]["val/train_total_steps"] == 6 and v[3]["val/rollout_count"] == 5 * 1
