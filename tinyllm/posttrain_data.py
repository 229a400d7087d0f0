"""Post-training data: preference pairs and prompts from JSONL, addressed by a cursor.

Item ``j`` of the training stream (``j = cursor * per_batch + i``) is row ``perm_e[j mod N]`` of
epoch ``e = j // N``, where ``perm_e`` is a permutation seeded by ``(seed, e)`` (or the file order
without shuffle): a pure function of the cursor, so the checkpointed cursor is the whole data
position. Texts are byte tokens; a pair member or prompt that cannot fit the model's context is
bad input at load, as is a malformed file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import tokenizer
from .errors import SpecError
from .datafiles import jsonl_objects, read_utf8, resolve_path

END = "\n"  # a completion ends with a newline (the byte tokenizer has no EOS); generation stops there


@dataclass(frozen=True)
class JsonlFile:
    path: Path
    sha256: str
    rows: list[dict]

    def identity(self) -> dict:
        return {"sha256": self.sha256, "records": len(self.rows)}


def read_jsonl(path_text: str, home: Path, what: str, columns: dict[str, bool]) -> JsonlFile:
    """Rows of a JSONL file holding string ``columns`` (name -> required); one SpecError line on any problem."""
    path = resolve_path(path_text, home)
    raw, text = read_utf8(path, what, SpecError)
    rows = []
    for n, row in jsonl_objects(text, f"{what} file {path}", SpecError):
        out: dict[str, Any] = {}
        for col, required in columns.items():
            v = row.get(col)
            if v is None and not required:
                out[col] = None
                continue
            if not isinstance(v, str) or (required and not v):
                raise SpecError(f"{what} file {path} line {n}: column {col!r} missing or not a non-empty string")
            out[col] = v
        rows.append(out)
    if not rows:
        raise SpecError(f"{what} file {path} has no rows")
    return JsonlFile(path, hashlib.sha256(raw).hexdigest(), rows)


def cursor_indices(n_rows: int, per_batch: int, cursor: int, seed: int, shuffle: bool) -> list[int]:
    """Row indices of batch ``cursor`` (see the module docstring)."""
    out = []
    cache: dict[int, np.ndarray] = {}
    for j in range(cursor * per_batch, (cursor + 1) * per_batch):
        epoch, k = divmod(j, n_rows)
        if not shuffle:
            out.append(k)
            continue
        if epoch not in cache:
            cache[epoch] = np.random.default_rng([seed & ((1 << 64) - 1), epoch]).permutation(n_rows)
        out.append(int(cache[epoch][k]))
    return out


def ids(text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text)]


# -- preference pairs ------------------------------------------------------------------------------

PAIR_COLUMNS = {"prompt": True, "chosen": True, "rejected": True}


def load_pairs(path_text: str, home: Path, block_size: int, what: str) -> JsonlFile:
    f = read_jsonl(path_text, home, what, PAIR_COLUMNS)
    for n, row in enumerate(f.rows, start=1):
        for member in ("chosen", "rejected"):
            length = len(ids(row["prompt"] + row[member] + END))
            if length > block_size + 1:
                raise SpecError(
                    f"{what} file {f.path} pair {n}: prompt + {member} is {length} tokens, "
                    f"more than block_size + 1 = {block_size + 1}"
                )
    return f


def pair_members(f: JsonlFile) -> set[str]:
    return {row["prompt"] + END + row[m] for row in f.rows for m in ("chosen", "rejected")}


def check_pairs_disjoint(train: JsonlFile, heldout: JsonlFile) -> None:
    """A held-out pair member (prompt + completion) that is also a training pair member is bad input."""
    if train.sha256 == heldout.sha256:
        raise SpecError(f"held-out pairs {heldout.path} are the training pairs {train.path} (same content)")
    shared = sorted(pair_members(train) & pair_members(heldout))
    if shared:
        prompt, completion = shared[0].split(END, 1)
        raise SpecError(
            f"held-out pairs {heldout.path} share {len(shared)} pair member(s) with the training pairs "
            f"{train.path}, e.g. prompt {prompt!r} completion {completion!r}"
        )


# -- prompts -------------------------------------------------------------------------------------


def load_prompts(
    path_text: str,
    home: Path,
    prompt_column: str,
    response_column: str | None,
    block_size: int,
    max_tokens: int,
    what: str,
) -> JsonlFile:
    cols = {prompt_column: True}
    if response_column:
        cols[response_column] = False
    f = read_jsonl(path_text, home, what, cols)
    rows = [
        {"prompt": r[prompt_column], "response": r.get(response_column) if response_column else None} for r in f.rows
    ]
    for n, row in enumerate(rows, start=1):
        length = len(ids(row["prompt"])) + max_tokens
        if length > block_size + 1:
            raise SpecError(
                f"{what} file {f.path} row {n}: prompt + max_tokens is {length} tokens, "
                f"more than block_size + 1 = {block_size + 1}"
            )
    return JsonlFile(f.path, f.sha256, rows)


def check_prompts_disjoint(train: JsonlFile, heldout_path: Path, heldout_sha: str, heldout_prompts: list[str]) -> None:
    """Held-out prompts must be a separate source: not the training file, and no shared prompt."""
    if Path(heldout_path).resolve() == Path(train.path).resolve() or heldout_sha == train.sha256:
        raise SpecError(f"held-out prompts {heldout_path} are the training prompts file {train.path}")
    shared = sorted({r["prompt"] for r in train.rows} & set(heldout_prompts))
    if shared:
        raise SpecError(
            f"held-out prompts {heldout_path} share {len(shared)} prompt(s) with the training prompts "
            f"{train.path}, e.g. {shared[0]!r}"
        )
