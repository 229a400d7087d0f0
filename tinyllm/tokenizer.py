"""Byte-level tokenizer: token id = UTF-8 byte, vocab 256; any text encodes, nothing is unknown."""
from __future__ import annotations

import numpy as np

VOCAB_SIZE = 256


def encode(text: str) -> np.ndarray:
    """Text -> uint16 token ids (the corpus files' dtype)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode(ids) -> str:
    """Token ids -> text; invalid UTF-8 (a cut multi-byte char) is replaced, never raised."""
    return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")
