"""Held-out lm loss and generation against tinyllm's real GPT (small config, CPU, seconds)."""

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinyllm import tokenizer
from tinyllm.model import GPT
from tinyllm.spec import ModelConfig
from tinyllm.validation.generation import evaluate_generation
from tinyllm.validation.isolation import isolated
from tinyllm.validation.lm import IGNORE, evaluate_lm, windows

BLOCK = 16
CFG = ModelConfig(block_size=BLOCK, n_layer=1, n_head=2, n_embd=16)
TEXT = "The keeper climbed the stairs before dawn, counting each step.\nBelow the tower the harbour lay quiet."
PROMPTS = [
    {"prompt": "Q: two plus two?\nA:", "response": "4"},
    {"prompt": "Q: sky?\nA:", "response": "blue"},
    {"prompt": "Q: no answer\nA:", "response": None},
]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 1, "repetition_penalty": 1.0, "n_generation": 1, "max_tokens": 6}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(CFG)


def test_windows_cover_every_target_once_and_pad_the_last():
    toks = tokenizer.encode(TEXT)
    w = windows(toks, BLOCK)
    assert len(w) == math.ceil((len(toks) - 1) / BLOCK)
    ys = np.concatenate([y for _, y in w])
    assert (ys != IGNORE).sum() == len(toks) - 1
    assert list(ys[ys != IGNORE]) == list(toks[1:])
    assert len(windows(toks, BLOCK, max_samples=2)) == 2


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_lm_counts_exclude_padding_and_loss_is_token_weighted(model, batch):
    toks = tokenizer.encode(TEXT)
    with isolated(model):
        m = evaluate_lm(model, toks, block_size=BLOCK, batch_size=batch)
    assert m["val/token_count"] == len(toks) - 1
    assert m["val/batch_count"] == math.ceil(math.ceil((len(toks) - 1) / BLOCK) / batch)
    # independent reference: each window unpadded, batch of one, summed per token
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(toks) - 1, BLOCK):
            x = torch.tensor(toks[s : s + BLOCK], dtype=torch.long)[None]
            y = torch.tensor(toks[s + 1 : s + 1 + BLOCK], dtype=torch.long)[None]
            x = x[:, : y.size(1)]
            total += float(F.cross_entropy(model(x)[0][0], y[0], reduction="sum"))
    assert m["val/loss"] == pytest.approx(total / (len(toks) - 1), rel=1e-5)
    assert m["val/ppl"] == pytest.approx(math.exp(m["val/loss"]))


def test_lm_is_deterministic_bit_for_bit_and_capped(model):
    toks = tokenizer.encode(TEXT)
    with isolated(model):
        a = evaluate_lm(model, toks, block_size=BLOCK, batch_size=2)
        b = evaluate_lm(model, toks, block_size=BLOCK, batch_size=2)
        c = evaluate_lm(model, toks, block_size=BLOCK, batch_size=2, max_samples=1)
    assert a["val/loss"].hex() == b["val/loss"].hex()
    assert (c["val/token_count"], c["val/batch_count"]) == (BLOCK, 1)


def test_isolation_restores_mode_rng_and_grad():
    torch.manual_seed(1)
    m = GPT(ModelConfig(block_size=BLOCK, n_layer=1, n_head=2, n_embd=16, dropout=0.1))
    m.train()
    m.blocks[0].mlp.eval()  # a module in its own mode stays so
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    with isolated(m):
        assert not m.training and not torch.is_grad_enabled()
        torch.rand(5), np.random.rand(3), random.random()
        m(torch.zeros((1, 4), dtype=torch.long))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
    assert m.training and not m.blocks[0].mlp.training and m.blocks[0].attn.training
    assert torch.is_grad_enabled()


def gen(model, **kw):
    args = dict(block_size=BLOCK, batch_size=2, sampling=GREEDY, rewards=["exact_match", "nonempty"], seed=0)
    args.update(kw)
    with isolated(model):
        return evaluate_generation(model, PROMPTS, **args)


def test_generation_metrics_counts_and_absent_components(model):
    m, rollouts = gen(model, sampling={**GREEDY, "n_generation": 2})
    assert m["val/rollout_count"] == len(PROMPTS) * 2 == len(rollouts)
    assert m["val/nonempty_count"] == 6 and m["val/exact_match_count"] == 4  # no reference: absent
    rewards = [r["reward"] for r in rollouts]
    assert m["val/reward_min"] == min(rewards) and m["val/reward_max"] == max(rewards)
    assert m["val/reward_avg"] == pytest.approx(sum(rewards) / 6)
    assert m["val/reward_std"] == pytest.approx(float(np.std(rewards)))
    assert all(len(r["completion"]) <= 6 and "\n" not in r["completion"] for r in rollouts)
    # greedy (default) generations of one prompt are identical
    assert rollouts[0]["completion"] == rollouts[1]["completion"]


def test_sampled_rollouts_depend_on_seed_not_on_batching(model):
    hot = {**GREEDY, "temperature": 1.5, "top_k": None, "n_generation": 2, "max_tokens": 8}
    a = [r["completion"] for r in gen(model, sampling=hot, batch_size=1)[1]]
    b = [r["completion"] for r in gen(model, sampling=hot, batch_size=4)[1]]
    c = [r["completion"] for r in gen(model, sampling=hot, batch_size=1, seed=1)[1]]
    assert a == b and a != c
    assert a[0] != a[1]  # per-generation randomness


def test_top_p_top_k_and_penalty_paths_run(model):
    s = {**GREEDY, "temperature": 0.9, "top_k": 5, "top_p": 0.5, "repetition_penalty": 1.3}
    m, r = gen(model, sampling=s, max_samples=2)
    assert m["val/rollout_count"] == 2 and len(r) == 2
