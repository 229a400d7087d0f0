"""The threaded worker's runner threads and its group commit of their outcomes.

``Worker`` (engine/_worker.py) mixes this in: ``_tick`` hands leases to ``_spawn`` and records what
``_drain_done`` collects.
"""
from __future__ import annotations

import queue
import threading

from ._activity import Lease

GROUP_MAX = 256  # outcomes recorded by one group commit at most


class Runners:
    """Runner threads and group commit; state set up by ``Worker._init_worker``."""

    def _spawn(self, lease: Lease) -> None:
        """Hand ``lease`` to an idle runner thread, or to a new one when none is idle (a thread start
        costs more than a no-op activity; a hung attempt never holds up another one)."""
        self._inflight[(lease.workflow_id, lease.activity_id)] = lease
        with self._runner_lock:
            reuse = self._idle_runners > 0
            self._idle_runners -= reuse
        self._run_q.put(lease)
        if not reuse:
            t = threading.Thread(target=self._runner, name="activity runner", daemon=True)
            self._runners.append(t)
            t.start()

    def _runner(self) -> None:
        me = threading.current_thread()
        while True:
            lease = self._run_q.get()
            if lease is None:
                return
            me.name = f"activity {lease.workflow_id}/{lease.activity_id}"
            try:
                ok, value = self._execute(lease)
            except BaseException as crash:  # noqa: BLE001 - handed to the loop, which re-raises it
                self._done_q.put((lease, None, crash))
                return
            with self._runner_lock:  # idle before the loop hears of it: the loop may hand it the next lease
                self._idle_runners += 1
            self._done_q.put((lease, ok, value))

    def _stop_runners(self) -> None:
        """Idle runners exit (busy ones after their attempt)."""
        for _ in self._runners:
            self._run_q.put(None)
        self._runners = []

    def _drain_done(self, timeout_s: float | None = None) -> bool:
        """Record the outcomes of finished attempts: all that are waiting (at most ``GROUP_MAX``) in one
        group commit, each its own member transaction (the ones that finish during a COMMIT's fsync
        wait for the next one). A member's error rolls back that member alone and is raised once the
        others are durable."""
        did = False
        while True:
            batch = []
            try:
                batch.append(self._done_q.get(timeout=timeout_s) if (timeout_s and not did) else self._done_q.get_nowait())
                while len(batch) < GROUP_MAX:
                    batch.append(self._done_q.get_nowait())
            except queue.Empty:
                pass
            if not batch:
                return did
            for lease, ok, value in batch:
                self._inflight.pop((lease.workflow_id, lease.activity_id), None)
                if ok is None:
                    raise value
            if len(batch) == 1:
                self._record_outcome(*batch[0])
            else:
                errors = []
                with self._tx("group", group=True):
                    for item in batch:
                        try:
                            self._record_outcome(*item)
                        except Exception as e:  # noqa: BLE001 - raised below, after the others commit
                            errors.append(e)
                if errors:
                    raise errors[0]
            did = True
