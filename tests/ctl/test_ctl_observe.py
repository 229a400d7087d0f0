"""Seeing a run through the CLI, with real processes: the plain progress lines of `ctl train`
when stderr is not a terminal, --quiet, `ctl status` (--json fields), `ctl history` (aligned
columns, ISO local times, figures), `ctl show`. Every figure is checked against the files the
run wrote (metrics.jsonl, the evaluations' summary.json)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from obs_helpers import ctl, write_spec

pytestmark = pytest.mark.slow  # reads a run made by the real ctl train (module fixture); ctl as subprocesses

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str]:
    """One run of the mini spec (2 segments, ppl after each, a 1 s wait), stderr in a pipe."""
    home = tmp_path_factory.mktemp("obs")
    spec = write_spec(home, keep_checkpoints={"last": 1, "boundaries": False})
    p = ctl(home, "train", "--spec", str(spec), "--eval-max-items", "4", extra_env={"CTL_PROGRESS_EVERY_S": "0.5"})
    return home, p.stderr


def frames(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "runs/mini/metrics.jsonl").read_text().splitlines()]


def summary(home: Path, step: int) -> dict:
    return json.loads((home / f"evals/ppl/mini-{step:06d}/summary.json").read_text())["metrics"][f"mini-{step:06d}"]


def test_plain_progress_lines_when_stderr_is_not_a_terminal(finished) -> None:
    home, err = finished
    assert "\x1b[" not in err  # no terminal codes in a log
    assert "train/mini: 24 steps in 2 segment(s), each checkpoint evaluated with ppl" in err
    for k in (1, 2):
        assert f"training segment {k}/2" in err
    ppl12 = summary(home, 12)["heldout/ppl"]
    assert f"ppl {ppl12:.4g} at step 12" in err  # each evaluation: one line with its figure
    assert re.search(r"segment 1/2 done: step 12, loss \d+\.\d{4}", err)
    assert "  checkpoint step 3  loss" in err and "runs/mini/ckpt/step-000024" in err
    assert re.search(r"step \d+/24 \(\d+%\) \| ETA \S+ \| loss .* \| elapsed \d+:\d\d", err)  # the periodic line
    assert "? tok/s" not in err  # tokens/s only once measured, never a placeholder (issue 40 item 13)
    assert "waiting 1.0 s, until" in err
    assert "train/mini completed in" in err


def test_quiet_prints_nothing_on_stderr(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="q", steps=3, eval_every=0)
    p = ctl(tmp_path, "train", "--spec", str(spec), "--no-eval", "--quiet")
    assert p.stderr == ""
    assert "run q: 3 steps" in p.stdout


def test_status_json_fields_match_the_run_files(finished) -> None:
    home, _ = finished
    st = json.loads(ctl(home, "status", "train/mini", "--json").stdout)
    assert st["state"] == "completed" and st["worker"] is None and st["timers"] == []
    p = st["progress"]
    last = frames(home)[-1]
    assert p["step"] == 24 == last["step"] and p["total_steps"] == 24
    assert float.hex(p["last_loss"]) == float.hex(last["train/loss"])
    assert p["last_checkpoint"] == "runs/mini/ckpt/step-000024" and p["last_checkpoint_step"] == 24
    assert p["last_eval"]["activity_id"] == "eval-000024-ppl" and p["last_eval"]["step"] == 24
    assert p["last_eval"]["metrics"] == summary(home, 24)
    assert p["segments_done"] == p["segments"] == 2 and p["eta_s"] == 0.0
    text = ctl(home, "status", "train/mini").stdout
    assert "progress: step 24/24, last loss" in text and "last evaluation: ppl at step 24: heldout/bpb=" in text


def test_history_is_aligned_with_iso_local_times_and_figures(finished) -> None:
    home, _ = finished
    lines = ctl(home, "history", "train/mini").stdout.splitlines()
    header, body = lines[0], lines[1:]
    events = json.loads(ctl(home, "history", "train/mini", "--json").stdout)["events"]
    assert len(body) == len(events)
    starts = [header.index(c) for c in ("TIME", "EVENT", "ACTIVITY", "DETAILS")]
    for line, e in zip(body, events):
        assert re.match(r"\s*\d+  " + ISO + "  ", line), line
        time_col = line[starts[0] : starts[1]].strip()
        assert dt.datetime.fromisoformat(time_col) == dt.datetime.fromtimestamp(int(e["time"])).astimezone()
        assert line[starts[1] : starts[2]].strip() == e["type"]  # every column starts at its header
        act = e["attrs"].get("activity_id", "")
        if act:
            assert line[starts[2] : starts[3]].strip().split("#")[0] == act
    text = "\n".join(body)
    ppl = summary(home, 12)
    assert f"ppl: heldout/bpb={ppl['heldout/bpb']:.4g}" in text  # an evaluation shows its figures
    assert re.search(r"timer_started\s+fires at \d\d:\d\d:\d\d \(1\.0 s\)", text)
    assert "step 12 loss" in text and "checkpoint runs/mini/ckpt/step-000012" in text
    assert "1796" not in text and "{" not in text  # no raw epoch seconds, no raw JSON


def test_show_is_a_table_of_segments_with_their_figures(finished) -> None:
    home, _ = finished
    lines = ctl(home, "show", "train/mini").stdout.splitlines()
    assert lines[0].startswith("train/mini: completed; 24 steps in 2 segment(s); suites ppl")
    assert lines[1].split() == ["SEG", "END", "STEP", "STATE", "CHECKPOINT", "TRAIN", "LOSS", "TIME", "ATTEMPTS", "ppl"]
    by_step = {f["step"]: f for f in frames(home)}
    for row, step in zip(lines[2:4], (12, 24)):
        cells = row.split()
        assert cells[:4] == [f"{step // 12}/2", str(step), "done", f"runs/mini/ckpt/step-{step:06d}"]
        assert cells[4] == f"{by_step[step]['train/loss']:.4f}"
        assert cells[-2:] == ["ppl", f"{summary(home, step)['heldout/ppl']:.4g}"]
    data = json.loads(ctl(home, "show", "train/mini", "--json").stdout)
    assert [s["until"] for s in data["segments"]] == [12, 24]
    assert data["segments"][1]["evals"][0]["metrics"] == summary(home, 24)


def test_retention_through_ctl_keeps_what_the_evaluations_name(finished) -> None:
    home, _ = finished
    kept = sorted(p.name for p in (home / "runs/mini/ckpt").glob("step-*"))
    assert kept == ["step-000012", "step-000024"]  # the evaluated ones; steps 3..21 pruned
    status = json.loads(ctl(home, "status", "train/mini", "--json").stdout)
    assert (home / status["progress"]["last_checkpoint"]).is_dir()


def test_show_refuses_what_is_not_a_training_run(finished) -> None:
    home, _ = finished
    p = ctl(home, "show", "train/nosuch", check=False)
    assert p.returncode == 2 and p.stderr.startswith("ctl: ") and "nosuch" in p.stderr


def test_status_shows_a_pending_timer_in_local_time(tmp_path: Path) -> None:
    """A workflow durably waiting: the timer as local time and time remaining, never epoch seconds."""
    from engine import Engine

    async def sleeper(rt, _input):
        await rt.sleep(3600)

    (tmp_path / ".ctl").mkdir()
    eng = Engine(tmp_path / ".ctl" / "engine.db")
    eng.register_workflow("Sleeper", sleeper)
    eng.start("Sleeper", "sleep/1", None)
    eng.run_until_idle()
    eng.close()
    p = ctl(tmp_path, "status", "sleep/1")
    m = re.search(r"timer: fires at (" + ISO + r") \(in ([\d:]+)\)", p.stdout)
    assert m, p.stdout
    parts = [int(x) for x in m.group(2).split(":")]
    left_s = sum(v * 60**i for i, v in enumerate(reversed(parts)))
    assert 3000 < left_s <= 3600
    assert not re.search(r"\b1\d{9}\b", p.stdout)  # no epoch seconds anywhere
    st = json.loads(ctl(tmp_path, "status", "sleep/1", "--json").stdout)
    (timer,) = st["timers"]
    assert 3000 < timer["remaining_s"] <= 3600 and dt.datetime.fromisoformat(timer["fire_at_local"]).timestamp() == int(
        timer["fire_at"]
    )


def test_plot_series_are_the_run_files(finished) -> None:
    home, _ = finished
    s = json.loads(ctl(home, "plot", "train/mini", "--json").stdout)
    jsonl = frames(home)
    assert s["loss"] == [[f["step"], f["train/loss"]] for f in jsonl]  # exact floats, every step
    assert s["lr"] == [[f["step"], f["optim/lr"]] for f in jsonl]
    assert [(e["step"], e["value"]) for e in s["evals"]] == [(st, summary(home, st)["heldout/loss"]) for st in (12, 24)]
    assert s["evals"][0]["label"] == f"ppl {summary(home, 12)['heldout/ppl']:.4g}"
    text = ctl(home, "plot", "train/mini").stdout  # in a pipe: the terminal chart, no colours
    assert text.startswith("train/mini (completed)") and "\x1b[" not in text
    assert f"◆ ppl {summary(home, 24)['heldout/ppl']:.4g} at step 24" in text
    assert f"{max(f['train/loss'] for f in jsonl):.3g}┤" in text  # the loss axis spans the data
    assert any(0x2800 < ord(c) <= 0x28FF for c in text)  # braille dots were drawn


def test_plot_png_is_written_and_draws_the_run(finished, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ctl import plot
    from app.runview import run_view
    from engine import Engine

    home, _ = finished
    out = tmp_path / "sub" / "mini.png"
    p = ctl(home, "plot", "train/mini", "-o", str(out))
    assert f"wrote {out} (24 steps, 2 evaluation(s))" in p.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 900  # 9 in at 100 dpi
    eng = Engine(home / ".ctl" / "engine.db")
    try:
        view = run_view("train/mini", eng.history("train/mini"), "completed")
    finally:
        eng.close()
    fig = plot.figure(plot.series(view, home))
    ax, ax_lr = fig.axes
    loss_line = ax.get_lines()[0]
    assert list(loss_line.get_xdata()) == [f["step"] for f in frames(home)]
    assert list(loss_line.get_ydata()) == [f["train/loss"] for f in frames(home)]
    assert list(ax_lr.get_lines()[0].get_ydata()) == [f["optim/lr"] for f in frames(home)]
    marks = ax.collections[0].get_offsets()
    assert [tuple(m) for m in marks] == [(st, summary(home, st)["heldout/loss"]) for st in (12, 24)]


def test_plot_to_a_path_that_cannot_be_written_is_one_line_exit_2(finished, tmp_path: Path) -> None:
    """-o under a regular file (its folder cannot be made) or in /proc: one ctl: line, exit 2, no traceback."""
    pytest.importorskip("matplotlib")
    from bi_helpers import one_line_error

    home, _ = finished
    (tmp_path / "a-file").write_text("x")
    for target in (tmp_path / "a-file" / "p.png", Path("/proc/no-such-dir-for-a-plot/p.png")):
        one_line_error(
            ctl(home, "plot", "train/mini", "-o", str(target), check=False), 2, f"cannot write the plot {target}"
        )


class _Backend:
    """The run's real history, cut where the test says (read as another backend's: engine.history; a backend
    with no local store, app.Backend's ``store`` None)."""

    store = None
    owner = None

    def __init__(self, events: list) -> None:
        self.events = events

    def history(self, workflow_id: str, after_seq: int = 0) -> list:
        return [e for e in self.events if e.seq > after_seq]


