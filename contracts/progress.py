"""The progress-line format: the JSON lines a trainer appends to its ``--progress`` file.

One JSON object per line, each with the ``time`` it was written (seconds since the epoch):

- a checkpoint line ``{"step", "loss", "loss_hex", "checkpoint", "time"}`` after each checkpoint, fsynced
  (tinyllm's have no ``event``; the durable helper's and the integrations' say ``"event": "checkpoint"``):
  the runner records it as the heartbeat's details, and a redelivered attempt resumes from its ``checkpoint``;
- a liveness line ``{"event", "time", ...}``: ``starting``, ``ready``, ``progress`` (``step``, ``loss``,
  ``last_checkpoint`` when training; ``done``, ``of``, ``unit`` when evaluating), ``start`` / ``resume``
  (``step``, ``resumed_from``, ``refused``), ``stopping`` (``step``, ``signal``: a polite stop noticed).

A line that is not a JSON object, or holds a non-finite number, is no progress line (``parse_line``: None).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

EVENT = "event"
CHECKPOINT_EVENT = "checkpoint"
STOPPING_EVENT = "stopping"
RESUME_EVENTS = ("resume", "start")


def format_line(line: Mapping[str, Any], time_s: float) -> str:
    """One progress line (with its newline): ``line``'s fields and the ``time`` it is written."""
    return json.dumps({**line, "time": time_s}) + "\n"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text}")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parse_line(raw: bytes | str) -> dict[str, Any] | None:
    """The object of one progress line; None for a blank, malformed, non-object or non-finite line."""
    if not raw.strip():
        return None
    try:
        value = json.loads(raw, parse_float=_finite, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def int_step(line: Mapping[str, Any]) -> int | None:
    """The line's integer ``step`` (a bool is no step), or None."""
    step = line.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def is_liveness(line: Mapping[str, Any]) -> bool:
    """A liveness line (it has an ``event``; it may omit ``step``)."""
    return EVENT in line


def saved_checkpoint(line: Mapping[str, Any]) -> str | None:
    """The checkpoint a checkpoint line says was saved at its step, else None (other lines may carry the
    newest checkpoint too, at another step: not a save at that step)."""
    if (
        line.get(EVENT) in (None, CHECKPOINT_EVENT)
        and isinstance(line.get("checkpoint"), str)
        and int_step(line) is not None
    ):
        return str(line["checkpoint"])
    return None
