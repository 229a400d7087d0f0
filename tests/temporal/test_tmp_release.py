"""``ctl --backend temporal release`` on a run trained on Temporal, real processes on a real dev server.

A failed gate publishes nothing (exit 1); a release SIGKILLed right after its publication's rename
(``TINYLLM_FAULT=release.after_rename``: the worker dies inside the publish activity) is finished by
the same command: the dead worker's publish attempt stops heartbeating, Temporal gives it to the new
worker (attempt 2), which finds the version of the same digest and publishes nothing twice; the
evaluation is not run again. Nothing of this touches the embedded engine (no ``.ctl/engine.db``).
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

pytest.importorskip("temporalio", reason="the [temporal] extra is not installed: pip install -e '.[temporal]'")

from test_tmp_ctl import SPEC, Ctl, make_home, train_args  # noqa: E402

pytestmark = pytest.mark.slow  # 27-70 s on 2 cores (15-24 s CPU): a Temporal training, two releases and a dead
# worker's heartbeat timeout

RELEASE_SPEC = {**SPEC, "steps": 6, "eval_every": 0, "lr_decay_steps": 6}
HEARTBEAT_S = "3"  # the killed publish attempt moves to the next worker after this


def _release(ctl: Ctl, gate: str, *extra: str) -> list[str]:
    return [
        "release",
        "train/mini",
        "--suite",
        "ppl",
        "--gate",
        gate,
        "--select",
        "latest",
        "--eval-max-items",
        "4",
        "--heartbeat-timeout",
        HEARTBEAT_S,
        *extra,
    ]


def _process(ctl: Ctl, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """A ctl process (a release runs a Temporal worker, as train does)."""
    proc = ctl.spawn(*args)
    stdout, stderr = ctl.finish(proc)
    if check and proc.returncode != 0:
        raise AssertionError(f"ctl {' '.join(args)} exited {proc.returncode}: {stderr[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.mark.soak  # (~30 s: the soak lane; CI runs the release's kills on the embedded engine and in the simulator)
@pytest.mark.ns("release")
def test_release_on_temporal_gates_and_publishes_once_after_a_kill(temporal_server, tmp_path_factory) -> None:
    home, spec_path = make_home(tmp_path_factory, "release", RELEASE_SPEC)
    ctl = Ctl(temporal_server, "release", home)
    trained = json.loads(ctl.run(*train_args(spec_path, evals=False)).stdout)
    assert trained["state"] == "completed"
    ckpt = trained["result"]["checkpoint"]

    failed = _process(ctl, *_release(ctl, "ppl/ppl<=1"), check=False)  # a tiny model's perplexity is far above 1
    assert failed.returncode == 1 and "not published: gate ppl/ppl<=1 failed" in failed.stderr
    assert not (home / "releases").exists()

    proc = ctl.spawn(*_release(ctl, "ppl/ppl<=1e9"), env={"TINYLLM_FAULT": "release.after_rename@1"})
    ctl.finish(proc)
    assert proc.returncode == -signal.SIGKILL  # killed inside publish, after v0001's rename, before CURRENT
    root = home / "releases" / "mini"
    assert [p.name for p in root.iterdir()] == ["v0001"]

    done = json.loads(_process(ctl, *_release(ctl, "ppl/ppl<=1e9"), "--json").stdout)  # the same command
    res = done["result"]
    assert done["state"] == "completed" and res["published"] and res["version"] == "v0001"
    assert res["checkpoint"] == ckpt
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", "v0001"]  # published once
    assert (root / "CURRENT").read_text().strip() == "v0001"
    manifest = json.loads((root / "v0001/manifest.json").read_text())
    assert manifest["checkpoint_digest"] == res["digest"] and (root / "v0001/model/model.pt").is_file()

    events = ctl.history(done["workflow_id"])
    started = [(e["attrs"]["activity_id"], e["attrs"]["attempt"]) for e in events if e["type"] == "activity_started"]
    completed = [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_completed"]
    assert completed == [f"eval-r{res['digest'][:12]}-ppl", "publish"]  # each once
    assert (f"eval-r{res['digest'][:12]}-ppl", 1) in started and (
        "publish",
        2,
    ) in started  # the dead one's, redelivered
    assert not (home / ".ctl" / "engine.db").exists()  # all of it on the Temporal backend

    listed = ctl.run("release", "--list")
    assert f"releases/mini/v0001  CURRENT  {ckpt}" in listed.stdout
