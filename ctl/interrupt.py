"""Ctrl-C, SIGINT and SIGTERM to a ``ctl train`` / ``ctl eval`` / ``ctl release`` that runs its workflow here.

The run stays resumable: ctl stops as after a kill, its trainer with it, and the same command
resumes from the last checkpoint. What it does, once, however many signals come:

- the first SIGINT/SIGTERM is handled; the ones after it are ignored. A signal to the whole
  process group arrives several times: a terminal's Ctrl-C reaches every process of the group,
  and ``timeout`` (without ``--foreground``) passes a SIGINT it receives on to its child and to
  its group again. A second KeyboardInterrupt raised while the first one was being handled
  escaped to click ("Aborted!", exit 1) and closed the database under the progress display;
- it stops the progress display (its terminal lines restored), then takes the engine's store
  lock, so no thread of this process writes the history any more (the runner thread would
  otherwise record the trainer's death as a failed attempt), SIGKILLs every process descended
  from ctl (the trainer, its ranks, an evaluation) and waits until they are gone;
- then it prints the one ``ctl: interrupted; ...`` line and exits 130 (``os._exit``: nothing
  is unwound, as after a kill; an open SQLite transaction is rolled back).

The work is done in the signal handler itself (the main thread, between two bytecodes), not by
an exception that would unwind through the engine's and click's ``finally`` blocks.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .errors import EXIT_CANCELED

KILL_WAIT_S = 10.0  # how long the killed descendants may take to disappear
LOCK_WAIT_S = 10.0  # how long another thread may hold the store's lock (one short transaction)
DISPLAY_WAIT_S = 2.0


def _children_map() -> dict[int, list[int]]:
    """``{ppid: [pid, ...]}`` of the live (not zombie) processes."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 2 or fields[0] in ("Z", "X"):
            continue
        out.setdefault(int(fields[1]), []).append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """The live processes descended from ``pid`` (children, theirs, ...), zombies excepted."""
    tree = _children_map()
    found, todo = [], list(tree.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(tree.get(p, []))
    return found


def kill_descendants(pid: int, wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every descendant of ``pid`` until none is left (re-scanned: late forks are caught).

    Returns those still alive after ``wait_s`` (none unless not ours to kill)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = descendants(pid)
        if not left or time.monotonic() > deadline:
            return left
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


class Interrupt:
    """The SIGINT/SIGTERM handler of one ``ctl train``/``ctl eval`` (see the module docstring).

    ``workflow_id``, ``engine`` and ``display`` are set as they come into being."""

    def __init__(self, what: str = "the run", keeps: str = "its checkpoints") -> None:
        self.what = what
        self.keeps = keeps  # what the interrupted workflow keeps, in its one line
        self.workflow_id: str | None = None
        self.engine: Any = None
        self.display: Any = None
        self.fired = False

    def install(self) -> "Interrupt":
        # SIGINT is installed explicitly: a process started as a non-interactive shell's background job
        # (`ctl train ... &` in a script, CI) inherits it ignored, and Python then installs no handler
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        return self

    def message(self) -> str:
        wid = self.workflow_id
        if wid is None:
            return f"ctl: interrupted before {self.what} started; run the same command to start (or resume) it"
        return (f"ctl: interrupted; {wid} keeps {self.keeps}: run the same command to resume, "
                f"or `ctl cancel {wid}`")

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.fired:
            return
        self.fired = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # the group's further copies of the signal
        try:
            if self.display is not None:
                self.display.stop(final=False, wait_s=DISPLAY_WAIT_S)
            lock = getattr(getattr(self.engine, "store", None), "_lock", None)
            if lock is not None:
                lock.acquire(timeout=LOCK_WAIT_S)  # never released: this process writes nothing more
            left = kill_descendants(os.getpid())
            sys.stderr.write(self.message() + "\n")
            if left:
                sys.stderr.write(f"ctl: processes {sorted(left)} could not be killed\n")
            sys.stderr.flush()
        finally:
            os._exit(EXIT_CANCELED)
