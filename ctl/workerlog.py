"""What ``ctl worker`` logs: each activity attempt it starts and ends, each workflow that ends.

A thread follows the history of the home's workflows through the worker's own Engine (one
connection per process) and prints, on stderr, one line per event that matters::

    2026-12-01T09:12:03+00:00 start  train/tiny train-000100#1
    2026-12-01T09:12:41+00:00 end    train/tiny train-000100#1 completed in 0:38 (step 100, loss 2.0123)
    2026-12-01T09:12:41+00:00 end    train/tiny eval-000100-ppl#1 failed in 0:02, will retry: RuntimeError: ...
    2026-12-01T09:13:30+00:00 workflow train/tiny completed in 1:27

Only attempts started by this process (``worker`` = host:pid in the started event) are logged
as start/end; workflow ends are logged for every workflow this worker has worked on, and handed to
``on_end`` for every workflow seen ending (ctl worker: the MLflow run's status, app/runsinks.py).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from app import Backend
from engine import read_events

from .historyview import details
from app.runview import fmt_duration, local_time

POLL_S = 0.5
MAX_EVENTS_PER_POLL = 10_000


class WorkerLog:
    def __init__(
        self,
        engine: Backend,
        emit: Callable[[str], None],
        *,
        poll_s: float = POLL_S,
        on_end: Callable[[str, str], None] | None = None,
    ):
        self.engine, self.emit, self.poll_s = engine, emit, poll_s
        self.on_end = on_end  # (workflow id, completed|failed|canceled) of each workflow seen ending
        owner = engine.owner  # another backend has none (and no local store: start() skips)
        self.me = f"{owner['host']}:{owner['pid']}" if owner else ""  # as the engine records its starts
        self._seen: dict[str, int] = {}
        self._started: dict[str, float] = {}  # "wf activity#attempt" -> start time (this worker's)
        self._touched: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctl-worker-log", daemon=True)

    def start(self) -> None:
        if self.engine.store is None:  # another backend: its server keeps the log
            return
        self._poll(initial=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if not self._thread.is_alive():
            return
        self._thread.join(timeout=5)
        try:
            self._poll()
        except Exception:  # noqa: BLE001 - the log must never break the worker
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._poll()
            except Exception as e:  # noqa: BLE001
                self.emit(f"(worker log stopped: {type(e).__name__}: {e})")
                return

    def _poll(self, initial: bool = False) -> None:
        store = self.engine.store
        assert store is not None  # (start() polls only a backend with a local store)
        ids = [r[0] for r in store.query("SELECT id FROM workflows WHERE state='running'")]
        ids += [w for w in self._touched if w not in ids]
        for wid in sorted(ids):
            with store._lock:
                events = read_events(store.conn, wid, self._seen.get(wid, 0), MAX_EVENTS_PER_POLL)
            if events:
                self._seen[wid] = events[-1].seq
            if initial:
                continue  # what happened before this worker started is not its log
            for e in events:
                self._line(wid, e)

    def _line(self, wid: str, e: Any) -> None:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        key = f"{wid} {a.get('activity_id')}#{a.get('attempt')}"
        when = local_time(e.time, date=True)
        if e.type == "activity_started" and a.get("worker") == self.me:
            self._started[key] = e.time
            self._touched.add(wid)
            self.emit(f"{when} start  {wid} {a.get('activity_id')}#{a.get('attempt')}")
        elif (
            e.type
            in (
                "activity_completed",
                "activity_failed",
                "activity_timed_out",
                "activity_canceled",
                "activity_preempted",
            )
            and key in self._started
        ):
            took = fmt_duration(e.time - self._started.pop(key))
            outcome = e.type.split("_", 1)[1]
            info = details(e)
            self.emit(
                f"{when} end    {wid} {a.get('activity_id')}#{a.get('attempt')} {outcome} in {took}"
                + (f": {info}" if info else "")
            )
        elif e.type in ("workflow_completed", "workflow_failed", "workflow_canceled") and self.on_end is not None:
            try:
                self.on_end(wid, e.type.split("_", 1)[1])
            except Exception as err:  # noqa: BLE001 - never the worker's failure
                self.emit(f"(after {wid} ended: {type(err).__name__}: {err})")
        if e.type in ("workflow_completed", "workflow_failed", "workflow_canceled") and wid in self._touched:
            self._touched.discard(wid)
            started = self.engine.status(wid).created_at
            self.emit(
                f"{when} workflow {wid} {e.type.split('_', 1)[1]} in {fmt_duration(e.time - started)}"
                + (f": {details(e)}" if details(e) else "")
            )
