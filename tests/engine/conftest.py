"""Fixtures for the engine tests (helpers live in eng_helpers.py)."""

from __future__ import annotations

import pytest

from engine import VirtualClock


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "engine.db")


@pytest.fixture
def clock():
    return VirtualClock(start=1_000_000.0)
