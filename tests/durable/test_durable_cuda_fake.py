"""tinyllm.durable's CUDA RNG save/restore, exercised with a FAKE torch.cuda RNG API.

Why a fake: the torch build here (and in CI) is CPU-only and no GPU is assumed, so
``torch.cuda.get_rng_state_all`` / ``set_rng_state_all`` cannot run for real. The fake stands in
for exactly that API (``is_available``, ``is_initialized``, ``get_rng_state_all``,
``set_rng_state_all``, ``manual_seed_all``): two "devices", each a byte-tensor state that every
draw advances. It proves the helper's code path captures every device's state into the checkpoint,
through the real checkpoint files, and puts it back on resume, so a loop drawing from the device
RNG continues bit for bit. It proves nothing about real CUDA generators (offsets, graphs, more
devices): that is untested here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tempfile
from pathlib import Path

import pytest
import torch

from tinyllm import checkpoint as ckpt
from tinyllm.durable import DurableRun
from tinyllm.durable.state import capture_rng, restore_rng

torch.set_num_threads(1)


class FakeCudaRng:
    """Two devices' RNG states (uint8 tensors, as torch.cuda returns them); a draw hashes and advances one."""

    def __init__(self, devices: int = 2):
        self.states = [torch.zeros(16, dtype=torch.uint8) for _ in range(devices)]
        self.sets = 0  # how many times set_rng_state_all was called (restores)

    def manual_seed_all(self, seed: int) -> None:
        for i in range(len(self.states)):
            self.states[i] = torch.frombuffer(
                bytearray(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:16]), dtype=torch.uint8
            ).clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states) -> None:
        assert len(states) == len(self.states) and all(s.dtype == torch.uint8 for s in states)
        self.states = [s.clone() for s in states]
        self.sets += 1

    def draw(self, device: int) -> float:
        digest = hashlib.sha256(self.states[device].numpy().tobytes()).digest()
        self.states[device] = torch.frombuffer(bytearray(digest[:16]), dtype=torch.uint8).clone()
        return int.from_bytes(digest[16:24], "big") / 2**64


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeCudaRng:
    fake = FakeCudaRng()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", fake.get_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", fake.set_rng_state_all)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", fake.manual_seed_all)
    return fake


def test_every_devices_rng_state_round_trips_through_a_checkpoint(fake_cuda: FakeCudaRng, tmp_path: Path) -> None:
    fake_cuda.manual_seed_all(5)
    for _ in range(3):
        fake_cuda.draw(0)
    fake_cuda.draw(1)
    state = capture_rng({})
    assert state["cuda"] is not None and len(state["cuda"]) == 2
    path = ckpt.save_checkpoint(tmp_path, 1, {"model": {}, "optimizer": {}, "training_state": {"rng": state}})
    loaded = ckpt.load_checkpoint(path)[0]["training_state"]["rng"]
    expected = [fake_cuda.draw(0), fake_cuda.draw(1), fake_cuda.draw(1)]
    fake_cuda.manual_seed_all(99)  # scrambled, as in a fresh process
    restore_rng(loaded, {})
    assert fake_cuda.sets == 1
    assert [fake_cuda.draw(0), fake_cuda.draw(1), fake_cuda.draw(1)] == expected


def _loop(home: Path, steps: int, fake: FakeCudaRng) -> tuple[DurableRun, list[str]]:
    """A loop whose loss depends on both fake devices' RNGs (as dropout on a GPU would)."""
    run = DurableRun({"name": "cuda", "steps": steps, "seed": 4, "checkpoint_every": 3, "log_every": 1000}, home=home)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.track(model=model, optimizer=opt)
    losses = []
    for _ in run.steps():
        x = torch.tensor([[fake.draw(0), fake.draw(1)]])
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(loss)
        losses.append(loss.item().hex())
    return run, losses


@pytest.mark.slow
def test_a_resumed_loop_drawing_from_the_device_rng_continues_bit_for_bit(fake_cuda: FakeCudaRng) -> None:
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        ref, ref_losses = _loop(Path(a), 8, fake_cuda)
        _, head = _loop(Path(b), 5, fake_cuda)  # ends with a checkpoint at step 5
        resumed, tail = _loop(Path(b), 8, fake_cuda)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "step-000005"
    assert fake_cuda.sets == 1  # the new run seeded the devices afresh; the resume put step 5's states back
    assert head + tail == ref_losses
    assert resumed.fingerprint() == ref.fingerprint()
