"""Run validation without touching training: model mode, RNG states and grad mode restored after.

Training with validation on must produce bitwise the same training losses as with it off, so a
validation pass may not consume the global torch/numpy/python RNG streams (it uses its own
generators, and dropout is off in eval mode anyway), leave a module in eval mode, or leave
autograd disabled. tinyllm's GPT keeps no KV cache; a module attribute ``kv_cache`` (a future
cache) is cleared and restored too.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def isolated(model: torch.nn.Module):
    modes = [(m, m.training) for m in model.modules()]
    caches = [(m, m.kv_cache) for m in model.modules() if hasattr(m, "kv_cache")]
    torch_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    grad_enabled = torch.is_grad_enabled()
    model.eval()
    for m, _ in caches:
        m.kv_cache = None  # type: ignore[assignment]  # torch's stub types Module attributes Tensor | Module; any value is legal
    try:
        with torch.inference_mode():
            yield model
    finally:
        for m, mode in modes:
            m.training = mode
        for m, cache in caches:
            m.kv_cache = cache
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        torch.set_grad_enabled(grad_enabled)
