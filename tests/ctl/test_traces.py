"""Traces of a TrainRun from its history (app/traces.py) and the trainer's train.step spans
(tinyllm/sinks/trace_export.py), checked with the SDK's in-memory exporter: the span tree, the attributes,
the ids (the same history gives the same spans; the trainer joins its attempt's span through
TRACEPARENT), each span sent once across ctl runs (the mark), a failing exporter (one warning, the mark
kept), and the trace id recorded in the history and read back. No process is started here; the real
ctl train with an OTLP collector stand-in, killed and resumed, is tests/ctl/test_traces_otlp.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from app import traces  # noqa: E402
from engine import Event  # noqa: E402
from tinyllm.sinks import trace_export, tracing  # noqa: E402
from workflows.models import TraceContext, TrainRunInput  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class History:
    """A TrainRun's events as the engine records them (the shapes of a real run's `ctl history --json`)."""

    def __init__(self, wid: str, trace: dict | None = None, t0: float = 1000.0):
        self.wid, self.t, self.events = wid, t0, []
        inp = {"spec": {"name": "mini", "steps": 8}}
        if trace is not None:
            inp["trace"] = trace
        self.add("workflow_started", input=inp)

    def add(self, type: str, dt: float = 0.0, **attrs) -> "History":
        self.t += dt
        self.events.append(Event(len(self.events) + 1, type, self.t, attrs))
        return self

    def attempt(self, aid: str, name: str, attempt: int = 1, schedule: bool = True, inp=None) -> "History":
        if schedule:
            self.add("activity_scheduled", activity_id=aid, name=name, cmd=0, input=inp or {})
        return self.add("activity_started", activity_id=aid, attempt=attempt, cmd=0, worker="vm:1")

    def heartbeat(self, aid: str, attempt: int, dt: float = 1.0, **details) -> "History":
        return self.add(
            "activity_heartbeat", dt, activity_id=aid, attempt=attempt, details={"time": self.t + dt - 0.1, **details}
        )


def killed_run() -> History:
    """corpus, segment 1, its evaluation, a wait, segment 2 killed after its checkpoint at step 6 (the
    recovery records "worker lost"), attempt 2 resumed from step 6, the last evaluation, completed."""
    h = History("train/mini", trace={"trace_id": TRACE, "parent_span_id": None})
    h.attempt("corpus-default", "corpus").add(
        "activity_completed",
        0.5,
        activity_id="corpus-default",
        attempt=1,
        result={"name": "default", "checksum": "9a2e", "tokens": 100},
    )
    h.attempt("train-000004", "train", inp={"spec": {"steps": 4}})
    h.heartbeat("train-000004", 1, event="resume", resumed_from=None, step=0)
    h.heartbeat("train-000004", 1, checkpoint="runs/mini/ckpt/step-000002", step=2, loss=5.5, loss_hex="0x1.6p+2")
    h.heartbeat("train-000004", 1, checkpoint="runs/mini/ckpt/step-000004", step=4, loss=5.4, loss_hex="0x1.59p+2")
    h.add(
        "activity_completed",
        0.3,
        activity_id="train-000004",
        attempt=1,
        result={
            "steps": 4,
            "final_loss_hex": "0x1.59p+2",
            "resumed_from": None,
            "checkpoint": "runs/mini/ckpt/step-000004",
        },
    )
    h.attempt("eval-000004-ppl", "eval", inp={"spec": {"suite": "ppl", "tag": "000004"}})
    h.add(
        "activity_completed",
        2.0,
        activity_id="eval-000004-ppl",
        attempt=1,
        result={"suite": "ppl", "summary": {"metrics": {"mini-000004": {"heldout/loss": 5.54}}}},
    )
    h.add("timer_started", 0.0, cmd=3, seconds=0.5).add("timer_fired", 0.5, cmd=3)
    h.attempt("train-000008", "train", inp={"spec": {"steps": 8}})
    h.heartbeat(
        "train-000008",
        1,
        checkpoint="runs/mini/ckpt/step-000004",
        event="resume",
        resumed_from="runs/mini/ckpt/step-000004",
        step=4,
    )
    h.heartbeat("train-000008", 1, checkpoint="runs/mini/ckpt/step-000006", step=6, loss=5.3)
    h.add(
        "activity_timed_out",
        30.0,
        activity_id="train-000008",
        attempt=1,
        kind="worker lost",
        final=False,
        error={"type": "WorkerLost", "message": "attempt 1: worker lost"},
    )
    h.attempt("train-000008", "train", attempt=2, schedule=False)
    h.heartbeat(
        "train-000008",
        2,
        checkpoint="runs/mini/ckpt/step-000006",
        event="resume",
        resumed_from="runs/mini/ckpt/step-000006",
        step=6,
    )
    h.heartbeat("train-000008", 2, checkpoint="runs/mini/ckpt/step-000008", step=8, loss=5.2)
    h.add(
        "activity_completed",
        0.3,
        activity_id="train-000008",
        attempt=2,
        result={"steps": 8, "final_loss_hex": "0x1.4cp+2", "resumed_from": "runs/mini/ckpt/step-000006"},
    )
    h.attempt("eval-000008-ppl", "eval", inp={"spec": {"suite": "ppl", "tag": "000008"}})
    h.add(
        "activity_completed",
        2.0,
        activity_id="eval-000008-ppl",
        attempt=1,
        result={"suite": "ppl", "summary": {"metrics": {"mini-000008": {"heldout/loss": 5.5}}}},
    )
    h.add(
        "workflow_completed", 0.0, result={"name": "mini", "steps": 8, "final_loss_hex": "0x1.4cp+2", "digest": "f3b5"}
    )
    return h


def tracer_for(home: Path, histories, exporter: SpanExporter, stream=None) -> traces.RunTracer:
    t = traces.RunTracer(home, "train/mini", "file:/unused", span_exporter=exporter, stream=stream)
    t.bind(histories, traces.trace_context(histories(), home, "train/mini", {}))
    return t


def tree(spans) -> dict:
    """{span name (attempt spans with their attempt): parent's name, or its id in hex when not sent}."""

    def label(s):
        a = s.attributes or {}
        return (
            f"{s.name}#{a['durable.attempt']}"
            if "durable.attempt" in a and s.name.split()[0] != "checkpoint"
            else s.name
        )

    by_id = {s.context.span_id: s for s in spans}
    return {
        label(s): (
            None
            if s.parent is None
            else label(by_id[s.parent.span_id])
            if s.parent.span_id in by_id
            else f"{s.parent.span_id:016x}"
        )
        for s in spans
    }


def test_span_tree_and_attributes_of_a_killed_and_resumed_run(tmp_path: Path) -> None:
    h = killed_run()
    mem = InMemorySpanExporter()
    t = tracer_for(tmp_path, lambda: [(h.wid, h.events)], mem)
    assert t.export_new() == 13
    spans = mem.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {int(TRACE, 16)}  # the recorded trace
    assert len({s.context.span_id for s in spans}) == len(spans)
    assert tree(spans) == {
        "TrainRun train/mini": None,
        "workflow train/mini": "TrainRun train/mini",
        "corpus corpus-default#1": "workflow train/mini",
        "train train-000004#1": "workflow train/mini",
        "checkpoint step-000002": "train train-000004#1",
        "checkpoint step-000004": "train train-000004#1",
        "eval eval-000004-ppl#1": "workflow train/mini",
        "durable.wait": "workflow train/mini",
        "train train-000008#1": "workflow train/mini",
        "checkpoint step-000006": "train train-000008#1",
        "train train-000008#2": "workflow train/mini",
        "checkpoint step-000008": "train train-000008#2",
        "eval eval-000008-ppl#1": "workflow train/mini",
    }
    by = {(s.name, (s.attributes or {}).get("durable.attempt")): s for s in spans}
    first, lost, resumed = by[("train train-000004", 1)], by[("train train-000008", 1)], by[("train train-000008", 2)]
    assert "durable.resume_checkpoint" not in first.attributes  # a fresh start
    assert lost.attributes["durable.resume_checkpoint"] == "runs/mini/ckpt/step-000004"
    assert lost.attributes["durable.outcome"] == "worker lost" and lost.status.status_code.name == "ERROR"
    assert resumed.attributes["durable.resume_checkpoint"] == "runs/mini/ckpt/step-000006"
    assert (
        resumed.attributes["durable.outcome"] == "completed"
        and resumed.attributes["train.final_loss_hex"] == "0x1.4cp+2"
    )
    # the lost attempt ends at its last recorded event, not when the recovery found it dead 30 s later
    last_hb = [
        e
        for e in h.events
        if e.type == "activity_heartbeat" and e.attrs["attempt"] == 1 and e.attrs["activity_id"] == "train-000008"
    ][-1]
    assert lost.end_time == round(last_hb.time * 1e9)
    ev = by[("eval eval-000004-ppl", 1)].attributes
    assert ev["eval.suite"] == "ppl" and ev["eval.mini-000004.heldout.loss"] == 5.54
    wait = next(s for s in spans if s.name == "durable.wait")
    assert wait.attributes["durable.wait_s"] == 0.5 and (wait.end_time - wait.start_time) == 500_000_000
    ckpt = next(s for s in spans if s.name == "checkpoint step-000006")
    assert ckpt.attributes["train.step"] == 6 and ckpt.attributes["checkpoint.path"] == "runs/mini/ckpt/step-000006"
    root = next(s for s in spans if s.parent is None)
    assert root.attributes["train.final_loss_hex"] == "0x1.4cp+2" and root.start_time == round(h.events[0].time * 1e9)


def test_the_same_history_gives_the_same_ids_and_the_attempt_span_is_the_trainers_traceparent(tmp_path: Path) -> None:
    h = killed_run()
    a, b = InMemorySpanExporter(), InMemorySpanExporter()
    tracer_for(tmp_path / "a", lambda: [(h.wid, h.events)], a).export_new()
    tracer_for(tmp_path / "b", lambda: [(h.wid, h.events)], b).export_new()
    ids = lambda m: sorted(  # noqa: E731
        (s.name, s.context.span_id, s.parent.span_id if s.parent else 0) for s in m.get_finished_spans()
    )
    assert ids(a) == ids(b)
    t = tracer_for(tmp_path / "c", lambda: [(h.wid, h.events)], InMemorySpanExporter())

    class Ctx:
        workflow_id, activity_id, attempt = "train/mini", "train-000008", 2

    parent = t.attempt_env(Ctx())["TRACEPARENT"]
    span = next(
        s for s in a.get_finished_spans() if s.name == "train train-000008" and s.attributes["durable.attempt"] == 2
    )
    assert parent == f"00-{TRACE}-{span.context.span_id:016x}-01"
    assert tracing.parse_traceparent(parent) == (TRACE, f"{span.context.span_id:016x}")

    class Other:
        workflow_id, activity_id, attempt = "train/other", "train-000008", 1

    assert t.attempt_env(Other()) == {}


def test_each_span_once_across_ctl_runs_as_the_history_grows(tmp_path: Path) -> None:
    """A ctl killed mid-run sent what had closed; the next sends only what closed since (the mark)."""
    full = killed_run().events
    cut = next(i for i, e in enumerate(full) if e.type == "activity_timed_out")  # the kill: the recovery's event next
    mem = InMemorySpanExporter()
    events = full[:cut]
    first = tracer_for(tmp_path, lambda: [("train/mini", events)], mem)
    sent_first = first.export_new()
    assert first.export_new() == 0  # nothing new closed
    assert {s.name for s in mem.get_finished_spans()} >= {"train train-000004", "checkpoint step-000006"}
    assert not any(s.name == "train train-000008" for s in mem.get_finished_spans())  # still open at the kill
    events = full
    second = tracer_for(tmp_path, lambda: [("train/mini", events)], mem)  # a new ctl train, the same home
    assert sent_first + second.export_new() == 13
    spans = mem.get_finished_spans()
    assert len({s.context.span_id for s in spans}) == len(spans) == 13
    mark = tracing.read_mark(tmp_path / "runs" / "mini")
    assert mark["trace_id"] == TRACE and mark["destinations"]["file:/unused"] == {"train/mini": len(full)}


def test_a_continued_run_is_one_trace_and_its_root_comes_at_completion(tmp_path: Path) -> None:
    one = History("train/mini", trace={"trace_id": TRACE, "parent_span_id": None})
    one.attempt("train-000004", "train").add("activity_canceled", 1.0, activity_id="train-000004", attempt=1)
    one.add("workflow_canceled", 0.0, error={"type": "Canceled", "message": "canceled"})
    mem = InMemorySpanExporter()
    gens = [(one.wid, one.events)]
    t = tracer_for(tmp_path, lambda: gens, mem)
    t.export_new()
    assert tree(mem.get_finished_spans()) == {
        "workflow train/mini": tracing.span_id(TRACE, "run"),  # not sent yet
        "train train-000004#1": "workflow train/mini",
    }
    two = History("train/mini/2", trace={"trace_id": TRACE, "parent_span_id": None}, t0=2000.0)
    two.attempt("train-000004", "train").add(
        "activity_completed", 1.0, activity_id="train-000004", attempt=1, result={}
    )
    two.add("workflow_completed", 0.0, result={"steps": 4})
    gens.append((two.wid, two.events))
    t.export_new()
    spans = mem.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {int(TRACE, 16)} and len(spans) == 5
    root = next(s for s in spans if s.parent is None)
    assert root.start_time == round(1000.0 * 1e9) and root.attributes["durable.workflow_ids"] == (
        "train/mini",
        "train/mini/2",
    )
    canceled = next(
        s for s in spans if s.name == "train train-000004" and s.attributes["durable.workflow_id"] == "train/mini"
    )
    assert canceled.attributes["durable.outcome"] == "canceled" and canceled.status.status_code.name == "UNSET"


class Failing(SpanExporter):
    def __init__(self):
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


def test_a_failing_destination_warns_once_and_keeps_the_mark(tmp_path: Path) -> None:
    h = killed_run()
    err, bad = io.StringIO(), Failing()
    t = tracer_for(tmp_path, lambda: [(h.wid, h.events)], bad, stream=err)
    assert t.export_new() == 0 and t.export_new() == 0
    assert bad.calls == 1 and len(err.getvalue().splitlines()) == 1 and "ctl: warning: traces to" in err.getvalue()
    assert tracing.read_mark(tmp_path / "runs" / "mini") == {}  # the next ctl train sends everything
    mem = InMemorySpanExporter()
    assert tracer_for(tmp_path, lambda: [(h.wid, h.events)], mem).export_new() == 13


def test_trace_context_recorded_then_read_back_derived_or_the_callers(tmp_path: Path) -> None:
    recorded = History("train/mini", trace={"trace_id": TRACE, "parent_span_id": "00f067aa0ba902b7"})
    assert traces.trace_context([(recorded.wid, recorded.events)], tmp_path, "train/mini", {}) == {
        "trace_id": TRACE,
        "parent_span_id": "00f067aa0ba902b7",
    }
    untraced = History("train/mini")  # started without tracing: derived from its first start, the same each time
    a = traces.trace_context([(untraced.wid, untraced.events)], tmp_path, "train/mini", {})
    assert a == traces.trace_context([(untraced.wid, untraced.events)], tmp_path, "train/mini", {})
    assert a["trace_id"] == tracing.derived_trace_id(tmp_path, "train/mini", 1000.0) != TRACE
    caller = {"TRACEPARENT": f"00-{TRACE}-00f067aa0ba902b7-01"}
    assert traces.trace_context([], tmp_path, "train/mini", caller) == {
        "trace_id": TRACE,
        "parent_span_id": "00f067aa0ba902b7",
    }
    fresh = traces.trace_context([], tmp_path, "train/mini", {"TRACEPARENT": "garbage"})
    assert len(fresh["trace_id"]) == 32 and fresh["parent_span_id"] is None
    # the root span is the caller's child
    mem = InMemorySpanExporter()
    h = killed_run()
    h.events[0] = recorded.events[0]
    tracer_for(tmp_path, lambda: [(h.wid, h.events)], mem).export_new()
    root = next(s for s in mem.get_finished_spans() if s.name.startswith("TrainRun"))
    assert root.parent.span_id == 0x00F067AA0BA902B7 and root.parent.is_remote


def test_the_input_records_the_trace_only_when_there_is_one() -> None:
    """An untraced run's history is what it was before traces (no "trace" key); a traced one records it."""
    plain = TrainRunInput(spec={"name": "x"})
    assert "trace" not in json.loads(plain.model_dump_json()) and "trace" not in plain.model_dump(mode="json")
    traced = plain.model_copy(update={"trace": TraceContext(trace_id=TRACE)})
    assert json.loads(traced.model_dump_json())["trace"] == {"trace_id": TRACE, "parent_span_id": None}
    assert TrainRunInput.model_validate_json(traced.model_dump_json()) == traced


def test_trainer_step_spans_join_the_attempt_span_sampled_every_log_every() -> None:
    mem = InMemorySpanExporter()
    parent_span = "00f067aa0ba902b7"
    sink = trace_export.StepSpanSink(2, 5, f"00-{TRACE}-{parent_span}-01", "file:/unused", span_exporter=mem)
    for step in range(1, 6):
        sink.write(
            step,
            {
                "train/loss": 5.0 - step / 10,
                "timer/step_s": 0.01,
                "timer/tokens_per_s": 1000.0 * step,
                "optim/lr": 1e-3,
                **({"val/loss": 4.9} if step == 3 else {}),
            },
        )
    sink.close()
    spans = mem.get_finished_spans()
    assert [s.attributes["train.step"] for s in spans] == [2, 3, 4, 5]  # every 2nd, the validation frame, the last
    assert {s.context.trace_id for s in spans} == {int(TRACE, 16)}
    assert {s.parent.span_id for s in spans} == {int(parent_span, 16)}
    s2 = spans[0]
    assert (
        s2.name == "train.step" and s2.attributes["train.loss"] == 4.8 and s2.attributes["timer.tokens_per_s"] == 2000.0
    )
    assert s2.end_time - s2.start_time == 10_000_000
    assert spans[1].attributes["val.loss"] == 4.9


def test_json_lines_file_one_span_a_line(tmp_path: Path) -> None:
    path = tmp_path / "t" / "trace.jsonl"
    h = killed_run()
    t = traces.RunTracer(tmp_path, "train/mini", f"file:{path}", span_exporter=trace_export.JsonLinesSpanExporter(path))
    t.bind(lambda: [(h.wid, h.events)], traces.trace_context([(h.wid, h.events)], tmp_path, "train/mini", {}))
    t.export_new()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 13 and {x["trace_id"] for x in lines} == {TRACE}
    root = next(x for x in lines if x["parent_id"] is None)
    assert root["name"] == "TrainRun train/mini" and root["service"] == "durable-train"
    att = next(x for x in lines if x["name"] == "train train-000008" and x["attributes"]["durable.attempt"] == 2)
    assert att["attributes"]["durable.resume_checkpoint"] == "runs/mini/ckpt/step-000006"
    assert att["start_time_unix_nano"] < att["end_time_unix_nano"]


def test_destination_and_traceparent_parsing() -> None:
    assert tracing.destination({}) is None
    assert tracing.destination({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == "otlp:http://127.0.0.1:4318"
    assert tracing.destination({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.destination({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.destination({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, "/tmp/t.jsonl") == "file:/tmp/t.jsonl"
    assert tracing.trainer_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is None  # no parent: no spans
    good = f"00-{TRACE}-00f067aa0ba902b7-01"
    assert tracing.trainer_tracing({"TRACEPARENT": good, "CTL_TRACE_FILE": "/tmp/t"}) == (good, "file:/tmp/t")
    for bad in (
        "",
        "00-0000-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"ff-{TRACE}-00f067aa0ba902b7-01",
    ):
        assert tracing.parse_traceparent(bad) is None, bad


@pytest.mark.slow  # a fresh interpreter
def test_nothing_of_opentelemetry_is_imported_when_tracing_is_off(tmp_path: Path) -> None:
    code = (
        "import os, sys; from pathlib import Path\n"
        "for k in list(os.environ):\n"
        "    if k.startswith('OTEL_') or k in ('TRACEPARENT', 'CTL_TRACE_FILE'): del os.environ[k]\n"
        "import ctl.cli, ctl.show, tinyllm.sinks.metrics, workflows\n"
        "r = tinyllm.sinks.metrics.default_reporter(Path(sys.argv[1]), -1, 4, 1)\n"
        "r.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry') or m in ('app.traces', 'tinyllm.sinks.trace_export')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
