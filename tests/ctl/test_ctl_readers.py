"""`ctl status` / `list` / `history` in other processes while `ctl train` runs are safe.

Defect 1 of issue 9: an `open()`/`close()` of engine.db inside the `ctl train` process (the
store's header check, a second Engine for the progress display) dropped that process's POSIX
locks, so the next reader to close its connection deleted the live WAL: from then on the run
committed into a deleted file, a SIGKILL lost every event since, and a `ctl cancel` from
another process was never seen. Real processes, real SIGKILL; the checks:

- the running `ctl train` never holds a deleted engine.db* file open, and opens engine.db once
  (one connection per process: the progress display reads through the run's own Engine);
- after a SIGKILL of `ctl train`, every event any reader printed is still in the history;
- a `ctl cancel` from another process stops the resumed run (exit 130, workflow canceled).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from simulator.proving import procs

pytestmark = pytest.mark.slow  # ctl readers in other processes (~20 s)

TIMEOUT_S = 180
SPEC = {  # long enough never to finish before the cancel; a checkpoint every few steps
    "name": "readers",
    "steps": 4000,
    "seed": 5,
    "eval_every": 0,
    "checkpoint_every": 5,
    "batch_size": 2,
    "warmup_steps": 1,
    "lr_decay_steps": 4000,
    "threads": 1,
    "log_every": 50,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
WID = "train/readers"


def _checkpoint_heartbeats(events: list[dict] | None, attempt: int) -> int:
    return sum(
        1
        for e in events or []
        if e["type"] == "activity_heartbeat"
        and e["attrs"].get("attempt") == attempt
        and "checkpoint" in (e["attrs"].get("details") or {})
    )


def _readers(home: Path, ctl_pid: int, rounds: int) -> list[list[dict]]:
    """``rounds`` of status, list and history in other processes; the histories they printed."""
    seen = []
    for _ in range(rounds):
        for args in (("status", WID), ("list",), ("status",)):
            p = procs.run(home, *args)
            assert p.returncode == 0, p.stderr
        events = procs.history(home, WID)
        assert events, "a reader found no history"
        seen.append(events)
        assert procs.deleted_db_files(ctl_pid) == [], "a reader's close deleted the running engine's WAL"
        opened = [f for f in procs.db_files(ctl_pid) if f.endswith("engine.db")]
        assert len(opened) == 1, f"ctl train opened engine.db {len(opened)} times: one connection per process"
    return seen


def test_readers_in_other_processes_lose_nothing_and_a_cancel_is_seen(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "readers.json"
    spec.write_text(json.dumps(SPEC))
    train = procs.spawn(home, "train", "--spec", str(spec), "--no-eval", "--json")
    try:
        procs.wait_for(
            "a checkpoint heartbeat",
            lambda: _checkpoint_heartbeats(procs.history(home, WID), 1) >= 1,
            timeout_s=TIMEOUT_S,
            alive=train,
        )
        seen = _readers(home, train.pid, rounds=3)
        # the run went on while the readers came and went: more heartbeats than the first one
        procs.wait_for(
            "more checkpoints",
            lambda: _checkpoint_heartbeats(procs.history(home, WID), 1) > _checkpoint_heartbeats(seen[-1], 1),
            timeout_s=TIMEOUT_S,
            alive=train,
        )
        seen.append(procs.history(home, WID))
        assert procs.deleted_db_files(train.pid) == []
        procs.killpg(train)  # SIGKILL: what was committed must be what readers saw, and more

        after_kill = procs.history(home, WID)
        for events in seen:
            assert procs.missing_events(events, after_kill) == []
        assert len(after_kill) >= len(seen[-1])

        train = procs.spawn(home, "train", "--spec", str(spec), "--no-eval", "--json")
        procs.wait_for(
            "a checkpoint of the resumed attempt",
            lambda: _checkpoint_heartbeats(procs.history(home, WID), 2) >= 1,
            timeout_s=TIMEOUT_S,
            alive=train,
        )
        seen += _readers(home, train.pid, rounds=1)
        cancel = procs.run(home, "cancel", WID)
        assert cancel.returncode == 0 and "cancel requested" in cancel.stdout, cancel.stdout + cancel.stderr
        out, err = train.communicate(timeout=TIMEOUT_S)
        assert train.returncode == 130, err[-2000:]
        assert json.loads(out)["state"] == "canceled"
        final = procs.history(home, WID)
        for events in seen:
            assert procs.missing_events(events, final) == []
        assert final[-1]["type"] == "workflow_canceled"
        assert any(e["type"] == "cancel_requested" for e in final)
    finally:
        if train.poll() is None:
            procs.killpg(train, signal.SIGKILL)
    assert procs.processes_in(home) == []
