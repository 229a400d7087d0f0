"""Lease owners: who holds an activity attempt, and whether that owner is known to be dead.

A lease records its owner as ``{host, boot, pid, pstart, instance}``: the host
name, the kernel boot id, the worker's pid and that process's start time (so a
reused pid is not mistaken for the owner), and the id of the ``Engine``
instance. On this host a lease is dead at once when the boot id changed, the
pid is gone or belongs to another process, or the pid is this very process and
the instance is no longer live (an ``Engine`` that crashed or was closed).
Elsewhere only the heartbeat timeout can tell.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import uuid

HOST = socket.gethostname()
_LIVE: set[str] = set()
_LIVE_LOCK = threading.Lock()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


BOOT = (_read("/proc/sys/kernel/random/boot_id") or "").strip()


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone or a zombie."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def new_owner() -> dict:
    """A fresh owner identity for an Engine instance in this process (registered as live)."""
    instance = uuid.uuid4().hex
    with _LIVE_LOCK:
        _LIVE.add(instance)
    return {"host": HOST, "boot": BOOT, "pid": os.getpid(), "pstart": proc_start(os.getpid()), "instance": instance}


def mark_dead(owner: dict) -> None:
    """Forget an Engine instance of this process: its leases are redelivered at once."""
    with _LIVE_LOCK:
        _LIVE.discard(owner["instance"])


def mark_live(owner: dict) -> None:
    """Undo ``mark_dead`` (the simulator pauses a worker, then lets it go on)."""
    with _LIVE_LOCK:
        _LIVE.add(owner["instance"])


def owner_dead(owner: dict | None) -> bool:
    """True when the owner is known dead (see the module docstring); False when alive or unknown."""
    if not owner:
        return True
    if owner.get("host") != HOST:
        return False
    if BOOT and owner.get("boot") and owner.get("boot") != BOOT:
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return True
    if owner.get("pstart") is None:  # no /proc here: fall back to "does the pid exist"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    elif proc_start(pid) != owner.get("pstart"):
        return True
    if pid == os.getpid():
        with _LIVE_LOCK:
            return owner.get("instance") not in _LIVE
    return False


def kill_leftover(child: dict | None) -> bool:
    """SIGKILL the process group of a dead owner's subprocess, if that exact process still runs."""
    if not child or not isinstance(child.get("pid"), int):
        return False
    pid = child["pid"]
    if proc_start(pid) is None or proc_start(pid) != child.get("pstart"):
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
    return True
