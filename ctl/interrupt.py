"""SIGTERM, SIGINT (Ctrl-C) and the preemption signal to a ``ctl train`` / ``eval`` / ``release`` / ``worker``.

One stop path for every polite stop (docs/preemption.md). The first signal asks the engine to stop
(``Engine.request_stop``): nothing new starts, the trainer in flight gets SIGTERM, finishes the step
it is in, writes a durable checkpoint there and exits; its attempt is recorded as ``preempted`` (not a
failure, no retry used); ctl then prints one line and exits ``EXIT_PREEMPTED`` (143), which
Kubernetes, systemd and Slurm read as "come back". The same command resumes from that checkpoint.

- **Bounded.** The attempts get ``grace_s`` less ``EXIT_MARGIN_S`` (the runner kills a trainer still
  running then, and its attempt says so); a watchdog ends ctl at ``grace_s`` whatever happens, so
  ctl never outlives the grace it was given (``--stop-grace``, default ``DEFAULT_GRACE_S``).
- **A second signal stops at once**: SIGKILL to every process descended from ctl, one
  ``ctl: interrupted`` line, exit 130, as after a kill (the run stays resumable; the steps since
  the last checkpoint may be lost). Copies of one group signal arriving within ``SAME_SIGNAL_S``
  (a terminal's Ctrl-C reaches every process of the group, ``timeout`` passes a SIGINT on to its
  child and to its group again) are one signal, not two.
- **Before a run is being followed** (no engine yet) a signal ends ctl at once (exit 130): nothing
  is running that could be saved.
- **Another backend** (Temporal: no ``request_stop``): the trainers descended from ctl get SIGTERM,
  checkpoint and exit within the grace; ctl exits 143 and the cluster redelivers the attempt.

The hard path runs in the signal handler itself (the main thread, between two bytecodes) or the
watchdog thread: it takes the engine's store lock (no thread writes the history any more), kills,
prints and ``os._exit``s; nothing is unwound.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from app import Backend
from app.errors import EXIT_CANCELED, EXIT_PREEMPTED

KILL_WAIT_S = 10.0  # how long the killed descendants may take to disappear
LOCK_WAIT_S = 10.0  # how long another thread may hold the store's lock (one short transaction)
DISPLAY_WAIT_S = 2.0
DEFAULT_GRACE_S = 25.0  # below Kubernetes' default 30 s terminationGracePeriodSeconds and Slurm's default
# KillWait of 30 s: the checkpoint is durable and ctl has exited before the platform's SIGKILL
EXIT_MARGIN_S = 3.0  # of the grace, kept for ctl to record the attempts and exit after the trainers' deadline
SAME_SIGNAL_S = 1.0  # signals closer than this to the first are copies of it (a group signal), not a second one
GRACE_ENV = "CTL_STOP_GRACE"
SIGNAL_ENV = "CTL_STOP_SIGNAL"


def signal_number(name: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1``, ``usr1`` or ``10`` -> the signal; ``ValueError`` naming the choices."""
    text = name.strip().upper()
    try:
        return (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError):
        raise ValueError(f"{name!r} is not a signal name (e.g. USR1, USR2, TERM, HUP)") from None


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


class Display(Protocol):
    """What a stop needs of the live display (ctl/display.py ``LiveDisplay``)."""

    def stop(self, *, final: bool = True, wait_s: float = 5.0) -> None: ...

    def stopping(self, signal_name: str) -> None: ...


