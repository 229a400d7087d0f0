"""Exact resume: real processes, real SIGKILL/SIGTERM, corrupt checkpoints, segmented runs.

The promise under test: any interruption and resume ends with the same final_loss_hex and model
digest as one uninterrupted run (the small spec has dropout 0.1, so the RNG state must resume too).
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from tl_helpers import SMALL_SPEC, cli_in_process, last_json, run_tinyllm, start_tinyllm, wait_for_progress, write_spec

pytestmark = pytest.mark.slow  # real tinyllm trainers, SIGKILL and SIGTERM (reference run: a module fixture)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, built_corpus) -> dict:
    """One uninterrupted run of the small spec (40 steps, checkpoints every 10)."""
    home = tmp_path_factory.mktemp("reference")
    shutil.copytree(built_corpus, home / "corpora")
    proc = run_tinyllm(home, "train", "--spec", str(SMALL_SPEC))
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    assert result["steps"] == 40 and result["resumed_from"] is None
    return {"result": result, "home": home}


def test_sigkill_at_every_checkpoint_then_resume_is_bitwise_equal(home, reference):
    """One attempt per kill point (like the runner's progress-<attempt>.jsonl): each attempt
    resumes from LATEST and is SIGKILLed right after its checkpoint at step 10, 20, 30 appears."""
    resumed_steps = []
    for attempt, kill_after in enumerate((10, 20, 30), start=1):
        progress = home / f"progress-{attempt}.jsonl"
        # held right after that checkpoint (TINYLLM_FAULT=trainer.hold): a slow poller cannot let the run go past it
        proc = start_tinyllm(
            home,
            "train",
            "--spec",
            str(SMALL_SPEC),
            "--progress",
            str(progress),
            env={"TINYLLM_FAULT": f"trainer.hold@{kill_after}"},
        )
        wait_for_progress(progress, kill_after, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, "the run finished before the kill; the spec is too short"
        resumed_steps.append(int((home / "runs/small/ckpt/LATEST").read_text().strip()[5:]))
    assert resumed_steps == sorted(resumed_steps) and resumed_steps[0] >= 10
    final = run_tinyllm(home, "train", "--spec", str(SMALL_SPEC), "--progress", str(home / "progress-4.jsonl"))
    assert final.returncode == 0, final.stderr
    result = last_json(final.stdout)
    assert result["resumed_from"] == f"runs/small/ckpt/step-{resumed_steps[-1]:06d}"
    assert result["final_loss_hex"] == reference["result"]["final_loss_hex"]
    assert result["digest"] == reference["result"]["digest"]


def test_sigterm_exits_130_with_a_loadable_checkpoint_and_resumes_exactly(home, reference):
    from tinyllm.checkpoint import load_checkpoint

    progress = home / "progress.jsonl"
    proc = start_tinyllm(home, "train", "--spec", str(SMALL_SPEC), "--progress", str(progress))
    wait_for_progress(progress, 10, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # it finished all 40 steps before the signal landed: nothing to test
        pytest.fail("run finished before SIGTERM; the spec is too short for this machine")
    assert proc.returncode == 130, err
    result = last_json(out)
    assert result["canceled"] is True and result["steps"] < 40
    components, manifest = load_checkpoint(home / result["checkpoint"])
    assert components["training_state"]["step"] == result["steps"] == manifest["step"]
    assert json.loads(progress.read_text().splitlines()[-1])["checkpoint"] == result["checkpoint"]
    resumed = run_tinyllm(home, "train", "--spec", str(SMALL_SPEC))
    assert resumed.returncode == 0, resumed.stderr
    assert last_json(resumed.stdout)["digest"] == reference["result"]["digest"]


def _train_in_process(home: Path, spec_path: Path, log=None) -> dict:
    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    return Trainer(load_train_spec(spec_path), home, log=log).run(reporter=Reporter([]))


def test_segmented_run_equals_one_run(home, reference, tmp_path):
    """Steps 20 then the same spec with steps 40 (what TrainRun's segments do); in-process."""
    first = _train_in_process(home, write_spec(tmp_path / "s20.json", steps=20))
    assert first["steps"] == 20
    second = _train_in_process(home, SMALL_SPEC)
    assert second["resumed_from"] == "runs/small/ckpt/step-000020"
    assert second["final_loss_hex"] == reference["result"]["final_loss_hex"]
    assert second["digest"] == reference["result"]["digest"]


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no-manifest"])
def test_corrupt_latest_is_refused_and_the_previous_one_used(home, reference, tmp_path, capsys, damage):
    import io

    shutil.copytree(reference["home"] / "runs", home / "runs")
    latest = home / "runs" / "small" / "ckpt" / "step-000040"
    if damage == "truncate":
        f = latest / "model.pt"
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "bitflip":
        f = latest / "optimizer.pt"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    else:
        (latest / "manifest.json").unlink()
    log = io.StringIO()
    result = _train_in_process(home, SMALL_SPEC, log=log)
    assert "tinyllm: refused checkpoint runs/small/ckpt/step-000040: " in log.getvalue()
    assert "tinyllm: resuming from runs/small/ckpt/step-000030 instead" in log.getvalue()
    assert result["resumed_from"] == "runs/small/ckpt/step-000030"
    assert [r["checkpoint"] for r in result["refused_checkpoints"]] == ["runs/small/ckpt/step-000040"]
    assert result["digest"] == reference["result"]["digest"]
    assert result["final_loss_hex"] == reference["result"]["final_loss_hex"]


def test_steps_below_the_checkpoint_is_a_clear_error(home, reference, tmp_path):
    shutil.copytree(reference["home"] / "runs", home / "runs")
    proc = cli_in_process(home, "train", "--spec", str(write_spec(tmp_path / "s20.json", steps=20)))
    assert proc.exit_code == 2
    assert "beyond the spec's steps 20" in proc.stderr
    assert (home / "runs/small/ckpt/LATEST").read_text().strip() == "step-000040"


def test_changed_trajectory_spec_is_refused_on_resume(home, reference, tmp_path):
    shutil.copytree(reference["home"] / "runs", home / "runs")
    proc = cli_in_process(home, "train", "--spec", str(write_spec(tmp_path / "lr.json", steps=50, lr=0.01)))
    assert proc.exit_code == 2 and "different spec (fields: lr)" in proc.stderr
