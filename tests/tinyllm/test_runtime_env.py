"""tinyllm/runtime_env.py: what a run's process is set up with when it starts (never on import), and
the thread-invariance setting (MKL's strict CNR mode) applied and checked, in real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tl_helpers import REPO, last_json, run_tinyllm, tinyllm_cmd, write_spec

from tinyllm import runtime_env

CLEAN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_CBWR", "TINYLLM_THREADS")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {**env, "PYTHONPATH": str(REPO), **extra}


@pytest.mark.parametrize(
    "busy, cpus, most, threads, policy",
    [
        (0, 2, 2, 2, "ACTIVE"),
        (1, 2, 2, 1, "ACTIVE"),
        (3, 2, 2, 1, "PASSIVE"),
        (0.0, 16, 4, 4, "ACTIVE"),
        (10, 16, 8, 6, "ACTIVE"),
        (None, 2, 2, 2, "PASSIVE"),
        (0, 1, 4, 1, "ACTIVE"),
        (1.5, 2, 2, 1, "PASSIVE"),
    ],
)
def test_threads_are_the_free_cpus_and_spin_only_where_each_has_one(busy, cpus, most, threads, policy):
    got = runtime_env.choose(busy, cpus, most, None)
    assert (got["threads"], got["wait_policy"]) == (threads, policy), got


def test_a_pinned_count_wins_and_the_policy_is_chosen_for_it():
    got = runtime_env.choose(0.0, 2, 2, 3)
    assert (got["threads"], got["wait_policy"]) == (3, "PASSIVE") and "TINYLLM_THREADS=3" in got["threads_reason"]


@pytest.mark.parametrize("raw, want", [("auto", None), ("", None), ("2", 2), ("0", None), ("x", None), ("-1", None)])
def test_pinned_threads_env(raw, want):
    assert runtime_env.pinned_threads({runtime_env.THREADS_ENV: raw}) == want


def test_prepare_sets_what_libgomp_and_mkl_read_and_a_users_setting_wins():
    env: dict = {}
    got = runtime_env.prepare(2, env=env, busy=lambda: 0.0, modules={})
    assert env == {"MKL_CBWR": "AUTO,STRICT", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}
    assert (
        got["omp"]["threads"] == min(2, runtime_env.cpu_count())
        and runtime_env.train_threads(2) == got["omp"]["threads"]
    )
    assert runtime_env.train_threads(4) == 4  # another spec's maximum (an in-process caller): its own
    env = {"OMP_WAIT_POLICY": "passive", "MKL_CBWR": "AVX2,STRICT"}
    got = runtime_env.prepare(2, env=env, busy=lambda: 0.0, modules={})
    assert env == {"OMP_WAIT_POLICY": "passive", "MKL_CBWR": "AVX2,STRICT"}
    assert got["omp"]["wait_policy"] == "passive" and "set in the environment" in got["omp"]["reason"]
    env = {}
    assert (
        runtime_env.prepare(2, env=env, busy=lambda: 0.0, modules={"torch": None})["omp"]["reason"]
        == "torch was loaded before the run started"
    )
    assert env == {"MKL_CBWR": "AUTO,STRICT"}  # the wait policy would come too late for libgomp


@pytest.mark.slow
def test_importing_tinyllm_sets_nothing():
    code = "import os, tinyllm, tinyllm.spec, tinyllm.cli; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (
        CLEAN,
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout).values()) == {None}


# A user's script that imports torch before the helper (the usual shape): the setting still applies
# when the run starts, because MKL reads MKL_CBWR at its first call; a script that ran tensor math
# first gets one warning, once (two DurableRuns here), and its run goes on.
DURABLE = r"""
import sys, torch
if sys.argv[2] == "math first":
    torch.randn(64, 64) @ torch.randn(64, 64)
from tinyllm import runtime_env
from tinyllm.durable import DurableRun
for _ in range(2):
    DurableRun({"name": "x", "steps": 1}, home=sys.argv[1])
