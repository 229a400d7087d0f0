"""Issue 40 item 3 (ctl's part): a release whose gate failed reads as such later -- ``ctl status`` and ``ctl list``
(and their ``--json``, through ``app/runview.py`` ``release_outcome``, which the UI reads too) show the gate's
outcome, not just "completed"; a gate on a figure the suite does not produce (``ppl/nosuch<=2``) is bad input
(exit 2) before any work, not a failed gate after a whole evaluation. Real ``ctl`` processes on the finished
tiny run of conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bi_helpers import copy_home, ctl, one_line_error
from tinyllm.eval_figures import suite_figures

pytestmark = pytest.mark.slow  # real ctl train (the session's finished run), release, status, list


def _release(home: Path, *args: str):
    return ctl(home, "release", "train/mini", "--select", "latest", "--eval-max-items", "2", *args)


def _releases(home: Path) -> list[dict]:
    return [w for w in json.loads(ctl(home, "list", "--json").stdout) if w["workflow_id"].startswith("release/")]


def test_a_gate_on_a_figure_the_suite_lacks_is_bad_input(finished_home: Path, tmp_path: Path) -> None:
    home = copy_home(finished_home, tmp_path / "home")
    one_line_error(
        _release(home, "--suite", "ppl", "--gate", "ppl/nosuch<=2"),
        2,
        "gate ppl/nosuch<=2: suite ppl has no figure 'nosuch'",
        "heldout/loss, heldout/ppl, heldout/bpb",
        "(or just bpb, loss, ppl)",
    )
    one_line_error(
        _release(home, "--suite", "zoo", "--gate", "zoo/acc>=0.5"),
        2,
        "'acc' is a figure of several tasks: name one as TASK/acc",
        "capitals/acc",
    )
    assert _releases(home) == [] and not (home / "evals").exists()  # no workflow started, nothing evaluated


def test_a_failed_gate_reads_as_failed_in_status_and_list(finished_home: Path, tmp_path: Path) -> None:
    home = copy_home(finished_home, tmp_path / "home")
    failed = _release(home, "--suite", "ppl", "--gate", "ppl/ppl<=2")  # a 6-step model's perplexity is ~256
    assert failed.returncode == 1 and "not published: gate ppl/ppl<=2 failed (" in failed.stderr, failed.stderr
    [row] = _releases(home)
    wid = row["workflow_id"]
    assert row["state"] == "completed" and row["release"]["published"] is False
    assert row["release"]["gates"][0]["gate"] == "ppl/ppl<=2" and row["release"]["gates"][0]["passed"] is False
    assert sorted(row["result"]["figures"]) == sorted(f"ppl/{f}" for f in suite_figures("ppl"))  # declared = produced
    table = ctl(home, "list").stdout
    line = next(ln for ln in table.splitlines() if ln.startswith(wid))
    assert "completed" in line and "not published: gate ppl/ppl<=2 failed (" in line, table
    st = ctl(home, "status", wid)
    assert st.returncode == 0 and "  release: not published: gate ppl/ppl<=2 failed (" in st.stdout, st.stdout
    assert json.loads(ctl(home, "status", wid, "--json").stdout)["release"]["published"] is False

    ok = _release(home, "--suite", "ppl", "--gate", "ppl/ppl<=1e9")
    assert ok.returncode == 0, ok.stderr
    passed = next(w for w in _releases(home) if w["workflow_id"] != wid)
    assert passed["release"]["published"] is True and passed["release"]["version"] == "v0001"
    st = ctl(home, "status", passed["workflow_id"]).stdout
    assert "  release: published v0001 (releases/mini/v0001); gates passed: ppl/ppl<=1e+09 (" in st, st
