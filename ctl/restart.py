"""``ctl train --spec FILE --restart``: start a run over, with a (corrected) spec, keeping what must be kept.

Why a flag of ``ctl train`` and not a ``ctl reset``: Temporal's reset replays a workflow from an event of
its own history with its own input, which cannot carry a corrected spec; what a wrong run needs is
Temporal's terminate-and-start-anew under the same id, and starting anew needs the spec anyway. So the
one command that takes the spec does it, and the refusal of a different spec points at it.

What it does, in this order (``restart_run``):

1. refuses (``BadRequest``, exit 2, nothing changed) while the run may be live: a trainer holds the run's
   lock (``runs/<name>/.lock``), a live worker holds the newest workflow's lease, or the newest workflow is
   running with nothing in flight to tell by (a durable wait: its ``ctl train`` may be waiting; stop it, or
   ``ctl cancel`` it first);
2. ends the newest workflow if it is still running without a live worker: a cancel, settled here (its dead
   attempt is recorded canceled, never redelivered); a completed, failed or canceled one stays as it is.
   Every workflow of the run stays under its id with its history (``ctl history train/NAME/G``);
3. moves the run's folder aside, never deleting anything: ``runs/<name>`` -> ``runs/<name>.restart-<n>``
   (checkpoints, metrics, kept outputs), with the run's evaluation outputs ``evals/<suite>/<name>-<step>``
   (which a new evaluation of the same checkpoint path would otherwise reuse) under its ``evals/``, and a
   ``RESTARTED.json`` saying what it is (a later run of that name is refused: it is not a run's folder);
4. the caller then starts the next workflow id ``train/<name>/<G+1>`` from scratch with the new spec, its
   input's ``restart`` the restart count (continuations of it reuse only work done since the restart).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.layout import STEP_PREFIX, RunHome

import app
from app import Backend
from . import runstatus
from app.errors import BadRequest

MARKER = "RESTARTED.json"
SETTLE_S = 120.0  # how long ending a dead workflow may take here (a dead attempt is canceled at once)


@dataclass
class Restarted:
    epoch: int  # the restart count the new workflow records (TrainRunInput.restart)
    line: str  # what was done (kept, ended, moved), for the one line ``ctl train`` prints


def refuse_moved_aside(home: Path, name: str) -> None:
    """``runs/<name>`` is a restarted run's folder moved aside (it holds ``RESTARTED.json``): not a run's."""
    marker = RunHome(home).run(name).path / MARKER
    if marker.is_file():
        raise BadRequest(
            f"{marker.parent.relative_to(home)} holds the folder of a restarted run moved aside ({marker.name}): it is "
            f"kept as it is; give the run another name"
        )


def _aside(home: Path, name: str) -> tuple[int, Path]:
    n = 1
    while (RunHome(home).runs / f"{name}.restart-{n}").exists():
        n += 1
    return n, RunHome(home).runs / f"{name}.restart-{n}"


def _check_not_live(engine: Backend, home: Path, name: str, st: Any) -> None:
    if st is None or st.state != "running":
        _check_no_trainer(home, name, st)
        return
    started = {
        f"{e.attrs.get('activity_id')}#{e.attrs.get('attempt')}": e.time
        for e in engine.history(st.workflow_id)
        if e.type == "activity_started"
    }
    worker = runstatus.worker_info(engine, st.workflow_id, time.time(), started)
    if worker.get("live") is True:
        raise BadRequest(
            f"cannot restart {st.workflow_id}: a live worker runs it (pid {worker.get('pid')} on "
            f"{worker.get('host')}, {worker.get('activity_id')}); stop it (Ctrl-C its ctl train, or "
            f"`ctl cancel {st.workflow_id}`) first"
        )
    if worker.get("live") is None and not st.cancel_requested:
        raise BadRequest(
            f"cannot restart {st.workflow_id}: it is running and nothing in flight tells whether a "
            f"worker holds it ({worker.get('reason')}); stop its ctl train, or `ctl cancel "
            f"{st.workflow_id}`, first"
        )
    _check_no_trainer(home, name, st)


def _check_no_trainer(home: Path, name: str, st: Any) -> None:
    run_dir = RunHome(home).run(name).path
    from tinyllm import runlock  # tinyllm.errors -> stopping (multiprocessing): only a --restart asks

    if run_dir.is_dir() and runlock.is_locked(run_dir):
        raise BadRequest(
            f"cannot restart train/{name}: a live trainer holds {run_dir / runlock.LOCK_NAME}; stop "
            f"its ctl train (Ctrl-C) or `ctl cancel {st.workflow_id if st else 'train/' + name}` first"
        )


def _end(engine: Backend, st: Any) -> str:
    """End a running workflow nobody runs (cancel, settled here); its state word for the summary."""
    if st.state != "running":
        return st.state
    engine.cancel(st.workflow_id)
    try:
        ended = engine.run_until_complete(st.workflow_id, timeout_s=SETTLE_S)
    except TimeoutError:
        raise BadRequest(
            f"cannot restart {st.workflow_id}: it did not end within {SETTLE_S:g} s of its cancel; "
            f"see `ctl status {st.workflow_id}`"
        ) from None
    return f"running, now {ended.state}"


def _eval_dirs(home: Path, name: str) -> list[Path]:
    """The run's own checkpoint evaluations: ``evals/<suite>/<name>-<step>`` (release evaluations, named by a
    checkpoint digest, are keyed by what was trained and stay)."""
    pattern = re.compile(rf"^{re.escape(name)}-\d{{6,}}$")
    root = RunHome(home).evals
    return sorted(
        d
        for s in (root.iterdir() if root.is_dir() else [])
        if s.is_dir()
        for d in s.iterdir()
        if d.is_dir() and pattern.match(d.name)
    )


def restart_run(engine: Backend, home: Path, name: str) -> Restarted:
    """Steps 1-3 of the module docstring; the caller starts the new workflow with ``restart=epoch``."""
    base = app.train_workflow_id(name)
    gens = app.run_generations(engine, base)
    current = gens[-1] if gens else None
    _check_not_live(engine, home, name, current)
    was = _end(engine, current) if current is not None else None
    epoch = (int((app.recorded_input(engine, current.workflow_id) or {}).get("restart") or 0) + 1) if current else 1
    run = RunHome(home).run(name)
    run_dir = run.path
    evals = _eval_dirs(home, name)
    what = []
    if run_dir.exists() or evals:
        n, aside = _aside(home, name)
        if run_dir.exists():
            ckpts = len([p for p in run.ckpt_root.glob(f"{STEP_PREFIX}*") if p.is_dir()])
            os.rename(run_dir, aside)
            what.append(f"moved {run_dir.relative_to(home)} to {aside.relative_to(home)} ({ckpts} checkpoint(s))")
        aside.mkdir(parents=True, exist_ok=True)
        for d in evals:
            target = RunHome(aside).eval_dir(d.parent.name, d.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(d, target)
        if evals:
            what.append(f"{len(evals)} evaluation output(s) to {aside.relative_to(home)}/evals/")
        (aside / MARKER).write_text(
            json.dumps(
                {
                    "run": name,
                    "restart": epoch,
                    "workflows": [g.workflow_id for g in gens],
                    "moved_at": time.time(),
                    "evals": [str(d.relative_to(home)) for d in evals],
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    ended = f"kept {current.workflow_id} ({was}) with its history" if current else "no earlier workflow"
    line = f"{ended}; " + ("; ".join(what) or "nothing on disk to move")
    return Restarted(epoch, line)
