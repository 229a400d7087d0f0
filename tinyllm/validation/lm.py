"""Held-out language-model loss and perplexity (objective ``lm``).

The held-out text is tokenized and cut into consecutive, non-overlapping windows of ``block_size``
next-token targets, in file order (deterministic; ``max_samples`` keeps the first windows). The last
window is right-padded; padded targets are ignored (-1) and excluded from every count, and right
padding under causal attention cannot change a real position's logits. Loss is token-weighted:
the sum of per-token cross-entropies over all real targets divided by their number.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from ..model import invariant_sum

IGNORE = -1


def windows(tokens: np.ndarray, block_size: int, max_samples: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) pairs, each of length block_size; targets padded with IGNORE."""
    toks = np.asarray(tokens, dtype=np.int64)
    n_targets = len(toks) - 1
    out = []
    for start in range(0, max(n_targets, 0), block_size):
        x = toks[start : start + block_size]
        y = toks[start + 1 : start + 1 + block_size]
        n = len(y)
        xp = np.zeros(block_size, dtype=np.int64)
        yp = np.full(block_size, IGNORE, dtype=np.int64)
        xp[:n], yp[:n] = x[:n], y
        out.append((xp, yp))
        if max_samples is not None and len(out) >= max_samples:
            break
    return out


def evaluate_lm(
    model: torch.nn.Module,
    tokens: np.ndarray,
    *,
    block_size: int,
    batch_size: int,
    max_samples: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Held-out metrics of ``model`` (call inside ``isolated``): val/loss, val/ppl, counts."""
    total, count, batches = loss_sums(model, windows(tokens, block_size, max_samples), batch_size, on_batch)
    return lm_metrics(total, count, batches)


def loss_sums(
    model: torch.nn.Module,
    wins: list[tuple[np.ndarray, np.ndarray]],
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[float, int, int]:
    """(sum of per-token cross-entropies, real targets, batches) over ``wins``, in order."""
    device = next(model.parameters()).device
    total, count, batches = 0.0, 0, 0
    for i in range(0, len(wins), batch_size):
        chunk = wins[i : i + batch_size]
        x = torch.from_numpy(np.stack([w[0] for w in chunk])).to(device)
        y = torch.from_numpy(np.stack([w[1] for w in chunk])).to(device)
        logits, _ = model(x)
        loss_sum = invariant_sum(
            F.cross_entropy(  # ignored targets give 0; the sum is thread-invariant
                logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=IGNORE, reduction="none"
            )
        )
        total += float(loss_sum)
        count += int((y != IGNORE).sum())
        batches += 1
        if on_batch is not None:
            on_batch(batches)
    return total, count, batches


def lm_metrics(total: float, count: int, batches: int) -> dict[str, float]:
    loss = total / count if count else float("nan")
    return {
        "val/loss": loss,
        "val/ppl": math.exp(loss) if loss < 700 else float("inf"),
        "val/token_count": count,
        "val/batch_count": batches,
    }
