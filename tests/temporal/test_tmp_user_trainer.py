"""A spec naming its own trainer on ``ctl --backend temporal`` (real dev server, worker, trainer):
examples/durable_train.py in two segments, each evaluated by its eval_command (suite ``acc``),
ends with the same loss bits and digest as one direct run of the trainer to the same steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the [temporal] extra is not installed: pip install -e '.[temporal]'")

from test_tmp_ctl import HEARTBEAT_S, Ctl  # noqa: E402

pytestmark = pytest.mark.slow  # a real Temporal dev server and the example trainer's processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ns("user")
def test_a_spec_with_its_own_trainer_runs_and_is_evaluated_on_temporal(temporal_server, tmp_path: Path) -> None:
    spec = json.loads((ROOT / "examples/specs/durable.json").read_text())
    spec.update(name="tmpusr", steps=20, eval_every=10, eval_interval_seconds=0)
    spec_path = tmp_path / "tmpusr.json"
    spec_path.write_text(json.dumps(spec))
    direct_home = tmp_path / "direct"  # the trainer alone, one process, no engine
    direct = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/durable_train.py"), "--spec", str(spec_path), "--home", str(direct_home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    ctl = Ctl(temporal_server, "user", tmp_path / "home")
    out = json.loads(
        ctl.run(
            "train", "--spec", str(spec_path), "--suite", "acc", "--heartbeat-timeout", HEARTBEAT_S, "--json"
        ).stdout
    )
    stdout, stderr = direct.communicate(timeout=300)
    assert direct.returncode == 0, stderr[-2000:]
    want = json.loads(stdout.splitlines()[-1])
    assert out["state"] == "completed"
    res = out["result"]
    assert (res["final_loss_hex"], res["digest"]) == (want["final_loss_hex"], want["digest"])
    suites = [seg["evals"]["suites"][0] for seg in res["segments"]]
    assert [(s["suite"], s["run"]) for s in suites] == [("acc", "tmpusr-000010"), ("acc", "tmpusr-000020")]
    events = ctl.history("train/tmpusr")
    evals = [
        e["attrs"]["activity_id"]
        for e in events
        if e["type"] == "activity_completed" and e["attrs"]["activity_id"].startswith("eval-")
    ]
    assert evals == ["eval-000010-acc", "eval-000020-acc"]  # each checkpoint evaluated once
