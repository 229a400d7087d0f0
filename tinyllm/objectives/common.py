"""Pieces every post-training objective shares: token log-probabilities of completions, the
optimizer update with the trainer's LR schedule, and the objective base class the trainer calls."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import SpecError
from ..spec import lr_at
from ..runtime_env import optimizer_step


def pack(prompts: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (x, y, mask), each (N, T): inputs, next-token targets, 1.0 on completion targets."""
    seqs = [p + c for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs) - 1
    x = torch.zeros((len(seqs), width), dtype=torch.long)
    y = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for r, (p, s) in enumerate(zip(prompts, seqs)):
        n = len(s) - 1
        x[r, :n] = torch.tensor(s[:-1], dtype=torch.long)
        y[r, :n] = torch.tensor(s[1:], dtype=torch.long)
        mask[r, len(p) - 1 : n] = 1.0  # target t is token t+1: completion tokens start at len(p)
    return x, y, mask


def token_logps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log p(y_t | x_<=t) per position, (N, T), float32."""
    logits, _ = model(x)
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, y.unsqueeze(-1)).squeeze(-1)


def optimizer_update(trainer, loss: torch.Tensor | None, update_index: int) -> dict:
    """One optimizer step at LR ``lr_at(update_index)`` after ``loss.backward()`` (None: already backed)."""
    lr = lr_at(update_index, trainer.spec)
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    if loss is not None:
        loss.backward()
    max_norm = trainer.spec.grad_clip if trainer.spec.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm).item()
    optimizer_step(trainer.optimizer)  # optimizer.step() without importing torch._dynamo (tinyllm/runtime_env.py)
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"optim/lr": lr, "optim/grad_norm": grad_norm}


class Objective:
    """What the trainer calls for a post-training objective (``lm`` has none).

    ``updates_per_step``: optimizer updates (public model steps) per trainer step.
    """

    name = "?"
    updates_per_step = 1

    def attach(self, trainer) -> None:
        """After the model and optimizer exist: load init weights, build frozen models."""

    def train_step(self, trainer) -> dict:
        raise NotImplementedError

    def components(self, trainer) -> dict[str, Any]:
        return {"posttrain": {"objective": self.name, "model_step": trainer.step * self.updates_per_step}}

    def on_resume(self, trainer, components: dict[str, Any]) -> None:
        state = components.get("posttrain")
        if not isinstance(state, dict) or state.get("objective") != self.name:
            raise SpecError(
                f"checkpoint {trainer.resumed_from} holds no {self.name} post-training state "
                f"(found {None if not isinstance(state, dict) else state.get('objective')!r})"
            )

    def identity(self) -> dict:
        """Recorded in every checkpoint's meta; a resume whose identity differs is refused."""
        return {"objective": self.name}

    def check_identity(self, recorded: dict | None, where) -> None:
        current = self.identity()
        if recorded is None:
            raise SpecError(
                f"checkpoint {where} records no post-training identity; it was not written by objective {self.name!r}"
            )
        diff = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
        if diff:
            shown = "; ".join(f"{k}: {recorded.get(k)} != {current.get(k)}" for k in diff)
            raise SpecError(
                f"checkpoint {where} was written with another post-training identity ({shown[:300]}); "
                "refusing to resume"
            )

    def validation_model(self):
        """What validation evaluates (GRPO/OPD: the rollout module; DPO: the policy with its reference)."""
        return None


class Timer:
    """Accumulates wall seconds by name (timer/* of a frame)."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def add(self, name: str, t0: float) -> float:
        t = time.perf_counter()
        self.s[name] = self.s.get(name, 0.0) + (t - t0)
        return t

    def frame(self) -> dict:
        return {f"timer/{k}_s": v for k, v in self.s.items()}
