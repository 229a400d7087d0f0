"""The rollout module: its own copy of the policy's weights, tagged with the model step it serves.

After every optimizer update the trainer synchronises it (``sync(policy, model_step)``); a request
names the weight version it expects, and an answer from any other version is refused
(``WeightVersionError``, fatal). Sampling is the validation sampler's (tinyllm.validation.
generation: repetition penalty, temperature, top-k, top-p), one ``torch.Generator`` per rollout
seeded from (seed, cursor, prompt slot, generation), so a rollout's tokens never depend on its
batch or on the global RNG, and the checkpointed cursor is the whole sampling state. A rollout
ends after ``max_tokens`` tokens or with a sampled newline, which is kept (the action that ends it).
The rollout also returns the behaviour log-probabilities of its tokens (the old policy of the
clipped objective), computed by the same frozen copy in inference mode.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

import torch

from .. import tokenizer
from ..validation.errors import ValidationIdentityError
from ..validation.generation import STOP_TOKEN, _next_token, generate
from .common import pack, token_logps


class WeightVersionError(ValidationIdentityError):
    """A rollout was answered by another weight version than the one requested (fatal, exit 2)."""


def rollout_seed(seed: int, cursor: int, slot: int, generation: int) -> int:
    digest = hashlib.sha256(f"tinyllm-rollout:{seed}:{cursor}:{slot}:{generation}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class Rollouts:
    prompts: list[list[int]]  # prompt ids per rollout
    completions: list[list[int]]  # sampled ids per rollout (the stop newline included when sampled)
    texts: list[str]  # decoded completions without the stop newline (what rewards score)
    old_logps: torch.Tensor  # (N, T) behaviour log-probs, aligned with pack(prompts, completions)
    version: int  # the weight version (model step) that produced them


class RolloutModule:
    def __init__(self, policy: torch.nn.Module, version: int):
        self.model = copy.deepcopy(policy)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.version = version

    def sync(self, policy: torch.nn.Module, version: int) -> None:
        with torch.no_grad():
            for dst, src in zip(self.model.state_dict().values(), policy.state_dict().values()):
                dst.copy_(src)
        self.version = version

    def _check(self, expected_version: int) -> None:
        if self.version != expected_version:
            raise WeightVersionError(
                f"rollout answered by weight version {self.version}, but the request is pinned "
                f"to model step {expected_version}; refusing its rollouts"
            )

    @torch.no_grad()  # not inference_mode: old_logps enter the autograd graph of the update
    def sample(
        self, prompts: list[str], seeds: list[int], sampling: dict, block_size: int, expected_version: int
    ) -> Rollouts:
        self._check(expected_version)
        prompt_ids = [[int(t) for t in tokenizer.encode(p)] for p in prompts]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        seqs = [list(p) for p in prompt_ids]
        out: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for _ in range(sampling["max_tokens"]):
            if not live:
                break
            width = max(len(seqs[i]) for i in live)
            x = torch.zeros((len(live), width), dtype=torch.long)
            for r, i in enumerate(live):
                x[r, : len(seqs[i])] = torch.tensor(seqs[i], dtype=torch.long)
            logits, _ = self.model(x)
            still = []
            for r, i in enumerate(live):
                tok = _next_token(logits[r, len(seqs[i]) - 1], seqs[i], sampling, gens[i])
                seqs[i].append(tok)
                out[i].append(tok)
                if tok != STOP_TOKEN:
                    still.append(i)
            live = still
        x, y, _ = pack(prompt_ids, out)
        old = token_logps(self.model, x, y)
        texts = [tokenizer.decode([t for t in o if t != STOP_TOKEN]) for o in out]
        self._check(expected_version)
        return Rollouts(prompt_ids, out, texts, old, self.version)

    def generate_texts(
        self, prompts: list[str], seeds: list[int], *, block_size: int, sampling: dict, expected_version: int
    ) -> list[str]:
        """Held-out generation (validation), pinned to ``expected_version``."""
        self._check(expected_version)
        texts = generate(self.model, prompts, seeds, block_size=block_size, sampling=sampling)
        self._check(expected_version)
        return texts
