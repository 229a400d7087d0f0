"""tinyllm.durable as a process: the contract's arguments, bad input, SIGTERM, the run lock, liveness.

Real processes (the example trainer) and real signals.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from helpers import ROOT, lines, start_example, wait_for, write_spec, example_spec

from tinyllm import runlock

pytestmark = pytest.mark.slow  # the example trainer as a subprocess


def test_the_helper_imports_torch_and_nothing_else_of_the_project() -> None:
    code = (
        "import sys, tinyllm.durable; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'click', 'engine', 'workflows', 'ctl', 'rich')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path) -> None:
    bad_name = tmp_path / "bad.json"
    bad_name.write_text(json.dumps({**example_spec(), "name": "../up"}))
    home = tmp_path / "home"
    for args, message in [
        ([], "bad arguments"),
        (["--spec", str(tmp_path / "missing.json")], "not found"),
        (["--spec", str(bad_name)], "not a plain identifier"),
    ]:
        p = subprocess.run(
            [sys.executable, str(ROOT / "examples/durable_train.py"), *args, "--home", str(home)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert p.returncode == 2, (args, p.stderr)
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and message in err[0], (args, p.stderr)
        assert not (home / "runs").exists()


def test_sigterm_checkpoints_at_the_step_boundary_and_exits_130(tmp_path) -> None:
    spec = write_spec(tmp_path, example_spec(name="term", steps=10**6, checkpoint_every=10**6))
    progress = tmp_path / "progress.jsonl"
    proc = start_example(spec, tmp_path, "--progress", str(progress))
    # liveness: with no checkpoint due, timed progress lines still come while steps complete
    wait_for(lambda: any(ln.get("event") == "step" for ln in lines(progress)), "a timed progress line", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["canceled"] is True and result["steps"] > 0
    assert result["final_loss_hex"] == float(result["final_loss"]).hex()
    ckpt = tmp_path / result["checkpoint"]
    assert ckpt.name == f"step-{result['steps']:06d}" and (ckpt / "manifest.json").is_file()
    assert (tmp_path / "runs/term/ckpt/LATEST").read_text().strip() == ckpt.name
    last = lines(progress)[-1]
    assert (
        last["event"] == "checkpoint" and last["step"] == result["steps"] and last["checkpoint"] == result["checkpoint"]
    )


def test_a_locked_run_directory_exits_75(tmp_path) -> None:
    spec = write_spec(tmp_path, example_spec(name="locked", steps=3))
    held = runlock.acquire(tmp_path / "runs" / "locked", "locked")
    try:
        p = start_example(spec, tmp_path)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 75 and "locked" in err
    finally:
        held.close()
