"""tinyllm.fsio: one home resolution for tinyllm, ctl and DurableRun; no descriptor leaked by a failing fsync."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from tinyllm.corpus import build_corpus
from tinyllm.spec import CorpusSpec


def test_tilde_ctl_home_names_one_folder_in_tinyllm_ctl_and_durable_run(tmp_path, monkeypatch):
    import app
    from tinyllm import cli
    from tinyllm.durable import DurableRun

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CTL_HOME", "~/h")
    expected = tmp_path / "h"
    assert cli.resolve_home(None) == expected
    assert app.resolve_home(None) == expected
    assert DurableRun({"name": "r", "steps": 1}, seed_rngs=False).home == expected
    for given in ("~/h", str(expected)):  # --home: the same folder, whichever way it is written
        assert cli.resolve_home(given) == app.resolve_home(given) == expected
        assert DurableRun({"name": "r", "steps": 1}, home=given, seed_rngs=False).home == expected


def _open_dir_fds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += stat.S_ISDIR(os.fstat(int(fd)).st_mode)
        except OSError:
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_corpus_directory_fsync_failure_closes_its_descriptor(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "injected fsync failure")
        return real_fsync(fd)

    before = _open_dir_fds()
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="injected"):
        build_corpus(CorpusSpec(heldout_fraction=0.2), tmp_path)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert _open_dir_fds() == before
