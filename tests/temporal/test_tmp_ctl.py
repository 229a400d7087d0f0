"""``ctl --backend temporal`` end to end with real processes on a real dev server: nothing is faked
(ctl, its Temporal worker, the subprocess runner, tinyllm and torch all run).

- ``ctl train`` (its worker) SIGKILLed in the middle of segment 2, then the same command (a new
  worker): the same ``final_loss_hex`` and digest as the embedded engine's run of the same spec,
  each evaluation completed once in Temporal's history, segment 2 redelivered (attempt 2) from
  the last heartbeated checkpoint.
- ``ctl cancel`` in the middle of a (long, single) segment: exit 130, checkpoints kept, the same
  command continues as ``train/mini/2`` and ends with the same loss bits as the embedded run.
- ``$CTL_TEMPORAL_API_KEY`` is never printed, logged, written under the home, or recorded in
  the workflow's history or the server's state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the [temporal] extra is not installed: pip install -e '.[temporal]'")

from no_leak import assert_secret_nowhere  # noqa: E402
from tinyllm import runlock  # noqa: E402

pytestmark = pytest.mark.slow  # real ctl processes on a real Temporal dev server

SPEC = {
    "name": "mini",
    "steps": 24,
    "seed": 5,
    "eval_every": 12,
    "eval_interval_seconds": 0,
    "checkpoint_every": 3,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 3,
    "lr_decay_steps": 24,
    "threads": 1,
    "log_every": 6,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
}
# one long segment (a cancel reaches an activity only with a heartbeat's answer: after the trainer's
# next progress line)
LONG_SPEC = {**SPEC, "steps": 120, "eval_every": 0, "lr_decay_steps": 120}
HOLD_STEP = 6  # TINYLLM_FAULT=trainer.hold (tinyllm/faults.py): the canceled run waits there, a checkpoint behind it
DEADLINE_S = 240
SECRET = "ctl-test-api-key-7f3a9c1e5b"
HEARTBEAT_S = "25"  # a dead worker's segment moves on after this; above a loaded machine's torch import (no line then)


class Ctl:
    """ctl on the temporal backend of one namespace, one home; every output kept (the secret check)."""

    def __init__(self, server, namespace: str, home: Path):
        self.home = home
        self.env = {
            **os.environ,
            "CTL_TEMPORAL_ADDRESS": server.address,
            "CTL_TEMPORAL_NAMESPACE": namespace,
            "CTL_TEMPORAL_API_KEY": SECRET,
            "PYTHONPATH": os.getcwd(),
            "OMP_NUM_THREADS": "1",
        }
        self.env.pop("CTL_BACKEND", None)
        self.outputs: list[str] = []

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ctl.cli", "--backend", "temporal", "--no-tls", *args, "--home", str(self.home)]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A process for train (it runs a worker and its trainers); in process for the quick commands."""
        if args[0] == "train":
            p = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=DEADLINE_S * 2, env=self.env)
        else:
            from click.testing import CliRunner

            from ctl.cli import main

            r = CliRunner().invoke(main, self.argv(*args)[3:], env=self.env, catch_exceptions=False)
            p = subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
        self.outputs += [p.stdout, p.stderr]
        if check and p.returncode != 0:
            raise AssertionError(f"ctl {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
        return p

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**self.env, **(env or {})}
        )

    def finish(self, proc: subprocess.Popen, timeout_s: float = DEADLINE_S) -> tuple[str, str]:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        self.outputs += [stdout, stderr]
        return stdout, stderr

    def history(self, wid: str) -> list[dict]:
        return json.loads(self.run("history", wid, "--json").stdout)["events"]


def train_args(spec_path: Path, evals: bool = True) -> list[str]:
    """Evaluations (ppl on 4 windows) only where the test counts them."""
    return [
        "train",
        "--spec",
        str(spec_path),
        *(["--eval-max-items", "4"] if evals else ["--no-eval"]),
        "--heartbeat-timeout",
        HEARTBEAT_S,
        "--json",
    ]


def make_home(tmp_path_factory, label: str, spec: dict | None = None) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp(label)
    spec_path = home / "mini.json"
    spec_path.write_text(json.dumps(spec or SPEC))
    return home, spec_path


