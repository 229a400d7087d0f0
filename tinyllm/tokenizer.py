"""Tokenizers: ``byte`` (id = UTF-8 byte, vocab 256; any text encodes, nothing is unknown) and
``char`` (id = index in the corpus's vocabulary: the sorted distinct characters of its text, as
nanoGPT's ``shakespeare_char`` builds its ``meta.pkl``).

A char vocabulary is computed once, when the corpus is built (tinyllm/corpus.py), stored in its
``meta.json`` and pinned in every checkpoint trained on it (``identity()``: kind, size, sha256 and
the characters themselves, so evals rebuild it from the checkpoint alone). Characters are Unicode
code points, not bytes: nanoGPT's ids, and a non-ASCII letter is one token, not two or three.
Text with a character outside the vocabulary does not encode: ``Tokenizer.encode`` raises
``UnknownCharacter`` naming the first one, and callers turn it into one bad-input line before work.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

VOCAB_SIZE = 256  # the byte tokenizer's
MAX_CHAR_VOCAB = 1 << 16  # ids are uint16 in the corpus files


def encode(text: str) -> np.ndarray:
    """Byte-level: text -> uint16 token ids (the corpus files' dtype)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode(ids) -> str:
    """Byte-level: token ids -> text; invalid UTF-8 (a cut multi-byte char) is replaced, never raised."""
    return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")


class UnknownCharacter(ValueError):
    """Text holds a character that the char vocabulary lacks (the message names it)."""


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def shown(ch: str) -> str:
    """A character for a message: repr and code point (``'\\t' (U+0009)``)."""
    return f"{ch!r} (U+{ord(ch):04X})"


@dataclass(frozen=True)
class Tokenizer:
    kind: str  # "byte" | "char"
    chars: str = ""  # char: the vocabulary, sorted by code point, each once
    _points: np.ndarray | None = field(default=None, repr=False, compare=False)  # char: code points, ascending

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE if self.kind == "byte" else len(self.chars)

    @property
    def sha256(self) -> str | None:
        """The char vocabulary's digest (None for bytes: always the same 256 ids)."""
        return (
            hashlib.sha256(b"tinyllm-char-vocab:" + self.chars.encode("utf-8")).hexdigest()
            if self.kind == "char"
            else None
        )

    def identity(self) -> dict:
        """What a checkpoint pins: a resume or an evaluation with another vocabulary is refused."""
        if self.kind == "byte":
            return {"kind": "byte", "vocab_size": VOCAB_SIZE}
        return {"kind": "char", "vocab_size": self.vocab_size, "sha256": self.sha256, "chars": self.chars}

    def describe(self) -> str:
        if self.kind == "byte":
            return "byte tokenizer (vocab 256)"
        return f"char tokenizer ({self.vocab_size} characters, vocabulary sha256 {(self.sha256 or '')[:12]})"

    def unknown(self, text: str) -> str | None:
        """The first character of ``text`` outside the vocabulary, or None (bytes: always None)."""
        if self.kind == "byte" or not text:
            return None
        pts = _codepoints(text)
        assert self._points is not None  # (a char tokenizer's, made with it)
        idx = np.minimum(np.searchsorted(self._points, pts), len(self._points) - 1)
        bad = np.nonzero(self._points[idx] != pts)[0]
        return text[int(bad[0])] if len(bad) else None

    def check(self, text: str, what: str) -> None:
        """``UnknownCharacter`` (one line naming ``what``) when ``text`` does not encode."""
        ch = self.unknown(text)
        if ch is not None:
            raise UnknownCharacter(
                f"{what}: character {shown(ch)} is not in the vocabulary ({self.describe()}); "
                "a char-level model reads only the characters of its corpus"
            )

    def encode(self, text: str, what: str = "text") -> np.ndarray:
        """Text -> uint16 ids; a character outside a char vocabulary raises ``UnknownCharacter``."""
        if self.kind == "byte":
            return encode(text)
        self.check(text, what)
        assert self._points is not None  # (a char tokenizer's, made with it)
        return np.searchsorted(self._points, _codepoints(text)).astype(np.uint16)

    def decode(self, ids) -> str:
        """Ids -> text; an id beyond a char vocabulary (a model wider than it) decodes to U+FFFD, never raised."""
        if self.kind == "byte":
            return decode(ids)
        n = len(self.chars)
        return "".join(self.chars[i] if 0 <= i < n else "\ufffd" for i in (int(t) for t in ids))

    def token_of(self, ch: str) -> int | None:
        """The id of one character (``"\\n"``: generation's stop token), None if the vocabulary lacks it."""
        if self.kind == "byte":
            b = ch.encode("utf-8")
            return b[0] if len(b) == 1 else None
        i = self.chars.find(ch)
        return i if i >= 0 else None


BYTE = Tokenizer("byte")


def char_tokenizer(chars: str) -> Tokenizer:
    """The char tokenizer of a vocabulary string (sorted, distinct: checked)."""
    pts = _codepoints(chars)
    if len(pts) == 0 or len(pts) > MAX_CHAR_VOCAB or np.any(pts[1:] <= pts[:-1]):
        raise ValueError(f"a char vocabulary is 1 to {MAX_CHAR_VOCAB} distinct characters in code point order")
    return Tokenizer("char", chars, pts)


def build_vocab(text: str) -> Tokenizer:
    """The char tokenizer of ``text``: its distinct characters, sorted (nanoGPT: ``sorted(set(data))``)."""
    return char_tokenizer("".join(sorted(set(text))))


def from_identity(ident: dict | None) -> Tokenizer:
    """The tokenizer a corpus meta.json or a checkpoint's ``meta.tokenizer`` names (absent: bytes, as
    everything built before the char tokenizer existed). ``ValueError`` when it is damaged."""
    if ident is None or ident.get("kind", "byte") == "byte":
        return BYTE
    if ident.get("kind") != "char" or not isinstance(ident.get("chars"), str):
        raise ValueError(f"unknown tokenizer {ident.get('kind')!r}")
    tok = char_tokenizer(ident["chars"])
    if ident.get("sha256") not in (None, tok.sha256) or ident.get("vocab_size") not in (None, tok.vocab_size):
        raise ValueError("the char vocabulary does not match its recorded sha256 or size (damaged)")
    return tok


def from_corpus_meta(meta: dict) -> Tokenizer:
    """A corpus's tokenizer from its meta.json (``tokenizer``, and ``vocab`` for char)."""
    if meta.get("tokenizer", "byte") == "byte":
        return BYTE
    return from_identity(
        {
            "kind": meta.get("tokenizer"),
            "chars": meta.get("vocab"),
            "sha256": meta.get("vocab_sha256"),
            "vocab_size": meta.get("vocab_size"),
        }
    )
