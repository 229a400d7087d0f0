"""The processes of an activity attempt, found by a tag they inherit, and stopped as one.

Every process an attempt starts carries ``DURABLE_ATTEMPT=<scope>|<workflow id>|<activity id>#<n>``
in its environment: the subprocess runner sets it on its child, and every descendant inherits it
(``torchrun`` copies its environment into each rank). Unlike a process group or a session, the
tag survives ``setsid`` (torchrun's ranks may get their own session) and re-parenting to init
(the worker was SIGKILLed), and unlike a cgroup it needs no privileges or delegation. So
``/proc/*/environ`` tells, on this host, every process of an attempt whether or not its parent,
its group or its worker still exists. ``scope`` names the engine database (two homes on one
host never touch each other's processes). A process that rebuilds its environment from nothing
escapes the tag; the runner also signals the child's process group, which catches those that
did not leave it.

The runner stops an attempt's processes when the attempt ends (any way), and stops those of
earlier attempts of the same activity before it starts a new one; a recovering worker kills
those of a dead worker's attempt before redelivering it. Between those moments the direct child
has a parent-death signal (subprocess_runner.py).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from typing import Iterable

from ._leases import proc_start

ENV_TAG = "DURABLE_ATTEMPT"
_KEY = ENV_TAG.encode() + b"="
KILL_WAIT_S = 10.0  # how long a SIGKILLed process may take to disappear before we call it unkillable
POLL_S = 0.05


def scope_of(db_path: str | os.PathLike) -> str:
    """A short stable name of an engine database (its real path, hashed)."""
    return hashlib.sha256(os.path.realpath(os.fspath(db_path)).encode()).hexdigest()[:16]


def attempt_tag(scope: str, workflow_id: str, activity_id: str, attempt: int) -> str:
    """The tag of one attempt (``|`` and ``#`` never occur in ids, engine/ids.py)."""
    return f"{scope}|{workflow_id}|{activity_id}#{attempt}"


def split_tag(tag: str) -> tuple[str, int] | None:
    """``(activity part, attempt)`` of a tag, or None when it is not one."""
    head, sep, n = tag.rpartition("#")
    if not sep or not n.isdigit():
        return None
    return head, int(n)


def _tag_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:  # gone, a zombie's is empty, or not ours to read
        return None
    for item in env.split(b"\0"):
        if item.startswith(_KEY):
            return item[len(_KEY) :].decode("utf-8", "replace")
    return None


def tagged(match) -> dict[int, str | None]:
    """``{pid: start time}`` of the live processes (never this one) whose tag satisfies ``match(tag)``."""
    me = os.getpid()
    found: dict[int, str | None] = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: only the process group can be signalled
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        tag = _tag_of(int(name))
        if tag is not None and match(tag):
            start = proc_start(int(name))
            if start is not None:
                found[int(name)] = start
    return found


def of_attempt(tag: str) -> dict[int, str | None]:
    """The live processes of exactly the attempt ``tag``."""
    return tagged(lambda t: t == tag)


def of_earlier_attempts(tag: str) -> dict[int, str | None]:
    """The live processes of attempts of the same activity numbered below ``tag``'s."""
    mine = split_tag(tag)
    if mine is None:
        return {}

    def match(t: str) -> bool:
        other = split_tag(t)
        return other is not None and other[0] == mine[0] and other[1] < mine[1]

    return tagged(match)


def _signal(procs: dict[int, str | None], sig: int) -> None:
    for pid, start in procs.items():
        if proc_start(pid) == start:  # still that very process, not a reused pid
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(procs: dict[int, str | None]) -> dict[int, str | None]:
    return {pid: s for pid, s in procs.items() if proc_start(pid) == s}


def stop(find, *, grace_s: float, groups: Iterable[int] = (), on_wait=None) -> dict[int, str | None]:
    """Stop the processes ``find()`` returns (re-scanned, so late forks are caught) and the groups.

    SIGTERM (then SIGCONT, so a stopped process can act on it), up to ``grace_s`` for them to
    exit, then SIGKILL until none is left (at most ``KILL_WAIT_S``). ``on_wait()`` is called on
    each poll while waiting. Returns what could not be killed (empty unless not ours to kill).
    """
    groups = list(groups)
    procs = find()
    if not procs and not groups:  # nothing of it is alive, so nothing can fork any more
        return procs
    if grace_s > 0 and (procs or groups):
        for sig in (signal.SIGTERM, signal.SIGCONT):
            for g in groups:
                signal_group(g, sig)
            _signal(procs, sig)
        deadline = time.monotonic() + grace_s
        while procs and time.monotonic() < deadline:
            if on_wait is not None:
                on_wait()
            time.sleep(POLL_S)
            procs = _alive({**procs, **find()})
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        for g in groups:
            signal_group(g, signal.SIGKILL)
        _signal(procs, signal.SIGKILL)
        time.sleep(POLL_S if procs else 0)
        procs = _alive({**procs, **find()})
        if not procs or time.monotonic() > deadline:
            return procs
        if on_wait is not None:
            on_wait()


def kill_attempt(tag: str) -> dict[int, str | None]:
    """SIGKILL every process of attempt ``tag`` (a dead worker's) and wait until they are gone."""
    return stop(lambda: of_attempt(tag), grace_s=0)
