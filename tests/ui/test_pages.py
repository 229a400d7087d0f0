"""The pages of ``ctl ui`` rendered by direct calls (``App.render``) on a synthetic home: the figures
are those of ``ctl status --json`` (runstatus.describe), hostile strings are escaped, unknown ids are a
404 page, a live page polls and a finished one does not."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import app
from app import backends
from ctl import runstatus
from ctl.ui import server

import synth

HOSTILE = '<script>window.pwned=1</script> "><img src=x onerror="window.pwned=2">'


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("ui") / "home"
    synth.home_with_three(home, HOSTILE)
    return home


@pytest.fixture(scope="module")
def ui(home: Path):
    backends.choose(backends.Choice())  # the embedded engine (an earlier test in this process may have chosen Temporal)
    engine = app.open_engine(home, create=False, readonly=True)
    yield server.App(engine, home)
    engine.close()


def _get(ui: server.App, url: str) -> tuple[int, str]:
    path, _, query = url.partition("?")
    from urllib.parse import parse_qs

    return ui.render(path, parse_qs(query))


def _rows(page: str) -> list[dict]:
    return [dict(re.findall(r'data-(\w+)="([^"]*)"', m)) for m in re.findall(r'<tr class="run"([^>]*)>', page)]


def test_runs_page_lists_every_workflow_newest_first_with_the_figures_of_ctl_status(ui: server.App) -> None:
    code, page = _get(ui, "/")
    assert code == 200
    rows = _rows(page)
    assert [r["id"] for r in rows] == ["train/live", "train/broke", "train/done"]
    now = time.time()
    for r in rows:
        st = ui.engine.status(r["id"])
        extra = runstatus.describe(ui.engine, ui.home, st, now)
        assert r["state"] == st.state
        assert int(r["step"]) == extra["progress"]["step"] and int(r["total"]) == extra["progress"]["total_steps"]
        assert f"{extra['progress']['last_loss']:.4f}" in page
    live_row = page.split('data-id="train/live"')[1].split("</tr>")[0]
    assert "live: pid" in live_row and '<td class="num eta">-</td>' not in live_row  # ETA while live
    done_row = page.split('data-id="train/done"')[1].split("</tr>")[0]
    assert '<td class="num eta">-</td>' in done_row and "none (ended)" in done_row


def test_state_filter(ui: server.App) -> None:
    assert [r["id"] for r in _rows(_get(ui, "/?state=failed")[1])] == ["train/broke"]
    assert [r["id"] for r in _rows(_get(ui, "/?state=canceled")[1])] == []


def test_run_page_timeline_checkpoints_curves_and_events(ui: server.App) -> None:
    code, page = _get(ui, "/run/train/done")
    assert code == 200
    assert page.count('class="item item-segment"') == 3 and page.count('class="item item-evaluation"') == 3
    assert page.count('class="item item-wait"') == 2
    assert "#1 timed out" in page and "#2 completed" in page and "step(s) redone" in page  # segment 2's retry
    assert "ppl 18.18" in page  # an evaluation's figure
    ckpts = page.split('id="checkpoints"')[1].split("</table>")[0]
    rows = {re.search(r"<td>(step-\d+)</td>", r).group(1): r for r in ckpts.split("<tr")[2:]}
    assert all(f in rows["step-000030"] for f in ("LATEST", "evaluated", "ppl 15.38"))
    assert "best" not in rows["step-000030"]  # the lowest ppl, but not what the run's selection named
    assert ">best<" in rows["step-000020"] and "val/loss 1.25" in rows["step-000020"]
    assert "LATEST" not in rows["step-000010"] and "evaluated" in rows["step-000010"]
    assert "not on disk" in rows["step-000016"]  # named by a heartbeat, gone from disk
    assert page.count("<svg") >= 3 and "<polyline" in page
    assert "https://" not in page and "http://" not in page  # nothing fetched from elsewhere
    n_events = len(ui.engine.history("train/done"))
    assert page.count('<tr class="event"') == n_events
    hb = _get(ui, "/run/train/done?kind=activity_heartbeat&attempt=2")[1]
    kinds = re.findall(r'<tr class="event" data-kind="(\w+)"', hb)
    assert kinds and set(kinds) == {"activity_heartbeat"} and len(kinds) == 2  # segment 2, attempt 2
    assert len(re.findall(r'<tr class="event"', _get(ui, "/run/train/done?limit=5")[1])) == 5


def test_hostile_strings_are_text(ui: server.App) -> None:
    for url in ("/", "/run/train/broke", "/run/train/broke?partial=1"):
        page = _get(ui, url)[1]
        assert HOSTILE not in page and "<img" not in page and "window.pwned=1</script>" not in page
        assert (
            "&lt;script&gt;window.pwned=1&lt;/script&gt; &#34;&gt;&lt;img src=x onerror=&#34;window.pwned=2&#34;&gt;"
            in page
        )
    page = _get(ui, "/run/train/broke")[1]
    assert page.count("<script") == 1  # the page's own poller, nothing else


def test_unknown_ids_and_paths_are_a_404_page(ui: server.App) -> None:
    for url in ("/run/train/nope", "/run/train/done/7", "/run/..%2F..%2Fetc", "/run/", "/nothing", "/run/%00"):
        code, page = _get(ui, url)
        assert code == 404, url
        assert "Traceback" not in page and 'id="problem"' in page


def test_a_live_page_polls_and_a_finished_one_does_not(ui: server.App) -> None:
    live = _get(ui, "/run/train/live?partial=1")[1]
    assert 'data-live="1"' in live and "<html" not in live
    assert 'data-live="0"' in _get(ui, "/run/train/done?partial=1")[1]
    assert 'data-live="1"' in _get(ui, "/")[1]  # a run is running: the runs page polls too
    full = _get(ui, "/run/train/live")[1]
    assert "setTimeout(tick, every)" in full and "every = 1000" in full


def test_chart_and_card_labels_are_escaped() -> None:
    """Series names, marks and figure names come from trainers' files (an eval_command's figures): text only."""
    from ctl.ui import svg

    markup = svg.chart(
        svg.Chart(
            HOSTILE,
            {HOSTILE: [(1, 1.0), (2, 2.0)]},
            (1, 10),
            marks=[(2, 2.0, HOSTILE)],
            stars=[(1, 1.0, HOSTILE)],
            vlines=[(2, HOSTILE, "stop")],
            shade=(2, 10, HOSTILE),
        )
    )
    card = svg.figure_card(HOSTILE, 1.0, HOSTILE)
    for out in (markup, card):
        assert "<script" not in out and "<img" not in out and "&lt;script&gt;" in out


def test_ticks_are_round_and_cover_the_range() -> None:
    from ctl.ui import svg

    assert svg.ticks(1, 300, integer=True) == [50, 100, 150, 200, 250, 300]
    assert [svg.tick_text(v, 0.0005) for v in svg.ticks(0.0006, 0.003)] == [
        "0.0010",
        "0.0015",
        "0.0020",
        "0.0025",
        "0.0030",
    ]
    assert [svg.tick_text(v, 2.5) for v in (2.5, 5.0)] == ["2.5", "5.0"]


def test_run_page_points_at_each_attempts_kept_output(ui: server.App, home: Path) -> None:
    """Each attempt in the timeline names the folder of its kept stdout/stderr (ctl logs; issue 40 item 8) when
    there is one, and only its own (generation 1, that attempt)."""
    seg = home / "runs/done/activity/train-000010"  # segment 1 (tests/ui/synth.py)
    (seg / "logs/g1-a1").mkdir(parents=True, exist_ok=True)
    (seg / "logs/g1-a1/stderr.log").write_text("step 1\n")
    (seg / "logs/g2-a2").mkdir(parents=True, exist_ok=True)  # another workflow's attempt: not this page's
    page = _get(ui, "/run/train/done")[1]
    assert page.count('<code class="output">') == 1, page
    assert f'output <code class="output">runs/done/activity/{seg.name}/logs/g1-a1/</code>' in page
