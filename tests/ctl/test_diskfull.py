"""A full disk: one line naming the file, exit 74, no temporary left, and the same command resumes
bit for bit once space is freed. The real thing on a real 20 MB tmpfs (root); the clean-up of
temporaries also with an injected ENOSPC, which runs anywhere."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bi_helpers import SPEC, Tmpfs, env, write_json

pytestmark = pytest.mark.slow  # real ctl train on a tmpfs


def _fill(fs: Path) -> Path:
    """Write a filler until the file system is full (1 MiB, then 4 KiB, then 1-byte writes)."""
    filler = fs / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    return filler


def _temporaries(home: Path) -> list[str]:
    return [str(p.relative_to(home)) for p in home.rglob("*") if "tmp-" in p.name or p.name.startswith(".replaced-")]


def test_disk_full_exit_74_one_line_no_temporaries_then_resumes_bitwise(tmp_path, finished_home):
    reference = json.loads(
        subprocess.run(
            [sys.executable, "-m", "ctl.cli", "status", "train/mini", "--json", "--home", str(finished_home)],
            capture_output=True,
            text=True,
            env=env(),
        ).stdout
    )["result"]["final_loss_hex"]
    with Tmpfs(tmp_path / "fs", "20m") as fs:
        if not fs.ok:
            pytest.skip(f"a real full disk needs a tmpfs mount: {fs.why}")
        home = fs.path / "home"
        home.mkdir()
        # two segments (3 + 3 steps): the disk fills while the second trainer starts; segments are
        # bitwise the one-segment reference run. The spec lives outside the full disk.
        spec = write_json(tmp_path / "spec.json", {**SPEC, "eval_every": 3})
        argv = [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec), "--no-eval", "--home", str(home)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        first = home / "runs" / "mini" / "ckpt" / "step-000003"
        give_up = time.monotonic() + 600
        while not first.exists() and proc.poll() is None and time.monotonic() < give_up:
            time.sleep(0.01)
        filler = _fill(fs.path)  # the disk is full from the first checkpoint on
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 74, (proc.returncode, out, err[-3000:])
        assert "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("ctl: disk full writing "), err[-2000:]
        assert sum("disk full" in ln for ln in err.splitlines()) == 1, err  # said once, in one line
        assert _temporaries(home) == []
        assert first.is_dir()  # what was written before is kept
        filler.unlink()  # space freed: the same command goes on
        done = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)["result"]
        assert result["final_loss_hex"] == reference
        assert _temporaries(home) == []


class _FullFile:
    """A file opened for writing on a full disk: every write raises ENOSPC."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_injected_enospc_removes_own_temporaries_and_names_the_file(tmp_path, monkeypatch):
    import builtins
    import io

    from tinyllm import checkpoint
    from tinyllm.diskfull import DiskFull, remove_own_temporaries
    from tinyllm.sinks.metrics import JsonlSink

    run = tmp_path / "runs" / "x"
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 5}\n')
    real_open = builtins.open

    def open_on_full_disk(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return _FullFile(f) if ("w" in mode or "a" in mode) else f

    monkeypatch.setattr(checkpoint, "_serialize", lambda obj: b"x" * 10)
    monkeypatch.setattr(builtins, "open", open_on_full_disk)
    monkeypatch.setattr(io, "open", open_on_full_disk)  # what pathlib writes with
    with pytest.raises(DiskFull) as info:  # a checkpoint write fails half-way
        checkpoint.save_checkpoint(run, 3, {"model": {}, "optimizer": {}, "training_state": {}})
    assert str(info.value).startswith("disk full writing ") and ".tmp-step-000003-" in str(info.value)
    with pytest.raises(DiskFull):  # the rewrite of metrics.jsonl on resume
        JsonlSink(run / "metrics.jsonl", resumed_step=2)
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_open)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 5}\n'  # untouched
    assert not list(run.glob("metrics.jsonl.tmp-*"))  # never left behind
    assert not (run / "ckpt" / "LATEST").exists()
    removed = remove_own_temporaries(tmp_path)  # what the CLI does before exiting 74
    assert [p.name for p in removed] == [f".tmp-step-000003-{os.getpid()}"]
    assert _temporaries(tmp_path) == []
