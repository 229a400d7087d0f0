"""Session-wide settings of the test lanes.

- **Compiled bytecode is cached for the processes the tests start** (ctl, tinyllm, trainers, workers).
  This machine and CI run with ``PYTHONDONTWRITEBYTECODE=1``, so every such process recompiled every
  project module it imported (the ctl/app/workflows/engine stack, or tinyllm's trainer): about 0.5 s
  of CPU a start. Measured on tests/ctl/test_ctl_rough_edges.py + test_ctl_preempt.py (14 tests, a
  fresh checkout, 2 cores): 159 s without the cache, 105 s with it (the cache filled during the run).
  The cache lives in one folder under the system's temp directory (``PYTHONPYCACHEPREFIX``), never
  beside the sources nor in a test's folders; Python checks each cached file against its source, so
  an edited module is recompiled.
- **mypy starts at once in the background** when tests/test_checked.py's mypy test is selected: a cold
  mypy is ~40 s of one core, which then overlaps the tests before it instead of adding to the lane.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MYPY_TEST = "tests/test_checked.py::test_mypy_finds_no_type_error"
_mypy: dict[str, subprocess.Popen[str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    cache = Path(tempfile.gettempdir()) / f"durable-train-pycache-{os.getuid()}"
    cache.mkdir(exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.nodeid == MYPY_TEST for item in session.items):
        _mypy["proc"] = subprocess.Popen(
            [sys.executable, "-m", "mypy"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = _mypy.pop("proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
def mypy_result() -> tuple[int, str]:
    """mypy's exit status and output: the run started at collection, or one run now."""
    proc = _mypy.pop("proc", None)
    if proc is None:
        done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout + done.stderr
    out, _ = proc.communicate()
    return proc.returncode, out
