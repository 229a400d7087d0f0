"""Checkpoint component sets and the metrics reporter, in-process (real files)."""

from __future__ import annotations

import io
import json

import pytest
import torch

from tinyllm import checkpoint as ckpt
from tinyllm.sinks.metrics import JsonlSink, Reporter


def _full(step: int) -> dict:
    return {
        "model": {"w": torch.full((3,), float(step))},
        "optimizer": {"state": {}},
        "training_state": {"step": step, "cursor": step},
    }


def test_full_set_moves_latest_and_subset_is_an_artifact(tmp_path):
    run = tmp_path / "run"
    p10 = ckpt.save_checkpoint(run, 10, _full(10))
    assert (run / "ckpt/LATEST").read_text().strip() == "step-000010"
    art = ckpt.save_checkpoint(run, 15, {"model": {"w": torch.zeros(3)}})
    assert art == run / "checkpoint_artifacts/iter_000015"
    assert (run / "ckpt/LATEST").read_text().strip() == "step-000010"
    assert ckpt.verify_checkpoint(art)["resumable"] is False
    assert ckpt.choose_resume(run).path == p10
    choice = ckpt.choose_resume(run, art)
    assert choice.path == p10 and "not a resumable" in choice.refused[0].reason
    components, manifest = ckpt.load_checkpoint(p10)
    assert torch.equal(components["model"]["w"], torch.full((3,), 10.0)) and manifest["step"] == 10


def test_resave_of_a_step_and_leftover_temporaries(tmp_path):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 10, _full(10))
    (run / "ckpt/.tmp-step-000020-999").mkdir()  # what a kill mid-write leaves
    ckpt.save_checkpoint(run, 10, _full(10))
    ckpt.recover_interrupted_writes(run, io.StringIO())
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["LATEST", "step-000010"]


def test_missing_latest_target_falls_back(tmp_path):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 10, _full(10))
    ckpt.publish_latest(run / "ckpt", "step-000020")  # points at nothing
    choice = ckpt.choose_resume(run)
    assert choice.path == run / "ckpt/step-000010"
    assert [r.reason for r in choice.refused] == ["LATEST names step-000020, which does not exist"]


class _Boom:
    name = "boom"

    def write(self, step, frame):
        raise OSError("disk full")

    def close(self):
        pass


def test_a_failing_sink_is_disabled_alone(tmp_path):
    warn = io.StringIO()
    jsonl = JsonlSink(tmp_path / "metrics.jsonl", resumed_step=0)
    reporter = Reporter([_Boom(), jsonl], warn_stream=warn)
    for step in (1, 2, 3):
        reporter.report(step, {"train/loss": 1.0 / step})
    reporter.close()
    assert warn.getvalue().count("'boom' failed") == 1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["train/loss"] == pytest.approx(1 / 3)


def test_jsonl_drops_frames_after_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)) + '{"step": 8, "tor')
    sink = JsonlSink(path, resumed_step=5)
    sink.write(6, {"train/loss": 0.5})
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
