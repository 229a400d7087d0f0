"""Corpora: ``corpora/<name>/`` = tokens.bin (training), heldout.bin (held out), meta.json.

Both token files are raw little-endian uint16 (``np.memmap``-able). The held-out part is explicit:
either the user's ``heldout`` files, or the tail byte range of the source text (recorded in
meta.json as ``{"kind": "tail", "start", "end"}``), or, with ``"heldout_split": "interleaved"``,
every k-th block of it (``{"kind": "interleaved", "block", "every"}``). Training reads only tokens.bin, so it never
sees held-out text. Token ids follow the spec's ``tokenizer``: ``byte`` (id = UTF-8 byte) or ``char``
(id = index in the vocabulary of the corpus's text, sources and held-out part together, as nanoGPT
computes it over its whole input; stored in meta.json as ``vocab`` and ``vocab_sha256``; its
split is in characters). Building is idempotent: an existing corpus whose source checksum matches is
kept as is; one built from other sources is never overwritten (bad input, exit 2).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from contracts.layout import RunHome

from . import faults, tokenizer
from .builtin_text import builtin_text
from .corpus_meta import read_meta
from .diskfull import writing
from .errors import STOP, StopRequested, signal_name
from .fsio import fsync_dir, write_synced
from .spec import CorpusSpec, SpecError

FORMAT = 1
DOC_SEPARATOR = b"\n\n"


def corpus_dir(home: Path, name: str) -> Path:
    return RunHome(home).corpus(name)


def _expand(home: Path, patterns: list[str], what: str) -> list[Path]:
    """Files of each pattern (a path or a glob, relative to home or absolute), pattern order, sorted within."""
    files: list[Path] = []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else str(home / pattern)
        matches = sorted(Path(m) for m in glob.glob(full, recursive=True) if Path(m).is_file())
        if not matches:
            raise SpecError(f"corpus {what} {pattern!r} matches no file (relative paths are under {home})")
        for m in matches:
            if m.resolve() not in {f.resolve() for f in files}:
                files.append(m)
    return files


def _display(home: Path, f: Path) -> str:
    try:
        return str(f.resolve().relative_to(home.resolve()))
    except ValueError:
        return str(f.resolve())


def _read(home: Path, files: list[Path]) -> tuple[bytes, list[dict]]:
    parts, described = [], []
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as e:
            raise SpecError(f"cannot read corpus file {f}: {e.strerror}") from None
        parts.append(data)
        described.append({"path": _display(home, f), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return DOC_SEPARATOR.join(parts), described


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<u2").tobytes()).hexdigest()


def plan_corpus(spec: CorpusSpec, home: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read the sources and split them: (train tokens, held-out tokens, meta without timings)."""
    if spec.sources:
        train_files = _expand(home, spec.sources, "source")
        train_bytes, train_desc = _read(home, train_files)
        source: dict[str, Any] = {
            "kind": "files",
            "description": f"{len(train_files)} user file(s)",
            "files": train_desc,
        }
    else:
        train_bytes = builtin_text().encode("utf-8")
        source = {
            "kind": "builtin",
            "description": "tinyllm built-in text: data/classics.txt + generated simple English",
            "bytes": len(train_bytes),
            "sha256": hashlib.sha256(train_bytes).hexdigest(),
        }
    if spec.heldout:
        held_files = _expand(home, spec.heldout, "heldout")
        overlap = {f.resolve() for f in held_files} & {f.resolve() for f in (train_files if spec.sources else [])}
        if overlap:
            raise SpecError(f"corpus held-out files overlap its sources: {sorted(str(p) for p in overlap)[0]}")
        held_bytes, held_desc = _read(home, held_files)
        source["heldout_files"] = held_desc
        heldout: dict[str, Any] = {"kind": "files", "files": [d["path"] for d in held_desc]}
    elif spec.heldout_split == "interleaved":
        every = interleave_every(spec.heldout_fraction)
        held_bytes = b""  # char: cut in characters (_char_tokens)
        if spec.tokenizer == "byte":
            train_bytes, held_bytes = interleave(train_bytes, every)
        heldout = {
            "kind": "interleaved",
            "block": HELDOUT_BLOCK,
            "every": every,
            "fraction": spec.heldout_fraction,
            "unit": "characters" if spec.tokenizer == "char" else "bytes",
        }
    else:
        split = int(len(train_bytes) * (1.0 - spec.heldout_fraction))
        train_bytes, held_bytes = train_bytes[:split], train_bytes[split:]
        heldout = {"kind": "tail", "start": split, "end": split + len(held_bytes), "fraction": spec.heldout_fraction}
    vocab = None
    if spec.tokenizer == "char":
        tokens, held, vocab, heldout = _char_tokens(spec, train_bytes, held_bytes, heldout)
    else:
        tokens = np.frombuffer(train_bytes, dtype=np.uint8).astype("<u2")  # byte-level: id = byte
        held = np.frombuffer(held_bytes, dtype=np.uint8).astype("<u2")
    if len(tokens) < 2 or len(held) < 2:
        raise SpecError(f"corpus {spec.name!r} is too small: {len(tokens)} training and {len(held)} held-out tokens")
    shown = spec.model_dump(exclude={"name"} | ({"heldout_split"} if spec.heldout_split == "tail" else set()))
    checksum_input = json.dumps({"spec": shown, "source": source, "heldout": heldout}, sort_keys=True)
    meta = {
        "format": FORMAT,
        "name": spec.name,
        "tokenizer": spec.tokenizer,
        "vocab_size": tokenizer.VOCAB_SIZE if vocab is None else vocab.vocab_size,
        "dtype": "uint16",
        "source": source,
        "heldout": heldout,
        "tokens": int(len(tokens)),
        "heldout_tokens": int(len(held)),
        "tokens_sha256": _sha(tokens),
        "heldout_sha256": _sha(held),
        "checksum": hashlib.sha256(checksum_input.encode() + _sha(tokens).encode() + _sha(held).encode()).hexdigest(),
    }
    if vocab is not None:
        meta.update(vocab=vocab.chars, vocab_sha256=vocab.sha256)
    return tokens, held, meta


