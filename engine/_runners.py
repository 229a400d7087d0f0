"""The threaded worker's runner threads and its group commit of their outcomes.

``Runners`` is an object the worker (engine/_worker.py) owns: its loop hands leases to ``spawn``
and records what ``drain`` collects. It gets the two worker functions it calls (``execute``: run
one attempt; ``record``: record its outcome) and the worker's transactions (engine/_tx.py).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from ._activity import Lease
from ._tx import Transactions

GROUP_MAX = 256  # outcomes recorded by one group commit at most


class Runners:
    """Runner threads and group commit; ``inflight``: the attempts handed to a runner, not recorded yet."""

    def __init__(
        self, execute: Callable[[Lease], tuple[bool, Any]], record: Callable[[Lease, bool, Any], None], tx: Transactions
    ):
        self.execute = execute
        self.record = record
        self.tx = tx
        self.inflight: dict[tuple[str, str], Lease] = {}
        self._run_q: queue.SimpleQueue = queue.SimpleQueue()  # leases for the runner threads (None: exit);
        # SimpleQueue (C, unbounded: at most one lease per runner is in it) hands off in a fraction of Queue's time
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0  # runners waiting on _run_q and not promised a lease yet
        self._done_q: queue.SimpleQueue = queue.SimpleQueue()  # outcomes: at most one per runner

    def spawn(self, lease: Lease) -> None:
        """Hand ``lease`` to an idle runner thread, or to a new one when none is idle (a thread start
        costs more than a no-op activity; a hung attempt never holds up another one)."""
        self.inflight[(lease.workflow_id, lease.activity_id)] = lease
        with self._lock:
            reuse = self._idle > 0
            self._idle -= reuse
        self._run_q.put(lease)
        if not reuse:
            t = threading.Thread(target=self._run, name="activity runner", daemon=True)
            self._threads.append(t)
            t.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            lease = self._run_q.get()
            if lease is None:
                return
            me.name = f"activity {lease.workflow_id}/{lease.activity_id}"
            try:
                ok, value = self.execute(lease)
            except BaseException as crash:  # noqa: BLE001 - handed to the loop, which re-raises it
                self._done_q.put((lease, None, crash))
                return
            with self._lock:  # idle before the loop hears of it: the loop may hand it the next lease
                self._idle += 1
            self._done_q.put((lease, ok, value))

    def stop(self) -> None:
        """Idle runners exit (busy ones after their attempt)."""
        for _ in self._threads:
            self._run_q.put(None)
        self._threads = []

    def drain(self, timeout_s: float | None = None) -> bool:
        """Record the outcomes of finished attempts: all that are waiting (at most ``GROUP_MAX``) in one
        group commit, each its own member transaction (the ones that finish during a COMMIT's fsync
        wait for the next one). A member's error rolls back that member alone and is raised once the
        others are durable."""
        did = False
        while True:
            batch = []
            try:
                batch.append(
                    self._done_q.get(timeout=timeout_s) if (timeout_s and not did) else self._done_q.get_nowait()
                )
                while len(batch) < GROUP_MAX:
                    batch.append(self._done_q.get_nowait())
            except queue.Empty:
                pass
            if not batch:
                return did
            for lease, ok, value in batch:
                self.inflight.pop((lease.workflow_id, lease.activity_id), None)
                if ok is None:
                    raise value
            if len(batch) == 1:
                self.record(*batch[0])
            else:
                errors = []
                with self.tx("group", group=True):
                    for item in batch:
                        try:
                            self.record(*item)
                        except Exception as e:  # noqa: BLE001 - raised below, after the others commit
                            errors.append(e)
                if errors:
                    raise errors[0]
            did = True