def _until_eval_started(home: Path) -> tuple[list, float]:
    from engine import Engine

    eng = Engine(home / ".ctl" / "engine.db")
    try:
        events = eng.history("train/mini")
    finally:
        eng.close()
    cut = next(
        i for i, e in enumerate(events) if e.type == "activity_started" and e.attrs["activity_id"] == "eval-000012-ppl"
    )
    return events[: cut + 1], events[cut].time


def _display(home: Path, events: list, now: float):
    import io

    from rich.console import Console

    from ctl.display import LiveDisplay

    out = io.StringIO()
    d = LiveDisplay(home, _Backend(events), "train/mini", console=Console(file=out, width=300), clock=lambda: now)
    d._poll()  # one poll, as the display's thread does every 0.5 s
    return d, out.getvalue()


def test_the_eval_phase_shows_the_count_of_its_progress_file(finished, tmp_path: Path) -> None:
    """The display and `ctl status` read the evaluation's counts from its attempt's progress file:
    the one tinyllm eval wrote in the run (ready 0/4, then 4/4 at the end of the subject), and a
    recorded mid-evaluation file (37/120 after 10 s: ETA 22 s - the 2 s since) with a torn last line."""
    import shutil
    from types import SimpleNamespace

    from ctl import runstatus

    home, _ = finished
    events, started = _until_eval_started(home)
    lines = [
        json.loads(x) for x in (home / "runs/mini/activity/eval-000012-ppl/progress-1.jsonl").read_text().splitlines()
    ]
    counted = [x for x in lines if "done" in x]
    assert (counted[0]["event"], counted[0]["done"], counted[-1]["done"], counted[-1]["of"]) == ("ready", 0, 4, 4)
    _, text = _display(home, events, counted[-1]["time"])
    assert "evaluating ppl (1/1) of step-000012: 4/4 windows, ETA 0:00 | step " in text  # the plain line

    mid = tmp_path / "mid"
    shutil.copytree(home / "runs/mini", mid / "runs/mini", ignore=shutil.ignore_patterns("ckpt", "activity"))
    progress = mid / "runs/mini/activity/eval-000012-ppl/progress-1.jsonl"
    progress.parent.mkdir(parents=True)
    progress.write_text(
        "".join(
            json.dumps(x) + "\n"
            for x in (
                {"event": "starting", "time": started},
                {"event": "ready", "done": 0, "of": 120, "unit": "windows", "time": started},
                {"event": "progress", "done": 37, "of": 120, "unit": "windows", "time": started + 10},
            )
        )
        + '{"event": "progress", "do'
    )
    d, text = _display(mid, events, started + 12)
    assert "evaluating ppl (1/1) of step-000012: 37/120 windows, ETA 0:20 |" in text
    assert d.phase_line(d._view(), started + 12) == (
        "evaluating ppl (1/1)",
        "step-000012: 37/120 windows, ETA 0:20",
        120.0,
        37.0,
    )  # the terminal's bar: 37 of 120
    st = SimpleNamespace(workflow_id="train/mini", workflow="TrainRun", state="running")
    extra = runstatus.describe(_Backend(events), mid, st, started + 12)
    assert extra["progress"]["eval_progress"] == {
        "done": 37,
        "of": 120,
        "unit": "windows",
        "eta_s": pytest.approx(83 / 3.7 - 2),
    }
    assert any(
        line.endswith("evaluating ppl (1/1) of step-000012: 37/120 windows, ETA 0:20")
        for line in runstatus.status_lines(st, extra, started + 12)
    )

    progress.write_text(json.dumps({"event": "starting", "time": started}) + "\n")  # an eval_command without counts
    _, text = _display(mid, events, started + 2)
    assert "evaluating ppl (1/1): step-000012: 0:02 |" in text and "windows" not in text