def _utf8(data: bytes, what: str, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"corpus {name!r}: the char tokenizer reads UTF-8 text; {what} is not UTF-8 "
            f"(byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


HELDOUT_BLOCK = 512  # units (bytes or characters) per block of an interleaved held-out split


def interleave_every(fraction: float) -> int:
    """k of an interleaved split: one block in k is held out (at least 2, so training keeps blocks)."""
    return max(2, round(1.0 / fraction))


def interleave(text, every: int):
    """(training, held-out) of ``text`` (bytes or str): of each group of ``every`` blocks of
    ``HELDOUT_BLOCK`` units the middle one is held out (index ``every // 2`` modulo ``every``: a short
    first part, such as the built-in text's 9 KB of classic prose, still gives the held-out part
    blocks), the others are trained on, each in order."""
    blocks = [text[i : i + HELDOUT_BLOCK] for i in range(0, len(text), HELDOUT_BLOCK)]
    empty, mid = text[:0], every // 2
    return (
        empty.join(b for j, b in enumerate(blocks) if j % every != mid),
        empty.join(b for j, b in enumerate(blocks) if j % every == mid),
    )


def _char_tokens(spec: CorpusSpec, train_bytes: bytes, held_bytes: bytes, heldout: dict):
    """(train ids, held-out ids, vocabulary, heldout record) at character level; a tail split
    (already cut in bytes above) is redone in characters, as nanoGPT's prepare.py does."""
    if heldout["kind"] == "tail":
        text = _utf8(train_bytes + held_bytes, "the source text", spec.name)
        split = int(len(text) * (1.0 - spec.heldout_fraction))
        train_text, held_text = text[:split], text[split:]
        heldout = {**heldout, "start": split, "end": len(text), "unit": "characters"}
    elif heldout["kind"] == "interleaved":  # the blocks are cut in characters
        train_text, held_text = interleave(_utf8(train_bytes, "the source text", spec.name), heldout["every"])
    else:
        train_text = _utf8(train_bytes, "the source text", spec.name)
        held_text = _utf8(held_bytes, "the held-out text", spec.name)
    distinct = len(set(train_text) | set(held_text))
    if distinct > tokenizer.MAX_CHAR_VOCAB:
        raise SpecError(
            f"corpus {spec.name!r} has {distinct} distinct characters; the char tokenizer holds at most "
            f"{tokenizer.MAX_CHAR_VOCAB} (use the byte tokenizer)"
        )
    vocab = tokenizer.build_vocab(train_text + held_text)
    return vocab.encode(train_text).astype("<u2"), vocab.encode(held_text).astype("<u2"), vocab, heldout


def _intact(path: Path, meta: dict) -> bool:
    for fname, key in (("tokens.bin", "tokens_sha256"), ("heldout.bin", "heldout_sha256")):
        try:
            if hashlib.sha256((path / fname).read_bytes()).hexdigest() != meta.get(key):
                return False
        except OSError:
            return False
    return True


def _fsync_write(path: Path, data: bytes) -> None:
    with writing(path):
        write_synced(path, data)


def build_corpus(spec: CorpusSpec, home: Path) -> dict:
    """Build (or keep) ``corpora/<name>/``; return the CLI's result object."""
    try:
        faults.arm_from_env()  # tests only: a misspelled TINYLLM_FAULT would run unarmed
    except faults.FaultError as e:
        raise SpecError(str(e)) from None
    tokens, held, meta = plan_corpus(spec, home)
    hold = lambda n: faults.hold_at("corpus.hold", n, RunHome(home).corpora, lambda: bool(STOP["requested"]))  # noqa: E731
    final = corpus_dir(home, spec.name)
    built = True
    existing = read_meta(final) if final.exists() else None
    if (
        final.exists()
        and existing is not None
        and existing.get("checksum") == meta["checksum"]
        and _intact(final, existing)
    ):
        built = False
    elif final.exists() and existing is not None and existing.get("checksum") != meta["checksum"]:
        raise SpecError(
            f"corpus {spec.name!r} already exists at {final} with other sources or another tokenizer; use another name or remove it"
        )
    elif final.exists() and existing is None and any(final.iterdir()):
        raise SpecError(f"{final} exists but is not a corpus (no readable meta.json); remove it or use another name")
    else:  # absent, empty, or same sources with damaged files: (re)build atomically
        hold(1)  # tests only (TINYLLM_FAULT=corpus.hold@1)
        if STOP["requested"]:  # a stop signal while planning: nothing written (the same command builds it)
            raise StopRequested(
                f"corpus {spec.name!r}: build stopped by {signal_name(STOP['signal'])} before "
                "anything was written; the same command builds it"
            )
        # from here the write runs to its end: a stop signal only sets the flag (tinyllm/errors.py)
        tmp = final.parent / f".tmp-{spec.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _fsync_write(tmp / "tokens.bin", tokens.tobytes())
        hold(2)  # tests only (TINYLLM_FAULT=corpus.hold@2): a stop in the middle of the write
        _fsync_write(tmp / "heldout.bin", held.tobytes())
        _fsync_write(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(final.parent)
    return {
        "name": spec.name,
        "path": str(final.relative_to(home)),
        "tokens": meta["tokens"],
        "heldout_tokens": meta["heldout_tokens"],
        "checksum": meta["checksum"],
        "built": built,
    }


def open_corpus(home: Path, name: str, part: str = "tokens") -> tuple[np.ndarray, dict]:
    """Memory-map ``tokens.bin`` (``part="tokens"``) or ``heldout.bin`` (``part="heldout"``)."""
    path = corpus_dir(home, name)
    meta = read_meta(path)
    if meta is None:
        raise SpecError(f"corpus {name!r} not found at {path} (build it with: tinyllm corpus --spec FILE)")
    fname, count = (
        ("tokens.bin", meta.get("tokens")) if part == "tokens" else ("heldout.bin", meta.get("heldout_tokens"))
    )
    f = path / fname
    try:
        n = int(count or 0)
    except (TypeError, ValueError):
        n = -1
    if not f.exists() or f.stat().st_size != 2 * n:
        raise SpecError(f"corpus {name!r}: {f} is missing or not {count} tokens long (rebuild it with tinyllm corpus)")
    key = "tokens_sha256" if part == "tokens" else "heldout_sha256"
    if _file_sha(f) != meta.get(key):  # never train or evaluate on silently damaged data
        raise SpecError(
            f"corpus {name!r}: {f} fails its sha256 checksum (damaged); rebuild it with tinyllm corpus "
            f"(ctl train rebuilds it by itself)"
        )
    return np.memmap(f, dtype="<u2", mode="r"), meta


def _file_sha(path: Path, chunk_bytes: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()
