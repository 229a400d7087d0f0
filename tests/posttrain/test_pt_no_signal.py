"""GRPO without a learning signal (tinyllm/objectives/no_signal.py): a reward that no rollout can get
(an answer longer than ``max_tokens``) is constant for the whole run; after ``WINDOW_STEPS`` batches
the trainer warns once, that step's frame carries the warning, a resume or a later segment neither
repeats nor misses it, and the training bits are those of a run without the watch. OPD (its signal is
the teacher's KL) never warns."""

from __future__ import annotations

import io

import pytest

from pt_helpers import RL, frames, spec, train_losses, without_timers, write_jsonl
from tinyllm.objectives import grpo
from tinyllm.objectives.no_signal import REWARD_KEY, STEPS_KEY, WINDOW_STEPS, NoSignalWatch, warning_text
from tinyllm.spec import parse_train_spec
from tinyllm.trainer import Trainer

NEVER = {**RL, "data": {"path": "never.jsonl", "prompt_column": "q", "response_column": "a"}, "reward": ["exact_match"]}


@pytest.fixture
def never_home(home):
    write_jsonl(home / "never.jsonl", [{"q": f"{a}+{b}=", "a": "never"} for a in range(4) for b in range(10)])
    return home  # "never" is 5 characters, max_tokens 3: exact match is 0.0 for every rollout


def run(home, s, steps, total_steps=None):
    log = io.StringIO()
    result = Trainer(parse_train_spec({**s, "steps": steps}), home, log=log, total_steps=total_steps).run()
    return result, [ln for ln in log.getvalue().splitlines() if "warning" in ln]


def warned(home, name):
    return [(f["step"], f[STEPS_KEY], f.get(REWARD_KEY)) for f in frames(home, name) if STEPS_KEY in f]


def test_a_constant_reward_warns_once_and_the_frame_carries_it(never_home):
    s = spec("grpo", name="never", rl=NEVER)
    _, lines = run(never_home, s, 12)
    assert len(lines) == 1, lines
    assert lines[0].startswith("tinyllm: warning: never: reward constant (0.0) for steps 1-10: no learning signal")
    assert warned(never_home, "never") == [(10, float(WINDOW_STEPS), 0.0)]
    assert all(f["train/reward_mean"] == 0.0 and f["train/loss"] == 0.0 for f in frames(never_home, "never"))
    frame = next(f for f in frames(never_home, "never") if STEPS_KEY in f)
    assert lines[0].endswith(warning_text(frame))  # the text ctl train's display and ctl show print


def test_the_watch_changes_no_bit(never_home, monkeypatch):
    s = spec("grpo", name="never", rl=NEVER)
    with_watch, _ = run(never_home, s, 12)
    monkeypatch.setattr(grpo.GRPOObjective, "watches_signal", False)
    without, lines = run(never_home, {**s, "name": "unwatched"}, 12)
    assert lines == [] and warned(never_home, "unwatched") == []
    assert with_watch["final_loss_hex"] == without["final_loss_hex"] and with_watch["digest"] == without["digest"]
    assert train_losses(never_home, "never") == train_losses(never_home, "unwatched")
    strip = lambda f: {k: v for k, v in without_timers(f).items() if not k.startswith("warn/")}  # noqa: E731
    assert [strip(f) for f in frames(never_home, "never")] == [strip(f) for f in frames(never_home, "unwatched")]


def test_segments_and_resumes_warn_once_per_run(never_home):
    s = spec("grpo", name="seg", rl=NEVER)
    first, lines1 = run(never_home, s, 6, total_steps=12)  # segment 1 ends inside the window
    second, lines2 = run(never_home, s, 12, total_steps=12)  # resumes at step 6: the streak came with it
    assert second["resumed_from"].endswith("step-000006")
    assert lines1 == [] and len(lines2) == 1 and "for steps 1-10" in lines2[0]
    third, lines3 = run(never_home, s, 14, total_steps=14)  # past the warning: it was given for this run
    assert third["resumed_from"].endswith("step-000012") and lines3 == []
    assert warned(never_home, "seg") == [(10, 10.0, 0.0)]


def test_a_run_shorter_than_the_window_is_one_window(never_home):
    _, lines = run(never_home, spec("grpo", name="short", rl=NEVER), 3)
    assert len(lines) == 1 and "for steps 1-3" in lines[0]


def test_opd_never_warns(never_home):
    _, lines = run(never_home, spec("opd", name="opd-never", rl=NEVER), 12)
    assert lines == [] and warned(never_home, "opd-never") == []


def test_the_window_resets_on_any_signal_and_names_one_value_only():
    w = NoSignalWatch(100, window=3)
    assert w.observe([[0.0, 0.0], [0.0, 0.0]]) == {}
    assert w.observe([[0.0, 1.0], [0.0, 0.0]]) == {}  # one group with a signal: the streak starts again
    assert w.observe([[0.0, 0.0], [1.0, 1.0]]) == {} and w.observe([[1.0, 1.0], [1.0, 1.0]]) == {}
    got = w.observe([[0.0, 0.0], [0.0, 0.0]])
    assert got == {STEPS_KEY: 3.0}  # each group constant, but not one value for the window: no reward named
    assert "same within every group" in warning_text({**got, "step": 5}) and "steps 3-5" in warning_text(
        {**got, "step": 5}
    )
    assert w.observe([[0.0, 0.0]]) == {}  # warned: once per run
    again = NoSignalWatch(100, window=2)
    again.restore(w.state())
    assert again.warned and again.observe([[0.0, 0.0]] * 2) == {}
    fresh = NoSignalWatch(100, window=2)
    fresh.restore(None)  # a checkpoint from before the watch: an empty streak
    assert fresh.observe([[1.0, 1.0]]) == {} and fresh.observe([[1.0, 1.0]]) == {STEPS_KEY: 2.0, REWARD_KEY: 1.0}


@pytest.mark.slow  # real ctl train (engine, worker, two trainer segments), then ctl show
def test_ctl_train_prints_the_warning_once_and_ctl_show_shows_it(never_home):
    import json
    import os
    import subprocess
    import sys

    from pt_helpers import write_spec

    path = write_spec(never_home, spec("grpo", name="never-ctl", rl=NEVER, steps=12, eval_every=6))
    env = {**os.environ, "CTL_PROGRESS_EVERY_S": "600"}
    env.pop("CTL_HOME", None)
    ctl = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "ctl.cli", *a, "--home", str(never_home)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    p = ctl("train", "--spec", str(path), "--no-eval", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    shown = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert (
        len(shown) == 1 and "warning at step 10: reward constant (0.0) for steps 1-10: no learning signal" in shown[0]
    ), p.stderr[-3000:]
    sh = ctl("show", "train/never-ctl")
    assert sh.returncode == 0 and "warning at step 10: reward constant (0.0) for steps 1-10" in sh.stdout, sh.stdout
    data = json.loads(ctl("show", "train/never-ctl", "--json").stdout)
    assert [w["step"] for w in data["warnings"]] == [10]
