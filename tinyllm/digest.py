"""Digests of model state (torch only): the result line's ``digest`` and the helper's fingerprints."""

from __future__ import annotations

import hashlib

import torch


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over a state dict in canonical order: sorted keys, each with dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(
            t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        )  # 0-d too (BatchNorm counters)
    return h.hexdigest()
