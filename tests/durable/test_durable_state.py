"""tinyllm.durable's save/restore of every state kind, through real checkpoint files (hypothesis).

RNGs (Python random, NumPy global, torch CPU, and registered torch/NumPy/legacy/Python generators)
round-trip through tinyllm's checkpoint writer and ``torch.load(weights_only=True)``; a model,
optimizer, LR scheduler, grad scaler and data sampler saved by a DurableRun at a random step and
restored by a fresh process-like DurableRun continue bit for bit like an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import io
import random
import tempfile
from pathlib import Path

import pytest

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyllm import checkpoint as ckpt
from tinyllm import faults
from tinyllm.durable import DurableRun, DurableSampler
from tinyllm.durable.state import capture_rng, restore_rng

torch.set_num_threads(1)


def generators(seed: int) -> dict:
    return {
        "torch": torch.Generator().manual_seed(seed),
        "pcg": np.random.default_rng(seed),
        "mt": np.random.Generator(np.random.MT19937(seed)),
        "legacy": np.random.RandomState(seed % 2**32),
        "py": random.Random(seed),
    }


def draw(gens: dict) -> list:
    """One draw from every RNG, as exact values."""
    return [
        random.random().hex(),
        float(np.random.random()).hex(),
        torch.rand(3).tolist(),
        torch.rand(2, generator=gens["torch"]).tolist(),
        float(gens["pcg"].random()).hex(),
        int(gens["mt"].integers(0, 2**62)),
        float(gens["legacy"].randn()).hex(),
        gens["py"].random().hex(),
    ]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**40), advance=st.integers(0, 40), gauss=st.booleans())
def test_every_rng_round_trips_through_a_checkpoint(seed: int, advance: int, gauss: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    gens = generators(seed + 1)
    for _ in range(advance):
        draw(gens)
    if gauss:  # states with a cached Gaussian (Python and legacy NumPy keep one)
        random.gauss(0, 1)
        np.random.standard_normal()
        gens["legacy"].standard_normal()
    state = capture_rng(gens)
    with tempfile.TemporaryDirectory() as tmp:
        path = ckpt.save_checkpoint(Path(tmp), 1, {"model": {}, "optimizer": {}, "training_state": {"rng": state}})
        loaded = ckpt.load_checkpoint(path)[0]["training_state"]["rng"]
    expected = [draw(gens) for _ in range(3)]
    random.seed(seed + 7)  # scramble everything, then restore into fresh generator objects
    np.random.seed((seed + 7) % 2**32)
    torch.manual_seed(seed + 7)
    fresh = generators(seed + 99)
    restore_rng(loaded, fresh)
    assert [draw(fresh) for _ in range(3)] == expected


def test_a_registered_generator_missing_from_the_checkpoint_is_an_error() -> None:
    state = capture_rng({})
    try:
        restore_rng(state, {"noise": torch.Generator()})
    except KeyError as e:
        assert "noise" in str(e)
    else:
        raise AssertionError("restore accepted a checkpoint without the generator's state")


def _loop(home: Path, steps: int, every: int, seed: int, scaler_on: bool) -> tuple[DurableRun, list[str]]:
    """A tiny loop with every piece of state: dropout, shuffled sampler, AdamW, LambdaLR, GradScaler,
    a registered noise generator and a cursor."""
    spec = {"name": "rt", "steps": steps, "seed": seed, "checkpoint_every": every, "log_every": 1000}
    run = DurableRun(spec, home=home)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2, enabled=scaler_on)
    xs = torch.randn(10, 3, generator=torch.Generator().manual_seed(seed))
    sampler = DurableSampler(10, seed=seed)
    noise = np.random.default_rng(seed)
    run.track(model=model, optimizer=opt, scheduler=sched, scaler=scaler, data=sampler, generators={"noise": noise})
    losses = []
    batches = run.batches(torch.utils.data.DataLoader(xs, batch_size=3, sampler=sampler))
    for _ in run.steps():
        x = next(batches)
        x = x + torch.from_numpy(noise.standard_normal(x.shape).astype("float32")) * 0.1
        loss = model(x).pow(2).mean() + random.random() * 0 + float(np.random.random()) * 0
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        run.cursor += 1
        run.log(loss, batch=x)
        losses.append(loss.item().hex())
    return run, losses


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(
    first=st.integers(1, 6),
    more=st.integers(1, 4),
    every=st.integers(1, 3),
    seed=st.integers(0, 1000),
    scaler_on=st.booleans(),
)
def test_a_resumed_loop_continues_bit_for_bit(first: int, more: int, every: int, seed: int, scaler_on: bool) -> None:
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        ref, ref_losses = _loop(Path(a), first + more, every, seed, scaler_on)
        _, head = _loop(Path(b), first, every, seed, scaler_on)  # ends with a checkpoint at `first`
        resumed, tail = _loop(Path(b), first + more, every, seed, scaler_on)
        assert resumed.resumed_from is not None and resumed.resumed_from.name == f"step-{first:06d}"
        assert head + tail == ref_losses
        assert resumed.fingerprint() == ref.fingerprint()
        assert resumed.cursor == ref.cursor == first + more


def test_sampler_state_round_trips_mid_epoch_and_at_the_epoch_end() -> None:
    s = DurableSampler(5, seed=3)
    it = iter(s)
    head = [next(it) for _ in range(2)]
    t = DurableSampler(5, seed=3)
    t.load_state_dict(s.state_dict())
    assert head + list(t) == list(DurableSampler(5, seed=3))
    assert t.state_dict()["position"] == 5
    u = DurableSampler(5, seed=3)
    u.load_state_dict(t.state_dict())  # (epoch 0, position 5) is (epoch 1, position 0)
    second = list(u)
    v = DurableSampler(5, seed=3)
    list(v)
    assert second == list(v) and sorted(second) == list(range(5))


def test_an_armed_checkpoint_write_fault_fires_in_one_process_once(tmp_path: Path, monkeypatch) -> None:
    """``TINYLLM_FAULT=durable.checkpoint_write@armed:FILE`` (the fault campaign's): the first write that finds
    FILE claims it by a rename; no other write fires. (``faults.fires`` decides; ``save`` then dies.)"""
    import os

    def fires(saves: int) -> bool:
        return faults.fires("durable.checkpoint_write", saves, tmp_path)

    spec = {"name": "arm", "steps": 3}
    monkeypatch.setenv("TINYLLM_FAULT", "durable.checkpoint_write@armed:arm")
    DurableRun(spec, home=tmp_path)  # arms from the environment
    assert not fires(1) and not fires(2)  # not armed yet
    (tmp_path / "arm").write_text("")
    assert [fires(1), fires(2), fires(3)] == [True, False, False]
    assert list(tmp_path.iterdir()) == [tmp_path / f"arm.fired-{os.getpid()}"]
    monkeypatch.setenv("TINYLLM_FAULT", "durable.checkpoint_write@2")
    DurableRun(spec, home=tmp_path)
    assert not fires(1) and fires(2)
    monkeypatch.delenv("TINYLLM_FAULT")
    DurableRun(spec, home=tmp_path)
    assert not fires(2)  # disarmed again


def test_run_steps_is_the_runs_full_length_from_ctl_else_the_specs_steps(tmp_path, monkeypatch) -> None:
    spec = {"name": "r", "steps": 20}
    assert DurableRun(spec, home=tmp_path).run_steps == 20
    monkeypatch.setenv("CTL_RUN_STEPS", "60")  # a segment ending at 20 of a 60-step run (ctl train)
    assert DurableRun(spec, home=tmp_path).run_steps == 60 and DurableRun(spec, home=tmp_path).total_steps == 20
    monkeypatch.setenv("CTL_RUN_STEPS", "junk")
    assert DurableRun(spec, home=tmp_path).run_steps == 20
