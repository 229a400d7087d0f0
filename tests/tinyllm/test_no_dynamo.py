"""tinyllm/runtime_env.py: a trainer never imports torch._dynamo / torch._inductor (seconds of
every start, bench/restart.py), and its optimizer steps equal ``optimizer.step()`` bit for bit.
Each check runs in a fresh interpreter: whether dynamo is loaded is process-wide state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tl_helpers import REPO, write_spec

pytestmark = pytest.mark.slow  # fresh interpreters running the trainer (~7 s each)


def run_python(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


TRAIN_IN_PROCESS = """
import json, sys
from tinyllm.cli import main
try:
    main(["train", "--spec", sys.argv[1], "--home", sys.argv[2]], standalone_mode=False)
except SystemExit:
    pass
import torch
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "inductor": "torch._inductor.config" in sys.modules,
                  "deterministic": torch.are_deterministic_algorithms_enabled()}))
"""


def test_a_resumed_trainer_never_imports_dynamo_and_stays_deterministic(home):
    spec = write_spec(home / "s.json", steps=2, checkpoint_every=1)
    first = run_python(TRAIN_IN_PROCESS, str(spec), str(home))
    write_spec(spec, steps=3, checkpoint_every=1)
    resumed = run_python(TRAIN_IN_PROCESS, str(spec), str(home))  # load_state_dict + step on a resume
    for got in (first, resumed):
        assert got == {"dynamo": False, "inductor": False, "deterministic": True}


STEPS_ALIKE = """
import json, sys, torch
from tinyllm.runtime_env import defer_dynamo_in_optimizers, optimizer_step

def train(step_fn, hook=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    calls = []
    if hook:
        opt.register_step_post_hook(lambda *a: calls.append(1))
    for i in range(5):
        x = torch.randn(32, 8)
        model(x).square().mean().backward()
        step_fn(opt)
        opt.zero_grad(set_to_none=True)
    state = [p.detach().clone() for p in model.parameters()] + [v.clone() for s in opt.state.values() for v in s.values()]
    return state, calls

assert defer_dynamo_in_optimizers() == 4
fast, _ = train(optimizer_step)
dynamo_after_fast = "torch._dynamo" in sys.modules
_, calls = train(optimizer_step, hook=True)  # a step hook: the public path, which calls it
dynamo_after_hook = "torch._dynamo" in sys.modules
ref, _ = train(lambda opt: opt.step())
fn = torch.optim.Optimizer.zero_grad.__wrapped__
print(json.dumps({"dynamo_after_fast": dynamo_after_fast, "hook_calls": len(calls), "dynamo_after_hook": dynamo_after_hook,
                  "equal": all(torch.equal(a, b) for a, b in zip(fast, ref)) and len(fast) == len(ref),
                  "switched": not getattr(getattr(fn, "__dynamo_disable"), "tinyllm_deferred", False)}))
"""


def test_optimizer_step_equals_torch_step_and_yields_to_hooks_and_dynamo():
    got = run_python(STEPS_ALIKE)
    assert got["equal"], "optimizer_step differs from optimizer.step() bit for bit"
    assert got["dynamo_after_fast"] is False
    assert got["hook_calls"] == 5 and got["dynamo_after_hook"] is True  # hooks registered: torch's own step
    assert got["switched"], "once dynamo is loaded, the deferred methods must use torch's own wrapper"
