"""Both engines are ``app.Backend``s (app/backend.py): every member of the protocol is there, and what the
Temporal adapter lacks it says by its capability flags and ``Unsupported``, not by a missing attribute.

(mypy checks the same statically: app/backend.py's ``_both_are_backends`` under TYPE_CHECKING.) The Temporal
adapter is built without connecting (``object.__new__``): its unsupported members touch no cluster, which is
the point here; its real behaviour on a dev server is tests/temporal's.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

import app
from app.backend import Backend
from engine import Engine, Unsupported

temporal = pytest.importorskip("engine.temporal.backend")


def _members() -> set[str]:
    return {n for n in typing._get_protocol_attrs(Backend)}  # type: ignore[attr-defined]


def test_the_protocol_names_what_ctl_uses() -> None:
    assert {
        "store",
        "owner",
        "polite_stop",
        "attempt_overrides",
        "generations",
        "describe",
        "request_stop",
        "preempted",
        "stop",
        "stop_grace_s",
        "attempt_options",
        "history",
    } <= _members()


def test_the_embedded_engine_has_every_member(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "engine.db")
    try:
        missing = sorted(m for m in _members() if not hasattr(engine, m))
        assert not missing, missing
        assert engine.polite_stop and engine.attempt_overrides and engine.store is not None
        assert engine.describe() == str(tmp_path / "engine.db")
    finally:
        engine.close()


def test_the_temporal_adapter_has_every_member_and_says_what_it_lacks() -> None:
    cls = temporal.TemporalEngine
    missing = sorted(m for m in _members() if not hasattr(cls, m))
    assert not missing, missing
    t = object.__new__(cls)  # no cluster: only the members that need none
    assert (
        t.polite_stop,
        t.attempt_overrides,
        t.store,
        t.owner,
        t.stop,
        t.preempted,
        t.stop_grace_s,
        t.attempt_options,
    ) == (False, False, None, None, None, [], None, None)
    with pytest.raises(Unsupported):
        t.request_stop("SIGTERM")
    with pytest.raises(Unsupported):
        t.stop_grace_s = 5.0
    with pytest.raises(Unsupported):
        t.attempt_options = app.heartbeat_override("train/x", 5.0)
    t.attempt_options = None  # none asked: nothing to refuse


def test_generations_of_the_embedded_engine(tmp_path: Path) -> None:
    """``train/x``, ``train/x/2``, ``train/x/10`` in generation order; ``train/xy`` and ``train/x/a`` are not
    generations of ``train/x``, and ``_`` in a base is no wildcard."""
    engine = Engine(tmp_path / "engine.db")

    async def wf(rt, inp):
        return None

    engine.register_workflow("W", wf)
    try:
        for wid in ("train/x/10", "train/x", "train/xy", "train/x/2", "train/x/a", "train/a_b", "train/aXb/2"):
            engine.start("W", wid, None)
        assert [s.workflow_id for s in engine.generations("train/x")] == ["train/x", "train/x/2", "train/x/10"]
        assert [s.workflow_id for s in engine.generations("train/a_b")] == ["train/a_b"]
        assert engine.generations("train/none") == []
    finally:
        engine.close()
