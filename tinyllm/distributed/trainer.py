"""Data-parallel training on torch.distributed: the rank side (the launcher is tinyllm/distributed/launch.py).

``DistributedTrainer`` is ``Trainer`` with these changes, each rank running the same loop:

- **Data**: every rank reads the single-process run's global batch ``cursor`` (the same pure function
  of seed and cursor, tinyllm/data.py) and keeps its own disjoint rows: rank ``r`` of ``W`` takes rows
  ``[r*B/W, (r+1)*B/W)``. The cursor advances alike on every rank.
- **Gradients**: after the micro-batches, one all-reduce (sum) of all gradients flattened into one
  buffer, divided by ``W``: the gradient of the mean loss over the global batch. The ranks' loss sums
  are all-reduced in float64 likewise. Every rank then clips and steps on identical gradients, so
  weights and optimizer state stay identical on every rank (asserted by digest at start).
- **RNG**: rank 0 keeps the single-process stream (``torch.manual_seed(seed)``, then model init);
  rank ``r > 0`` is reseeded after init from ``(seed, r)``, so dropout masks differ by rank.
- **Stop**: a stop signal (SIGTERM, SIGINT, ``$DURABLE_STOP_SIGNAL``) may reach one rank only, or the
  ranks at different steps; at each step boundary the ranks all-reduce their stop flags (max), so all
  stop after the same step, rank 0 writes the ``stopping`` line at it, they checkpoint together (one
  checkpoint) and exit 130.
- **Checkpoints**: rank 0 writes them, after a gather of every rank's RNG state (the gather is the
  barrier: all ranks are at the same step), with the usual manifest and LATEST rules; a barrier
  after the write keeps any rank from going on (or exiting) before the checkpoint is committed. The
  ``ranks`` component holds the world size and every rank's RNG state; model, optimizer and
  training_state are the single-process ones (identical on every rank). Rank 0 alone holds the run
  lock, recovers interrupted writes (before the other ranks read a checkpoint), writes progress
  lines and metrics, and prunes.

Why rank 0 after a barrier and not ``torch.distributed.checkpoint``: every rank holds the full,
identical model and optimizer (data parallel, no sharding), so one writer has everything; it keeps
tinyllm's one checkpoint layout (manifest with checksums, verified loads, LATEST, retention,
``ctl verify-resume``) unchanged, and the only per-rank state, the RNG (a few KiB), travels by one
gather. DCP pays off when state is sharded (FSDP/TP) and each rank must write its own shard.

Exactness: at ``W == 1`` the all-reduce of one rank returns its input and the division by 1.0 is
exact, so a 1-rank run equals the plain one-process run bit for bit (tests/ddp). At ``W > 1`` it
cannot: the loss is a mean of per-rank means and the gradient a sum of per-rank gradients, a
different floating-point association than the one-process mean over all rows (and matmuls over
half the rows may block differently). A ``W``-rank run is bitwise repeatable and resumable at the
same ``W``: each rank's shard, RNG and the reduction order are fixed by (seed, cursor, rank, W).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from contracts.layout import RunDir

from .. import checkpoint as ckpt
from ..errors import STOP, CheckpointError, PeerLost
from ..sinks.metrics import Reporter
from ..model import state_digest
from ..spec import SpecError, TrainSpec
from ..trainer import Trainer, TrainerHooks

COLLECTIVE_TIMEOUT_S = 600.0  # a hung peer: the engine's heartbeat rule notices it long before this
RANKS_COMPONENT = "ranks"


class _NullLog:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None: ...


def rank_seed(seed: int, rank: int) -> int:
    """Rank ``rank``'s dropout seed (rank 0 keeps the single-process stream and never calls this)."""
    digest = hashlib.sha256(f"tinyllm-rank-rng:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class _RankHooks(TrainerHooks):
    """The ``ranks`` checkpoint component: every rank's RNG state, gathered; restored per rank."""

    def checkpoint_components(self, trainer: Trainer, step: int) -> dict[str, Any]:
        assert isinstance(trainer, DistributedTrainer)  # (the hooks of DistributedTrainer only)
        states = trainer.gather_rng_states()
        return {RANKS_COMPONENT: {"world_size": trainer.world_size, "torch_rng": states}}

    def on_resume(self, trainer: Trainer, components: dict[str, Any]) -> None:
        assert isinstance(trainer, DistributedTrainer)  # (the hooks of DistributedTrainer only)
        ranks = components.get(RANKS_COMPONENT)
        if not isinstance(ranks, dict) or len(ranks.get("torch_rng", ())) != ranks.get("world_size"):
            raise CheckpointError(
                f"{trainer.resumed_from}: no valid '{RANKS_COMPONENT}' component "
                "(not a checkpoint of a distributed run)"
            )
        if ranks["world_size"] != trainer.world_size:  # the spec check said the same; never resume across
            raise SpecError(
                f"checkpoint {trainer.resumed_from} holds {ranks['world_size']} ranks' state, "
                f"this run has {trainer.world_size}"
            )
        torch.set_rng_state(ranks["torch_rng"][trainer.rank])

    def after_step(self, trainer: Trainer, step: int, frame: dict) -> None:
        assert isinstance(trainer, DistributedTrainer)  # (the hooks of DistributedTrainer only)
        frame["timer/allreduce_s"] = trainer.allreduce_s


class DistributedTrainer(Trainer):
    def __init__(
        self, spec: TrainSpec, home: Path, progress: Path | None = None, resume: Path | None = None, **kwargs: Any
    ):
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if spec.distributed is None:
            raise SpecError('a torchrun rank needs a spec with a distributed block (e.g. {"world_size": 2})')
        if spec.distributed.world_size != self.world_size:
            raise SpecError(
                f"torchrun started {self.world_size} ranks, the spec asks for world_size {spec.distributed.world_size}"
            )
        if spec.distributed.backend == "nccl":  # the launcher refuses it first; a rank started by hand too
            raise SpecError("distributed.backend nccl needs CUDA devices, and tinyllm trains on CPU: use gloo")
        lead = self.rank == 0
        super().__init__(
            spec,
            home,
            progress if lead else None,
            resume,
            hooks=_RankHooks(),
            log=None if lead else _NullLog(),
            **kwargs,
        )
        self.per_rank = spec.batch_size // self.world_size
        if self.validator is not None:  # every rank evaluates its shard; rank 0 records (validation.py)
            from ..validation.runner import Validator
            from .validation import RankValidator

            # (a proxy: what it does not define is the wrapped Validator's)
            self.validator = cast(Validator, RankValidator(self.validator, self.rank, self.world_size))
        self.allreduce_s = 0.0  # wall time of the last step's all-reduces (gradients and loss): timer/allreduce_s
        dist.init_process_group(spec.distributed.backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))

    # -- setup: rank 0 locks and recovers; every rank builds the same model ------------------

    def _lock(self) -> None:
        self.lock_file = None
        if self.rank == 0:
            super()._lock()

    def _recover(self) -> None:
        if self.rank == 0:
            super()._recover()
        dist.barrier()  # no rank reads a checkpoint while rank 0 may still be putting one back

    def _build(self) -> None:
        super()._build()
        with torch.no_grad():
            for t in self.model.state_dict().values():
                dist.broadcast(t, src=0)  # identical already (same seed); a broadcast makes it certain
        if self.rank > 0:
            torch.manual_seed(rank_seed(self.spec.seed, self.rank))

    def _resume(self) -> None:
        super()._resume()
        digests = [None] * self.world_size
        dist.all_gather_object(digests, state_digest(self.model.state_dict()))
        if len(set(digests)) != 1:
            raise RuntimeError(f"ranks start from different weights (digests {digests})")

    # -- the step ------------------------------------------------------------------------

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = self.rank * self.per_rank
        return x[lo : lo + self.per_rank], y[lo : lo + self.per_rank]

    def reduce_gradients(self, loss_sum: float) -> float:
        t0 = time.perf_counter()
        params = [p for p in self.model.parameters()]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # sum over ranks
        flat.div_(float(self.world_size))  # the mean over the global batch; exact at W == 1
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        losses = torch.tensor([loss_sum], dtype=torch.float64)
        dist.all_reduce(losses)
        self.allreduce_s = time.perf_counter() - t0
        return losses.item() / self.world_size

    def _stop_signal(self) -> int | None:
        """Any rank's stop signal stops every rank after the same step (called alike on every rank, at
        each step boundary): one all-reduce (max) of ``signal number + 1`` (0: no stop on this rank), so
        every rank, rank 0's ``stopping`` line included, agrees on the step and names one signal."""
        mine = int(STOP["signal"] or 0) + 1 if STOP["requested"] else 0
        flag = torch.tensor([mine], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        return agreed - 1 if agreed else None

    # -- checkpoints: gathered, written by rank 0 ----------------------------------------

    def gather_rng_states(self) -> list[torch.Tensor]:
        mine = torch.get_rng_state()
        states = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(states, mine)  # also the barrier before rank 0 writes: every rank is at this step
        return states

    def _async_checkpoints(self) -> bool:
        """Synchronous: rank 0 writes and every rank waits at a barrier until it is committed (the
        checkpoint's RNG states are gathered by a collective anyway; docs/checkpoints.md)."""
        return False

    def _write_checkpoint(self, components: dict[str, Any], step: int | None = None, meta: dict | None = None) -> Path:
        step = self.step if step is None else step
        if self.rank == 0:
            path = super()._write_checkpoint(components, step, meta)
        elif ckpt.FULL_COMPONENTS <= set(components):
            path = RunDir(self.run_dir, self.spec.name).step_dir(step)
        else:  # a validation plan's partial, non-resumable artifact
            path = RunDir(self.run_dir, self.spec.name).artifact_dir(step)
        dist.barrier()  # the checkpoint is committed (LATEST moved) before any rank goes on or exits
        return path

    def _prune(self, step: int | None = None) -> None:
        if self.rank == 0:
            super()._prune(step)

    # -- the run -------------------------------------------------------------------------

    def run(self, reporter: Reporter | None = None) -> dict:
        try:
            pids = [None] * self.world_size
            dist.all_gather_object(pids, os.getpid())
            self.progress_file.event("ranks", pids=pids, world_size=self.world_size)  # rank 0's file only
            result = super().run(reporter if self.rank == 0 else Reporter([]))
            # no rank exits before rank 0 has closed its sinks (an MLflow flush may take its flush_timeout_s):
            # once one rank exits non-zero (130 after a stop), torchrun SIGKILLs the others 30 s later
            dist.barrier()
            return result
        except RuntimeError as e:  # gloo: "Connection reset by peer", "Connection closed by peer", timeouts
            if not isinstance(e, dist.DistError) and "gloo" not in str(e):
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". This is typically")[0]
            raise PeerLost(
                f"rank {self.rank}: a collective failed, another rank died or hung ({first[:300]})"
            ) from None
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
