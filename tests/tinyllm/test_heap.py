"""tinyllm/heap.py: a training step faults in no fresh pages (freed memory stays in the heap), said in
the 'ready' line; TINYLLM_KEEP_HEAP=0 turns it off. The bits are unaffected (the trainer's runs in
test_resume.py / test_threads.py run with it on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tinyllm import heap
from tl_helpers import REPO, run_tinyllm, write_spec

glibc = pytest.mark.skipif(not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc only")

# the trainer on nanoGPT's recipe shape (activations of ~0.4 MB: above glibc's first mmap threshold),
# in a fresh interpreter; minor page faults over the 16 steps after 4 warm-up steps
FAULTS = """
import json, resource, sys
from pathlib import Path
import tinyllm
from tinyllm.metrics import Reporter
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


def _faults(home, **env) -> float:
    run_env = {**os.environ, "PYTHONPATH": str(REPO), "TINYLLM_THREADS": "1", **env}
    out = subprocess.run([sys.executable, "-c", FAULTS, str(home)], env=run_env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["faults"]


@pytest.mark.slow
@glibc
def test_a_training_step_faults_in_no_fresh_pages(home):
    # measured 185-297 over these 16 steps; without the setting 17,833-18,759 (bursts of 2,000-3,900 faults
    # on about half of the steps, where glibc gave the heap's top back or mapped a block afresh)
    assert _faults(home) < 2000


def test_the_setting_can_be_turned_off():
    got = heap.keep_freed_memory(env={heap.ENV: "0"})
    assert got == {"enabled": False, "reason": f"{heap.ENV}=0"} and heap.status() == got


@pytest.mark.slow
@glibc
def test_the_ready_line_says_what_was_done(home):
    p = run_tinyllm(home, "train", "--spec", str(write_spec(home / "s.json", steps=1)), "--progress",
                    str(home / "p.jsonl"))
    assert p.returncode == 0, p.stderr
    ready = [json.loads(x) for x in (home / "p.jsonl").read_text().splitlines() if '"ready"' in x][-1]
    assert ready["heap"]["enabled"] is True and ready["heap"]["mmap_threshold"] == heap.MMAP_THRESHOLD_BYTES
