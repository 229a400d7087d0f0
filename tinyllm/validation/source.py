"""The explicit held-out source: resolve, read, parse, identify, and check it is disjoint from training.

The trainer loads it once at start (bad data fails before any work, exit 2) and again at every
validation, comparing its identity (sha256 of the file's bytes) with the one recorded: a file that
changed during a run is a data mismatch, fatal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..datafiles import BUILTIN_DIR, jsonl_objects, read_utf8, resolve_path  # noqa: F401 (BUILTIN_DIR, resolve_path: re-exported)
from ..posttrain_data import load_pairs
from ..errors import SpecError
from ..tokenizer import UnknownCharacter
from ..validation_config import ValidationConfig
from .errors import ValidationDataError

MIN_OVERLAP_BYTES = 24  # held-out records at least this long must not occur verbatim in training


@dataclass(frozen=True)
class HeldOutSource:
    path: Path
    sha256: str
    size_bytes: int
    text: str = ""  # lm: the whole text
    prompts: list[dict] = field(default_factory=list)  # generation: {"prompt", "response"} in file order
    pairs: list[dict] = field(default_factory=list)  # dpo: {"prompt", "chosen", "rejected"} in file order

    def identity(self) -> dict:
        return {
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "records": len(self.prompts or self.pairs) or None,
        }

    def records(self) -> list[str]:
        """Texts that must not occur in training: lm lines, generation prompts and responses."""
        if self.prompts:
            out = [p["prompt"] for p in self.prompts] + [p["response"] for p in self.prompts if p["response"]]
        else:
            out = [line.strip() for line in self.text.splitlines()]
        return [r for r in out if len(r.encode("utf-8")) >= MIN_OVERLAP_BYTES]


def load_source(cfg: ValidationConfig, home: str | Path, block_size: int = 1 << 30) -> HeldOutSource:
    """Read and parse the held-out source; any problem is one ``ValidationDataError`` line."""
    assert cfg.data is not None
    path = resolve_path(cfg.data.path, home)
    raw, text = read_utf8(path, "validation data", ValidationDataError)
    sha = hashlib.sha256(raw).hexdigest()
    if cfg.objective == "lm":
        if len(raw) < 2:
            raise ValidationDataError(f"validation data file {path} has fewer than 2 tokens")
        return HeldOutSource(path, sha, len(raw), text=text)
    if cfg.objective == "dpo":  # the training pairs' format (tinyllm.posttrain_data)
        try:
            pairs = load_pairs(str(path), Path(home), block_size, "validation data").rows
        except SpecError as e:
            raise ValidationDataError(str(e)) from None
        return HeldOutSource(path, sha, len(raw), pairs=pairs)
    return HeldOutSource(path, sha, len(raw), prompts=_parse_prompts(cfg, path, text))


def _parse_prompts(cfg: ValidationConfig, path: Path, text: str) -> list[dict]:
    assert cfg.data is not None  # (load_source's)
    pcol, rcol = cfg.data.prompt_column, cfg.data.response_column
    out = []
    for n, row in jsonl_objects(text, f"validation data {path}", ValidationDataError):
        prompt = row.get(pcol)
        if not isinstance(prompt, str) or not prompt:
            raise ValidationDataError(
                f"validation data {path} line {n}: column {pcol!r} missing or not a non-empty string"
            )
        response = row.get(rcol) if rcol else None
        if response is not None and not isinstance(response, str):
            raise ValidationDataError(f"validation data {path} line {n}: column {rcol!r} is not a string")
        out.append({"prompt": prompt, "response": response})
    if not out:
        raise ValidationDataError(f"validation data {path} has no prompts")
    return out


def check_encodes(source: HeldOutSource, tok) -> None:
    """A char-level run reads only its corpus's characters: held-out text (lm) or prompts (generation)
    with another one is one ``ValidationDataError`` line at start (bytes: everything encodes)."""
    try:
        if source.text:
            tok.check(source.text, f"validation data {source.path}")
        for n, row in enumerate(source.prompts, start=1):
            tok.check(row["prompt"], f"validation data {source.path} prompt {n}")
        for n, row in enumerate(source.pairs, start=1):
            for key in ("prompt", "chosen", "rejected"):
                tok.check(row[key], f"validation data {source.path} pair {n} {key}")
    except UnknownCharacter as e:
        raise ValidationDataError(str(e)) from None


def check_disjoint(
    source: HeldOutSource, training_tokens: np.ndarray, corpus: str = "training corpus", tok=None
) -> None:
    """Reject a held-out source that overlaps the training data (byte-level tokens = UTF-8 bytes;
    char-level ones are decoded with ``tok`` and compared as UTF-8).

    Overlap: the whole held-out file, or any held-out record (lm line; generation prompt or
    response) of at least ``MIN_OVERLAP_BYTES`` bytes, occurs verbatim in the training tokens.
    """
    if tok is not None and tok.kind != "byte":
        train = tok.decode(np.asarray(training_tokens)).encode("utf-8")
    else:
        train = np.asarray(training_tokens).astype(np.uint8).tobytes()
    whole = (source.text or "").strip().encode("utf-8")
    if len(whole) >= MIN_OVERLAP_BYTES and whole in train:
        raise ValidationDataError(f"validation data {source.path} overlaps the {corpus}: the whole file occurs in it")
    for rec in dict.fromkeys(source.records()):
        if rec.encode("utf-8") in train:
            shown = rec if len(rec) <= 60 else rec[:57] + "..."
            raise ValidationDataError(
                f"validation data {source.path} overlaps the {corpus}: {shown!r} occurs in the training data "
                "(the held-out source must be disjoint from training)"
            )


def verify_unchanged(source: HeldOutSource, recorded: dict, step: int) -> None:
    if source.identity() != recorded:
        raise ValidationDataError(
            f"validation data {source.path} changed: step {step} recorded sha256 {recorded.get('sha256', '?')[:12]}, "
            f"the file now has {source.sha256[:12]}"
        )
