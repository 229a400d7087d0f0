"""The training token stream: batch ``cursor`` is a pure function of (tokens, seed, cursor).

No RNG state is carried between batches: batch ``c`` draws its row offsets from a generator
seeded with ``(seed, c)``. The checkpoint stores the cursor, so a resumed run reads exactly the
batches the uninterrupted run would have read.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


class TokenStream:
    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int):
        if len(tokens) < block_size + 2:
            raise ValueError(f"corpus has {len(tokens)} tokens, fewer than block_size + 2 = {block_size + 2}")
        self.tokens = tokens  # uint16, usually a read-only memmap of tokens.bin
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed & _MASK64
        self._offsets = np.arange(block_size + 1, dtype=np.int64)  # (T+1,)

    def batch(self, cursor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, T) int64; y is x shifted by one token."""
        rng = np.random.default_rng([self.seed, cursor])
        starts = rng.integers(0, len(self.tokens) - self.block_size - 1, size=self.batch_size, endpoint=True)  # (B,)
        rows = np.asarray(self.tokens[starts[:, None] + self._offsets], dtype=np.int64)  # (B, T+1)
        chunk = torch.from_numpy(rows)
        return chunk[:, :-1], chunk[:, 1:]
