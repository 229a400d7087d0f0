"""Held-out validation (objective ``lm``) in a distributed run: every rank evaluates, rank 0 records.

``RankValidator`` wraps each rank's ``Validator`` (tinyllm/validation/runner.py). The evaluation is
collective: the held-out windows (the one-process run's, in file order) are cut into ``W``
contiguous shards of equal length, the last ones padded with windows whose targets are all ignored
(a padded window adds no loss and no token to any count); each rank sums its shard's per-token
losses, and one float64 all-reduce of (loss sum, tokens, batches) gives the global metrics, the
same on every rank. Everything durable (the pending marker's journal, sidecars, publication,
archives) stays with rank 0's own ``Validator``; the other ranks only take part in the evaluation.
At a resume, rank 0 reads the checkpoint's journal *before* acting on it and broadcasts whether
the resume rules evaluate, so every rank joins the same collectives.

At ``W == 1`` the shard is the whole window list and the all-reduce returns its input, so the
metrics equal the one-process run's bit for bit; at ``W > 1`` the loss sum is added per rank
first, another floating-point association (deterministic for a fixed ``W``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import faults
from ..validation.isolation import isolated
from ..validation.lm import IGNORE, lm_metrics, loss_sums, windows
from ..validation.runner import Validator
from ..validation.source import load_source
from ..validation.transaction import read_journal, resume_action


def shard_windows(wins: list, rank: int, world_size: int, block_size: int) -> list:
    """Rank ``rank``'s contiguous share of ``wins``, padded to ceil(n / W) with all-ignored windows."""
    per = -(-len(wins) // world_size)
    mine = list(wins[rank * per : (rank + 1) * per])
    pad = (np.zeros(block_size, dtype=np.int64), np.full(block_size, IGNORE, dtype=np.int64))
    return mine + [pad] * (per - len(mine))


class RankValidator:
    """One rank's view of validation; attributes not defined here are the wrapped Validator's."""

    def __init__(self, inner: Validator, rank: int, world_size: int):
        self.inner, self.rank, self.world_size = inner, rank, world_size
        # rank 0's own passes evaluate collectively too (this instance's method replaced)
        inner._evaluate = self._evaluate  # type: ignore[method-assign]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _evaluate(self, step: int, model: torch.nn.Module) -> dict:
        cfg, block = self.inner.cfg, self.inner.spec.model.block_size
        if self.rank > 0:  # rank 0's run() loaded (and verified) the source just before
            self.inner.source = load_source(cfg, self.inner.home, block)
        wins = windows(self.inner.tok.encode(self.inner.source.text), block, cfg.max_samples)

        def on_batch(n: int) -> None:
            if n == 1 and self.rank == 0:
                faults.point("validation.during_evaluation", step)

        with isolated(model):
            total, count, batches = loss_sums(
                model, shard_windows(wins, self.rank, self.world_size, block), cfg.batch_size, on_batch
            )
        sums = torch.tensor([total, float(count), float(batches)], dtype=torch.float64)
        dist.all_reduce(sums)
        return lm_metrics(sums[0].item(), int(sums[1].item()), int(sums[2].item()))

    def run(self, step: int, model: torch.nn.Module, *, ckpt_dir: Path | None, frame: dict, publish, journal=None):
        if self.rank == 0:
            return self.inner.run(step, model, ckpt_dir=ckpt_dir, frame=frame, publish=publish, journal=journal)
        return self._evaluate(step, model)  # nothing recorded or published here

    def resume(self, step: int, ckpt_dir: Path, marker: dict | None, model: torch.nn.Module, publish, frame=None):
        action: list[str | None] = [None]
        if self.rank == 0:  # read before rank 0's own resume writes anything
            journal = read_journal(ckpt_dir, marker)
            action[0] = resume_action(journal, ckpt_step=step, due=self.inner.due(step))
        dist.broadcast_object_list(action, src=0)
        if self.rank == 0:
            return self.inner.resume(step, ckpt_dir, marker, model, publish, frame=frame)
        if action[0] == "evaluate":
            self._evaluate(step, model)
        return None

    def archive_artifact(self, artifact_dir: Path) -> str | None:
        return self.inner.archive_artifact(artifact_dir) if self.rank == 0 else None
