"""OpenTelemetry traces of a TrainRun, built from the engine's durable history (the ``[trace]`` extra).

Imported by ``ctl train`` only when tracing is on (``--trace-file FILE``, or
``$OTEL_EXPORTER_OTLP_ENDPOINT``; tinyllm/sinks/tracing.py). One trace per run (``train/<name>`` and its
continuations ``/2``, ``/3``); its spans:

    TrainRun train/tiny                      the run, first start to completion (sent when it completes)
      workflow train/tiny                    each workflow of the run, start to its end
        corpus corpus-default                each activity attempt: durable.attempt, durable.outcome,
        train train-000100                   durable.resume_checkpoint (what it resumed from), ...
          checkpoint step-000050             each checkpoint the attempt reported (written -> recorded)
          train.step                         sampled steps, sent by the trainer itself (TRACEPARENT)
        eval eval-000100-ppl                 each evaluation suite (eval.suite, its figures)
        durable.wait                         each durable timer, started -> fired

Every span but ``train.step`` is made here from the history, with the recorded times, when the event
that ends it is in the history: an attempt at its completed / failed / timed-out event (a worker killed
mid-attempt: the recovering ``ctl train`` records "worker lost", and the attempt's span ends at the last
event it recorded), a workflow at its end. Span ids are hashes of the trace id and what the span stands
for (tinyllm/sinks/tracing.py ``span_id``), so the same history always gives the same spans, and each
trainer, given ``TRACEPARENT`` = its attempt's span, joins the tree with no other message.

Delivery: a thread reads the events the history gained since its last poll every ``POLL_S`` (and once
more at the end; ``HistorySpans`` keeps what is open in between, so a poll costs what is new, not the
whole history), and exports the spans they closed in one ``export`` call; only when it succeeded is the mark
``runs/<name>/sinks/trace.json`` advanced (per destination: the last event seq sent of each workflow).
So a ``ctl train`` killed at any moment leaves the rest to the next one, which sends it from the
history: each span once, but for a kill between an export and its mark (the same span, same id, sent
again). A failing destination costs one warning line and turns traces off for that command; the mark
stays, and the next ``ctl train`` of the run sends what is missing.

The trace id is recorded in the run's history (``TrainRunInput.trace``, see ``trace_context``), so it
survives any kill; ``ctl show`` prints it.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from contracts.layout import RunHome
from tinyllm.sinks import tracing
from tinyllm.fsio import atomic_write

try:
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

    from tinyllm.sinks import trace_export
except ImportError:  # pragma: no cover - the message names the extra
    raise ImportError(f"traces need the trace extra: {tracing.EXTRA_HINT}") from None

POLL_S = 1.0  # how often the spans the history closed are sent while the run goes on

Histories = Callable[[], list[tuple[str, list[Any]]]]
"""() -> [(workflow id, its events)] of every workflow of the run, oldest first."""
NewEvents = Callable[[Mapping[str, int]], list[tuple[str, list[Any]]]]
"""(the last event seq read of each workflow) -> [(workflow id, its events after that)], oldest first."""


# --- the spans of a history (no OpenTelemetry: plain records) ----------------------------------------


@dataclass
class SpanRecord:
    key: str  # what it stands for; its span id is tracing.span_id(trace_id, key)
    name: str
    parent_key: str | None  # None: the root (its parent: the caller's span, if any)
    start: float  # seconds since the epoch, as recorded
    end: float
    closed_at: tuple[str, int]  # (workflow id, seq) of the event that ends it
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a description: the span's status is ERROR


@dataclass
class _Attempt:
    wid: str
    activity_id: str
    name: str
    attempt: int
    start: float
    worker: str | None
    last: float
    input: Any
    resume: str | None = None
    resumed: bool = False

    @property
    def key(self) -> str:
        return tracing.attempt_key(self.wid, self.activity_id, self.attempt)


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        out[prefix] = value


def _attempt_record(
    a: _Attempt, end: float, seq: int, outcome: str, result: Any = None, error: Any = None
) -> SpanRecord:
    attrs: dict[str, Any] = {
        "durable.workflow_id": a.wid,
        "durable.activity_id": a.activity_id,
        "durable.activity": a.name,
        "durable.attempt": a.attempt,
        "durable.outcome": outcome,
    }
    if a.worker:
        attrs["durable.worker"] = a.worker
    res = result if isinstance(result, dict) else {}
    if a.name == "train":
        resume = a.resume if a.resumed else res.get("resumed_from")
        if resume:
            attrs["durable.resume_checkpoint"] = str(resume)
        spec = a.input.get("spec") if isinstance(a.input, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("steps"), int):
            attrs["train.until_step"] = spec["steps"]
        for k in ("steps", "final_loss", "final_loss_hex", "digest", "checkpoint"):
            _flat(f"train.{k}", res.get(k), attrs)
    elif a.name == "eval":
        spec = a.input.get("spec") if isinstance(a.input, dict) else None
        if isinstance(spec, dict):
            _flat("eval.suite", spec.get("suite"), attrs)
            _flat("eval.tag", spec.get("tag"), attrs)
        metrics = (res.get("summary") or {}).get("metrics") if isinstance(res.get("summary"), dict) else None
        for subject, figures in (metrics or {}).items():
            for metric, value in (figures or {}).items() if isinstance(figures, dict) else ():
                _flat(f"eval.{subject}.{metric.replace('/', '.')}", value, attrs)
    elif a.name == "corpus":
        for k in ("name", "checksum", "tokens"):
            _flat(f"corpus.{k}", res.get(k), attrs)
    why = None
    if isinstance(error, dict):
        why = f"{error.get('type', 'error')}: {error.get('message', '')}"
        attrs["error.type"] = str(error.get("type", "error"))
    elif outcome not in ("completed", "canceled"):
        why = outcome
    return SpanRecord(
        a.key, f"{a.name} {a.activity_id}", f"workflow {a.wid}", a.start, max(end, a.start), (a.wid, seq), attrs, why
    )


@dataclass
class _Workflow:
    """What ``HistorySpans`` keeps of one workflow between polls: what is open, and the last event fed."""

    start: float
    last_seq: int = 0
    scheduled: dict[str, tuple[str, Any]] = field(default_factory=dict)
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    timers: dict[int, tuple[float, dict]] = field(default_factory=dict)


class HistorySpans:
    """The spans of a run's workflows' histories (``engine.Event``s), made as the histories grow: ``feed``
    takes a workflow's events after those fed before and returns the records they close, each once, in
    the order they end; what is still open (attempts, timers) is kept for the next call. Feeding a
    history in any number of pieces gives the records of feeding it whole (``build_spans``)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.first_start: float | None = None
        self.workflows: dict[str, _Workflow] = {}  # in the order they started (oldest first)

    def seen(self) -> dict[str, int]:
        """The last event seq fed of each workflow."""
        return {wid: w.last_seq for wid, w in self.workflows.items()}

    def feed(self, wid: str, events: Iterable[Any]) -> list[SpanRecord]:
        out: list[SpanRecord] = []
        w = self.workflows.get(wid)
        for e in events:
            if w is None:
                w = self.workflows[wid] = _Workflow(e.time)
                self.first_start = e.time if self.first_start is None else self.first_start
            if e.seq <= w.last_seq:
                continue  # fed already
            w.last_seq = e.seq
            self._event(wid, w, e, out)
        return out

    def _event(self, wid: str, w: _Workflow, e: Any, out: list[SpanRecord]) -> None:
        wf_key = f"workflow {wid}"
        scheduled, open_attempts, timers = w.scheduled, w.attempts, w.timers
        a = e.attrs if isinstance(e.attrs, dict) else {}
        aid = str(a.get("activity_id", ""))
        att: _Attempt | None
        if e.type == "activity_scheduled":
            scheduled[aid] = (str(a.get("name", "")), a.get("input"))
        elif e.type == "activity_started":
            if aid in open_attempts:  # (never recorded so: a recovery closes an attempt first)
                out.append(_attempt_record(open_attempts.pop(aid), e.time, e.seq, "superseded"))
            name, inp = scheduled.get(aid, ("", None))
            open_attempts[aid] = _Attempt(
                wid, aid, name, int(a.get("attempt", 0)), e.time, a.get("worker"), e.time, inp
            )
        elif e.type == "activity_heartbeat" and aid in open_attempts:
            att = open_attempts[aid]
            if a.get("attempt") != att.attempt:
                return
            att.last = e.time
            d = x if isinstance(x := a.get("details"), dict) else {}
            if d.get("event") == "resume":
                att.resume, att.resumed = d.get("resumed_from"), True
            elif d.get("checkpoint") and "event" not in d:
                ckpt = str(d["checkpoint"])
                written = d.get("time") if isinstance(d.get("time"), (int, float)) else e.time
                attrs = {"checkpoint.path": ckpt, "durable.activity_id": aid, "durable.attempt": att.attempt}
                for k in ("step", "loss", "loss_hex"):
                    _flat(f"train.{k}", d.get(k), attrs)
                out.append(
                    SpanRecord(
                        f"checkpoint {att.key} {ckpt}",
                        f"checkpoint {Path(ckpt).name}",
                        att.key,
                        min(written, e.time),
                        e.time,
                        (wid, e.seq),
                        attrs,
                    )
                )
        elif e.type in (
            "activity_completed",
            "activity_failed",
            "activity_timed_out",
            "activity_canceled",
            "activity_preempted",
        ):
            att = open_attempts.get(aid)
            if att is None or a.get("attempt") != att.attempt:
                return  # canceled before it ran: no attempt
            del open_attempts[aid]
            if e.type == "activity_completed":
                out.append(_attempt_record(att, e.time, e.seq, "completed", result=a.get("result")))
            elif e.type == "activity_timed_out":
                kind = str(a.get("kind") or "timed out")
                end = att.last if kind == "worker lost" else e.time  # found dead later: it ended by then
                out.append(_attempt_record(att, end, e.seq, kind, error=a.get("error")))
            elif e.type == "activity_failed":
                out.append(_attempt_record(att, e.time, e.seq, "failed", error=a.get("error")))
            elif e.type == "activity_preempted":  # a polite stop: not an error
                out.append(
                    _attempt_record(
                        att,
                        e.time,
                        e.seq,
                        f"preempted ({a.get('signal')}, saved step {a.get('step')}, {a.get('steps_lost')} steps lost)",
                    )
                )
            else:
                out.append(_attempt_record(att, e.time, e.seq, "canceled"))  # a cancel: not an error
        elif e.type == "timer_started":
            timers[int(a.get("cmd", -1))] = (e.time, a)
        elif e.type in ("timer_fired", "timer_canceled") and int(a.get("cmd", -1)) in timers:
            started, ta = timers.pop(int(a["cmd"]))
            attrs = {
                "durable.workflow_id": wid,
                "durable.wait_s": float(ta.get("seconds", 0.0)),
                "durable.outcome": "fired" if e.type == "timer_fired" else "canceled",
            }
            out.append(
                SpanRecord(f"timer {wid} {a['cmd']}", "durable.wait", wf_key, started, e.time, (wid, e.seq), attrs)
            )
        elif e.type in ("workflow_completed", "workflow_failed", "workflow_canceled"):
            state = e.type.split("_", 1)[1]
            for att in open_attempts.values():  # still running when the workflow ended: abandoned
                out.append(_attempt_record(att, e.time, e.seq, f"abandoned (workflow {state})"))
            open_attempts.clear()
            for cmd, (started, ta) in timers.items():
                out.append(
                    SpanRecord(
                        f"timer {wid} {cmd}",
                        "durable.wait",
                        wf_key,
                        started,
                        e.time,
                        (wid, e.seq),
                        {
                            "durable.workflow_id": wid,
                            "durable.outcome": f"workflow {state}",
                            "durable.wait_s": float(ta.get("seconds", 0.0)),
                        },
                    )
                )
            timers.clear()
            err = a.get("error") if isinstance(a.get("error"), dict) else None
            attrs = {"durable.workflow_id": wid, "durable.state": state}
            why = f"{err.get('type', 'error')}: {err.get('message', '')}" if err and state == "failed" else None
            out.append(SpanRecord(wf_key, f"workflow {wid}", "run", w.start, e.time, (wid, e.seq), attrs, why))
            if state == "completed":  # the run's root: sent once, when the run completes
                res = x if isinstance(x := a.get("result"), dict) else {}
                root = {"durable.run_id": self.run_id, "durable.workflow_ids": list(self.workflows)}
                for k in ("name", "steps", "final_loss_hex", "digest", "checkpoint"):
                    _flat(f"train.{k}", res.get(k), root)
                assert self.first_start is not None  # (set at the run's first workflow_started)
                out.append(
                    SpanRecord("run", f"TrainRun {self.run_id}", None, self.first_start, e.time, (wid, e.seq), root)
                )


