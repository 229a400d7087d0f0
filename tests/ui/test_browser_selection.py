"""``ctl ui`` in a real headless Chromium on a run early stopping ended, and its releases (issue 40 items 1, 3, 13).

A real ``ctl train`` of a tiny spec stops early at step 4 (its first segment's end) with its best checkpoint at
step 2 (``val/loss``, mode max: the metric gets worse from there); the one evaluation (ppl) is of step 4 and so
has the lowest perplexity of the evaluated checkpoints. Two real ``ctl release --select best`` runs: one whose
gate fails, one that publishes v0001. In the browser:

- the run page flags as best the checkpoint ``ctl show --json`` names (step-000002), not the evaluated one;
  it says the run stopped early (when, why) and lists the skipped segments and evaluations in the timeline;
- no chart draws ``val/token_count`` (a count) on the axis of ``val/loss``; constant counts and the one-point
  evaluation are figure cards; the validation loss chart's ticks stay in the losses' range;
- every chart: round ticks with gridlines, x over the planned 1..12 (not 1..4), the legend above the plot
  (no legend label inside the plot frame), no text outside the chart (nothing clipped), the early stop
  and the best checkpoint marked;
- the runs page's release rows and the run page's Releases table show version, checkpoint, each gate's
  outcome and figures as ``ctl status --json`` records them (a failed gate reads as failed), and link the
  release pages.

Screenshots go to $CTL_UI_ARTIFACTS (else the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from simulator.proving import procs

from browser import Ui, chromium, quit_browser

pytestmark = pytest.mark.slow  # real ctl train / ctl release / ctl ui / chromium processes

TIMEOUT_S = 300
SPEC = {
    "name": "early",
    "steps": 12,
    "seed": 3,
    "eval_every": 4,
    "checkpoint_every": 4,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 5,
    "lr_decay_steps": 40,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
    "validation": {
        "enabled": True,
        "every_steps": 2,
        "batch_size": 4,
        "max_samples": 4,
        "data": {"path": "builtin:heldout.txt"},
    },
    "early_stopping": {"metric": "val/loss", "mode": "max", "patience": 1},
    "keep_checkpoints": {"last": 1, "best": {"metric": "val/loss", "mode": "max", "k": 1}},
}

# every chart's geometry, read from the rendered DOM (where each text is laid out on screen, not the markup)
CHARTS_JS = """return Array.from(document.querySelectorAll('svg.chart')).map(function (svg) {
  var vb = svg.viewBox.baseVal, frame = svg.querySelector('rect.frame'), s = svg.getBoundingClientRect();
  var k = vb.width / s.width;  // on screen (rotations included), in the chart's own units
  function boxes(sel) { return Array.from(svg.querySelectorAll(sel)).map(function (t) {
      var b = t.getBoundingClientRect();
      return {text: t.textContent, x: (b.left - s.left) * k, y: (b.top - s.top) * k, w: b.width * k, h: b.height * k};
  }); }
  return {title: svg.getAttribute('aria-label'), text: svg.textContent, width: vb.width, height: vb.height,
          frame: frame ? frame.getBBox() : null, texts: boxes('text'), legend: boxes('text.legend'),
          ticks: boxes('text.tick'), grid: svg.querySelectorAll('line.grid').length,
          stops: boxes('text.vlabel-stop').map(function (b) { return b.text; }),
          bests: boxes('text.vlabel-best, text.starlabel').map(function (b) { return b.text; }),
          stars: svg.querySelectorAll('polygon.star').length};
});"""
CARDS_JS = """return Array.from(document.querySelectorAll('.figure')).map(function (f) {
  return {name: f.querySelector('.fname').textContent, value: f.querySelector('.fvalue').textContent,
          note: f.querySelector('.fnote').textContent}; });"""
CHECKPOINTS_JS = """return Array.from(document.querySelectorAll('#checkpoints tr')).slice(1).map(function (r) {
  return {name: r.cells[0].innerText.trim(), flags: Array.from(r.cells[2].querySelectorAll('.flag')).map(
      function (f) { return f.innerText.trim(); })}; });"""
TIMELINE_JS = """return Array.from(document.querySelectorAll('#timeline tr.item')).map(function (r) {
  return {what: r.cells[0].innerText.trim(), state: r.cells[1].innerText.trim(), details: r.cells[5].innerText.trim()};
});"""
RELEASES_JS = """return Array.from(document.querySelectorAll('#releases tr.release')).map(function (r) {
  return {id: r.cells[0].innerText.trim(), href: r.cells[0].querySelector('a').getAttribute('href'),
          outcome: r.cells[1].innerText.trim(), version: r.cells[2].innerText.trim(),
          checkpoint: r.cells[3].innerText.trim(), gates: r.cells[4].innerText.trim(),
          figures: r.cells[5].innerText.trim(), gateState: r.dataset.gates}; });"""


def _json(home: Path, *args: str) -> dict:
    p = procs.run(home, *args, "--json", timeout_s=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def _release(home: Path, gate: str) -> tuple[int, str]:
    p = procs.run(
        home, "release", "train/early", "--suite", "ppl", "--eval-max-items", "4", "--gate", gate, timeout_s=TIMEOUT_S
    )
    return p.returncode, p.stderr


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("ui-selection") / "home"
    home.mkdir()
    (home / "early.json").write_text(json.dumps(SPEC))
    p = procs.run(
        home, "train", "--spec", str(home / "early.json"), "--eval-max-items", "4", "--quiet", timeout_s=TIMEOUT_S
    )
    assert p.returncode == 0, p.stderr[-2000:]
    failed = _release(home, "ppl/ppl<=6.5")  # a tiny model's perplexity is far above 6.5
    assert failed[0] == 1 and "not published: gate ppl/ppl<=6.5 failed" in failed[1], failed
    assert _release(home, "ppl/ppl<=1e6")[0] == 0
    with Ui(home) as ui:
        yield home, ui


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = Path(os.environ.get("CTL_UI_ARTIFACTS") or tmp_path_factory.mktemp("ui-screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _full_page(browser, path: Path) -> None:
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, min(4000, max(1000, height + 40)))
    browser.save_screenshot(str(path))


def test_early_stop_best_checkpoint_skipped_segments_and_readable_charts(home, artifacts) -> None:
    home_dir, ui = home
    shown = _json(home_dir, "show", "train/early")
    assert shown["stopped_early"]["step"] == 4 and shown["best_checkpoints"][0]["step"] == 2, shown
    best = Path(shown["best_checkpoints"][0]["checkpoint"]).name  # what ctl show marks "<- best"
    evaluated = [e["step"] for s in shown["segments"] for e in s["evals"] if e["state"] == "done"]
    assert evaluated == [4]  # the only evaluated checkpoint, which an own "lowest ppl" judgement would call best
    browser = chromium()
    try:
        browser.get(ui.url + "run/train/early")
        ckpts = {r["name"]: r["flags"] for r in browser.execute_script(CHECKPOINTS_JS)}
        assert [n for n, flags in ckpts.items() if "best" in flags] == [best] == ["step-000002"], ckpts
        assert "evaluated" in ckpts["step-000004"] and "best" not in ckpts["step-000004"]
        stopped = browser.find_element("id", "stopped-early").text
        assert "stopped early at step 4: val/loss (max) did not improve for 1 check(s); best step 2" in stopped
        assert "runs/early/ckpt/step-000002 (val/loss" in browser.find_element("css selector", ".best-checkpoint").text
        rows = browser.execute_script(TIMELINE_JS)
        skipped = [r["what"] for r in rows if r["state"] == "skipped"]
        assert skipped == [
            "segment 2/3 (train-000008)",
            "ppl of step-000008",
            "segment 3/3 (train-000012)",
            "ppl of step-000012",
        ], rows
        assert any(r["state"] == "stopped early" and "stopped early at step 4" in r["what"] for r in rows), rows
        final = browser.find_element("id", "final").text
        assert shown["final"]["final_loss_hex"] in final and shown["final"]["digest"] in final

        charts = {c["title"]: c for c in browser.execute_script(CHARTS_JS)}
        assert not [t for t, c in charts.items() if "val/token_count" in c["text"] and "val/loss" in c["text"]]
        assert not [t for t, c in charts.items() if "val/token_count" in c["text"]]  # constant: a card
        cards = {c["name"]: c for c in browser.execute_script(CARDS_JS)}
        assert cards["val/token_count"]["value"] == "128"
        ev = cards["evaluation ppl: heldout/ppl"]  # one evaluation: a figure, not a made-up axis
        assert ev["note"] == "of step-000004" and not [t for t in charts if t.startswith("evaluation")]
        val_loss = [f["val/loss"] for f in shown["validation_frames"]]
        vl = charts["validation loss"]
        y_ticks = [float(t["text"]) for t in vl["ticks"] if t["y"] <= vl["frame"]["y"] + vl["frame"]["height"]]
        assert len(y_ticks) >= 3 and all(min(val_loss) - 1 < v < max(val_loss) + 1 for v in y_ticks), y_ticks
        assert charts["validation loss"]["stars"] == 1 and "best 2: val/loss" in charts["validation loss"]["bests"][0]
        assert charts["train loss"]["stops"] == ["stopped early at 4"] and "best 2" in charts["train loss"]["bests"]
        for title, c in charts.items():
            frame = c["frame"]
            x_ticks = [t for t in c["ticks"] if t["y"] > frame["y"] + frame["height"]]
            assert max(float(t["text"]) for t in x_ticks) == SPEC["steps"], (title, x_ticks)  # planned 1..12
            assert len(x_ticks) >= 4 and len(c["ticks"]) - len(x_ticks) >= 3 and c["grid"] >= 6, title
            for t in c["texts"]:  # nothing clipped: every label inside the chart
                assert (
                    t["x"] >= -0.5
                    and t["y"] >= -0.5
                    and t["x"] + t["w"] <= c["width"] + 0.5
                    and t["y"] + t["h"] <= c["height"] + 0.5
                ), (title, t)
            for t in c["legend"]:  # the legend never covers a curve: it is above the plot frame
                assert t["y"] + t["h"] <= frame["y"] + 0.5, (title, t)
        _full_page(browser, artifacts / "early-stopped-run.png")
    finally:
        quit_browser(browser)
    print(f"screenshots in {artifacts}", file=sys.stderr)


def test_release_rows_show_version_checkpoint_gates_and_figures(home, artifacts) -> None:
    home_dir, ui = home
    listed = _json(home_dir, "list")
    ids = sorted(
        w["workflow_id"]
        for w in (listed if isinstance(listed, list) else listed["workflows"])
        if w["workflow_id"].startswith("release/")
    )
    results = {wid: _json(home_dir, "status", wid)["result"] for wid in ids}
    failed = next(w for w, r in results.items() if not r["published"])
    published = next(w for w, r in results.items() if r["published"])
    browser = chromium()
    try:
        browser.get(ui.url)
        row = {r.get_attribute("data-id"): r.text for r in browser.find_elements("css selector", "tr.run")}
        assert "not published" in row[failed] and "gate failed" in row[failed]
        assert f"gate ppl/ppl<=6.5 failed ({results[failed]['gates'][0]['figure']:.6g})" in row[failed]
        assert results[failed]["checkpoint"] in row[failed]
        r = results[published]
        assert f"published {r['version']}" in row[published] and "CURRENT" in row[published]
        assert r["checkpoint"] in row[published] and "gate ppl/ppl<=1e+06 passed" in row[published]
        assert f"ppl/heldout/ppl {r['figures']['ppl/heldout/ppl']:.4g}" in row[published]
        assert " - " not in row[published].replace("runs/", "")  # no placeholder cells
        assert "stopped early" in row["train/early"]
        _full_page(browser, artifacts / "runs-with-releases.png")

        browser.get(ui.url + "run/train/early")
        rel = {x["id"]: x for x in browser.execute_script(RELEASES_JS)}
        assert sorted(rel) == ids
        assert rel[failed]["outcome"] == "not published" and rel[failed]["gateState"] == "failed"
        assert "ppl/ppl<=6.5 failed" in rel[failed]["gates"] and rel[failed]["version"] == "-"
        assert rel[published]["outcome"] == "published" and rel[published]["version"].startswith(r["version"])
        assert rel[published]["checkpoint"] == r["checkpoint"] and rel[published]["gateState"] == "passed"
        assert f"ppl/heldout/ppl {r['figures']['ppl/heldout/ppl']:.4g}" in rel[published]["figures"]
        ckpts = {x["name"]: x["flags"] for x in browser.execute_script(CHECKPOINTS_JS)}
        assert f"released {r['version']} CURRENT" in ckpts[Path(r["checkpoint"]).name]
        browser.find_element("css selector", f'#releases a[href="{rel[failed]["href"]}"]').click()
        assert browser.current_url.endswith(rel[failed]["href"])
        assert browser.find_element("id", "release-outcome").text.startswith("not published")
        assert browser.find_element("id", "release-verdict").text == "not published: gate failed"
        assert "ppl/ppl<=6.5 failed" in browser.find_element("id", "release-gates").text
        _full_page(browser, artifacts / "failed-release.png")
    finally:
        quit_browser(browser)
