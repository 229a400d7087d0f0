"""HF ``Trainer``'s private generators (issue 40 item 6), with the real library and real processes
(tests/integrations/hf_edges.py: a plain torch module whose forward draws noise from a generator of the
script's own): unregistered, a resume is NOT EXACT and the diagnosis names ``DurableTrainer``'s own call
(not ``run.track``); registered with ``track_generators``, EXACT. Soak lane: 6 starts of transformers
(~4 min on 2 loaded cores); CI's lane has the same for Lightning (test_lightning_edges.py) and the
diagnosis' wording per trainer kind (tests/ctl/test_verify_report.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "hf_edges.py"
ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("CTL_RUN_STEPS", "TINYLLM_FAULT")},
    "PYTHONPATH": str(ROOT),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def verify(home: Path, **config) -> tuple[int, dict]:
    path = home / f"hfedges-{len(config)}.json"
    path.write_text(
        json.dumps(
            {
                "name": "hfedges",
                "steps": 8,
                "seed": 1,
                "checkpoint_every": 2,
                "log_every": 2,
                "trainer": {"command": [sys.executable, str(SCRIPT)]},
                "config": config,
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(path),
            "--home",
            str(home),
            "--json",
            "--kills",
            "1",
            "--signal",
            "kill",
            "--segments",
            "1",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        raise AssertionError(done.stderr[-3000:]) from None


def test_a_private_generator_is_diagnosed_with_the_trainers_own_call_and_exact_once_registered(tmp_path) -> None:
    rc, report = verify(tmp_path, register=False)
    assert rc == 1 and report["verdict"] == "not_exact", report
    # seen red: "register it: run.track(generators={...})", a call HF users do not have
    assert "DurableTrainer(run, ..., track_generators={'aug': g})" in report["diagnosis"], report["diagnosis"]
    assert "run.track" not in report["diagnosis"], report["diagnosis"]
    rc, report = verify(tmp_path, register=True)
    assert rc == 0 and report["verdict"] == "exact", report  # seen red without the generators' file in the checkpoint
