"""OpenTelemetry's side of tracing (the ``[trace]`` extra): exporters, and the trainer's ``train.step`` spans.

Imported only when tracing is on (``tinyllm/sinks/tracing.py`` decides; nothing imports this module
otherwise, so ``opentelemetry`` is never loaded by a run without tracing).

- ``exporter(destination)``: ``file:PATH`` -> ``JsonLinesSpanExporter`` (one span a line, appended with
  one ``write`` per batch, so that ctl and its trainers can share the file); ``otlp:ENDPOINT`` -> the
  SDK's OTLP/HTTP exporter, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables. Either is
  wrapped in ``WarnOnce``: the first failure prints one warning line and turns exporting off for this
  process; training never waits on it beyond the exporter's own timeout and never fails for it.
- ``StepSpanSink``: a metrics sink (tinyllm/sinks/metrics.py) of a trainer whose ``$TRACEPARENT`` names its
  activity attempt's span: every ``log_every`` steps (and the last one, and every validation frame) a
  ``train.step`` span, child of that span, lasting the step (``timer/step_s``), with the frame's
  figures as attributes (``train.loss``, ``timer.tokens_per_s``, ``optim.lr``, ``val.*``). Spans go out
  in batches on the SDK's thread (``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default); a killed trainer loses
  at most the batch in waiting (best effort, as every sink).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

try:
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the message names the extra
    raise ImportError("traces need the trace extra: pip install -e '.[trace]'") from None

SERVICE_NAME = "durable-train"
INSTRUMENTATION = "durable-train"
for _name in ("opentelemetry.exporter", "opentelemetry.sdk._shared_internal", "opentelemetry.sdk.trace.export"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)  # WarnOnce says it once, in our words


def resource() -> Resource:
    """``service.name`` durable-train (``$OTEL_SERVICE_NAME`` / ``$OTEL_RESOURCE_ATTRIBUTES`` win)."""
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})


def hex_id(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """One span as a JSON object (a line of a ``--trace-file``)."""
    ctx = span.get_span_context()
    assert ctx is not None  # (a span the SDK made has its context)
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": hex_id(ctx.trace_id, 32),
        "span_id": hex_id(ctx.span_id, 16),
        "parent_id": hex_id(parent.span_id, 16) if parent is not None else None,
        "kind": span.kind.name,
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "service": (span.resource.attributes or {}).get("service.name"),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each batch to ``path`` as JSON lines, in one ``write`` of an ``O_APPEND`` descriptor (whole
    lines even with several writing processes); nothing is buffered between batches."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        data = "".join(json.dumps(span_json(s), sort_keys=True) + "\n" for s in spans).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class WarnOnce(SpanExporter):
    """Wraps an exporter: its first failure (a result or an exception) prints one warning line and
    turns it off for this process (later batches fail at once, costing nothing)."""

    def __init__(self, inner: SpanExporter, where: str, prefix: str, then: str, stream=None):
        self.inner, self.where, self.prefix, self.then = inner, where, prefix, then
        self.stream = stream
        self.failed: str | None = None
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.failed is not None:
            return SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
            why = None if result == SpanExportResult.SUCCESS else "the exporter reported a failure"
        except Exception as e:  # a full disk, a refused connection the exporter did not catch, ...
            result, why = SpanExportResult.FAILURE, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if why is not None:
            with self._lock:
                first, self.failed = self.failed is None, why
            if first:
                print(
                    f"{self.prefix}: warning: traces to {self.where} failed ({why}); off for this {self.then}",
                    file=self.stream or sys.stderr,
                    flush=True,
                )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def exporter(where: str) -> SpanExporter:
    """The exporter of a destination (``tinyllm.sinks.tracing.destination``)."""
    kind, _, target = where.partition(":")
    if kind == "file":
        return JsonLinesSpanExporter(target)
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ImportError(
                "OTLP traces need the trace extra (opentelemetry-exporter-otlp-proto-http): pip install -e '.[trace]'"
            ) from None
        return OTLPSpanExporter()  # endpoint, headers, timeout, compression: the OTEL_EXPORTER_OTLP_* variables
    raise ValueError(f"unknown trace destination {where!r}")


def _attribute(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) else None


class StepSpanSink:
    """The trainer's sampled ``train.step`` spans (see the module docstring)."""

    name = "trace"

    def __init__(
        self,
        every: int,
        total_steps: int,
        parent: str,
        where: str,
        *,
        span_exporter: SpanExporter | None = None,
        attributes: dict[str, Any] | None = None,
        stream=None,
    ):
        self.every, self.total = max(1, int(every)), total_steps
        self.context = TraceContextTextMapPropagator().extract({"traceparent": parent})
        inner = span_exporter if span_exporter is not None else exporter(where)
        self.exporter = WarnOnce(inner, where.partition(":")[2], "tinyllm", "attempt (training goes on)", stream)
        self.provider = TracerProvider(resource=resource())
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer(INSTRUMENTATION)
        self.attributes = dict(attributes or {})

    def write(self, step: int, frame: dict) -> None:
        has_val = any(k.startswith("val/") for k in frame)
        if step % self.every and step != self.total and not has_val:
            return
        end = time.time_ns()
        took = frame.get("timer/step_s")
        start = end - int(took * 1e9) if isinstance(took, (int, float)) and took > 0 else end
        attrs = {**self.attributes, "train.step": step}
        for key, value in frame.items():
            if (v := _attribute(value)) is not None:
                attrs[key.replace("/", ".")] = v
        span = self.tracer.start_span(
            "train.step", context=self.context, kind=trace_api.SpanKind.INTERNAL, attributes=attrs, start_time=start
        )
        span.end(end_time=end)

    def close(self) -> None:
        self.provider.shutdown()  # the last batch goes out (bounded by the exporter's timeout)
