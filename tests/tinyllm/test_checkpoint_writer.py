"""tinyllm/checkpoint_writer.py: asynchronous checkpoints (issue 42 item 2).

Fast lane: the writer's rules with fake persists (threads and events, no timing asserted: the
point is the order of events, not the file system), the snapshot's exactness on real tensors
(``torch.save`` of the snapshot is byte for byte that of the live state, and training after it
changes nothing in it), and a real in-process ``Trainer`` whose writer fails (a full disk injected
into the real write path): the same ``DiskFull`` surfaces from ``run()`` and ``LATEST`` stays.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
import torch

from tinyllm import checkpoint as ckpt
from tinyllm.checkpoint_writer import (
    ASYNC_ENV,
    CheckpointWriter,
    async_enabled,
    snapshot,
)
from tinyllm.diskfull import DiskFull

# --- the writer's rules -------------------------------------------------------------------------


def test_one_in_flight_and_each_done_handed_out_once_in_order() -> None:
    """The second submit waits for the first persist (never two at once) and hands back its Done;
    poll/wait hand out each Done exactly once."""
    writer = CheckpointWriter(asynchronous=True)
    release = threading.Event()
    running, most, events = [0], [0], []
    lock = threading.Lock()

    def persist(name: str, block: bool):
        def body():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            events.append(f"start {name}")
            if block:
                assert release.wait(30)
            events.append(f"end {name}")
            with lock:
                running[0] -= 1
            return name

        return body

    writer.submit(persist("a", block=True), tag=1)
    assert writer.in_flight
    assert writer.poll() is None  # still running: nothing to announce
    with pytest.raises(RuntimeError, match="still in flight"):  # never a second one beside it
        writer.submit(persist("b", block=False), tag=2)
    threading.Timer(0.05, release.set).start()
    done = writer.wait()  # the loop waits for a (and announces it) before b
    assert (done.tag, done.result) == (1, "a")
    assert events == ["start a", "end a"]
    writer.submit(persist("b", block=False), tag=2)
    last = writer.wait()
    assert (last.tag, last.result) == (2, "b")
    assert writer.wait() is None and writer.poll() is None and not writer.in_flight  # handed out once
    assert most[0] == 1 and events == ["start a", "end a", "start b", "end b"]


def test_a_failed_persist_raises_the_same_error_on_the_training_thread_then_the_writer_is_free() -> None:
    error = DiskFull("/x/.tmp-step-000004-1/model.pt")

    def fail():
        raise error

    writer = CheckpointWriter(asynchronous=True)
    writer.submit(fail, tag=4)
    with pytest.raises(DiskFull) as info:
        writer.wait()
    assert info.value is error and str(info.value) == "disk full writing /x/.tmp-step-000004-1/model.pt"
    assert not writer.in_flight
    writer.submit(fail, tag=5)
    while writer._thread is not None and writer._thread.is_alive():
        threading.Event().wait(0.01)
    with pytest.raises(DiskFull):  # a poll at a step boundary surfaces it too (the loop never loses it)
        writer.poll()
    assert writer.wait() is None  # the failed one is not retried
    writer.submit(fail, tag=7)
    assert writer.close() is error and not writer.in_flight  # close: returned, not raised (finally blocks)


def test_synchronous_mode_persists_inline() -> None:
    writer = CheckpointWriter(asynchronous=False)
    order = []
    writer.submit(lambda: order.append("persisted") or "p", tag=1)
    assert order == ["persisted"]  # done before submit returned
    assert writer.wait().result == "p" and writer.poll() is None
    with pytest.raises(OSError):
        writer.submit(lambda: (_ for _ in ()).throw(OSError("boom")), tag=2)


def test_the_switch_reads_its_variable_and_refuses_other_values() -> None:
    assert async_enabled({}) and async_enabled({ASYNC_ENV: "1"})
    assert not async_enabled({ASYNC_ENV: "0"}) and not async_enabled({ASYNC_ENV: "off"})
    with pytest.raises(ValueError, match="TINYLLM_ASYNC_CHECKPOINTS='maybe'") as e:
        async_enabled({ASYNC_ENV: "maybe"})
    assert "\n" not in str(e.value)


# --- the snapshot -------------------------------------------------------------------------------


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight  # tied, as GPT's wte/lm_head: one storage, saved once
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.head(self.norm(self.emb(x)))


def test_the_snapshot_saves_the_same_bytes_and_training_does_not_reach_it() -> None:
    from tinyllm.runtime_env import defer_dynamo_in_optimizers, optimizer_step

    defer_dynamo_in_optimizers()  # the trainer's AdamW step, without torch._dynamo's import (seconds)
    torch.manual_seed(0)
    model = _Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)

    def step():
        model(torch.arange(11)).pow(2).mean().backward()
        optimizer_step(opt)
        opt.zero_grad()

    step()
    live = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "training_state": {"step": 1, "torch_rng": torch.get_rng_state(), "loss": 0.5},
    }
    before = {k: _saved(v) for k, v in live.items()}
    snap = snapshot(live)
    assert {k: _saved(v) for k, v in snap.items()} == before  # byte for byte: the same checkpoint files
    assert (
        snap["model"]["head.weight"].untyped_storage().data_ptr()
        == snap["model"]["emb.weight"].untyped_storage().data_ptr()
    )
    assert snap["model"]["emb.weight"].untyped_storage().data_ptr() != model.emb.weight.untyped_storage().data_ptr()
    step()  # the next optimizer step changes every tensor of the live state ...
    assert _saved(live["model"]) != before["model"]
    assert {k: _saved(v) for k, v in snap.items()} == before  # ... and nothing of the snapshot


# --- a real trainer whose writer hits a full disk -----------------------------------------------


@pytest.mark.slow  # a real (in-process) training run: about a second
def test_trainer_surfaces_the_writers_disk_full_and_keeps_latest(home: Path, monkeypatch) -> None:
    """The real Trainer (in process), asynchronous checkpoints every 2 steps; the write of step 4's
    first file finds the disk full (injected into the real write path, on the writer thread). ``run()``
    raises that DiskFull (what the CLI turns into its one line and exit 74), LATEST still names step 2,
    and no progress line names step 4."""
    from tinyllm.spec import parse_train_spec
    from tinyllm.trainer import Trainer

    monkeypatch.delenv(ASYNC_ENV, raising=False)
    real = ckpt._write_file
    threads = set()

    def write_file(path: Path, data: bytes) -> None:
        threads.add(threading.current_thread().name)
        if ".tmp-step-000004-" in str(path):
            raise DiskFull(path)
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_file", write_file)
    spec = parse_train_spec(
        {
            "name": "w",
            "steps": 8,
            "checkpoint_every": 2,
            "batch_size": 2,
            "threads": 1,
            "log_every": 100,
            "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
        }
    )
    progress = home / "p.jsonl"
    trainer = Trainer(spec, home, progress=progress, log=io.StringIO())
    assert trainer.async_checkpoints
    with pytest.raises(DiskFull, match=r"disk full writing .*\.tmp-step-000004-\d+/model\.pt"):
        trainer.run()
    assert threads == {"tinyllm-checkpoint-writer"}  # every file was written off the training thread
    ckpt_root = home / "runs" / "w" / "ckpt"
    assert (ckpt_root / "LATEST").read_text().strip() == "step-000002"
    assert "step-000004" not in progress.read_text()
    assert trainer.writer.poll() is None and not trainer.writer.in_flight  # nothing left running


# --- the helper: asynchronous and synchronous checkpoints are the same checkpoints -------------------


def _helper_run(home: Path, asynchronous: bool) -> tuple[list[dict], dict[str, bytes], dict[int, dict]]:
    import contextlib
    import json

    from tinyllm.durable import DurableRun
    from tinyllm.runtime_env import defer_dynamo_in_optimizers, optimizer_step

    defer_dynamo_in_optimizers()
    progress = home / "p.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        run = DurableRun(
            {"name": "h", "steps": 5, "checkpoint_every": 2, "seed": 1},
            home=home,
            progress=progress,
            console=io.StringIO(),
            async_checkpoints=asynchronous,
        )
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        run.track(model=model, optimizer=opt, scheduler=sched)
        live = {}  # step -> the live fingerprint after that step (a checkpoint's state)
        for step in run.steps():
            live[step - 1] = run.fingerprint()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            optimizer_step(opt)
            opt.zero_grad()
            sched.step()
            run.log(loss)
        live[run.step] = run.fingerprint()
    lines = [json.loads(ln) for ln in progress.read_text().splitlines()]
    checkpoints = [{k: v for k, v in ln.items() if k != "time"} for ln in lines if ln.get("event") == "checkpoint"]
    root = home / "runs" / "h" / "ckpt"
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    return checkpoints, files, live


@pytest.mark.slow  # two in-process runs: about a second
@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")  # optimizer_step: no dynamo import
def test_the_helpers_asynchronous_checkpoints_are_its_synchronous_ones(tmp_path: Path) -> None:
    """Same files byte for byte (manifests included), same checkpoint lines (step, loss bits, the state
    fingerprint, computed from the snapshot on the writer thread), each line after its step's save."""
    (tmp_path / "a").mkdir()
    (tmp_path / "s").mkdir()
    lines_a, files_a, live = _helper_run(tmp_path / "a", asynchronous=True)
    lines_s, files_s, _ = _helper_run(tmp_path / "s", asynchronous=False)
    assert [ln["step"] for ln in lines_a] == [2, 4, 5]
    assert [ln["checkpoint"] for ln in lines_a] == [f"runs/h/ckpt/step-00000{s}" for s in (2, 4, 5)]
    assert all(ln["state"] == live[ln["step"]] for ln in lines_a)  # the snapshot's fingerprint is the live one
    assert lines_a == lines_s
    assert files_a == files_s and files_a["LATEST"] == b"step-000005\n"


