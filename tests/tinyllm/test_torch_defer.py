"""tinyllm/torch_defer.py: ``tinyllm train`` runs torch's tracing-only modules (torch.export, the python
meta kernels) only when something touches them. A real resumed trainer says which were deferred, never
runs them, and trains bit for bit as with the deferral off; whatever needs them gets them when it
touches them (the same resume with tinyllm/torch_preload.py off too: bitwise the same). Each check runs
in a fresh interpreter: what torch has run is process-wide state."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tl_helpers import REPO, write_spec

from tinyllm import torch_defer

DEFERRED = sorted(torch_defer.DEFERRED)


def run_python(code: str, *args: str, **env: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# the real CLI in this process, then what ran: the result line, then the deferral's state at the end
TRAIN = """
import json, sys, types
from tinyllm.cli import main
try:
    main(["train", "--spec", sys.argv[1], "--home", sys.argv[2], "--progress", sys.argv[3]], standalone_mode=False)
except SystemExit as e:
    assert not e.code, e.code
from tinyllm import torch_defer
print(json.dumps({**torch_defer.status(), "run": sorted(n for n in torch_defer.DEFERRED
                  if type(sys.modules.get(n, getattr(sys.modules["torch"], n.rpartition(".")[2], None))) is types.ModuleType)}))
"""


def _ready(progress) -> dict:
    return [json.loads(line) for line in progress.read_text().splitlines() if '"ready"' in line][-1]


@pytest.mark.slow
def test_a_resumed_trainer_defers_and_trains_bit_for_bit_as_with_it_off(home, tmp_path):
    spec = write_spec(home / "s.json", steps=2, checkpoint_every=1)
    run_python(TRAIN, str(spec), str(home), str(home / "p0.jsonl"))
    write_spec(spec, steps=3, checkpoint_every=1)
    off_home = tmp_path / "off"
    shutil.copytree(home, off_home)  # the same checkpoint at step 2, resumed both ways
    on_result, on = run_python(TRAIN, str(spec), str(home), str(home / "p.jsonl"),
                               TINYLLM_TORCH_PRELOAD="1")  # whatever the load
    off_result, off = run_python(TRAIN, str(off_home / "s.json"), str(off_home), str(off_home / "p.jsonl"),
                                 TINYLLM_TORCH_DEFER="0", TINYLLM_TORCH_PRELOAD="0")  # and torch_preload.py off
    assert on_result["resumed_from"] == off_result["resumed_from"] == "runs/small/ckpt/step-000002"
    assert (on_result["final_loss_hex"], on_result["digest"]) == (off_result["final_loss_hex"], off_result["digest"])
    # the guard: deferred before the first step (the ready line) and still never run after steps and a checkpoint
    assert _ready(home / "p.jsonl")["torch_defer"] == {"enabled": True, "reason": "torch 2.13.0",
                                                       "deferred": DEFERRED, "executed": []}
    assert on["deferred"] == DEFERRED and on["run"] == []
    assert _ready(off_home / "p.jsonl")["torch_defer"]["enabled"] is False
    preload = _ready(home / "p.jsonl")["torch_preload"]  # its libraries were the ones torch imported
    assert preload["enabled"] is True and preload["same_file"] is True, preload
    assert _ready(off_home / "p.jsonl")["torch_preload"] == {"enabled": False, "reason": "TINYLLM_TORCH_PRELOAD=0"}
    assert off["reason"] == "TINYLLM_TORCH_DEFER=0" and off["run"] == DEFERRED  # torch imported as it is


TOUCH = """
import json, sys, types
from tinyllm import torch_defer
torch_defer.install()
import torch
torch_defer.after_import()
out = {"before": torch_defer.status()["deferred"]}
g = torch.Generator()
g.manual_seed(3)
out["generator"] = torch.randn(4, generator=g).tolist()  # eager code needs Generator() while deferred
x = torch.empty(16, device="meta")
try:
    torch.histc(x)  # only a python meta kernel: not there while deferred (the documented gap)
    out["meta_before"] = "ran"
except NotImplementedError:
    out["meta_before"] = "NotImplementedError"
""" + """
how = sys.argv[1]
if how == "fake":
    from torch._subclasses import FakeTensorMode
    with FakeTensorMode():
        y = torch.nn.functional.layer_norm(torch.randn(2, 4), (4,))
    out["fake"] = [type(y).__name__, list(y.shape)]
elif how == "consumer":
    import torch._decomp  # what tracing imports: everything deferred runs after it, into one torch._decomp
    out["one_decomp"] = sys.modules["torch._meta_registrations"].global_decomposition_table is \
        sys.modules["torch._decomp"].global_decomposition_table
elif how == "submodule":
    import torch.export.graph_signature as g
    out["one_class"] = torch.export.ExportGraphSignature is g.ExportGraphSignature is \\
        sys.modules["torch.export.graph_signature"].ExportGraphSignature
out["after"] = torch_defer.status()
g = torch.Generator()
g.manual_seed(3)
out["generator_after"] = torch.randn(4, generator=g).tolist()
out["meta_after"] = list(torch.histc(x).shape)
out["modules"] = all(sys.modules[n] is getattr(sys.modules[n.rpartition(".")[0]], n.rpartition(".")[2])
                     and type(sys.modules[n]) is types.ModuleType for n in torch_defer.DEFERRED)
print(json.dumps(out))
"""


def _touched(how: str) -> dict:
    (got,) = run_python(TOUCH, how)
    assert got["before"] == DEFERRED
    assert got["meta_before"] == "NotImplementedError"
    assert got["after"]["deferred"] == [] and got["after"]["executed"] == DEFERRED, f"{how} did not run them"
    assert got["meta_after"] == [100], "the python meta kernels must be registered once they ran"
    assert got["generator"] == got["generator_after"]
    assert got["modules"], "each ran in the object bound on its parent, and is in sys.modules again"
    return got


@pytest.mark.slow
def test_a_fake_tensor_mode_runs_what_was_deferred_first():
    assert _touched("fake")["fake"] == ["FakeTensor", [2, 4]]


@pytest.mark.slow
def test_importing_a_consumer_or_a_submodule_runs_them_once():
    assert _touched("consumer")["one_decomp"] is True
    assert _touched("submodule")["one_class"] is True  # the parent package ran first, its submodule once


def test_it_is_not_installed_where_what_it_relies_on_differs(monkeypatch):
    monkeypatch.setattr(torch_defer, "_torch_version", lambda: "9.9.9")
    before = list(sys.meta_path)
    got = torch_defer.install()
    assert got["enabled"] is False and "9.9.9" in got["reason"]
    assert sys.meta_path == before
    monkeypatch.setenv(torch_defer.ENV, "0")
    assert torch_defer.install()["reason"] == "TINYLLM_TORCH_DEFER=0"