print(runtime_env.mkl_mode())
"""
WARNING = "tinyllm: warning: MKL runs without strict CNR mode"


@pytest.mark.slow
def test_durable_run_applies_the_setting_after_import_torch_and_warns_once_when_too_late(tmp_path):
    applied = subprocess.run(
        [sys.executable, "-c", DURABLE, str(tmp_path), "torch first"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    late = subprocess.run(
        [sys.executable, "-c", DURABLE, str(tmp_path), "math first"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert applied.returncode == 0 and late.returncode == 0, applied.stderr + late.stderr
    if applied.stdout.strip() == "unknown":
        pytest.skip("torch without MKL here")
    assert applied.stdout.strip() == "strict" and WARNING not in applied.stderr, applied.stderr
    assert late.stdout.strip() == "not strict" and late.stderr.count(WARNING) == 1, late.stderr
    assert "MKL ran before the run started" in late.stderr


@pytest.mark.slow
def test_tinyllm_train_runs_in_strict_mode_and_says_what_it_chose(home):
    progress = home / "p.jsonl"
    p = run_tinyllm(home, "train", "--spec", str(write_spec(home / "s.json", steps=1)), "--progress", str(progress))
    assert p.returncode == 0 and WARNING not in p.stderr, p.stderr
    ready = [json.loads(x) for x in progress.read_text().splitlines() if '"ready"' in x][-1]
    assert ready["omp"]["mkl_mode"] in ("strict", "unknown"), ready  # "unknown": torch without MKL
    assert ready["omp"]["mkl_cbwr"] == os.environ.get("MKL_CBWR", "AUTO,STRICT") and ready["omp"]["threads"] >= 1
    if os.confstr("CS_GNU_LIBC_VERSION"):
        assert ready["heap"]["enabled"] is True, ready
    assert "torch_defer" not in ready and "torch_preload" not in ready
    assert last_json(p.stdout)["steps"] == 1


@pytest.mark.slow
def test_both_policies_train_bit_for_bit_alike_and_say_which_ran(home):
    """Real trainers on 2 threads, one per policy (the user's setting): same loss and weights."""
    spec = write_spec(home / "two-threads.json", threads=2, steps=6, checkpoint_every=6)
    results, ready = {}, {}
    for policy in ("ACTIVE", "PASSIVE"):
        home_p = home / policy
        home_p.mkdir()
        (home_p / "corpora").symlink_to(home / "corpora")
        progress = home_p / "progress.jsonl"
        proc = subprocess.run(
            tinyllm_cmd("train", "--spec", str(spec), "--progress", str(progress), "--home", str(home_p)),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=home_p,
            env=_env(OMP_WAIT_POLICY=policy, TINYLLM_THREADS="2"),
        )  # the count pinned
        assert proc.returncode == 0, proc.stderr
        results[policy] = last_json(proc.stdout)
        ready[policy] = next(json.loads(x) for x in progress.read_text().splitlines() if '"ready"' in x)["omp"]
    a, p = results["ACTIVE"], results["PASSIVE"]
    assert (a["final_loss_hex"], a["digest"]) == (p["final_loss_hex"], p["digest"])
    assert ready["ACTIVE"]["wait_policy"] == "ACTIVE" and ready["PASSIVE"]["wait_policy"] == "PASSIVE"
    assert ready["ACTIVE"]["threads"] == 2 and "set in the environment" in ready["ACTIVE"]["reason"]


# the trainer on nanoGPT's recipe shape (activations of ~0.4 MB: above glibc's first mmap threshold),
# in a fresh interpreter; minor page faults over the 16 steps after 4 warm-up steps
FAULTS = """
import json, resource, sys
from pathlib import Path
from tinyllm import runtime_env
if sys.argv[2] == "keep":
    runtime_env.prepare(1)
from tinyllm.sinks.metrics import Reporter
from tinyllm.spec import parse_train_spec
from tinyllm.trainer import Trainer
spec = parse_train_spec({"name": "heap", "steps": 20, "corpus": "default", "seed": 7, "batch_size": 12, "threads": 1,
                         "checkpoint_every": 1000, "log_every": 1000,
                         "model": {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0}})
faults = []
class Counting(Reporter):
    def report(self, step, frame):
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
Trainer(spec, Path(sys.argv[1])).run(reporter=Counting([]))
per_step = [b - a for a, b in zip(faults[3:], faults[4:])]
print(json.dumps({"faults": sum(per_step)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc only")
def test_a_training_step_faults_in_no_fresh_pages(home):
    # measured 185-297 over these 16 steps; without the setting 17,833-18,759 (bursts of 2,000-3,900 faults
    # on about half of the steps, where glibc gave the heap's top back or mapped a block afresh)
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, str(home), "keep"],
        env=_env(TINYLLM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out.stdout)["faults"] < 2000
