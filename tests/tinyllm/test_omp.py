"""The OpenMP wait policy (tinyllm/omp.py): chosen by machine load, an explicit setting wins, and
either policy trains bit for bit the same. The load is faked (a stand-in for /proc/stat's
procs_running) where the choice is the point; the bitwise check runs real trainers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tinyllm import omp
from tl_helpers import REPO, last_json, run_tinyllm, write_spec


@pytest.fixture(autouse=True)
def _keep_this_process_choice(monkeypatch):
    monkeypatch.setattr(omp, "_CHOSEN", dict(omp._CHOSEN))  # configure() below rebinds it; restored after


def fake_load(*readings):
    it = iter(readings)
    return lambda: next(it)


@pytest.mark.parametrize("busy, cpus, threads, policy", [
    (0, 2, 2, "ACTIVE"), (0.0, 16, 2, "ACTIVE"), (14, 16, 2, "ACTIVE"),
    (1, 2, 2, "PASSIVE"), (15, 16, 2, "PASSIVE"), (8, 2, 2, "PASSIVE"), (1, 2, 1, "ACTIVE"), (None, 2, 2, "PASSIVE"),
])
def test_choose_spins_only_where_every_thread_has_a_free_cpu(busy, cpus, threads, policy):
    assert omp.choose(busy, cpus, threads)[0] == policy


def test_busy_tasks_is_the_median_reading_less_this_process():
    assert omp.busy_tasks(fake_load(1, 1, 9, 1, 1), gap_s=0) == 0  # one spike is not a busy machine
    assert omp.busy_tasks(fake_load(2, 2, 1, 2, 1), gap_s=0) == 1  # a competitor that blocked for a moment still is
    assert omp.busy_tasks(fake_load(3, 4, 3, 1, 3), gap_s=0) == 2
    assert omp.busy_tasks(fake_load(None), gap_s=0) is None  # no /proc: unknown, so PASSIVE
    assert omp.read_procs_running("/nonexistent/stat") is None
    assert omp.read_procs_running() >= 1  # the real /proc/stat counts at least this process


def configure(env, load, cpus=2, threads=2, modules=()):
    return omp.configure(env=env, modules=dict.fromkeys(modules), busy=lambda: load, cpus=cpus, threads=threads)


def test_idle_machine_spins_briefly_and_a_busy_one_sleeps():
    env = {}
    got = configure(env, load=0)
    assert got["wait_policy"] == "ACTIVE" and env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert env["GOMP_SPINCOUNT"] == omp.ACTIVE_SPINS and got["spin_count"] == omp.ACTIVE_SPINS  # ~3 ms, not 5 min
    env = {}
    got = configure(env, load=3)
    assert got["wait_policy"] == "PASSIVE" and env["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in env
    assert "3 other runnable tasks + 2 threads exceed 2 CPUs" in got["reason"]


def test_an_explicit_user_setting_wins_over_the_load():
    for env, policy in [({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE"),
                        ({"TINYLLM_OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
                        ({"TINYLLM_OMP_WAIT_POLICY": "passive"}, "PASSIVE")]:
        for load in (0, 50):
            e = dict(env)
            assert configure(e, load=load)["wait_policy"] == policy, (env, load)
            assert e["OMP_WAIT_POLICY"] == policy
    e = {"GOMP_SPINCOUNT": "1000"}  # the user's spin count: left alone, no policy added
    got = configure(e, load=0)
    assert e == {"GOMP_SPINCOUNT": "1000", "MKL_CBWR": "AUTO,STRICT"} and "GOMP_SPINCOUNT=1000 set in the environment" in got["reason"]


def test_a_child_decides_again_unless_the_user_changed_what_the_parent_chose():
    parent = {}
    configure(parent, load=0)  # a worker started on an idle machine...
    child = dict(parent)
    assert configure(child, load=5)["wait_policy"] == "PASSIVE"  # ...starts a trainer on a busy one
    assert "GOMP_SPINCOUNT" not in child and child["OMP_WAIT_POLICY"] == "PASSIVE"
    child = dict(parent, OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="5")  # the user's, though the mark is there
    got = configure(child, load=0)
    assert got["wait_policy"] == "PASSIVE" and child["GOMP_SPINCOUNT"] == "5"


def test_after_torch_loaded_it_only_reports():
    env = {}
    configure(env, load=0)
    assert configure(env, load=9, modules=["torch"])["wait_policy"] == "ACTIVE"  # what libgomp was given
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"
    omp._CHOSEN = {}  # a process that imported torch before tinyllm
    got = configure({}, load=0, modules=["torch"])
    assert got["reason"] == "torch was imported before tinyllm"


def test_a_bad_override_warns_and_chooses(capsys):
    assert configure({"TINYLLM_OMP_WAIT_POLICY": "fast"}, load=0)["wait_policy"] == "ACTIVE"
    assert "is not ACTIVE, PASSIVE or auto" in capsys.readouterr().err


@pytest.mark.slow
def test_importing_tinyllm_sets_the_policy_before_torch():
    """A real interpreter: the package sets it at import; the user's value is left as it is."""
    code = "import os, sys, tinyllm; assert 'torch' not in sys.modules; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "TINYLLM_OMP"))}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() in omp.POLICIES, out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "passive"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "passive", out.stderr


@pytest.mark.slow
def test_both_policies_train_bit_for_bit_alike_and_say_which_ran(home, monkeypatch):
    """Real trainers on 2 threads, one per policy (the user's setting): same loss and weights."""
    spec = write_spec(home / "two-threads.json", threads=2, steps=6, checkpoint_every=6)
    results, ready = {}, {}
    # a user's shell: none of this (pytest) process's own automatic choice. On an idle machine that
    # choice is ACTIVE, marked as tinyllm's; a child handed ACTIVE with that mark decides again
    for name in [k for k in os.environ if k.startswith(("OMP_WAIT_POLICY", "GOMP_", omp.MARK_ENV))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(omp.THREADS_ENV, "2")  # about the policy: the count pinned, not chosen by the machine's load
    for policy in omp.POLICIES:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
        home_p = home / policy
        home_p.mkdir()
        (home_p / "corpora").symlink_to(home / "corpora")
        progress = home_p / "progress.jsonl"
        proc = run_tinyllm(home_p, "train", "--spec", str(spec), "--progress", str(progress))
        assert proc.returncode == 0, proc.stderr
        results[policy] = last_json(proc.stdout)
        ready[policy] = next(json.loads(x) for x in progress.read_text().splitlines() if '"ready"' in x)["omp"]
    a, p = results["ACTIVE"], results["PASSIVE"]
    assert (a["final_loss_hex"], a["digest"]) == (p["final_loss_hex"], p["digest"])
    assert ready["ACTIVE"]["wait_policy"] == "ACTIVE" and ready["PASSIVE"]["wait_policy"] == "PASSIVE"
    assert ready["ACTIVE"]["threads"] == 2 and "set in the environment" in ready["ACTIVE"]["reason"]
