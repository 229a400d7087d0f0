"""``ctl ui`` in a real headless Chromium on a real home: a finished, a failed and a live ``ctl train``.

- the runs page shows the figures ``ctl status ID --json`` prints; clicking into the live run, its
  step advances without a reload and its charts span the planned steps (1..4000, not 1..last step); screenshots are kept ($CTL_UI_ARTIFACTS, else the test's tmp dir);
- a trainer's error message and a spec field holding ``<script>`` / ``"><img onerror=...>`` are text;
- the UI reading at full rate during the run, then a SIGKILL of ``ctl train``: every event the UI
  showed is still in the history, the running engine never held a deleted WAL, ``ctl ui`` opened
  engine.db once.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from simulator.proving import procs

from browser import Ui, chromium, quit_browser

pytestmark = pytest.mark.slow  # real ctl train / ctl ui / chromium processes

TIMEOUT_S = 180
HOSTILE = '<script>window.pwned=1</script> "><img src=x onerror="window.pwned=2">'
DONE = {
    "name": "done",
    "steps": 6,
    "eval_every": 0,
    "checkpoint_every": 3,
    "batch_size": 2,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}
LIVE = {
    "name": "live",
    "steps": 4000,
    "seed": 5,
    "eval_every": 0,
    "checkpoint_every": 5,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 4000,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
BROKE = {
    "name": "broke",
    "steps": 4,
    "config": {"note": HOSTILE},
    "trainer": {"command": ["python", "-c", f"import sys; sys.stderr.write({HOSTILE!r} + '\\n'); sys.exit(2)"]},
}


ROWS_JS = """return Array.from(document.querySelectorAll('tr.run')).map(function (r) {
  function cell(c) { return r.querySelector('td.' + c).innerText.trim(); }
  return {id: r.dataset.id, state: r.dataset.state, dataStep: r.dataset.step, dataTotal: r.dataset.total,
          step: cell('step'), loss: cell('loss'), eta: cell('eta'), worker: cell('worker')}; });"""
STEP_JS = "return document.getElementById('step').dataset.step;"
X_TICKS_JS = """var svg = document.querySelector('svg.chart[aria-label="' + arguments[0] + '"]');
var bottom = svg.querySelector('rect.frame').getBBox(); bottom = bottom.y + bottom.height;
return Array.from(svg.querySelectorAll('text.tick')).filter(function (t) { return t.getBBox().y > bottom; })
  .map(function (t) { return parseFloat(t.textContent); });"""


def _click(browser, css: str) -> None:
    """Click ``css``, again if a poll replaced it between finding and clicking."""
    from selenium.common.exceptions import StaleElementReferenceException  # lazy: the optional [ui-test] extra
    from selenium.webdriver.common.by import By

    for _ in range(10):
        try:
            browser.find_element(By.CSS_SELECTOR, css).click()
            return
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError(f"could not click {css}")


def _status(home: Path, wid: str) -> dict:
    p = procs.run(home, "status", wid, "--json")
    return json.loads(p.stdout)


def _checkpoints(home: Path) -> int:
    return sum(
        1
        for e in procs.history(home, "train/live") or []
        if e["type"] == "activity_heartbeat" and "checkpoint" in (e["attrs"].get("details") or {})
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("ui-browser") / "home"
    home.mkdir()
    for spec in (DONE, LIVE, BROKE):
        (home / f"{spec['name']}.json").write_text(json.dumps(spec))
    done = procs.spawn(home, "train", "--spec", str(home / "done.json"), "--no-eval", "--quiet")
    _, err = done.communicate(timeout=TIMEOUT_S)
    assert done.returncode == 0, err[-2000:]
    broke = procs.spawn(home, "train", "--spec", str(home / "broke.json"), "--quiet")
    _, err = broke.communicate(timeout=TIMEOUT_S)  # one after another: a ctl train's worker runs any open run
    assert broke.returncode == 1, err[-2000:]
    train = procs.spawn(home, "train", "--spec", str(home / "live.json"), "--no-eval", "--quiet")
    try:
        procs.wait_for(
            "a checkpoint of the live run", lambda: _checkpoints(home) >= 1, timeout_s=TIMEOUT_S, alive=train
        )
        with Ui(home) as ui:
            yield home, train, ui
    finally:
        if train.poll() is None:
            procs.killpg(train)
        train.wait()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = Path(os.environ.get("CTL_UI_ARTIFACTS") or tmp_path_factory.mktemp("ui-screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_runs_page_matches_ctl_status_and_the_live_run_advances_in_the_browser(home, artifacts) -> None:
    from selenium.webdriver.common.by import By  # lazy: the optional [ui-test] extra (browser.chromium skips)

    home_dir, train, ui = home
    browser = chromium()
    try:
        before = _status(home_dir, "train/live")
        browser.get(ui.url)
        rows = {r["id"]: r for r in browser.execute_script(ROWS_JS)}  # at once: the live page replaces its rows
        after = _status(home_dir, "train/live")
        assert list(rows) == ["train/live", "train/broke", "train/done"]  # newest first
        for wid in ("train/done", "train/broke"):
            st, row = _status(home_dir, wid), rows[wid]
            p = st["progress"]
            assert row["state"] == st["state"]
            assert row["step"] == f"{p['step'] or 0}/{p['total_steps']}"
            loss = p["last_loss"]
            assert row["loss"] == (f"{loss:.4f}" if loss is not None else "-")
            assert row["eta"] == "-"
        live = rows["train/live"]
        assert live["state"] == before["state"] == "running"
        assert before["progress"]["step"] <= int(live["dataStep"]) <= after["progress"]["step"]
        assert int(live["dataTotal"]) == after["progress"]["total_steps"] == LIVE["steps"]
        assert f"live: pid {after['worker']['pid']}" in live["worker"]
        assert re.fullmatch(r"\d+:\d\d(:\d\d)?", live["eta"])
        browser.save_screenshot(str(artifacts / "runs.png"))

        _click(browser, 'tr.run[data-id="train/live"] a.runlink')
        assert browser.current_url.endswith("/run/train/live")
        first = int(browser.execute_script(STEP_JS))
        browser.execute_script("window.notReloaded = true;")
        deadline = time.monotonic() + 60
        step = first
        while step <= first and time.monotonic() < deadline:
            time.sleep(0.5)
            step = int(browser.execute_script(STEP_JS))
        assert step > first, f"the live page's step stayed at {first}"
        x_ticks = browser.execute_script(X_TICKS_JS, "train loss")  # the planned 1..steps, not 1..last step
        assert max(x_ticks) == LIVE["steps"] and step < LIVE["steps"], (x_ticks, step)
        assert browser.execute_script("return window.notReloaded === true;"), "the page reloaded"
        browser.save_screenshot(str(artifacts / "live-run.png"))

        browser.get(ui.url + "run/train/broke")
        assert HOSTILE in browser.find_element(By.ID, "error").text
        assert HOSTILE in browser.find_element(By.ID, "stderr").get_attribute("textContent")
        spec = json.loads(browser.find_element(By.ID, "spec").get_attribute("textContent"))  # the DOM's text
        assert spec["config"]["note"] == HOSTILE
        assert browser.find_elements(By.CSS_SELECTOR, "main img, main script") == []
        assert browser.execute_script("return window.pwned;") is None
        browser.save_screenshot(str(artifacts / "failed-run.png"))
        browser.get(ui.url)
        assert browser.execute_script("return window.pwned;") is None
        browser.save_screenshot(str(artifacts / "runs-with-hostile-error.png"))
        browser.get(ui.url + "run/train/nothing")
        assert "no workflow 'train/nothing'" in browser.find_element(By.ID, "problem").text
        print(f"screenshots in {artifacts}", file=sys.stderr)
    finally:
        quit_browser(browser)


def _events_shown(url: str) -> list[tuple[int, str]]:
    with urllib.request.urlopen(url, timeout=30) as r:
        page = r.read().decode("utf-8")
    return [
        (int(seq), kind)
        for kind, seq in re.findall(r'<tr class="event" data-kind="(\w+)"><td class="num">(\d+)</td>', page)
    ]


def test_ui_reads_at_full_rate_during_a_run_and_a_sigkill_loses_nothing(home) -> None:
    home_dir, train, ui = home
    seen: list[list[tuple[int, str]]] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            seen.append(_events_shown(ui.url + "run/train/live?partial=1&limit=all"))
            urllib.request.urlopen(ui.url, timeout=30).read()

    reader = threading.Thread(target=hammer, daemon=True)
    reader.start()
    try:
        start = _checkpoints(home_dir)
        procs.wait_for(
            "more checkpoints while the UI reads",
            lambda: _checkpoints(home_dir) >= start + 2,
            timeout_s=TIMEOUT_S,
            alive=train,
        )
        assert procs.deleted_db_files(train.pid) == [], "a UI read deleted the running engine's WAL"
        assert procs.deleted_db_files(ui.proc.pid) == []
        opened = [f for f in procs.db_files(ui.proc.pid) if f.endswith("engine.db")]
        assert len(opened) == 1, f"ctl ui opened engine.db {len(opened)} times: one connection per process"
    finally:
        stop.set()
        reader.join(timeout=60)
    assert len(seen) >= 5, f"only {len(seen)} UI reads"
    procs.killpg(train)  # SIGKILL: what was committed is what the UI showed, and more
    train.wait()
    after = {(e["seq"], e["type"]) for e in procs.history(home_dir, "train/live")}
    for shown in seen:
        assert set(shown) <= after, sorted(set(shown) - after)[:5]
    assert max(seen, key=len)[-1] in after
    assert _events_shown(ui.url + "run/train/live?limit=all")  # still serving after the kill
