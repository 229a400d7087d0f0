"""Fixtures of the workflow tests (helpers live in wf_world.py, fakes in wf_fakes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import VirtualClock
from wf_fakes import Fakes
from wf_world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    clock = VirtualClock()
    w = World(home=tmp_path, clock=clock, fakes=Fakes(home=tmp_path, clock=clock))
    yield w
    if w.engine is not None:
        w.engine.close()
