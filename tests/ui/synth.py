"""Synthetic homes for the UI's tests and bench: a real engine database (the engine's own schema,
events written with their checksums) holding TrainRun histories of any size, and their metrics files.

Nothing here runs a trainer: ``train_run(...)`` writes the events a TrainRun of ``segments``
segments would record (scheduled / started / heartbeats / completed for each train and eval
activity, a durable wait after each evaluation, a second attempt of every ``retry_every``-th
segment resumed from a checkpoint), ending in the state asked for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engine import Engine

# (private engine modules: a synthetic history is written the way the engine writes its own)
from engine.testing import HOST, dumps, event_row, insert_events


class Writer:
    def __init__(self, home: Path):
        (home / ".ctl").mkdir(parents=True, exist_ok=True)
        self.home = home
        self.engine = Engine(home / ".ctl" / "engine.db")

    def close(self) -> None:
        self.engine.close()

    def workflow(
        self,
        wid: str,
        name: str,
        inp: dict,
        events: list[tuple[str, float, dict]],
        state: str,
        *,
        result: Any = None,
        error: Any = None,
        running: list[dict] | None = None,
        timers: list[float] | None = None,
    ) -> None:
        created, updated = events[0][1], events[-1][1]
        rows = [event_row(wid, i + 1, t, when, dumps(attrs)) for i, (t, when, attrs) in enumerate(events)]
        with self.engine.store.transaction("synthetic") as db:
            db.execute(
                "INSERT INTO workflows(id, name, input, state, result, error, created_at, updated_at, "
                "task_pending) VALUES (?,?,?,?,?,?,?,?,0)",
                (
                    wid,
                    name,
                    dumps(inp),
                    state,
                    None if result is None else dumps(result),
                    None if error is None else dumps(error),
                    created,
                    updated,
                ),
            )
            for i in range(0, len(rows), 500):
                for row in rows[i : i + 500]:
                    insert_events(db, [row])
            for k, a in enumerate(running or []):
                db.execute(
                    "INSERT INTO activities(workflow_id, activity_id, cmd, name, input, options, state, attempt,"
                    " due_at, hb_deadline, last_hb_at, owner) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        wid,
                        a["activity_id"],
                        10_000 + k,
                        "train",
                        "{}",
                        "{}",
                        "running",
                        a["attempt"],
                        a["since"],
                        a["hb_deadline"],
                        a["since"],
                        json.dumps(a["owner"]),
                    ),
                )
            for k, fire_at in enumerate(timers or []):
                db.execute(
                    "INSERT INTO timers(workflow_id, cmd, fire_at, state) VALUES (?,?,?,'pending')",
                    (wid, 20_000 + k, fire_at),
                )


def spec(name: str, steps: int, eval_every: int, **extra: Any) -> dict:
    return {
        "name": name,
        "steps": steps,
        "eval_every": eval_every,
        "checkpoint_every": max(1, eval_every // 2),
        "eval_interval_seconds": 5,
        "batch_size": 2,
        "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
        **extra,
    }


def train_run(
    w: Writer,
    name: str,
    *,
    segments: int,
    eval_every: int = 10,
    heartbeats: int = 2,
    retry_every: int = 0,
    state: str = "completed",
    t0: float = 1.7e9,
    error: dict | None = None,
    spec_extra: dict | None = None,
    live_pid: int | None = None,
    metrics: bool = True,
    selection: dict | None = None,
) -> str:
    """A TrainRun history of ``segments`` segments (see the module docstring); returns its workflow id.
    ``selection``: fields the last segment's result carries (``best_checkpoints``, ``stopped_early``)."""
    wid = f"train/{name}"
    steps = segments * eval_every
    sp = spec(name, steps, eval_every, **(spec_extra or {}))
    inp = {"spec": sp, "corpus": {"name": "default"}, "eval_suites": ["ppl"], "eval_seed": 0}
    t = t0
    ev: list[tuple[str, float, dict]] = [("workflow_started", t, {"workflow": "TrainRun", "input": inp})]
    frames = []
    last_seg = segments if state == "completed" else segments - 1

    def add(kind: str, attrs: dict, dt: float = 0.5) -> None:
        nonlocal t
        t += dt
        ev.append((kind, t, attrs))

    running = []
    for k in range(1, segments + 1):
        until = k * eval_every
        aid = f"train-{until:06d}"
        add("activity_scheduled", {"activity_id": aid, "name": "train"})
        attempts = 2 if retry_every and k % retry_every == 0 else 1
        ckpt = None
        for n in range(1, attempts + 1):
            add("activity_started", {"activity_id": aid, "attempt": n, "worker": "synthetic"})
            for j in range(1, heartbeats + 1):
                step = until - eval_every + j * eval_every // (heartbeats + 1)
                ckpt = f"runs/{name}/ckpt/step-{step:06d}"
                add(
                    "activity_heartbeat",
                    {"activity_id": aid, "attempt": n, "details": {"step": step, "loss": 3.0 / k, "checkpoint": ckpt}},
                )
            if n < attempts:  # a liveness line past the checkpoint: those steps are redone by the next attempt
                add("activity_heartbeat", {"activity_id": aid, "attempt": n, "details": {"step": step + 2}})
                add(
                    "activity_timed_out",
                    {
                        "activity_id": aid,
                        "attempt": n,
                        "final": False,
                        "error": {"type": "HeartbeatTimeout", "message": "no heartbeat"},
                    },
                )
        if k > last_seg:  # the segment in flight
            if live_pid is not None:
                running.append(
                    {
                        "activity_id": aid,
                        "attempt": attempts,
                        "since": t,
                        "hb_deadline": t + 1e9,
                        "owner": {"host": HOST, "pid": live_pid, "pstart": None},
                    }
                )
            break
        for s in range(until - eval_every + 1, until + 1):
            frames.append(
                {
                    "step": s,
                    "time": t0 + s * 0.1,
                    "train/loss": 3.0 / (1 + s / 50),
                    "optim/lr": 1e-3 * min(1.0, s / 10),
                    "train/tokens": 32 * s,
                }
            )
        add(
            "activity_completed",
            {
                "activity_id": aid,
                "attempt": attempts,
                "result": {
                    "name": name,
                    "steps": until,
                    "checkpoint": f"runs/{name}/ckpt/step-{until:06d}",
                    "final_loss": 3.0 / (1 + until / 50),
                    "final_loss_hex": (3.0 / (1 + until / 50)).hex(),
                    "digest": "0" * 64,
                    "resumed_from": ckpt if attempts > 1 else None,
                    **(selection or {} if k == last_seg else {}),
                },
            },
            dt=5,
        )
        eid = f"eval-{until:06d}-ppl"
        add("activity_scheduled", {"activity_id": eid, "name": "eval"})
        add("activity_started", {"activity_id": eid, "attempt": 1, "worker": "synthetic"})
        add(
            "activity_completed",
            {
                "activity_id": eid,
                "attempt": 1,
                "result": {
                    "suite": "ppl",
                    "summary": {
                        "metrics": {"subject": {"heldout/ppl": 20.0 / (1 + k / 10), "heldout/loss": 2.5 / (1 + k / 10)}}
                    },
                },
            },
            dt=2,
        )
        if k < segments:
            add("timer_started", {"seconds": 5, "fire_at": t + 5})
            add("timer_fired", {}, dt=5)
    result = None
    if state == "completed":
        add(
            "workflow_completed",
            {
                "result": {
                    "steps": steps,
                    "final_loss_hex": "0x1p-1",
                    "checkpoint": f"runs/{name}/ckpt/step-{steps:06d}",
                }
            },
        )
        result = {"name": name, "steps": steps, "segments": []}
    elif state in ("failed", "canceled"):
        if state == "canceled":
            add("cancel_requested", {})
        add(f"workflow_{state}", {"error": error or {"type": "Canceled", "message": "canceled"}})
    w.workflow(
        wid, "TrainRun", inp, ev, state, result=result, error=error if state != "completed" else None, running=running
    )
    if metrics:
        run_dir = w.home / "runs" / name / "ckpt"
        run_dir.mkdir(parents=True, exist_ok=True)
        for k in range(1, last_seg + 1):
            (run_dir / f"step-{k * eval_every:06d}").mkdir(exist_ok=True)
        if last_seg:
            (run_dir / "LATEST").write_text(f"step-{last_seg * eval_every:06d}\n")
        with open(run_dir.parent / "metrics.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(fr) + "\n" for fr in frames)
    return wid


def home_with_three(home: Path, hostile: str = "") -> dict[str, str]:
    """A finished, a failed (its error and a spec field carry ``hostile``) and a live run."""
    w = Writer(home)
    try:
        # its selection named step-000020 best (val/loss), not step-000030 (the lowest ppl): the page must not re-decide
        done = train_run(
            w,
            "done",
            segments=3,
            retry_every=2,
            selection={
                "best_checkpoints": [
                    {"checkpoint": "runs/done/ckpt/step-000020", "step": 20, "metric": "val/loss", "value": 1.25}
                ]
            },
        )
        failed = train_run(
            w,
            "broke",
            segments=2,
            state="failed",
            t0=1.7e9 + 100,
            spec_extra={"note": hostile},
            error={
                "type": "ActivityError",
                "message": f"trainer failed: {hostile}",
                "details": {"stderr_tail": f"Traceback...\nValueError: {hostile}\n"},
            },
        )
        live = train_run(w, "live", segments=3, state="running", t0=1.7e9 + 200, live_pid=os.getppid())
    finally:
        w.close()
    return {"done": done, "failed": failed, "live": live}
