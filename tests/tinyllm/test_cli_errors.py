"""Bad input: one clear line on stderr, exit 2, nothing written; a locked run: exit 75."""

from __future__ import annotations

import fcntl

import pytest

from tl_helpers import SMALL_SPEC, run_tinyllm, tree, write_spec

pytestmark = pytest.mark.slow  # every case runs the real tinyllm CLI


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"name": "../x"}, "name"),
        ({"name": "a b"}, "name"),
        ({"name": ""}, "name"),
        ({"steps": -5}, "steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"model": {"n_embd": 30, "n_head": 4}}, "n_embd"),
    ],
)
def test_bad_train_spec_exits_2_and_writes_nothing(home, tmp_path, changes, needle):
    spec = write_spec(tmp_path / "bad.json", **changes)
    before = tree(home)
    proc = run_tinyllm(home, "train", "--spec", str(spec), "--progress", str(home / "p.jsonl"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert tree(home) == before


def test_malformed_json_and_missing_file_exit_2(home, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = run_tinyllm(home, "train", "--spec", str(bad))
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    proc = run_tinyllm(home, "train", "--spec", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_missing_corpus_exits_2_and_writes_nothing(tmp_path):
    home = tmp_path / "empty-home"
    home.mkdir()
    proc = run_tinyllm(home, "train", "--spec", str(write_spec(tmp_path / "s.json", corpus="nope")))
    assert proc.returncode == 2 and "corpus 'nope' not found" in proc.stderr
    assert tree(home) == []


def test_locked_run_exits_75(home):
    run_dir = home / "runs" / "small"
    run_dir.mkdir(parents=True)
    with open(run_dir / ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_tinyllm(home, "train", "--spec", str(SMALL_SPEC))
    assert proc.returncode == 75 and "locked" in proc.stderr
    assert not (run_dir / "ckpt").exists()
