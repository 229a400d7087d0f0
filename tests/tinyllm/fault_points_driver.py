"""Reach every fault point of tinyllm/faults.py in a real process: ``python fault_points_driver.py CORPORA OUT``.

torch and tinyllm are imported once; then one child is forked per point (a real process, its own
home), which sets ``TINYLLM_FAULT`` to that point and runs the production path that reaches it
(``Trainer``, ``DurableRun``, a checkpoint re-save; each arms from the environment as it starts).
The parent computes nothing before forking (no thread pool to inherit) and prints one JSON object:
point -> {"signal": N or null, "exit": N or null, ...what the child left}, to OUT/report.json.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from tinyllm import checkpoint as ckpt
from tinyllm import faults
from tinyllm.durable import DurableRun
from tinyllm.spec import parse_train_spec
from tinyllm.trainer import Trainer

MODEL = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.0}
BASE = {
    "name": "f",
    "steps": 6,
    "seed": 3,
    "checkpoint_every": 1,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 2,
    "threads": 1,
    "log_every": 1000,
    "model": MODEL,
}
VALIDATION = {
    **BASE,
    "checkpoint_every": 3,  # step 2 validated with a full checkpoint: every phase
    "validation": {
        "enabled": True,
        "data": {"path": "builtin:heldout.txt"},
        "batch_size": 4,
        "max_samples": 6,
        "every_steps": 2,
        "save_checkpoint": True,
    },
}
RETENTION = {**BASE, "keep_checkpoints": {"last": 1, "boundaries": False}}  # step-000001 pruned at step 2
DURABLE = {"name": "d", "steps": 4, "checkpoint_every": 2}


def train(home: Path, spec: dict) -> int:
    result = Trainer(parse_train_spec(spec), home, log=io.StringIO()).run()
    return 130 if result.get("canceled") else 0


def durable_loop(home: Path) -> int:
    run = DurableRun(DURABLE, home=home, console=io.StringIO())
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.track(model=model, optimizer=opt)
    for _ in run.steps():
        loss = model(torch.ones(1, 2)).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.log(loss)
    return 0


def resave(home: Path) -> int:
    faults.arm_from_env()  # what Trainer and DurableRun do first
    final = home / "runs" / "c" / "ckpt" / "step-000004"
    for _ in range(2):  # the second write re-saves step 4: the old directory is renamed away first
        ckpt.write_checkpoint_dir(final, 4, {"model": {"w": torch.zeros(1)}})
    return 0


# point -> (its TINYLLM_FAULT entry, what the child runs)
CASES = {
    "checkpoint.between_renames": ("checkpoint.between_renames@4", resave),
    **{
        p: (f"{p}@2#0", lambda h: train(h, RETENTION))
        for p in ("retention.after_rename", "retention.during_delete", "retention.after_delete")
    },
    **{
        p: (f"{p}@2", lambda h: train(h, VALIDATION))
        for p in faults.POINTS
        if p.startswith("validation.") and p != "validation.hold"
    },  # (a hold, not a kill: test_val_stop.py)
    "durable.checkpoint_write": ("durable.checkpoint_write@1", durable_loop),
    "durable.checkpoint_write armed": ("durable.checkpoint_write@armed:arm", durable_loop),
    "durable.fingerprint": ("durable.fingerprint", durable_loop),
    "trainer.hold": ("trainer.hold@2", lambda h: train(h, {**BASE, "steps": 40})),
}


def start(name: str, home: Path) -> int:
    entry, run = CASES[name]
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        code = 1
        try:
            os.environ[faults.ENV] = entry
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # result lines: the report is the parent's
            os.dup2(os.open(home / "child.log", os.O_WRONLY | os.O_CREAT, 0o644), 2)  # step lines, a traceback
            code = run(home)
        finally:
            os._exit(code)
    return pid


def status(pid: int) -> dict:
    _, st = os.waitpid(pid, 0)
    return {
        "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None,
        "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
    }


def latest(home: Path, name: str) -> str | None:
    try:
        return (home / "runs" / name / "ckpt" / "LATEST").read_text().strip()
    except OSError:
        return None


def main() -> None:
    corpora, out = Path(sys.argv[1]), Path(sys.argv[2])
    homes = {}
    for i, name in enumerate(CASES):
        homes[name] = out / f"home-{i}"
        shutil.copytree(corpora, homes[name] / "corpora")
    (homes["durable.checkpoint_write armed"] / "arm").write_text("")
    pids = {name: start(name, homes[name]) for name in CASES if name != "trainer.hold"}  # all at once
    report = {name: status(pid) for name, pid in pids.items()}
    home = homes["trainer.hold"]  # held at step 2 until stopped: still there a second later, then SIGTERM
    pid = start("trainer.hold", home)
    deadline = time.monotonic() + 60
    while latest(home, "f") != "step-000002" and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(1.0)
    held = latest(home, "f")
    os.kill(pid, signal.SIGTERM)
    report["trainer.hold"] = {**status(pid), "latest_after_1s": held, "latest_after_stop": latest(home, "f")}
    for name in ("durable.checkpoint_write", "durable.checkpoint_write armed", "durable.fingerprint"):
        metrics = homes[name] / "runs" / "d" / "metrics.jsonl"
        frames = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        report[name]["frames_with_state"] = sum("state" in f for f in frames if "step" in f)
        report[name]["files"] = sorted(p.name for p in homes[name].iterdir())
    for name in CASES:
        report[name]["home"] = str(homes[name])
    (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