@pytest.mark.slow  # a real (in-process) training run: about a second
def test_a_stop_while_a_checkpoint_is_in_flight_writes_its_line_before_stopping(home: Path, monkeypatch) -> None:
    """The stop arrives while step 4's checkpoint is being written (the write holds until the loop is past
    step 4, then the stop is requested, as a signal handler would). The progress file: step 4's line, then
    ``stopping`` at S, then exactly one checkpoint line, at S; the result names step S's checkpoint."""
    import json
    import signal
    import time

    from tinyllm.errors import STOP, request_stop
    from tinyllm.spec import parse_train_spec
    from tinyllm.trainer import Trainer

    monkeypatch.delenv(ASYNC_ENV, raising=False)
    monkeypatch.setitem(STOP, "requested", False)
    monkeypatch.setitem(STOP, "signal", None)
    real = ckpt._write_file
    spec = parse_train_spec(
        {
            "name": "s",
            "steps": 40,
            "checkpoint_every": 4,
            "batch_size": 2,
            "threads": 1,
            "log_every": 100,
            "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
        }
    )
    progress = home / "p.jsonl"
    trainer = Trainer(spec, home, progress=progress, log=io.StringIO())

    def write_file(path: Path, data: bytes) -> None:
        if ".tmp-step-000004-" in str(path) and not STOP["requested"]:
            deadline = time.monotonic() + 60
            while trainer.step < 5 and time.monotonic() < deadline:  # training goes on beside this write
                time.sleep(0.005)
            request_stop(signal.SIGTERM, None)
            time.sleep(0.2)  # the loop notices the stop while this write is still in flight
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_file", write_file)
    result = trainer.run()
    lines = [json.loads(ln) for ln in progress.read_text().splitlines()]
    at = next(i for i, ln in enumerate(lines) if ln.get("event") == "stopping")
    stop_step = lines[at]["step"]
    assert stop_step >= 5 and result["canceled"] and result["steps"] == stop_step
    before = [ln["step"] for ln in lines[:at] if "checkpoint" in ln and "event" not in ln]
    after = [ln["step"] for ln in lines[at:] if "checkpoint" in ln and "event" not in ln]
    assert 4 in before and after == [stop_step]
    assert result["checkpoint"] == f"runs/s/ckpt/step-{stop_step:06d}"
