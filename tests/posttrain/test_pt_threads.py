"""Each post-training objective gives the same bits for 1, 2 and 3 torch threads (the count is
chosen by load at each start, tinyllm/runtime_env.py; a spec's threads is only the most it uses).

Each kind trains in a child process: MKL's strict CNR mode (MKL_CBWR, applied when the trainer
starts, tinyllm/runtime_env.py) is fixed at MKL's first call, and this pytest process may have run
tensor math first (then MKL's gemm differs at 3 threads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one child process per objective

HERE = Path(__file__).resolve().parent
CHILD = r"""
import json, sys
from pt_helpers import copy_home, spec, train_inprocess
from test_pt_threads import bigger
pt_home, tmp, kind = sys.argv[1:4]
got = {}
for t in (1, 2, 3):
    r = train_inprocess(copy_home(Path(pt_home), Path(tmp) / f"home{t}"), bigger(spec(kind), t))
    got[t] = [r["final_loss_hex"], r["digest"]]
print(json.dumps(got))
""".replace("import json, sys", "import json, sys\nfrom pathlib import Path")


def bigger(d: dict, threads: int) -> dict:
    """10 steps (AdamW's first updates are about sign(g): a last-bit gradient difference hides there)
    and, for the RL objectives, more and longer rollouts, so LayerNorm sums over enough rows."""
    d = {**d, "threads": threads, "steps": 10}
    if "rl" in d:
        d["batch_size"] = 4
        d["rl"] = {**d["rl"], "n_mini": 1, "sampling": {"max_tokens": 8}}
    if d["objective"] == "grpo":  # the tiny base's rewards are all equal (zero advantages): the KL term
        d["ref"], d["rl"]["kl_beta"] = {"build_ref": True}, 0.5  # gives the gradient
    return d


@pytest.mark.parametrize("kind", ["dpo", "grpo", "opd"])
def test_objective_is_the_same_bits_for_1_2_3_threads(pt_home, tmp_path, kind):
    repo = str(HERE.parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), repo, os.environ.get("PYTHONPATH", "")])}
    env.pop("MKL_CBWR", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(pt_home), str(tmp_path), kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["2"] == got["1"] and got["3"] == got["1"], got
