"""ctl doctor's leftover temporaries: one whose writer (the pid in its name) still runs is not a leftover;
one whose writer is gone, or a zombie, is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctl.doctor import _temporaries

pytestmark = pytest.mark.slow  # writer processes, alive, dead and zombie


def test_a_temporary_is_a_leftover_only_when_its_writer_is_gone_or_a_zombie(tmp_path: Path) -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(500):  # exited, not yet reaped: a zombie
        if Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.01)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    for pid in (os.getpid(), zombie.pid, int(dead.stdout)):
        (run / f"metrics.jsonl.tmp-{pid}").write_text("x")
    try:
        found = sorted(f.path for f in _temporaries(tmp_path))
    finally:
        zombie.wait()
    assert found == sorted(f"runs/r/metrics.jsonl.tmp-{p}" for p in (zombie.pid, int(dead.stdout))), found