class Interrupt:
    """The polite-stop handler of one ctl command (see the module docstring).

    ``workflow_id``, ``engine`` and ``display`` are set as they come into being."""

    def __init__(
        self,
        what: str = "the run",
        keeps: str = "its checkpoints",
        *,
        grace_s: float = DEFAULT_GRACE_S,
        stop_signal: signal.Signals | None = None,
    ) -> None:
        self.what = what
        self.keeps = keeps  # what the interrupted workflow keeps, in its one line
        self.grace_s = grace_s
        self.stop_signal = stop_signal
        self.workflow_id: str | None = None
        self.display: Display | None = None
        self._engine: Backend | None = None
        self.first_at: float | None = None  # time.monotonic() of the first signal
        self.signal_name: str | None = None  # its name, once one came
        self.fired = False  # the hard path ran

    @property
    def engine(self) -> Backend | None:
        return self._engine

    @engine.setter
    def engine(self, engine: Backend | None) -> None:
        """The engine this command runs; a stop that reaches it through a trainer gets this command's grace."""
        self._engine = engine
        if engine is not None and engine.polite_stop:
            engine.stop_grace_s = max(0.0, self.grace_s - EXIT_MARGIN_S)

    @property
    def stopping(self) -> bool:
        """A polite stop was asked (the command finishes it and exits ``EXIT_PREEMPTED``)."""
        return self.first_at is not None and not self.fired

    def signals(self) -> list[signal.Signals]:
        sigs = [signal.SIGINT, signal.SIGTERM]
        if self.stop_signal is not None and self.stop_signal not in sigs:
            sigs.append(self.stop_signal)
        return sigs

    def install(self) -> "Interrupt":
        # SIGINT is installed explicitly: a process started as a non-interactive shell's background job
        # (`ctl train ... &` in a script, CI) inherits it ignored, and Python then installs no handler
        for sig in self.signals():
            signal.signal(sig, self._on_signal)
        return self

    def message(self) -> str:
        wid = self.workflow_id
        if wid is None:
            return f"ctl: interrupted before {self.what} started; run the same command to start (or resume) it"
        return f"ctl: interrupted; {wid} keeps {self.keeps}: run the same command to resume, or `ctl cancel {wid}`"

    def _on_signal(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.fired:
            return
        if self.first_at is not None:
            if now - self.first_at < SAME_SIGNAL_S:
                return  # a copy of the first (its group's), not a second signal
            self.hard(f"ctl: second signal ({signal.Signals(signum).name}): stopping now")
            return
        self.first_at, self.signal_name = now, signal.Signals(signum).name
        engine = self.engine
        if engine is None:
            self.hard()
            return
        if engine.polite_stop:
            engine.request_stop(self.signal_name, grace_s=max(0.0, self.grace_s - EXIT_MARGIN_S))
        else:  # another backend: the trainers below us checkpoint on their own SIGTERM
            threading.Thread(target=self._stop_children, name="ctl-stop", daemon=True).start()
        if self.display is not None:
            self.display.stopping(self.signal_name)
        else:
            sys.stderr.write(
                f"ctl: {self.signal_name}: stopping {self.what} at the step it is at and "
                f"saving it (at most {self.grace_s:g} s; Ctrl-C again to stop now)\n"
            )
            sys.stderr.flush()
        threading.Thread(target=self._watchdog, name="ctl-stop-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        """ctl never outlives its grace: at ``grace_s`` after the first signal, the hard path."""
        time.sleep(self.grace_s)
        self.hard(f"ctl: the stop's grace ({self.grace_s:g} s) ran out: stopping now", code=EXIT_PREEMPTED)

    def _stop_children(self) -> None:
        """Another backend's polite stop: SIGTERM to the processes descended from ctl (its trainers), up to
        the grace for them to end, then exit ``EXIT_PREEMPTED`` (the cluster redelivers the attempt)."""
        pids = descendants(os.getpid())
        for p in pids:
            try:
                os.kill(p, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + max(0.0, self.grace_s - EXIT_MARGIN_S)
        while descendants(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.1)
        how = (
            "the processes it started exited within the grace"
            if not descendants(os.getpid())
            else "the processes still running at the grace were killed"
        )  # not whether they saved: their history says
        self.hard(
            f"ctl: stopped by {self.signal_name}: {how}; run the same command to resume",
            code=EXIT_PREEMPTED,
            quiet_kill=True,
        )

    def hard(self, why: str | None = None, *, code: int = EXIT_CANCELED, quiet_kill: bool = False) -> None:
        """Stop now: display stopped, history writes blocked, every descendant killed, one line, ``os._exit``."""
        if self.fired:
            return
        self.fired = True
        for sig in self.signals():
            try:
                signal.signal(sig, signal.SIG_IGN)  # the group's further copies of the signal
            except ValueError:  # not the main thread (the watchdog): the handler above ignores them (fired)
                pass
        try:
            if self.display is not None:
                self.display.stop(final=False, wait_s=DISPLAY_WAIT_S)
            store = self.engine.store if self.engine is not None else None
            if store is not None:
                store._lock.acquire(timeout=LOCK_WAIT_S)  # never released: this process writes nothing more
            left = kill_descendants(os.getpid())
            if why and not quiet_kill:
                sys.stderr.write(why + "\n")
            sys.stderr.write((why if quiet_kill and why else self.message()) + "\n")
            if left:
                sys.stderr.write(f"ctl: processes {sorted(left)} could not be killed\n")
            sys.stderr.flush()
        finally:
            os._exit(code)