def build_spans(histories: Iterable[tuple[str, list[Any]]], run_id: str) -> list[SpanRecord]:
    """The spans of a run's workflows' whole histories, each once, in the order they end."""
    spans = HistorySpans(run_id)
    return [r for wid, events in histories for r in spans.feed(wid, events)]


# --- the run's trace context ---------------------------------------------------------------------------


def recorded_trace(histories: list[tuple[str, list[Any]]]) -> dict | None:
    """The trace a run's history records (its first workflow that started traced), or None."""
    for _, events in histories:
        if events and isinstance(events[0].attrs, dict):
            trace = (events[0].attrs.get("input") or {}).get("trace")
            if isinstance(trace, dict) and trace.get("trace_id"):
                return {"trace_id": trace["trace_id"], "parent_span_id": trace.get("parent_span_id")}
    return None


def trace_context(histories: list[tuple[str, list[Any]]], home: Path, run_id: str, env: Mapping[str, str]) -> dict:
    """The trace of run ``run_id``: the one its history records; else (it started untraced) one derived
    from its first start; else (a new run) the caller's ``$TRACEPARENT`` trace, else a fresh one."""
    recorded = recorded_trace(histories)
    if recorded is not None:
        return recorded
    started = [events[0].time for _, events in histories if events]
    if started:
        return {"trace_id": tracing.derived_trace_id(home, run_id, started[0]), "parent_span_id": None}
    caller = tracing.parse_traceparent(env.get(tracing.TRACEPARENT))
    if caller is not None:
        return {"trace_id": caller[0], "parent_span_id": caller[1]}
    return {"trace_id": tracing.new_trace_id(), "parent_span_id": None}


