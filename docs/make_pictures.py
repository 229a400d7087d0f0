"""Generate the pictures in docs/ctl.md ("Watching a run") of a real run: the live display of `ctl train` and `ctl plot`;
and docs/ui.md's: a run page of `ctl ui` in headless chromium.

    python docs/make_pictures.py            # writes docs/live-display.svg and docs/plot.png
    python docs/make_pictures.py ui         # writes docs/ui.png (Debian's chromium + chromedriver, selenium)

It trains a small spec in a temporary home with the real engine and trainer, shows the run
with the same ``LiveDisplay`` that `ctl train` uses (on a recording rich console), snapshots
the screen once the second segment is past half way, and draws the finished run with
``ctl.plot`` (matplotlib: ``pip install -e '.[plot]'``). Nothing in the pictures is hand-made. ``ui``: a real ``ctl train`` of ``UI_SPEC`` (early stopping ends it
at step 4 with its best checkpoint at step 2), a ``ctl release`` whose gate fails and one that publishes,
then ``ctl ui`` and chromium as tests/ui/browser.py starts them; the top of the run page is the picture.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import app  # noqa: E402
from ctl import plot  # noqa: E402
from ctl.display import LiveDisplay  # noqa: E402
from app.runview import run_view  # noqa: E402

SPEC = {
    "name": "demo",
    "steps": 240,
    "seed": 7,
    "eval_every": 80,
    "eval_interval_seconds": 1,
    "checkpoint_every": 40,
    "batch_size": 8,
    "lr": 0.003,
    "warmup_steps": 10,
    "lr_decay_steps": 240,
    "threads": 1,
    "log_every": 1000,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
}
WIDTH = 140
UI_SPEC = {
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


class Snapshot(LiveDisplay):
    """The live display, which also keeps its permanent lines and grabs one frame of its screen."""

    def __init__(self, *args, at_step: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at_step, self.lines, self.svg = at_step, [], None

    def _emit(self, text: str) -> None:
        self.lines.append(text)
        super()._emit(text)

    def _update(self, view, now) -> None:
        super()._update(view, now)
        step = self.tail.step if self.tail and self.tail.step is not None else 0
        if self.svg is None and self._progress is not None and view.phase.kind == "training" and step >= self.at_step:
            rec = Console(record=True, width=WIDTH, force_terminal=True, file=io.StringIO())
            rec.print("$ ctl train --spec specs/demo.json")
            rec.print(f"ctl: started {self.workflow_id}")
            for line in self.lines:
                rec.print(line, highlight=False)
            rec.print(self._progress.get_renderable())
            self.svg = rec.export_svg(title="ctl train")


def main() -> int:
    out = REPO / "docs"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "demo.json").write_text(json.dumps(SPEC))
        inp = app.train_request(str(home / "demo.json"), ["ppl"], eval_max_items=8).input
        engine = app.open_engine(home, create=True)
        try:
            wid = app.start_run(engine, "TrainRun", "train/demo", inp).workflow_id
            console = Console(file=io.StringIO(), force_terminal=True, width=WIDTH)
            display = Snapshot(home, engine, wid, console=console, at_step=130, poll_s=0.2)
            display.start()
            try:
                st = engine.run_until_complete(wid)
            finally:
                display.stop()
            if st.state != "completed" or display.svg is None:
                print(f"make_pictures: {wid} ended {st.state}; no snapshot taken", file=sys.stderr)
                return 1
            (out / "live-display.svg").write_text(display.svg, encoding="utf-8")
            view = run_view(wid, engine.history(wid), st.state)
        finally:
            engine.close()
        plot.write_png(plot.series(view, home), out / "plot.png")
    print(f"wrote {out / 'live-display.svg'} and {out / 'plot.png'}")
    return 0


def ui_picture() -> int:
    """docs/ui.png: the run page of an early-stopped run with two releases (see the module docstring)."""
    import subprocess

    sys.path.insert(0, str(REPO / "tests" / "ui"))
    from browser import Ui, chromium, env, quit_browser  # the UI tests' own process helpers

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "early.json").write_text(json.dumps(UI_SPEC))
        ctl = [sys.executable, "-m", "ctl.cli"]
        runs = [
            ["train", "--spec", str(home / "early.json"), "--eval-max-items", "4", "--quiet"],
            ["release", "train/early", "--suite", "ppl", "--eval-max-items", "4", "--gate", "ppl/ppl<=6.5"],
            ["release", "train/early", "--suite", "ppl", "--eval-max-items", "4", "--gate", "ppl/ppl<=1e6"],
        ]
        for argv in runs:
            p = subprocess.run([*ctl, *argv, "--home", str(home)], capture_output=True, text=True, env=env())
            if p.returncode not in (0, 1):
                print(f"make_pictures: ctl {argv[0]} exited {p.returncode}: {p.stderr[-2000:]}", file=sys.stderr)
                return 1
        with Ui(home) as ui:
            browser = chromium()
            try:
                browser.set_window_size(1400, 1420)
                browser.get(ui.url + "run/train/early")
                browser.save_screenshot(str(REPO / "docs" / "ui.png"))
            finally:
                quit_browser(browser)
    print(f"wrote {REPO / 'docs' / 'ui.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(ui_picture() if sys.argv[1:] == ["ui"] else main())
