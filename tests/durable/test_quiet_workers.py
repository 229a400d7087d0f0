"""tinyllm.stopping.quiet_workers on a real DataLoader: its worker processes ignore the stop signals (a real
SIGTERM to a worker leaves it alive), with the fork and the spawn start methods (spawn pickles the process
object: the quiet process classes must be importable), and the loader's own worker_init_fn still runs."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tinyllm import stopping

pytestmark = pytest.mark.slow  # worker processes (spawn imports torch: seconds)


class Pids(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.tensor([os.getpid(), i, int(os.environ.get("QUIET_TEST_INIT", "0"))])


def mark(worker_id: int) -> None:
    os.environ["QUIET_TEST_INIT"] = "1"  # the user's own worker_init_fn ran (after the quiet one)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_workers_ignore_sigterm_and_the_users_worker_init_fn_still_runs(method: str, monkeypatch) -> None:
    monkeypatch.setenv(stopping.STOP_SIGNAL_ENV, "USR1")
    loader = stopping.quiet_workers(
        DataLoader(
            Pids(),
            batch_size=4,
            num_workers=2,
            worker_init_fn=mark,
            multiprocessing_context=method,
            persistent_workers=True,
        )
    )
    it = iter(loader)
    first = next(it)
    pids = {int(p) for p in first[:, 0]}
    assert all(int(x) == 1 for x in first[:, 2])
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            os.kill(pid, sig)
    time.sleep(0.5)  # time for a default action to kill it (it must not)
    rest = list(it)  # seen red without quiet_workers: "DataLoader worker (pid(s) ...) exited unexpectedly"
    assert len(rest) == 15
    for pid in pids:
        os.kill(pid, 0)  # still alive (ProcessLookupError otherwise)
    del it
