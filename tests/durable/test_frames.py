"""Per-step frames written off the training thread (tinyllm/durable/frames.py), in-process and fast.

What must hold for the proofs to stay as strong as when each frame was written at its step: frames in
step order and byte-identical in content; every frame up to a checkpoint's step in metrics.jsonl before
that checkpoint is written (so before LATEST names it); a held trainer's frame on disk (verify-resume
polls it); a stop's frames before its checkpoint; everything at the end; the batch digest of the batch
as it was at its step; an error of the writer raised on the training thread; liveness lines from the
training loop itself, never waiting for the writer. The writer's batch interval is made huge in the
tests that are about a flush, so only the flush can have put the frame there.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from tinyllm import checkpoint as ckpt
from tinyllm import faults
from tinyllm.durable import DurableRun
from tinyllm.durable.frames import FrameWriter, frame_line
from tinyllm.durable.state import digest, digest_of_snapshots, snapshot

torch.set_num_threads(1)


def frames(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def make_run(home: Path, steps: int = 6, checkpoint_every: int = 3, **kw) -> DurableRun:
    run = DurableRun(
        {"name": "fw", "steps": steps, "checkpoint_every": checkpoint_every, "log_every": 1},
        home=home,
        progress=home / "progress.jsonl",
        console=io.StringIO(),
        **kw,
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.track(model=model, optimizer=opt)
    return run


def step(run: DurableRun, s: int) -> torch.Tensor:
    x = torch.full((2, 3), float(s))
    loss = run.model(x).pow(2).mean()
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    run.log(loss, batch=x)
    return x


@pytest.fixture
def slow_writer(monkeypatch):
    """The writer thread writes only when told to (so a frame on disk was put there by a flush)."""
    monkeypatch.setitem(FrameWriter.__init__.__kwdefaults__, "interval_s", 3600.0)


def test_frames_are_written_in_step_order_with_the_synchronous_lines_content(tmp_path: Path) -> None:
    w = FrameWriter(tmp_path / "m.jsonl", -1, interval_s=0.001)
    batch = {"x": torch.arange(6).reshape(2, 3)}
    for s in range(1, 301):
        w.put(s, 1.0 / s, [0.1 / s, 0.2], lambda: digest(batch), None)
    w.close()
    got = frames(tmp_path / "m.jsonl")
    assert [f["step"] for f in got] == list(range(1, 301))
    f = got[6]
    assert f["train/loss_hex"] == (1.0 / 7).hex() and f["optim/lr_hex"] == [(0.1 / 7).hex(), (0.2).hex()]
    assert f["optim/lr"] == 0.1 / 7 and f["data/batch"] == digest(batch)
    assert list(f) == ["step", "time", "train/loss", "train/loss_hex", "optim/lr", "optim/lr_hex", "data/batch"]


def test_a_snapshot_digest_is_the_batch_as_it_was_even_if_refilled_in_place() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    batch = {"input_ids": x, "labels": [x[0], 3, "a", 0.5, None], "extra": ("t", b"b")}
    want = digest(batch)
    snap = snapshot(batch)
    x.add_(1.0)  # a loop that refills one buffer in place for the next step
    assert digest(snap) == want != digest(batch)
    assert digest_of_snapshots([snap, snapshot(batch)]) == digest([want, digest(batch)])


@pytest.mark.parametrize(
    "t",
    [
        torch.randint(0, 256, (8, 32)),
        torch.randn(4, 5).t(),
        torch.randn(3, requires_grad=True),
        torch.zeros(0, 3),
        torch.randn(2, 3, dtype=torch.bfloat16),
        torch.tensor([True, False]),
        torch.randn(2, dtype=torch.complex64),
        torch.randn(4, dtype=torch.float16)[::2],
        torch.tensor(3.5),
        torch.arange(6, dtype=torch.uint8).reshape(2, 3)[:, 1:],
    ],
    ids=[
        "int64",
        "transposed",
        "requires_grad",
        "empty",
        "bfloat16",
        "bool",
        "complex",
        "strided_half",
        "scalar",
        "sliced_uint8",
    ],
)
def test_a_snapshot_digest_equals_the_tensors_digest_for_every_kind(t: torch.Tensor) -> None:
    assert digest(snapshot(t)) == digest(t)
    assert digest(snapshot({"a": [t, (t, 1.5)], "b": "x"})) == digest({"a": [t, (t, 1.5)], "b": "x"})


def test_the_writer_error_is_raised_on_the_training_thread(tmp_path: Path) -> None:
    w = FrameWriter(tmp_path / "m.jsonl", -1, interval_s=0.001)
    w.sink.file.close()  # every later write fails (as a full disk would)
    w.put(1, 0.5)
    deadline = time.monotonic() + 30
    while w._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ValueError):
        w.put(2, 0.5)
    with pytest.raises(ValueError):
        w.flush()


def test_every_frame_is_on_disk_before_each_checkpoint_is_written(tmp_path: Path, monkeypatch, slow_writer) -> None:
    seen: dict[int, list[int]] = {}
    real = ckpt.save_checkpoint

    def spy(run_dir, step_no, *a, **kw):
        seen[step_no] = [f["step"] for f in frames(run_dir / "metrics.jsonl")]
        return real(run_dir, step_no, *a, **kw)

    monkeypatch.setattr(ckpt, "save_checkpoint", spy)
    run = make_run(tmp_path, steps=7, checkpoint_every=3)
    with contextlib.redirect_stdout(io.StringIO()):
        for s in run.steps():
            step(run, s)
    # (the checkpoint writer may persist a step's checkpoint after later steps: their frames may be there too)
    assert sorted(seen) == [3, 6, 7] and all(seen[c][:c] == list(range(1, c + 1)) for c in seen)
    assert [f["step"] for f in frames(tmp_path / "runs/fw/metrics.jsonl")] == list(range(1, 8))


def test_a_stop_writes_its_frames_before_its_checkpoint_and_its_console_lines_before_its_own(
    tmp_path: Path, monkeypatch, slow_writer
) -> None:
    seen: dict[int, list[int]] = {}
    real = ckpt.save_checkpoint

    def spy(run_dir, step_no, *a, **kw):
        seen[step_no] = [f["step"] for f in frames(run_dir / "metrics.jsonl")]
        return real(run_dir, step_no, *a, **kw)

    monkeypatch.setattr(ckpt, "save_checkpoint", spy)
    run = make_run(tmp_path, steps=10, checkpoint_every=100)
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        for s in run.steps():
            step(run, s)
            if s == 4:
                run._stop = True  # what the stop signal's handler sets
    assert exit_.value.code == 130
    assert list(seen) == [4] and seen[4][:4] == [1, 2, 3, 4]
    console = run.console.getvalue().splitlines()
    at = next(i for i, line in enumerate(console) if "stopping at step 4" in line)
    assert [line.split("|")[0].strip() for line in console[:at] if "| loss" in line] == [
        f"fw: step      {s}/10" for s in range(1, 5)
    ]


def test_a_held_trainer_has_its_frame_on_disk_while_it_holds(tmp_path: Path, slow_writer) -> None:
    run = make_run(tmp_path, steps=5, checkpoint_every=100)
    metrics = tmp_path / "runs/fw/metrics.jsonl"
    saw: list[int] = []

    def poll() -> None:  # verify-resume's poller: signal once the held step's frame is there
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not saw:
            got = [f["step"] for f in frames(metrics)]
            if 2 in got:
                saw.extend(got)
            time.sleep(0.01)
        run._stop = True

    faults.arm("trainer.hold@2")
    try:
        poller = threading.Thread(target=poll)
        poller.start()
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
            for s in run.steps():
                step(run, s)
        poller.join()
    finally:
        faults.arm(None)
    assert saw == [1, 2]


def test_liveness_lines_come_from_the_loop_at_once_not_from_the_writer(tmp_path: Path, slow_writer) -> None:
    run = make_run(tmp_path, steps=4, checkpoint_every=100, progress_interval_s=0.0)
    progress, metrics = tmp_path / "progress.jsonl", tmp_path / "runs/fw/metrics.jsonl"
    steps_seen, frames_seen = [], []
    with contextlib.redirect_stdout(io.StringIO()):
        for s in run.steps():
            steps_seen.append(max(ln.get("step", 0) for ln in frames(progress)))  # the previous step's line
            frames_seen.append(len(frames(metrics)))
            step(run, s)
    assert steps_seen == [0, 1, 2, 3]
    assert frames_seen == [0, 0, 0, 0]  # the frames waited for the writer; the liveness lines did not


def test_frame_line_keeps_the_synchronous_key_order_and_nan() -> None:
    line = json.loads(frame_line((3, 1.5, float("nan"), None, "abc", {"state": {"model": "x"}}, False)))
    assert list(line) == ["step", "time", "train/loss", "train/loss_hex", "data/batch", "state"]
    assert line["train/loss_hex"] == "nan"
