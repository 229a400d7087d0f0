"""The kill-and-compare core that every real-process proof shares: ``ctl verify-resume`` (verify.py), the
real kill loop (kill_loop.py) and the fault campaign (campaign*.py).

Each of them runs a trainer uninterrupted, runs it again with interruptions, and compares; what they
have in common is here, once:

- reading a run home as the trainer contract writes it (``latest_step``: LATEST's step; ``last_step``:
  the last per-step record of ``metrics.jsonl``; ``progress_lines``: the JSON objects of a progress file);
- signalling an attempt (``signal_group``: a process group that may be gone already);
- the comparison, bit for bit (``differing``: the result fields that differ; ``compare_results``: a
  whole ``ctl train`` outcome, its segments too, in words);
- what an interruption cost and what it proved (``steps_lost``: the steps done when it came that the next
  attempt's checkpoint does not hold; ``resumed_inside``: a resume from a checkpoint strictly inside a
  segment, the only kind that proves exact resume);
- the errors (``ProofError``, ``BadInput``: bad input before anything ran; ``RunFailed``).

It imports nothing of ctl: ctl's ``verify-resume`` command is a thin click wrapper over verify.py and
turns these errors into its exit codes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from contracts.layout import STEP_PREFIX, RunHome

RESULT_KEYS = ("final_loss_hex", "digest")  # what a trainer's result line proves bit for bit
_STEP = re.compile(rf"{STEP_PREFIX}(\d+)$")


class ProofError(Exception):
    """A proof could not be made (a run failed in a way that is no planned interruption)."""


class BadInput(ProofError):
    """Bad input (the spec, an option, the trainer's command): nothing was run."""


class RunFailed(ProofError):
    """A run of the trainer failed in a way that is not a planned interruption."""


# --- a run home, as the trainer contract writes it ------------------------------------------------


def latest_step(home: Path, name: str) -> int:
    """The step of the run's newest checkpoint (LATEST: ``step-NNNNNN``, or a path ending so), 0 when it has
    none or names none."""
    try:
        text = RunHome(home).run(name).latest.read_text(encoding="utf-8").strip()
        m = _STEP.search(text)
        return int(m.group(1)) if m else int(text.removeprefix(STEP_PREFIX))
    except (OSError, ValueError):
        return 0


def last_step(metrics: Path, tail_bytes: int = 65536) -> int | None:
    """The ``step`` of the last per-step record of ``metrics`` (runs/<name>/metrics.jsonl), read from its
    tail; None when it has none (or cannot be read)."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            return int(json.loads(raw)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def progress_lines(path: Path) -> list[dict]:
    """The JSON objects of a progress file, in order (a line that is no JSON object, or no UTF-8, is skipped)."""
    out = []
    try:
        for raw in path.read_bytes().splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                out.append(line)
    except OSError:
        pass
    return out


# --- signals -----------------------------------------------------------------------------------


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to process group ``pid`` (an attempt started in its own session); nothing if it is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


# --- the comparison ----------------------------------------------------------------------------


def differing(got: dict, want: dict, keys: Iterable[str] = RESULT_KEYS) -> list[str]:
    """The ``keys`` whose values differ between two results (bit for bit: ``final_loss_hex`` is float.hex)."""
    return [k for k in keys if got.get(k) != want.get(k)]


def compare_results(got: dict, want: dict) -> list[str]:
    """A ``ctl train --json`` result against the uninterrupted run's: every difference, in words (its steps,
    final loss bits, model digest, final checkpoint; each segment's loss bits and digest; their number)."""
    bad = [
        f"{key}: {got.get(key)} != uninterrupted {want.get(key)}"
        for key in differing(got, want, ("steps", "final_loss_hex", "digest", "checkpoint"))
    ]
    for a, b in zip(got.get("segments") or [], want.get("segments") or []):
        for key in differing(a["train"], b["train"]):
            bad.append(f"segment {a['until']} {key}: {a['train'].get(key)} != {b['train'].get(key)}")
    if len(got.get("segments") or []) != len(want.get("segments") or []):
        bad.append("a different number of segments")
    return bad


# --- what an interruption cost, and what it proved ------------------------------------------------


def steps_lost(done: Iterable[Any], resumed: int) -> tuple[int | None, int | None]:
    """``(lost, done)`` of one interruption: done = the furthest of the integers in ``done`` (its ``stopping``
    line's step, the last per-step record it wrote: a trainer that trains on after the signal loses those
    steps too), lost = the steps of those not in the checkpoint the next attempt resumed from (``resumed``);
    ``(None, None)`` when nothing says how far it got."""
    steps = [s for s in done if isinstance(s, int) and not isinstance(s, bool)]
    top = max(steps) if steps else None
    return (None if top is None else max(0, top - resumed)), top


def resumed_inside(step: int, ends: Iterable[int]) -> bool:
    """A resume from the checkpoint at ``step`` proves exact resume: it is strictly inside a segment (the run's
    segments end at ``ends``): not a fresh start (0), not a segment's end, not past the run's end (a resume
    from there trains nothing after it)."""
    ends = set(ends)
    return 0 < step < max(ends, default=0) and step not in ends
