"""Issue 40 item 2: a train spec's corpus that is neither a built-in corpus, one given by ``--corpus-spec``, nor
one already built in the home is bad input (a typo used to build the built-in text under that name and train
on it, exit 0): one ``ctl:`` line naming the known ones, exit 2, no workflow, nothing written. Real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_helpers import SPEC, ctl, one_line_error, snapshot, tinyllm, write_json

pytestmark = pytest.mark.slow  # real ctl and tinyllm processes


def test_a_corpus_typo_is_refused_before_any_work(tmp_path: Path) -> None:
    write_json(tmp_path / "spec.json", {**SPEC, "corpus": "nosuch"})
    before = snapshot(tmp_path)
    err = one_line_error(
        ctl(tmp_path, "train", "--spec", str(tmp_path / "spec.json"), "--no-eval", "--detach"),
        2,
        "unknown corpus 'nosuch'",
        "built-in corpora are default",
        "none",
        "--corpus-spec FILE",
    )
    assert err.startswith("ctl: ")
    assert snapshot(tmp_path) == before  # no database, no workflow, no corpora/nosuch, no runs/


def test_a_corpus_built_in_the_home_or_given_is_known(tmp_path: Path) -> None:
    (tmp_path / "my.txt").write_text("".join(f"line {i} of my own text, not the built-in one.\n" for i in range(200)))
    write_json(tmp_path / "mine.json", {"name": "mine", "sources": ["my.txt"]})
    write_json(tmp_path / "typo.json", {**SPEC, "corpus": "mien"})
    write_json(tmp_path / "spec.json", {**SPEC, "corpus": "mine"})
    assert tinyllm(tmp_path, "corpus", "--spec", str(tmp_path / "mine.json")).returncode == 0
    one_line_error(
        ctl(tmp_path, "train", "--spec", str(tmp_path / "typo.json"), "--no-eval", "--detach"),
        2,
        "unknown corpus 'mien'",
        f"built in {tmp_path}: mine",
    )
    ok = ctl(tmp_path, "train", "--spec", str(tmp_path / "spec.json"), "--no-eval", "--detach")
    assert ok.returncode == 0, ok.stderr  # built in the home: no --corpus-spec needed
    given = tmp_path / "other"
    given.mkdir()
    (given / "my.txt").write_text((tmp_path / "my.txt").read_text())
    ok = ctl(
        given,
        "train",
        "--spec",
        str(tmp_path / "spec.json"),
        "--corpus-spec",
        str(tmp_path / "mine.json"),
        "--no-eval",
        "--detach",
    )
    assert ok.returncode == 0, ok.stderr  # given by --corpus-spec (built by the run)
