"""Which ``ctl`` processes are running a home's workflows right now, for ``ctl status`` between activities.

While an activity runs, its lease says who holds it. Between activities (a durable wait of
``eval_interval_seconds``, a workflow task) nothing in the database does: after a kill, status could not tell a
waiting worker from none. So each ``ctl train``/``ctl eval`` that follows a workflow, and each ``ctl worker``,
writes ``<home>/.ctl/workers/<pid>-<instance>.json`` -- its engine's lease owner (engine/_leases.py: host, boot,
pid, process start time) and the workflow it runs (None: a ``ctl worker``, every workflow) -- and removes it
when it ends. A file whose owner is known dead (a SIGKILL leaves it behind) counts for nothing; readers never
remove it (status is read-only); the next writer in that home removes dead ones.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from app import Backend
from contracts.layout import RunHome
from engine import owner_dead
from tinyllm.fsio import atomic_write


def _folder(home: Path) -> Path:
    return RunHome(home).ctl_dir / "workers"


def announce(home: Path, engine: Backend, workflow_id: str | None) -> Path | None:
    """Record that this process runs ``workflow_id`` (None: all) of ``home``; the path to ``withdraw``.
    None where the engine has no lease owner (another backend) or the file cannot be written (never fatal)."""
    owner = engine.owner
    if owner is None:
        return None
    folder = _folder(home)
    path = folder / f"{owner['pid']}-{str(owner.get('instance', ''))[:12]}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.json"):  # left by killed processes
            if _read(old) is None:
                old.unlink(missing_ok=True)
        atomic_write(path, json.dumps({"owner": owner, "workflow_id": workflow_id, "since": time.time()}).encode())
    except OSError:
        return None
    return path


def withdraw(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _read(path: Path) -> dict | None:
    """The record, or None when unreadable or its owner is known dead."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or owner_dead(rec.get("owner")):
        return None
    return rec


def live_runners(home: Path, workflow_id: str) -> list[dict]:
    """The live processes running ``workflow_id`` (a ``ctl worker`` runs every workflow), oldest first."""
    folder = _folder(home)
    found = [
        rec
        for p in (sorted(folder.glob("*.json")) if folder.is_dir() else [])
        if (rec := _read(p)) is not None and rec.get("workflow_id") in (None, workflow_id)
    ]
    return sorted(found, key=lambda r: r.get("since") or 0.0)
