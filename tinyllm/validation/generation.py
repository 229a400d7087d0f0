"""Held-out generation (objective ``generation``): prompts -> rollout -> rule rewards -> metrics.

Rollouts are (prompt i, generation g) for every held-out prompt (``max_samples`` keeps the first
prompts) and g < n_generation, in that order, ``batch_size`` per forward. Each rollout draws from
its own ``torch.Generator`` seeded from (validation seed, i, g), so its tokens do not depend on the
batch it lands in, and the global RNG is never touched. Sampling, per position: repetition penalty
(CTRL: a seen token's logit is divided by the penalty if positive, multiplied if negative), then
greedy if temperature == 0, else temperature, top-k, top-p (nucleus) and a draw. A rollout stops
after ``max_tokens`` tokens or at a newline (the tokenizers have no end-of-sequence token; a char
vocabulary without a newline never stops early); the newline is not part of the completion. Batches are right-padded: causal attention keeps each row's
last real position exact, and logits are read there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

from .. import tokenizer
from .rewards import score

STOP_TOKEN = 10  # "\n"


def rollout_seed(seed: int, prompt_index: int, generation_index: int) -> int:
    digest = hashlib.sha256(f"tinyllm-validation:{seed}:{prompt_index}:{generation_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _next_token(logits: torch.Tensor, seen: list[int], sampling: dict, gen: torch.Generator) -> int:
    logits = logits.double().clone()  # (V,)
    penalty = sampling["repetition_penalty"]
    if penalty != 1.0 and seen:
        idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
        vals = logits[idx]
        logits[idx] = torch.where(vals > 0, vals / penalty, vals * penalty)
    if sampling["temperature"] == 0.0 or sampling["top_k"] == 1:
        return int(torch.argmax(logits))  # greedy; ties -> lowest id
    logits = logits / sampling["temperature"]
    if sampling["top_k"] is not None and sampling["top_k"] < logits.numel():
        kth = torch.topk(logits, sampling["top_k"]).values[-1]
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    probs = torch.softmax(logits, dim=-1)
    if sampling["top_p"] < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, stable=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling["top_p"]  # always keeps the first
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen))


def generate(
    model,
    prompts: list[str],
    seeds: list[int],
    *,
    block_size: int,
    sampling: dict,
    tok: tokenizer.Tokenizer = tokenizer.BYTE,
) -> list[str]:
    """Completions of ``prompts`` (one batch) in ``tok``'s ids (stop: its newline, if it has one);
    call inside ``isolated``."""
    device = next(model.parameters()).device
    stop = tok.token_of("\n")
    seqs = [list(map(int, tok.encode(p))) for p in prompts]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    out: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    for _ in range(sampling["max_tokens"]):
        if not live:
            break
        ctx = [seqs[i][-block_size:] for i in live]
        width = max(len(c) for c in ctx)
        x = torch.zeros((len(ctx), width), dtype=torch.long)
        for r, c in enumerate(ctx):
            x[r, : len(c)] = torch.tensor(c, dtype=torch.long)
        logits, _ = model(x.to(device))
        still = []
        for r, i in enumerate(live):
            t = _next_token(logits[r, len(ctx[r]) - 1].cpu(), seqs[i], sampling, gens[i])
            if t == stop:
                continue
            seqs[i].append(t)
            out[i].append(t)
            still.append(i)
        live = still
    return [tok.decode(o) for o in out]


def evaluate_generation(
    model,
    prompts: list[dict],
    *,
    block_size: int,
    batch_size: int,
    sampling: dict,
    rewards: list[str],
    seed: int,
    max_samples: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    generate_fn: Callable[..., list[str]] | None = None,
    tok: tokenizer.Tokenizer = tokenizer.BYTE,
) -> tuple[dict[str, float], list[dict]]:
    """(metrics, rollouts): val/reward_* over all rollouts and val/<reward>, val/<reward>_count.

    ``generate_fn(prompts, seeds, block_size=, sampling=)``: the rollout module of a GRPO/OPD run
    (pinned to the validated model step); default: ``generate`` with ``model``."""
    rows = prompts[:max_samples] if max_samples is not None else prompts
    jobs = [(i, g) for i in range(len(rows)) for g in range(sampling["n_generation"])]
    rollouts: list[dict] = []
    for b in range(0, len(jobs), batch_size):
        chunk = jobs[b : b + batch_size]
        texts = (generate_fn or (lambda *a, **k: generate(model, *a, tok=tok, **k)))(
            [rows[i]["prompt"] for i, _ in chunk],
            [rollout_seed(seed, i, g) for i, g in chunk],
            block_size=block_size,
            sampling=sampling,
        )
        for (i, g), text in zip(chunk, texts):
            comps = score(rewards, text, rows[i]["response"])
            rollouts.append(
                {
                    "prompt_index": i,
                    "generation": g,
                    "completion": text,
                    "components": comps,
                    "reward": sum(comps.values()),
                }
            )
        if on_batch is not None:
            on_batch(b // batch_size + 1)
    totals = torch.tensor([r["reward"] for r in rollouts], dtype=torch.float64)
    metrics: dict[str, float] = {
        "val/reward_avg": float(totals.mean()),
        "val/reward_std": float(totals.std(unbiased=False)),
        "val/reward_min": float(totals.min()),
        "val/reward_max": float(totals.max()),
        "val/rollout_count": len(rollouts),
    }
    for name in rewards:
        vals = [r["components"][name] for r in rollouts if name in r["components"]]
        if vals:  # absent components are not filled with zero
            metrics[f"val/{name}"] = sum(vals) / len(vals)
            metrics[f"val/{name}_count"] = len(vals)
    return metrics, rollouts
