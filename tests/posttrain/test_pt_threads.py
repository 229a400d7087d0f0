"""Each post-training objective gives the same bits for 1, 2 and 3 torch threads (the count is
chosen by load at each start, tinyllm/omp.py; a spec's threads is only the most it uses)."""
from __future__ import annotations

import pytest

from pt_helpers import copy_home, spec, train_inprocess


def _bigger(d: dict, threads: int) -> dict:
    """10 steps (AdamW's first updates are about sign(g): a last-bit gradient difference hides there)
    and, for the RL objectives, more and longer rollouts, so LayerNorm sums over enough rows."""
    d = {**d, "threads": threads, "steps": 10}
    if "rl" in d:
        d["batch_size"] = 4
        d["rl"] = {**d["rl"], "n_mini": 1, "sampling": {"max_tokens": 8}}
    if d["objective"] == "grpo":  # the tiny base's rewards are all equal (zero advantages): the KL term
        d["ref"], d["rl"]["kl_beta"] = {"build_ref": True}, 0.5  # gives the gradient
    return d


@pytest.mark.parametrize("kind", ["dpo", "grpo", "opd"])
def test_objective_is_the_same_bits_for_1_2_3_threads(pt_home, tmp_path, kind):
    got = {}
    for t in (1, 2, 3):
        home = copy_home(pt_home, tmp_path / f"home{t}")
        r = train_inprocess(home, _bigger(spec(kind), t))
        got[t] = (r["final_loss_hex"], r["digest"])
    assert got[2] == got[1] and got[3] == got[1], got