# --- spans out: OpenTelemetry's SDK, with the ids and times chosen here ---------------------------------


class _ChosenIds(IdGenerator):
    """Hands out the ids set just before each span starts (one thread builds spans at a time)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _ns(t: float) -> int:
    return int(round(t * 1e9))


class SpanBuilder:
    """``SpanRecord``s -> the SDK's ``ReadableSpan``s of one trace (ids from the keys)."""

    def __init__(self, trace_id: str, parent_span_id: str | None = None):
        self.trace_id, self.parent_span_id = trace_id, parent_span_id
        self.ids = _ChosenIds()
        self.collect = _Collect()
        self.provider = TracerProvider(resource=trace_export.resource(), id_generator=self.ids)
        self.provider.add_span_processor(self.collect)
        self.tracer = self.provider.get_tracer(trace_export.INSTRUMENTATION)
        self.lock = threading.Lock()

    def span_id(self, key: str) -> str:
        return tracing.span_id(self.trace_id, key)

    def _context(self, span_hex: str | None, remote: bool) -> Any:
        if span_hex is None:
            return None
        parent = SpanContext(
            int(self.trace_id, 16), int(span_hex, 16), is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
        return trace_api.set_span_in_context(NonRecordingSpan(parent))

    def build(self, records: list[SpanRecord]) -> list[ReadableSpan]:
        with self.lock:
            self.collect.spans = []
            for r in records:
                self.ids.trace_id, self.ids.span_id = int(self.trace_id, 16), int(self.span_id(r.key), 16)
                parent = (
                    self._context(self.span_id(r.parent_key), False)
                    if r.parent_key is not None
                    else self._context(self.parent_span_id, True)
                )
                span = self.tracer.start_span(r.name, context=parent, attributes=r.attributes, start_time=_ns(r.start))
                if r.error is not None:
                    span.set_status(Status(StatusCode.ERROR, r.error))
                span.end(end_time=_ns(r.end))
            return list(self.collect.spans)


# --- the mark, and the run's tracer --------------------------------------------------------------------


class RunTracer:
    """The traces of one ``ctl train``: the trainers' ``TRACEPARENT`` (``attempt_env``), and the spans the
    history closes, sent to ``where`` (``exporter``: an SDK exporter instead, e.g. in tests)."""

    def __init__(
        self,
        home: Path,
        run_id: str,
        where: str,
        *,
        span_exporter: SpanExporter | None = None,
        stream=None,
        poll_s: float = POLL_S,
    ):
        self.home, self.run_id, self.where, self.poll_s = Path(home), run_id, where, poll_s
        self.name = run_id.split("/", 1)[1] if "/" in run_id else run_id
        inner = span_exporter if span_exporter is not None else trace_export.exporter(where)
        self.exporter = trace_export.WarnOnce(
            inner,
            where.partition(":")[2],
            "ctl",
            "command; the next `ctl train` of the run sends what is missing",
            stream,
        )
        self.histories: Histories | None = None
        self.trace: dict | None = None
        self.builder: SpanBuilder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._mark_warned = False

    # before the run starts: which trace (recorded in the new workflow's input by the caller)
    def context(self, histories: Histories, env: Mapping[str, str]) -> dict:
        return trace_context(histories(), self.home, self.run_id, env)

    def bind(self, histories: Histories, trace: dict, new_events: NewEvents | None = None) -> None:
        """From now on: read the run's workflows with ``new_events`` (only what each poll adds; without it,
        ``histories``, whose events already read are skipped), in trace ``trace``."""
        self.histories, self.trace = histories, trace
        self.new_events: NewEvents = new_events or (lambda seen: histories())
        self.builder = SpanBuilder(trace["trace_id"], trace.get("parent_span_id"))
        self.spans = HistorySpans(self.run_id)

    @property
    def trace_id(self) -> str | None:
        return self.trace["trace_id"] if self.trace else None

    def attempt_env(self, ctx: Any) -> dict[str, str]:
        """``TRACEPARENT`` (the attempt's span) for an attempt of this run; ``CTL_TRACE_FILE`` with a file."""
        wid = ctx.workflow_id
        if self.builder is None or not (wid == self.run_id or wid.startswith(self.run_id + "/")):
            return {}
        env = {
            tracing.TRACEPARENT: tracing.traceparent(
                self.builder.trace_id, self.builder.span_id(tracing.attempt_key(wid, ctx.activity_id, ctx.attempt))
            )
        }
        kind, _, target = self.where.partition(":")
        if kind == "file":
            env[tracing.TRACE_FILE_ENV] = target
        return env

    def export_new(self) -> int:
        """Send the spans the history closed since the mark; the number sent (0 also when failing)."""
        if self.histories is None or self.builder is None or self.exporter.failed is not None:
            return 0
        with self._lock:  # only the events since the last poll are read and made into spans (HistorySpans)
            closed = [r for wid, events in self.new_events(self.spans.seen()) for r in self.spans.feed(wid, events)]
            if not closed:
                return 0  # nothing new closed: no file read, no export (the mark need not move)
            data = tracing.read_mark(RunHome(self.home).run(self.name).path)
            marks = (data.get("destinations") or {}).get(self.where) or {}
            fresh = [r for r in closed if r.closed_at[1] > int(marks.get(r.closed_at[0], 0))]
            if not fresh:
                return 0  # sent by an earlier ctl train (the mark need not move: what it passes over closes nothing)
            if self.exporter.export(self.builder.build(fresh)) != SpanExportResult.SUCCESS:
                return 0  # (off for this command: what closed now is sent by the next ctl train, from the mark)
            self._write_mark(data, {**marks, **self.spans.seen()})
            return len(fresh)

    def _write_mark(self, data: dict, marks: dict[str, int]) -> None:
        data = {**data, "trace_id": self.trace_id, "run_id": self.run_id}
        data["destinations"] = {**(data.get("destinations") or {}), self.where: marks}
        path = tracing.mark_path(RunHome(self.home).run(self.name).path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, (json.dumps(data, sort_keys=True, indent=1) + "\n").encode("utf-8"))
        except OSError as e:  # the spans went out; the next ctl train may send them again (same ids)
            if not self._mark_warned:
                self._mark_warned = True
                print(
                    f"ctl: warning: traces: could not write {path} ({e}); the next ctl train may send spans again",
                    file=sys.stderr,
                    flush=True,
                )

    # while the run goes on
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ctl-traces", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._safe_export()

    def _safe_export(self) -> None:
        try:
            self.export_new()
        except Exception as e:  # reading the history, building spans: never the run's failure
            if self.exporter.failed is None:
                self.exporter.failed = f"{type(e).__name__}: {e}"
                print(
                    f"ctl: warning: traces off for this command ({self.exporter.failed})", file=sys.stderr, flush=True
                )

    def close(self) -> None:
        """Stop the thread, send what is left, shut the exporter down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._safe_export()
        try:
            self.exporter.shutdown()
        except Exception:
            pass
