"""What the platform tests read back from a run's home: attempts, steps, steps lost, the result, the trace.

One tiny spec (``SPEC``) for every test here: ``checkpoint_every`` exceeds ``steps``, so only a stop's
own checkpoint can save work and a stop that is not polite shows as steps lost. "0 steps lost" is the
definition of issue 39 (COMMON.md): the stopped attempt's ``stopping`` line is at step S, it wrote a
checkpoint at a step >= S, and the next attempt's ``resume`` line names that checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.proving import procs

NAME = "slq"
STEPS = 500
SPEC = {
    "name": NAME,
    "steps": STEPS,
    "seed": 5,
    "eval_every": 0,
    "checkpoint_every": 100000,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": STEPS,
    "threads": 1,
    "log_every": 50,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
BOUND_S = 240.0  # the most any wait here may take (a loaded machine); never asserted as a time


def reference_run(d: Path) -> dict:
    """The uninterrupted run of SPEC (plain ctl train) in ``d``: its final_loss_hex and digest."""
    (d / "spec.json").write_text(json.dumps(SPEC))
    p = procs.run(d / "home", "train", "--spec", str(d / "spec.json"), "--no-eval", "--json", timeout_s=BOUND_S)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)["result"]
    return {"final_loss_hex": result["final_loss_hex"], "digest": result["digest"]}


def _json_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            x = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(x, dict):
            out.append(x)
    return out


def attempts(home: Path) -> list[tuple[int, list[dict]]]:
    """The training activity's attempts in order: (attempt, its progress lines)."""
    out = [
        (int(f.stem.rsplit("-", 1)[1]), _json_lines(f))
        for f in home.glob(f"runs/{NAME}/activity/train-*/progress-*.jsonl")
    ]
    return sorted(out, key=lambda a: a[0])


def furthest_step(home: Path) -> int:
    """The furthest step seen so far: progress lines, and the per-step frames of metrics.jsonl."""
    steps = [x.get("step") or 0 for _, lines in attempts(home) for x in lines]
    metrics = home / "runs" / NAME / "metrics.jsonl"
    if metrics.exists():
        steps += [x.get("step") or 0 for x in _json_lines(metrics)]
    return max(steps, default=0)


def steps_lost(runs: list[tuple[int, list[dict]]]) -> list[str]:
    """One line per interrupted attempt that lost steps (empty: none lost; see the module docstring)."""
    out = []
    for (n, lines), (n2, nxt) in zip(runs, runs[1:]):
        reached = max((x.get("step") or 0 for x in lines), default=0)
        resume = next((x for x in nxt if x.get("event") == "resume" and x.get("checkpoint")), None)
        resumed = resume["step"] if resume else 0
        stopping = [x for x in lines if x.get("event") == "stopping"]
        final = [x for x in lines if "checkpoint" in x and "event" not in x and x.get("step") == STEPS]
        if not stopping and final and resume is not None and resume["checkpoint"] == final[-1]["checkpoint"]:
            continue  # stopped after its last step was saved (the loop had ended): nothing to lose
        if not stopping:
            out.append(
                f"attempt {n}: no 'stopping' line (it reached step {reached} or later); attempt {n2} "
                f"started from step {resumed}: at least {reached - resumed} steps lost"
            )
            continue
        s = stopping[-1]["step"]
        saved = [x for x in lines if "checkpoint" in x and "event" not in x and x.get("step", -1) >= s]
        if not saved:
            out.append(
                f"attempt {n}: stopping at step {s}, but no checkpoint at or after it; attempt {n2} started "
                f"from step {resumed}: {s - resumed} steps lost"
            )
        elif resume is None or resume["checkpoint"] != saved[-1]["checkpoint"]:
            out.append(
                f"attempt {n}: checkpoint {saved[-1]['checkpoint']} at the stop, but attempt {n2} resumed from "
                f"{resume and resume['checkpoint']}: {saved[-1]['step'] - resumed} steps lost"
            )
    return out


def history(home: Path) -> list[dict]:
    h = procs.history(home, f"train/{NAME}")
    assert h is not None, f"no history of train/{NAME} in {home}"
    return h


def final_result(events: list[dict]) -> dict:
    """The completed run's result (``workflow_completed``): final_loss_hex, digest, ..."""
    done = [e for e in events if e["type"] == "workflow_completed"]
    assert done, [e["type"] for e in events]
    return done[-1]["attrs"]["result"]


def trace_ids(path: Path) -> set[str]:
    """The trace ids of the spans in a --trace-file."""
    return {x.get("trace_id") or x.get("context", {}).get("trace_id") for x in _json_lines(path)}
