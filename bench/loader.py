"""The loader's position: tinyllm's DurableSampler against torchdata's StatefulDataLoader, in one run.

Prints, for a map-style dataset (4096 rows of 32 floats, batch 8, one torch thread), the time per batch of
``DataLoader(sampler=DurableSampler)`` and of ``StatefulDataLoader(shuffle=True)`` with 0 and 2 worker
processes, the time of one ``state_dict()`` (what a checkpoint asks), and whether a ``DurableRun`` whose
``data`` is a ``StatefulDataLoader`` (0 and 2 workers) stopped mid-epoch at step 7 and resumed ends with the
uninterrupted run's per-step losses bit for bit. docs/trainer-contract.md says what follows.
torchdata is not a dependency of the project: ``pip install torchdata`` first (the script says so and
exits 0 without it).

Usage: python bench/loader.py
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from tinyllm.durable import DurableRun, DurableSampler

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:
    print("torchdata is not installed (pip install torchdata): nothing to compare")
    sys.exit(0)


def per_batch(make, n: int = 400, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        it = iter(make())
        next(it)
        t0 = time.perf_counter()
        for _ in range(n):
            next(it)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def state_dict_s(loader, holder, reps: int = 50) -> float:
    it = iter(loader)
    for _ in range(5):
        next(it)
    t0 = time.perf_counter()
    for _ in range(reps):
        holder.state_dict()
    return (time.perf_counter() - t0) / reps


def train(home: Path, data, workers: int, stop_at: int | None = None) -> list:
    """A DurableRun over a StatefulDataLoader (its ``data``): the per-step losses as float.hex."""
    run = DurableRun(
        {"name": "td", "steps": 12, "checkpoint_every": 100, "log_every": 100}, home=home, console=io.StringIO()
    )
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True, num_workers=workers)
    run.track(model=model, optimizer=opt, data=loader)
    batches = run.batches(loader)
    losses = []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        for s in run.steps():
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log(loss, batch=(x, y))
            losses.append((s, loss.item().hex()))
            if s == stop_at:
                run._stop = True  # what a stop signal's handler sets: checkpoint at this step, exit 130
    return losses


def main() -> None:
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    for workers in (0, 2):
        kw = {"num_workers": workers}
        a = per_batch(lambda kw=kw: DataLoader(data, batch_size=8, sampler=DurableSampler(len(data), seed=0), **kw))
        b = per_batch(lambda kw=kw: StatefulDataLoader(data, batch_size=8, shuffle=True, **kw))
        sampler = DurableSampler(len(data), seed=0)
        plain = DataLoader(data, batch_size=8, sampler=sampler, **kw)
        stateful = StatefulDataLoader(data, batch_size=8, shuffle=True, **kw)
        print(
            f"workers {workers}: per batch DurableSampler {a * 1e6:.1f} us, StatefulDataLoader {b * 1e6:.1f} us; "
            f"state_dict DurableSampler {state_dict_s(plain, sampler) * 1e6:.1f} us, "
            f"StatefulDataLoader {state_dict_s(stateful, stateful) * 1e6:.1f} us"
        )
    small = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
    for workers in (0, 2):
        ref = train(Path(tempfile.mkdtemp()), small, workers)
        home = Path(tempfile.mkdtemp())
        got = train(home, small, workers, stop_at=7) + train(home, small, workers)
        print(
            f"DurableRun(data=StatefulDataLoader, {workers} workers) stopped at step 7 (mid-epoch), resumed: "
            f"{'EXACT' if got == ref else 'DIFFERENT'} ({len(ref)} steps)"
        )


if __name__ == "__main__":
    main()
