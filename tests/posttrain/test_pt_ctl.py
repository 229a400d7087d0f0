"""``ctl train`` of each objective (miniature versions of specs/dpo.json, grpo.json, opd.json),
SIGKILLed in the middle of its second segment, then the same command again: the final loss, the
weights digest and the final frame (train/* and val/*) equal an uninterrupted run's, bit for bit.
Real processes throughout (ctl, the engine's worker and runner, tinyllm); the three runs go at once."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pt_helpers import VALIDATION, copy_home, frames, spec, train_inprocess, without_timers, write_spec
from tinyllm import runlock

pytestmark = pytest.mark.slow  # real ctl train, killed mid-segment

CTL_SPECS = {
    "dpo": spec("dpo", VALIDATION["dpo"], steps=10, eval_every=5, checkpoint_every=1),
    "grpo": spec("grpo", VALIDATION["grpo"], steps=8, eval_every=4, checkpoint_every=1),
    "opd": spec("opd", VALIDATION["opd"], steps=8, eval_every=4, checkpoint_every=1),
}
DEADLINE_S = 240


def ctl_cmd(home, spec_path):
    return [
        sys.executable,
        "-m",
        "ctl.cli",
        "train",
        "--spec",
        str(spec_path),
        "--no-eval",
        "--json",
        "--home",
        str(home),
    ]


def progress_in_segment_2(home, s) -> bool:
    p = home / "runs" / s["name"] / "activity" / f"train-{s['steps']:06d}" / "progress-1.jsonl"
    try:
        lines = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        return any(x["step"] > s["eval_every"] for x in lines if "checkpoint" in x)  # checkpoint lines only
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def resumed(pt_home, tmp_path_factory):
    runs = {}
    for kind, s in CTL_SPECS.items():
        home = copy_home(pt_home, tmp_path_factory.mktemp(f"ctl-{kind}") / "home")
        path = write_spec(home, s)
        # the trainer holds one step before its end (TINYLLM_FAULT=trainer.hold, in segment 2): a starved poller
        # cannot let a run finish before its kill; the kill still lands anywhere from segment 2's first
        # checkpoint to the hold. The second command has no hold.
        hold = {**os.environ, "TINYLLM_FAULT": f"trainer.hold@{s['steps'] - 1}"}
        runs[kind] = (
            home,
            path,
            subprocess.Popen(ctl_cmd(home, path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=hold),
        )
    deadline = time.monotonic() + DEADLINE_S
    pending = dict(runs)
    while pending and time.monotonic() < deadline:
        for kind, (home, _, p) in list(pending.items()):
            if progress_in_segment_2(home, CTL_SPECS[kind]) or p.poll() is not None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=60)
                del pending[kind]
        time.sleep(0.02)
    assert not pending, f"no checkpoint in segment 2 in time: {sorted(pending)}"
    for kind, (home, _, p) in runs.items():
        assert p.returncode == -signal.SIGKILL, f"{kind}: ctl ended before the kill: {p.stderr.read()[-2000:]}"
        while runlock.is_locked(home / "runs" / CTL_SPECS[kind]["name"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # the orphaned trainer dies with its worker
    again = {
        kind: subprocess.Popen(ctl_cmd(home, path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for kind, (home, path, _) in runs.items()
    }
    out = {}
    for kind, p in again.items():
        stdout, stderr = p.communicate(timeout=DEADLINE_S)
        assert p.returncode == 0, f"{kind}: {stderr[-2000:]}"
        out[kind] = (runs[kind][0], json.loads(stdout))
    return out


@pytest.mark.parametrize("kind", list(CTL_SPECS))
def test_ctl_train_killed_mid_segment_gives_the_same_final_metrics(resumed, pt_home, tmp_path, kind):
    home, out = resumed[kind]
    assert out["state"] == "completed", out
    res = out["result"]
    base_home = copy_home(pt_home, tmp_path / "base")
    base = train_inprocess(base_home, CTL_SPECS[kind])
    assert (res["final_loss_hex"], res["digest"]) == (base["final_loss_hex"], base["digest"])
    resumed_from = res["segments"][1]["train"]["resumed_from"]
    assert resumed_from is not None and int(resumed_from.rsplit("-", 1)[1]) > CTL_SPECS[kind]["eval_every"]
    name = CTL_SPECS[kind]["name"]
    assert without_timers(frames(home, name)[-1]) == without_timers(frames(base_home, name)[-1])
