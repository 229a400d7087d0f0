"""A finished tiny run (train/mini: corpus, one segment with checkpoints at steps 3 and 6, no evaluation), built once per session
by the real ``ctl train``; tests copy it (``bi_helpers.copy_home``) before touching anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_helpers import SPEC, ctl, write_json


@pytest.fixture(scope="session")
def finished_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("finished") / "home"
    home.mkdir()
    write_json(home / "spec.json", SPEC)
    proc = ctl(home, "train", "--spec", str(home / "spec.json"), "--no-eval", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a second workflow, started and never run: status and list must keep showing it
    write_json(home / "other.json", {**SPEC, "name": "other"})
    proc = ctl(home, "train", "--spec", str(home / "other.json"), "--no-eval", "--detach")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home
