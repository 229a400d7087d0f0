"""Traces of a TrainRun: whether tracing is configured, and the W3C trace context (standard library only).

Tracing is on for ``ctl train`` when ``--trace-file FILE`` is given (JSON lines) or
``$OTEL_EXPORTER_OTLP_ENDPOINT`` / ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (OTLP over HTTP,
the ``[trace]`` extra), unless ``$OTEL_SDK_DISABLED`` is true or ``$OTEL_TRACES_EXPORTER`` is
``none``. For a trainer (``tinyllm train``) it is on when, besides, ``$TRACEPARENT`` names its parent
span (ctl sets it to the activity attempt's span; ``$CTL_TRACE_FILE`` carries ctl's ``--trace-file``).

Nothing here imports OpenTelemetry: this module only decides, and names ids. The spans are made by
``tinyllm/sinks/trace_export.py`` (the trainer's sampled ``train.step`` spans, the exporters) and
``app/traces.py`` (the run's spans, from the engine's history), which are imported only when tracing
is on.

Ids: a run's trace id is recorded in its history (``TrainRunInput.trace``) when it starts traced, and
read back by every later ``ctl train`` of it, so a resume continues the same trace. Span ids are
``span_id(trace_id, key)``: a hash of the trace id and what the span stands for (``attempt train/tiny
train-000200 2``), so a span built again from the history has the same id, and the trainer's spans
name their parent without any message between the processes but ``TRACEPARENT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Mapping

TRACEPARENT = "TRACEPARENT"  # the W3C trace context of a process's parent span (the standard variable)
TRACE_FILE_ENV = "CTL_TRACE_FILE"  # ctl's --trace-file, for the trainers it starts
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
EXTRA_HINT = "pip install -e '.[trace]'"


def otlp_endpoint(env: Mapping[str, str] | None = None) -> str | None:
    """The OTLP endpoint the environment names (the traces one first), or None (also when disabled)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    return (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ""
    ).strip() or None


def destination(env: Mapping[str, str] | None = None, trace_file: str | Path | None = None) -> str | None:
    """Where spans go: ``file:<absolute path>`` (``trace_file``, else ``$CTL_TRACE_FILE``), else
    ``otlp:<endpoint>``; None: tracing is off."""
    env = os.environ if env is None else env
    path = trace_file or env.get(TRACE_FILE_ENV)
    if path:
        return f"file:{Path(path).expanduser().resolve()}"
    endpoint = otlp_endpoint(env)
    return f"otlp:{endpoint}" if endpoint else None


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, span id) in hex of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``), or None
    when it is missing or malformed (an all-zero id, version ff)."""
    m = _TRACEPARENT_RE.match((value or "").strip().lower())
    if not m or m.group(1) == "ff" or set(m.group(2)) == {"0"} or set(m.group(3)) == {"0"}:
        return None
    return m.group(2), m.group(3)


def traceparent(trace_id: str, span_id: str) -> str:
    """The W3C ``traceparent`` of a sampled span."""
    return f"00-{trace_id}-{span_id}-01"


def span_id(trace_id: str, key: str) -> str:
    """The span id (16 hex digits, never zero) of what ``key`` names in trace ``trace_id``."""
    digest = hashlib.sha256(f"{trace_id}\x00{key}".encode("utf-8")).digest()
    value = int.from_bytes(digest[:8], "big") or 1
    return f"{value:016x}"


def new_trace_id() -> str:
    """A fresh random trace id (32 hex digits), for a run that starts traced with no caller's trace."""
    while True:
        value = os.urandom(16).hex()
        if set(value) != {"0"}:
            return value


def derived_trace_id(home: str | Path, run_id: str, started_at: float) -> str:
    """The trace id of a run whose history records none (it started without tracing): a hash of the
    home, the run's id and its first workflow's start time, so every later ``ctl train`` of it agrees."""
    text = f"durable-train trace\x00{Path(home).resolve()}\x00{run_id}\x00{float(started_at).hex()}"
    return hashlib.sha256(text.encode("utf-8")).digest()[:16].hex()


def attempt_key(workflow_id: str, activity_id: str, attempt: int) -> str:
    """The key of an activity attempt's span (the parent of its trainer's spans)."""
    return f"attempt {workflow_id} {activity_id} {attempt}"


def trainer_tracing(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(traceparent, destination) when a trainer should emit spans: ``$TRACEPARENT`` is valid and
    a destination is configured; else None."""
    env = os.environ if env is None else env
    parent = env.get(TRACEPARENT)
    where = destination(env)
    if parse_traceparent(parent) is None or where is None:
        return None
    return str(parent), where


MARK_FILE = "trace.json"


def mark_path(run_dir: Path) -> Path:
    """ctl's record of a run's trace: its id, and per destination the last event sent of each workflow."""
    return Path(run_dir) / "sinks" / MARK_FILE


def read_mark(run_dir: Path) -> dict:
    try:
        data = json.loads(mark_path(run_dir).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
