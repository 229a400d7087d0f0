"""tinyllm/torch_preload.py: ``tinyllm train`` loads torch's native libraries in its main thread while a
helper thread reads the spec. The real CLI, in a fresh interpreter, stopped right after that step: the
OpenMP policy libgomp loaded with is the one chosen for the spec's threads, the helper imported no C
extension module (it would wait for the loader's lock), torch is not imported yet, and a bad spec's
error still comes back as one line. (Bitwise on/off: the resumed trainer of test_torch_defer.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tl_helpers import REPO, write_spec

from tinyllm import torch_preload

# the real `tinyllm train` up to the end of the preload, then one JSON line of what happened
UNTIL_LOADED = """
import importlib.machinery, json, os, sys, threading
from tinyllm import cli, omp, torch_preload
choose = omp.choose  # the spec's 1 thread spins (ACTIVE), as on an idle machine; 1000 threads never fit
omp.choose = lambda busy, cpus, threads: choose(0.0, max(cpus, 2), threads) if threads == 1 else choose(busy, cpus, threads)
helper_extensions = []
create = importlib.machinery.ExtensionFileLoader.create_module
def spy(self, spec):
    if threading.current_thread().name == "tinyllm-spec":
        helper_extensions.append(spec.name)
    return create(self, spec)
importlib.machinery.ExtensionFileLoader.create_module = spy
real = torch_preload.while_loading
def stop(work):
    read = real(work)
    try:
        got = type(read.result()).__name__
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    print(json.dumps({"status": torch_preload.status(), "helper_extensions": helper_extensions, "spec": got,
                      "torch_imported": "torch" in sys.modules}), flush=True)
    raise SystemExit(0)
torch_preload.while_loading = stop
cli.main(["train", "--spec", sys.argv[1], "--home", sys.argv[2]], standalone_mode=False)
"""


def until_loaded(spec, home) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "TINYLLM_"))}
    # importing tinyllm decides with OMP_NUM_THREADS threads: 1000 never fit (PASSIVE); libgomp prints
    # the policy it loaded with (OMP_DISPLAY_ENV): ACTIVE only if the CLI chose for the spec's 1 thread first
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1000", OMP_DISPLAY_ENV="verbose",
               TINYLLM_TORCH_PRELOAD="1")  # whatever the machine's load (auto: tested below)
    out = subprocess.run([sys.executable, "-c", UNTIL_LOADED, str(spec), str(home)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.slow
def test_the_libraries_load_with_the_specs_policy_while_the_helper_reads_the_spec(tmp_path):
    spec = write_spec(tmp_path / "s.json", threads=1)
    got, stderr = until_loaded(spec, tmp_path)
    assert got["status"]["enabled"] is True and got["status"]["load_s"] > 0, got
    assert got["spec"] == "TrainSpec" and got["torch_imported"] is False
    assert got["helper_extensions"] == []  # EXTENSIONS covers the spec's path: the helper never waited
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in stderr, stderr[-2000:]  # libgomp loaded after the choice
    assert "GOMP_SPINCOUNT = '300000'" in stderr


@pytest.mark.slow
def test_a_bad_spec_fails_after_the_load_as_it_did_before(tmp_path):
    spec = write_spec(tmp_path / "s.json", threads=1, stpes=3)
    got, _ = until_loaded(spec, tmp_path)
    assert got["status"]["enabled"] is True
    assert got["spec"].startswith("SpecError: invalid train spec: stpes: unknown field"), got


@pytest.mark.parametrize("content,env,reason", [
    ({"threads": 2}, {torch_preload.ENV: "0"}, "TINYLLM_TORCH_PRELOAD=0"),
    ({"threads": 2, "distributed": {"world_size": 2}}, {}, "distributed spec"),
    ({"threads": "2"}, {}, "threads invalid"),
    ({"threads": 0}, {}, "threads invalid"),
    ([1, 2], {}, "not a JSON object"),
    ("{not json", {}, "unreadable"),
    ({"threads": 2}, {"TORCH_USE_RTLD_GLOBAL": "1"}, "TORCH_USE_RTLD_GLOBAL"),
])
def test_plan_leaves_the_loading_to_torch_where_it_does_not_apply(tmp_path, content, env, reason):
    path = tmp_path / "s.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert torch_preload.plan(str(path), env=env, modules={}) is None
    assert not torch_preload.status()["enabled"] and reason in torch_preload.status()["reason"]
    assert torch_preload.while_loading(lambda: 7).result() == 7  # then the work runs in this thread
    assert torch_preload.plan(str(tmp_path / "missing.json"), env={}, modules={}) is None


def test_plan_reads_the_threads_or_the_specs_default(tmp_path):
    from tinyllm.spec import TrainSpec

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "x", "steps": 1}))
    on = {torch_preload.ENV: "1"}
    assert torch_preload.plan(str(path), env=on, modules={}) == TrainSpec.model_fields["threads"].default
    path.write_text(json.dumps({"name": "x", "steps": 1, "threads": 3}))
    assert torch_preload.plan(str(path), env=on, modules={}) == 3
    assert torch_preload.status()["enabled"] is True
    assert torch_preload.plan(str(path), env=on, modules={"torch": object()}) is None  # too late


def test_auto_preloads_only_where_a_cpu_is_free_for_the_second_thread(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "x", "steps": 1, "threads": 2}))
    assert torch_preload.plan(str(path), env={}, modules={}, busy=lambda: 0.0, cpus=2) == 2
    assert torch_preload.plan(str(path), env={}, modules={}, busy=lambda: 1.0, cpus=2) is None
    assert "1 other runnable tasks + 2 threads exceed 2 CPUs" in torch_preload.status()["reason"]
    assert torch_preload.plan(str(path), env={}, modules={}, busy=lambda: None, cpus=8) is None  # unknown
    assert torch_preload.plan(str(path), env={}, modules={}, busy=lambda: 1.0, cpus=4) == 2
    assert torch_preload.plan(str(path), env={torch_preload.ENV: "1"}, modules={}, busy=lambda: 9.0, cpus=2) == 2
