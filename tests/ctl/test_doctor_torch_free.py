"""``ctl doctor`` verifies checkpoints with the manifest's digests through contracts/, without importing torch
(issue 42: a doctor on a home of six checkpoints took seconds, most of them ``import torch``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.layout import LATEST, MANIFEST, RunHome
from contracts.manifest import build_manifest, file_entry

pytestmark = pytest.mark.slow  # one ctl process (no torch: well under a second)

ROOT = Path(__file__).resolve().parents[2]
# torch made unimportable: any `import torch` on doctor's path raises, and ctl would print a traceback
DOCTOR = (
    "import sys; sys.modules['torch'] = None; sys.argv = ['ctl', 'doctor', '--json', '--home', sys.argv[1]]\n"
    "from ctl.cli import main\nmain()"
)


def _checkpoint(home: Path, step: int) -> Path:
    d = RunHome(home).run("r").step_dir(step)
    d.mkdir(parents=True)
    files = {}
    for c in ("model", "optimizer", "training_state"):
        data = f"{c} {step}".encode()
        (d / f"{c}.pt").write_bytes(data)
        files[f"{c}.pt"] = file_entry(data)
    (d / MANIFEST).write_text(json.dumps(build_manifest(step, ["model", "optimizer", "training_state"], files)))
    (d.parent / LATEST).write_text(d.name + "\n")
    return d


def test_doctor_verifies_checkpoints_without_torch(tmp_path: Path) -> None:
    home = tmp_path / "h"
    for s in (2, 4, 6):
        _checkpoint(home, s)
    (RunHome(home).run("r").step_dir(4) / "model.pt").write_bytes(b"model 5")  # same size, other bytes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", DOCTOR, str(home)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["checked"]["checkpoints"] == 3
    found = [f for f in report["findings"] if f["path"].startswith("runs/")]  # (and: no database yet)
    assert [(f["kind"], f["path"], f["problem"]) for f in found] == [
        ("damaged", "runs/r/ckpt/step-000004", "model.pt fails its sha256 checksum (corrupt)")
    ]
    assert "train/r resumes from step-000006 instead" in found[0]["means"]
    assert proc.returncode == 1
