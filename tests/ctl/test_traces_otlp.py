"""One trace across a SIGKILL, through the real OTLP/HTTP exporter: ``ctl train`` of a tiny run with
``$OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a collector stand-in this test starts on loopback (the
standard library's http.server, decoding each POST /v1/traces with the OTLP protobuf), killed with
SIGKILL in its second segment after a checkpoint, then the same command again.

Checked from what the collector received: one trace id, the one the history records and ``ctl show``
prints; the tree TrainRun > workflow > attempts (> checkpoints, > train.step from the trainer process
through TRACEPARENT), the evaluation suites and the durable wait; the killed attempt (worker lost,
resumed from the segment's start) and attempt 2 (resumed from the checkpoint at step 6); every span id
names one span (a span the killed ctl sent just before its mark would be sent again identical); the
train.step spans' losses equal metrics.jsonl's; the final loss is the untraced golden-path value of
this spec (tracing changes no bit).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

pytestmark = pytest.mark.slow  # real ctl train runs (two), a kill (~20 s)

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "mini",
    "steps": 8,
    "seed": 5,
    "eval_every": 4,
    "eval_interval_seconds": 0.2,
    "checkpoint_every": 2,
    "batch_size": 2,
    "threads": 1,
    "log_every": 2,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}
UNTRACED_FINAL_LOSS_HEX = "0x1.61f1320000000p+2"  # this spec's ctl train without tracing, on this machine's kernels
DEADLINE_S = 120


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


class Collector:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: keeps every span it receives, as plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                enc = self.headers.get("Content-Encoding", "")
                body = gzip.decompress(body) if enc == "gzip" else zlib.decompress(body) if enc == "deflate" else body
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest.FromString(body)
                got = []
                for rs in req.resource_spans:
                    service = {a.key: _value(a.value) for a in rs.resource.attributes}.get("service.name")
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            got.append(
                                {
                                    "name": s.name,
                                    "trace_id": s.trace_id.hex(),
                                    "span_id": s.span_id.hex(),
                                    "parent_id": s.parent_span_id.hex() or None,
                                    "start": s.start_time_unix_nano,
                                    "end": s.end_time_unix_nano,
                                    "status": s.status.code,
                                    "service": service,
                                    "attributes": {a.key: _value(a.value) for a in s.attributes},
                                }
                            )
                with outer.lock:
                    outer.spans.extend(got)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def env(collector: Collector, **extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k not in ("TRACEPARENT", "CTL_HOME")}
    e.update(
        PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",
        **extra,
    )
    return e


def ctl_args(home: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ctl.cli",
        "train",
        "--spec",
        str(home / "mini.json"),
        "--eval-max-items",
        "1",
        "--json",
        "--home",
        str(home),
    ]


def wait_for(cond, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"ctl ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)  # a poll interval, not a wait for the outcome
    raise AssertionError(f"timed out waiting for {what}")


def test_one_trace_across_a_sigkill_through_otlp(tmp_path: Path, collector: Collector) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "mini.json").write_text(json.dumps(SPEC))
    # the trainer of segment 2 holds at step 7 (after its checkpoint at 6) until killed (tinyllm/faults.py)
    proc = subprocess.Popen(
        ctl_args(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(collector, TINYLLM_FAULT="trainer.hold@7"),
        start_new_session=True,
    )
    try:
        # the killed attempt's checkpoint is recorded, and its trainer's step-6 span has arrived
        wait_for(
            lambda: any(
                s["name"] == "train.step" and s["attributes"].get("train.step") == 6 for s in collector.snapshot()
            ),
            "the trainer's step 6 span",
            proc,
        )
        wait_for(
            lambda: any(s["name"] == "checkpoint step-000006" for s in collector.snapshot()),
            "the checkpoint step-000006 span (ctl's poll of the history)",
            proc,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # ctl and its trainer
        proc.wait(timeout=30)
    before = collector.snapshot()
    assert not any(s["name"].startswith(("TrainRun", "workflow")) for s in before)  # the run had not ended

    again = subprocess.run(ctl_args(home), capture_output=True, text=True, env=env(collector), timeout=DEADLINE_S * 2)
    assert again.returncode == 0, again.stderr[-3000:]
    out = json.loads(again.stdout)
    assert out["state"] == "completed" and out["result"]["final_loss_hex"] == UNTRACED_FINAL_LOSS_HEX

    spans = collector.snapshot()
    # one trace: the id the history records (the first start's input) and ctl show prints
    history = json.loads(
        subprocess.run(
            [sys.executable, "-m", "ctl.cli", "history", "train/mini", "--json", "--home", str(home)],
            capture_output=True,
            text=True,
            env=env(collector),
        ).stdout
    )
    recorded = history["events"][0]["attrs"]["input"]["trace"]["trace_id"]
    assert {s["trace_id"] for s in spans} == {recorded}
    shown = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "show", "train/mini", "--home", str(home)],
        capture_output=True,
        text=True,
        env=env(collector),
    ).stdout
    assert f"trace: {recorded}" in shown
    # each span id names one span (a re-sent span is the same span)
    by_id: dict[str, dict] = {}
    for s in spans:
        assert by_id.setdefault(s["span_id"], s) == s, ("a span id names two spans", s, by_id[s["span_id"]])
    unique = list(by_id.values())
    assert {s["service"] for s in unique} == {"durable-train"}

    def label(s):
        a = s["attributes"]
        if s["name"] == "train.step":
            return f"train.step {a['train.step']}"
        return (
            f"{s['name']}#{a['durable.attempt']}" if s["name"].split()[0] in ("train", "eval", "corpus") else s["name"]
        )

    tree = {label(s): (label(by_id[s["parent_id"]]) if s["parent_id"] else None) for s in unique}
    assert tree == {
        "TrainRun train/mini": None,
        "workflow train/mini": "TrainRun train/mini",
        "corpus corpus-default#1": "workflow train/mini",
        "train train-000004#1": "workflow train/mini",
        "train.step 2": "train train-000004#1",
        "checkpoint step-000002": "train train-000004#1",
        "train.step 4": "train train-000004#1",
        "checkpoint step-000004": "train train-000004#1",
        "eval eval-000004-ppl#1": "workflow train/mini",
        "durable.wait": "workflow train/mini",
        "train train-000008#1": "workflow train/mini",  # killed
        "train.step 6": "train train-000008#1",
        "checkpoint step-000006": "train train-000008#1",
        "train train-000008#2": "workflow train/mini",  # resumed
        "train.step 8": "train train-000008#2",
        "checkpoint step-000008": "train train-000008#2",
        "eval eval-000008-ppl#1": "workflow train/mini",
    }
    att = {(s["name"], s["attributes"].get("durable.attempt")): s["attributes"] for s in unique}
    killed, resumed = att[("train train-000008", 1)], att[("train train-000008", 2)]
    assert (
        killed["durable.outcome"] == "worker lost"
        and killed["durable.resume_checkpoint"] == "runs/mini/ckpt/step-000004"
    )
    assert (
        resumed["durable.outcome"] == "completed"
        and resumed["durable.resume_checkpoint"] == "runs/mini/ckpt/step-000006"
    )
    assert resumed["train.final_loss_hex"] == UNTRACED_FINAL_LOSS_HEX
    assert att[("eval eval-000004-ppl", 1)]["eval.suite"] == "ppl"
    assert (
        by_id[next(k for k, s in by_id.items() if s["name"] == "TrainRun train/mini")]["attributes"][
            "train.final_loss_hex"
        ]
        == UNTRACED_FINAL_LOSS_HEX
    )
    # the trainer's sampled steps carry the frame's loss (as metrics.jsonl has it) and tokens/s
    frames = {f["step"]: f for f in map(json.loads, (home / "runs/mini/metrics.jsonl").read_text().splitlines())}
    for s in unique:
        if s["name"] == "train.step":
            a = s["attributes"]
            assert a["train.loss"] == frames[a["train.step"]]["train/loss"] and a["timer.tokens_per_s"] > 0
            assert s["start"] < s["end"]
    # and the span of the killed attempt ends at its last recorded event, before attempt 2 starts
    k_span = next(s for s in unique if s["name"] == "train train-000008" and s["attributes"]["durable.attempt"] == 1)
    r_span = next(s for s in unique if s["name"] == "train train-000008" and s["attributes"]["durable.attempt"] == 2)
    assert k_span["end"] < r_span["start"]
