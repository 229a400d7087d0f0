"""ctl/traces.py makes spans incrementally: each poll reads only the events the history gained since the
last (``RunTracer.bind(..., new_events)``, as ``ctl train`` binds it) and ``HistorySpans`` keeps what is
still open in between. Checked: a history fed in pieces (every cut) gives the records of the whole; a
tracer polled after every event sends the same spans (ids, parents, attributes, times) as one export of
the whole history; a poll with nothing new reads no more than the new events and exports nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from app import traces  # noqa: E402
from test_traces import History, killed_run, tracer_for  # noqa: E402  (the same synthetic histories)


def _continued() -> list[tuple[str, list]]:
    """A canceled first workflow and its continuation /2 that completes the run (two workflows)."""
    one = History("train/mini", trace={"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "parent_span_id": None})
    one.attempt("train-000004", "train").add("timer_started", 0.1, cmd=5, seconds=9.0)
    one.add("activity_canceled", 1.0, activity_id="train-000004", attempt=1)
    one.add("workflow_canceled", 0.0, error={"type": "Canceled", "message": "canceled"})
    two = History("train/mini/2", t0=2000.0)
    two.attempt("train-000004", "train").add(
        "activity_completed", 1.0, activity_id="train-000004", attempt=1, result={}
    )
    two.add("workflow_completed", 0.0, result={"steps": 4})
    return [(one.wid, one.events), (two.wid, two.events)]


@pytest.mark.parametrize("make", [lambda: [("train/mini", killed_run().events)], _continued])
def test_fed_in_pieces_gives_the_records_of_the_whole(make) -> None:
    histories = make()
    whole = traces.build_spans(histories, "train/mini")
    assert whole
    flat = [(wid, e) for wid, events in histories for e in events]
    for cut in range(len(flat) + 1):
        spans = traces.HistorySpans("train/mini")
        got = []
        for wid, e in flat[:cut]:
            got += spans.feed(wid, [e])
        got += [r for wid, events in histories for r in spans.feed(wid, events)]  # the rest, and again what was fed
        assert got == whole, cut


def _ids(mem: InMemorySpanExporter) -> list:
    return sorted(
        (
            s.name,
            s.context.span_id,
            s.parent.span_id if s.parent else 0,
            s.start_time,
            s.end_time,
            tuple(sorted((s.attributes or {}).items())),
            s.status.status_code.name,
        )
        for s in mem.get_finished_spans()
    )


def test_polled_after_every_event_sends_what_one_export_of_the_whole_sends(tmp_path: Path) -> None:
    full = killed_run().events
    once = InMemorySpanExporter()
    tracer_for(tmp_path / "once", lambda: [("train/mini", full)], once).export_new()
    grown: list = []
    reads: list[int] = []

    def new_events(seen):
        after = seen.get("train/mini", 0)
        got = [e for e in grown if e.seq > after]
        reads.append(len(got))
        return [("train/mini", got)]

    mem = InMemorySpanExporter()
    t = traces.RunTracer(tmp_path / "polled", "train/mini", "file:/unused", span_exporter=mem)
    t.bind(
        lambda: [("train/mini", grown)],
        traces.trace_context([("train/mini", full)], tmp_path, "train/mini", {}),
        new_events,
    )
    for e in full:
        grown.append(e)
        t.export_new()
        assert t.export_new() == 0  # nothing new: nothing read again, nothing sent
    assert _ids(mem) == _ids(once) and len(mem.get_finished_spans()) == 13
    assert sum(reads) == len(full)  # each event read once