def wait_for(cond, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ctl ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)  # a poll interval, not a wait for the outcome
    raise AssertionError(f"timed out waiting for {what}")


def checkpoints_in_segment_2(home: Path, attempt: int = 1) -> list[int]:
    progress = home / f"runs/mini/activity/train-000024/progress-{attempt}.jsonl"
    try:
        lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []
    return [x["step"] for x in lines if "checkpoint" in x and 12 < x["step"] <= 24]  # not the liveness lines


def start_reference(tmp_path_factory, label: str, spec: dict):
    """The embedded engine's uninterrupted run of ``spec`` (no evaluations: they do not change the
    training), started at once, alongside the Temporal runs; returns (process, result function)."""
    home, spec_path = make_home(tmp_path_factory, label, spec)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    env.pop("CTL_BACKEND", None)
    proc = subprocess.Popen(
        [
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
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    cache: dict = {}

    def result() -> dict:
        if not cache:
            stdout, stderr = proc.communicate(timeout=DEADLINE_S * 2)
            assert proc.returncode == 0, stderr[-2000:]
            cache.update(json.loads(stdout)["result"])
        return cache

    return proc, result


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    started = {
        "kill": start_reference(tmp_path_factory, "ref", SPEC),
        "cancel": start_reference(tmp_path_factory, "ref-long", LONG_SPEC),
    }
    yield {k: result for k, (_, result) in started.items()}
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def killed_run(temporal_server, tmp_path_factory):
    """ctl train SIGKILLed mid segment 2, then the same command; what it printed and recorded."""
    home, spec_path = make_home(tmp_path_factory, "kill")
    ctl = Ctl(temporal_server, "kill", home)
    # held at step 18 (TINYLLM_FAULT=trainer.hold) until killed: segment 2 cannot end before the kill lands
    proc = ctl.spawn(*train_args(spec_path), env={"TINYLLM_FAULT": "trainer.hold@18"})
    killed_after = max(wait_for(lambda: checkpoints_in_segment_2(home), "a checkpoint in segment 2", proc))
    os.kill(proc.pid, signal.SIGKILL)
    ctl.finish(proc, timeout_s=30)
    assert proc.returncode == -signal.SIGKILL
    wait_for(lambda: not runlock.is_locked(home / "runs/mini"), "the killed worker's trainer to die")
    latest_at_kill = (home / "runs/mini/ckpt/LATEST").read_text().strip()
    again = json.loads(ctl.run(*train_args(spec_path)).stdout)  # the same command: a new worker
    return {
        "ctl": ctl,
        "out": again,
        "killed_after": killed_after,
        "latest_at_kill": latest_at_kill,
        "events": ctl.history("train/mini"),
    }


@pytest.mark.ns("kill")
def test_worker_killed_mid_segment_resumes_bitwise(killed_run, references) -> None:
    out, events = killed_run["out"], killed_run["events"]
    assert out["state"] == "completed" and out["workflow_id"] == "train/mini"
    res, ref = out["result"], references["kill"]()
    assert res["final_loss_hex"] == ref["final_loss_hex"]
    assert res["digest"] == ref["digest"]
    assert [s["train"]["digest"] for s in res["segments"]] == [s["train"]["digest"] for s in ref["segments"]]
    completed = [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_completed"]
    assert sorted(completed) == [
        "corpus-default",
        "eval-000012-ppl",
        "eval-000024-ppl",
        "train-000012",
        "train-000024",
    ]  # each once, each evaluation once
    starts = {e["attrs"]["activity_id"]: e["attrs"]["attempt"] for e in events if e["type"] == "activity_started"}
    assert starts["train-000024"] >= 2 and starts["train-000012"] == 1 and starts["eval-000012-ppl"] == 1
    # attempt 2 resumed from the checkpoint heartbeated before the kill: only the steps after it were redone
    latest = killed_run["latest_at_kill"]
    assert int(latest.split("-")[1]) >= killed_run["killed_after"] > 12
    assert res["segments"][1]["train"]["resumed_from"] == f"runs/mini/ckpt/{latest}"


@pytest.mark.ns("kill")
def test_api_key_never_printed_logged_or_recorded(killed_run, temporal_server) -> None:
    ctl = killed_run["ctl"]
    st = ctl.run("status", "train/mini")
    ctl.run("list")
    assert "train/mini" in st.stdout
    assert_secret_nowhere(SECRET, ctl.outputs, ctl.home, temporal_server, "kill", "train/mini")


def checkpoints(home: Path, activity_id: str) -> list[int]:
    progress = home / f"runs/mini/activity/{activity_id}/progress-1.jsonl"
    try:
        return [
            x["step"]
            for x in map(json.loads, filter(str.strip, progress.read_text().splitlines()))
            if "checkpoint" in x and "event" not in x
        ]  # not the resume line
    except (OSError, ValueError):
        return []


@pytest.mark.ns("cancel")
def test_cancel_mid_segment_exits_130_then_same_command_continues(
    temporal_server, tmp_path_factory, references
) -> None:
    home, spec_path = make_home(tmp_path_factory, "cancel", LONG_SPEC)
    ctl = Ctl(temporal_server, "cancel", home)
    # the trainer holds at step 6 (its second checkpoint) until stopped: the cancel lands mid-segment however
    # fast the machine (a race before: 120 tiny steps can end before a cancel's heartbeat answer arrives)
    proc = ctl.spawn(*train_args(spec_path, evals=False), env={"TINYLLM_FAULT": f"trainer.hold@{HOLD_STEP}"})
    wait_for(lambda: checkpoints(home, "train-000120"), "the segment's first checkpoint", proc)
    ctl.run("cancel", "train/mini")
    stdout, stderr = ctl.finish(proc)
    assert proc.returncode == 130, stderr[-2000:]
    out = json.loads(stdout)
    assert out["state"] == "canceled" and out["error"]["type"] == "Canceled"
    ckpts = home / "runs/mini/ckpt"
    latest = (ckpts / "LATEST").read_text().strip()
    assert latest == f"step-{HOLD_STEP:06d}" and (ckpts / latest).is_dir()  # stopped mid-segment, checkpointed
    kept = {p.name for p in ckpts.iterdir() if p.name.startswith("step-")}
    st = ctl.run("status", "train/mini", "--json", check=False)
    assert st.returncode == 130 and json.loads(st.stdout)["state"] == "canceled"
    events = ctl.history("train/mini")
    assert [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_canceled"] == ["train-000120"]

    again = json.loads(ctl.run(*train_args(spec_path, evals=False)).stdout)  # the same command continues
    assert again["state"] == "completed" and again["workflow_id"] == "train/mini/2"
    res, ref = again["result"], references["cancel"]()
    assert res["final_loss_hex"] == ref["final_loss_hex"] and res["digest"] == ref["digest"]
    assert res["segments"][0]["train"]["resumed_from"] == f"runs/mini/ckpt/{latest}"
    assert kept <= {p.name for p in ckpts.iterdir()}  # nothing deleted


def test_ui_serves_the_same_pages_through_the_temporal_backend(killed_run) -> None:
    """``ctl --backend temporal ui``: the runs page and the run's page of the killed-and-resumed run read
    through ctl's read layer from the Temporal server (its two attempts of segment 2 on the timeline)."""
    import re
    import select
    import urllib.error
    import urllib.request

    ctl = killed_run["ctl"]
    proc = subprocess.Popen(
        ctl.argv("ui", "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ctl.env,
        start_new_session=True,
    )
    try:
        banner, url, deadline = "", None, time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 0.2)[0]:
                banner += os.read(proc.stderr.fileno(), 65536).decode("utf-8", "replace")
                m = re.search(r"at (http://\S+/) ", banner)
                url = m.group(1) if m else None
        assert url is not None, f"ctl ui did not start: {banner}"
        with urllib.request.urlopen(url, timeout=30) as r:
            runs = r.read().decode()
        assert 'data-id="train/mini"' in runs and 'data-state="completed"' in runs, runs[-2000:]
        with urllib.request.urlopen(url + "run/train/mini", timeout=30) as r:
            page = r.read().decode()
        assert r.status == 200 and "#2 " in page and "resumed from" in page, page[-3000:]  # segment 2 redelivered
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "run/train/none", timeout=30)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert SECRET not in banner
