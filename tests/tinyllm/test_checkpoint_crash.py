"""Checkpoint crash windows (issue 9, defect 6), on real files, with real processes where the
behaviour is about them:

- every directory entry a checkpoint needs (ckpt/, step-NNNNNN, LATEST) is fsynced into its
  parent before LATEST names it and before save_checkpoint returns (a recorded-syscall model:
  a power cut cannot be staged in a test, the order of renames and fsyncs can be checked);
- a real SIGKILL between the two renames of a re-save keeps the checkpoint LATEST names;
- a corrupt explicit --resume gives way to a newer valid LATEST, not only to older checkpoints;
- a corrupt validation_phase.json (sealed sidecar) refuses its checkpoint: no traceback;
- every refusal is said on stderr, in the progress file and in the result.

Only the kill runs ``tinyllm train`` as its own process; the other runs use the real CLI in this
process (``cli_in_process``: one torch import, the slow part on a loaded machine).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch

from tinyllm import checkpoint as ckpt
from tl_helpers import cli_in_process, last_json, tinyllm_cmd, write_spec

FAST = {
    "name": "crash",
    "steps": 6,
    "checkpoint_every": 2,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 6,
    "log_every": 100,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1},
}


def run_tinyllm(home: Path, *args: str):
    """The real CLI in this process (one torch import for the file: these checks are about files,
    not processes); the kill below is a real process."""
    proc = cli_in_process(home, *args)
    proc.returncode = proc.exit_code
    return proc


def _full(step: int) -> dict:
    return {
        "model": {"w": torch.full((3,), float(step))},
        "optimizer": {"state": {}},
        "training_state": {"step": step, "cursor": step},
    }


# --- the fsync protocol ---------------------------------------------------------------------


class DirEntryModel:
    """Records mkdir/rename/replace and directory fsyncs; an entry is durable once its parent
    directory was fsynced after the entry appeared (the POSIX rule for new names)."""

    def __init__(self, monkeypatch):
        self.pending: set[tuple[str, str]] = set()  # (parent, name) not yet durable
        self.violations: list[str] = []
        real_mkdir, real_rename, real_replace, real_fsync = os.mkdir, os.rename, os.replace, os.fsync

        def entry(path) -> tuple[str, str]:
            p = Path(os.path.abspath(path))
            return str(p.parent), p.name

        def mkdir(path, *a, **k):
            real_mkdir(path, *a, **k)
            self.pending.add(entry(path))

        def rename(src, dst, *a, **k):
            (real_replace if self._replacing else real_rename)(src, dst, *a, **k)
            self.pending.discard(entry(src))
            self.pending.add(entry(dst))

        def replace(src, dst, *a, **k):
            if Path(dst).name == "LATEST":
                target = Path(dst).parent / Path(src).read_text().strip()
                if entry(target) in self.pending or not target.is_dir():
                    self.violations.append(f"LATEST names {target.name} before its entry is durable")
            self._replacing = True
            try:
                rename(src, dst)
            finally:
                self._replacing = False

        def fsync(fd):
            real_fsync(fd)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                d = os.readlink(f"/proc/self/fd/{fd}")
                self.pending = {e for e in self.pending if e[0] != d}

        self._replacing = False
        for name, fn in (("mkdir", mkdir), ("rename", rename), ("replace", replace), ("fsync", fsync)):
            monkeypatch.setattr(os, name, fn)

    def not_durable(self, root: Path) -> list[str]:
        """Pending entries that are not temporaries (a lost temporary is harmless)."""
        return sorted(f"{p}/{n}" for p, n in self.pending if not n.startswith(".") and p.startswith(str(root)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_every_entry_is_fsynced_before_latest_names_it_and_before_return(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "r"  # nothing exists yet: save creates runs/, runs/r/, ckpt/
    model = DirEntryModel(monkeypatch)
    ckpt.save_checkpoint(run, 2, _full(2))
    assert model.violations == [] and model.not_durable(tmp_path) == []
    ckpt.save_checkpoint(run, 2, _full(2))  # a re-save swaps the old directory out
    assert model.violations == [] and model.not_durable(tmp_path) == []
    art = ckpt.save_checkpoint(run, 3, {"model": {"w": torch.zeros(3)}})  # checkpoint_artifacts/ too
    assert art.is_dir() and model.not_durable(tmp_path) == []


# --- a kill between the two renames of a re-save ------------------------------------------------


@pytest.mark.slow
def test_real_sigkill_between_the_renames_keeps_the_checkpoint(home, tmp_path):
    """LATEST (step 4) is corrupt, so the trainer resumes from step 2 and re-saves step 4 over it; a
    real SIGKILL between that re-save's two renames leaves LATEST naming a missing directory. The
    next start must restore step 4 from its complete new copy (today: both copies deleted, back to 2)."""
    import subprocess

    reference = run_tinyllm(home, "train", "--spec", str(write_spec(tmp_path / "ref.json", **{**FAST, "name": "ref"})))
    assert reference.returncode == 0, reference.stderr
    spec4 = write_spec(tmp_path / "crash4.json", **{**FAST, "steps": 4})
    spec = write_spec(tmp_path / "crash.json", **FAST)
    assert run_tinyllm(home, "train", "--spec", str(spec4)).returncode == 0
    root = home / "runs/crash/ckpt"
    _corrupt(root / "step-000004/model.pt")
    env = {**os.environ, "TINYLLM_FAULT": "checkpoint.between_renames@4"}
    killed = subprocess.run(
        tinyllm_cmd("train", "--spec", str(spec), "--home", str(home)),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert killed.returncode == -9, killed.stderr
    assert "refused checkpoint runs/crash/ckpt/step-000004" in killed.stderr
    assert not (root / "step-000004").exists() and (root / "LATEST").read_text().strip() == "step-000004"
    assert sorted(p.name.rsplit("-", 1)[0] for p in root.glob(".*-step-000004-*")) == [
        ".replaced-step-000004",
        ".tmp-step-000004",
    ]
    again = run_tinyllm(home, "train", "--spec", str(spec))
    assert again.returncode == 0, again.stderr
    result = last_json(again.stdout)
    assert "restored" in again.stderr and "refused" not in again.stderr, again.stderr
    assert result["resumed_from"] == "runs/crash/ckpt/step-000004" and result["refused_checkpoints"] == []
    ref = last_json(reference.stdout)
    assert (result["final_loss_hex"], result["digest"]) == (ref["final_loss_hex"], ref["digest"])
    assert not list(root.glob(".*-step-*"))  # temporaries gone, after the restore


@pytest.mark.parametrize("new_copy", ["complete", "torn", "absent"])
def test_recovery_restores_before_it_deletes(tmp_path, new_copy):
    """The on-disk states a kill between the renames can leave (new copy complete, torn, or not yet
    made): the step directory comes back, from the complete new copy if there is one."""
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 4, _full(4))
    root = run / "ckpt"
    os.rename(root / "step-000004", root / ".replaced-step-000004-77")
    if new_copy != "absent":
        ckpt.write_checkpoint_dir(root / "new", 4, {**_full(4), "model": {"w": torch.full((3,), 40.0)}})
        os.rename(root / "new", root / ".tmp-step-000004-77")
        if new_copy == "torn":
            (root / ".tmp-step-000004-77" / "manifest.json").unlink()
    log = io.StringIO()
    assert ckpt.recover_interrupted_writes(run, log) == [root / "step-000004"]
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-000004"]
    w = ckpt.load_checkpoint(root / "step-000004")[0]["model"]["w"]
    assert w[0].item() == (40.0 if new_copy == "complete" else 4.0)
    assert "restored" in log.getvalue()
    assert ckpt.choose_resume(run).path == root / "step-000004"


def test_a_finished_swap_only_drops_the_replaced_copy(tmp_path):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 4, _full(4))
    shutil.copytree(run / "ckpt/step-000004", run / "ckpt/.replaced-step-000004-9")  # kill before rmtree
    assert ckpt.recover_interrupted_writes(run, io.StringIO()) == []
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["LATEST", "step-000004"]


# --- which checkpoint a resume uses, and saying so --------------------------------------------------


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_corrupt_explicit_resume_gives_way_to_newer_valid_latest(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 6):
        ckpt.save_checkpoint(run, step, _full(step))
    _corrupt(run / "ckpt/step-000004/model.pt")
    choice = ckpt.choose_resume(run, run / "ckpt/step-000004")
    assert choice.path == run / "ckpt/step-000006"
    assert [(r.checkpoint.name, r.reason) for r in choice.refused] == [
        ("step-000004", "model.pt fails its sha256 checksum (corrupt)")
    ]
    assert ckpt.choose_resume(run, run / "ckpt/step-000004", max_step=5).path == run / "ckpt/step-000002"
    _corrupt(run / "ckpt/step-000006/optimizer.pt")  # LATEST corrupt too: the newest valid older one
    choice = ckpt.choose_resume(run, run / "ckpt/step-000004")
    assert choice.path == run / "ckpt/step-000002" and len(choice.refused) == 2


@pytest.mark.slow
def test_trainer_reports_the_refused_checkpoint_on_stderr_progress_and_result(home, tmp_path):
    spec = write_spec(tmp_path / "crash.json", **{**FAST, "steps": 4})
    assert run_tinyllm(home, "train", "--spec", str(spec)).returncode == 0
    _corrupt(home / "runs/crash/ckpt/step-000002/model.pt")
    progress = tmp_path / "progress.jsonl"
    spec6 = write_spec(tmp_path / "crash6.json", **FAST)
    proc = run_tinyllm(
        home, "train", "--spec", str(spec6), "--resume", "runs/crash/ckpt/step-000002", "--progress", str(progress)
    )
    assert proc.returncode == 0, proc.stderr
    why = "model.pt fails its sha256 checksum (corrupt)"
    assert f"tinyllm: refused checkpoint runs/crash/ckpt/step-000002: {why}" in proc.stderr
    assert "tinyllm: resuming from runs/crash/ckpt/step-000004 instead" in proc.stderr
    [first] = [line for line in map(json.loads, progress.read_text().splitlines()) if line.get("event") == "resume"]
    assert first["event"] == "resume" and first["resumed_from"] == "runs/crash/ckpt/step-000004"
    assert first["refused"] == [{"checkpoint": "runs/crash/ckpt/step-000002", "reason": why}]
    result = last_json(proc.stdout)
    assert result["resumed_from"] == "runs/crash/ckpt/step-000004" and result["refused_checkpoints"] == first["refused"]


# --- validation_phase.json under a checksum ---------------------------------------------------------


VALIDATION = {
    "enabled": True,
    "every_steps": 3,
    "data": {"path": "builtin:heldout.txt"},
    "batch_size": 2,
    "max_samples": 4,
}


def _val_frames(home: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (home / "runs/crash/metrics.jsonl").read_text().splitlines()]
    return {
        r["step"]: {k: float(v).hex() for k, v in r.items() if k.startswith("val/")}
        for r in rows
        if any(k.startswith("val/") for k in r)
    }


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbled", "metric-changed"])
def test_corrupt_phase_file_refuses_its_checkpoint(home, tmp_path, damage):
    spec = write_spec(tmp_path / "crash.json", **{**FAST, "checkpoint_every": 3, "validation": VALIDATION})
    first = run_tinyllm(home, "train", "--spec", str(spec))
    assert first.returncode == 0, first.stderr
    reference = (last_json(first.stdout), _val_frames(home))
    assert sorted(reference[1]) == [3, 6]
    phase = home / "runs/crash/ckpt/step-000006/validation_phase.json"
    assert json.loads(phase.read_text())["body"]["phase"] == "completed"
    if damage == "garbled":
        phase.write_text(phase.read_text()[:-20])
    else:  # still valid JSON and a valid journal: only the checksum can tell
        sealed = json.loads(phase.read_text())
        key = next(iter(sealed["body"]["metrics_hex"]))
        sealed["body"]["metrics_hex"][key] = (2.5).hex()
        phase.write_text(json.dumps(sealed))
    # the run is complete; one more resume (the same command again) must refuse step 6, not trust it
    again = run_tinyllm(home, "train", "--spec", str(spec))
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert "refused checkpoint runs/crash/ckpt/step-000006: validation_phase.json" in again.stderr
    result = last_json(again.stdout)
    assert result["resumed_from"] == "runs/crash/ckpt/step-000003"
    assert (result["final_loss_hex"], result["digest"]) == (reference[0]["final_loss_hex"], reference[0]["digest"])
    assert _val_frames(home) == reference[1]  # step 6 validated again, from its weights: the same bits


def test_a_failed_rename_into_place_puts_the_old_copy_back(tmp_path, monkeypatch):
    """A re-save whose final rename fails (ENOSPC growing the directory) must not leave the step
    missing: the disk-full clean-up would then delete the only copy, its .replaced- directory."""
    import errno

    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 4, _full(4))
    real = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".tmp-"):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(run, 4, _full(4))
    monkeypatch.undo()
    choice = ckpt.choose_resume(run)
    assert choice.path == run / "ckpt/step-000004" and choice.refused == []
    assert not list((run / "ckpt").glob(".replaced-*"))
