"""The real kill loop: `ctl train` SIGKILLed (its whole process group) three times, then run to its end.

Real processes, real files, real SIGKILL: the final loss and the model digest must equal an
uninterrupted run's bit for bit, and no trainer may outlive its killed worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.proving.core import compare_results as compare
from simulator.proving.kill_loop import kill_loop

SPEC = Path(__file__).with_name("kill-loop-spec.json")


@pytest.mark.slow
def test_three_sigkills_then_the_same_command_ends_bitwise_equal(capsys, tmp_path):
    rc = kill_loop(str(SPEC), kills=3, seed=1, home=str(tmp_path / "killed"), timeout_s=600)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("SIGKILL after") == 3, out  # each of the three runs was killed, none finished first
    assert "bitwise equal" in out
    attempts = sorted(p.name for p in (tmp_path / "killed/runs/killme/activity/train-000200").glob("progress-*"))
    assert len(attempts) >= 2, attempts  # the segment was redelivered after the kills


def test_the_comparison_reports_a_single_different_bit():
    want = {
        "steps": 60,
        "final_loss_hex": "0x1.9c6d2c0000000p+1",
        "digest": "ab",
        "checkpoint": "c",
        "segments": [{"until": 60, "train": {"final_loss_hex": "0x1.9c6d2c0000000p+1", "digest": "ab"}}],
    }
    got = {**want, "final_loss_hex": "0x1.9c6d2c0000001p+1"}
    assert compare(want, want) == []
    assert compare(got, want) == ["final_loss_hex: 0x1.9c6d2c0000001p+1 != uninterrupted 0x1.9c6d2c0000000p+1"]


def test_a_missing_spec_is_bad_input(capsys):
    assert kill_loop("/nonexistent/spec.json", kills=1, seed=0) == 2
    assert "spec file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_no_kill_that_landed_is_not_tested_exit_3_never_bitwise_equal(capsys, tmp_path):
    """A home whose run is already complete: every ``ctl train`` finishes before its kill. The loop printed
    'kill-loop: 2 kills, final loss and digest bitwise equal' and exit 0 with no kill landed."""
    import json
    import subprocess
    import sys

    toy = Path(__file__).parents[1] / "durable" / "toy_trainer.py"
    spec = tmp_path / "toy.json"
    spec.write_text(
        json.dumps(
            {
                "name": "toy",
                "steps": 6,
                "checkpoint_every": 3,
                "config": {"step_s": 0.01},
                "trainer": {"command": [sys.executable, str(toy)]},
            }
        )
    )
    home = tmp_path / "killed"
    done = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec), "--home", str(home), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rc = kill_loop(str(spec), kills=2, seed=0, home=str(home), timeout_s=120)
    out = capsys.readouterr().out
    assert out.count("finished on its own") == 2, out
    assert rc == 3 and "bitwise equal" not in out, out
    assert "no kill landed: a resume after a kill is not tested" in out, out
