"""The home folder's state before and during writes: read-only, lost history, full disk.

``check_home_writable`` and ``refuse_lost_history`` run before ``ctl train`` (and the other
writing commands) open the database; ``as_ctl_error`` turns an exception from deep inside a
write (SQLite's "database or disk is full", ``ENOSPC``, a read-only file system) into the one
line and exit code ctl reports. Nothing here opens ``engine.db`` (``os.stat`` only).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from contracts.layout import RunHome
from tinyllm.fsio import DISK_FULL_ERRNOS

from .errors import BadRequest, CtlError, DiskFull

_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}


def _read_only_message(home: Path) -> str:
    return (
        f"home {home} is read-only: this command writes its database and runs there "
        f"(status, list and history work read-only); pass a writable --home"
    )


def _is_read_only(path: Path) -> bool:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return True
    except OSError:
        return False
    return not os.access(path, os.W_OK)


def check_home_writable(home: Path) -> None:
    """``BadRequest`` when ``home`` (or its ``.ctl``, or the nearest folder that exists) is read-only."""
    probe = home
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if _is_read_only(probe) or (RunHome(home).ctl_dir.is_dir() and _is_read_only(RunHome(home).ctl_dir)):
        raise BadRequest(_read_only_message(home))


def refuse_lost_history(home: Path, db: Path) -> None:
    """A zero-length database beside existing runs is a lost history: refuse, and say what to do."""
    try:
        size = db.stat().st_size
    except FileNotFoundError:
        return
    runs_dir = RunHome(home).runs
    runs = sorted(p.name for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []
    if size == 0 and runs:
        shown = ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else "")
        raise BadRequest(
            f"engine database {db} is empty (0 bytes) but runs/ holds {len(runs)} run(s) ({shown}): their history "
            f"is lost; restore the file from a backup, or delete it to start a new history (training then resumes "
            f"from each run's checkpoints, and every evaluation is done again)"
        )


def as_ctl_error(err: BaseException, home: Path | None) -> CtlError | None:
    """The one-line error for a resource failure inside a write, or None when ``err`` is not one."""
    db = f"{home}/.ctl/engine.db" if home is not None else "the engine database"
    if isinstance(err, sqlite3.OperationalError):
        text = str(err).lower()
        if "disk is full" in text or "disk full" in text:
            return DiskFull(
                f"disk full writing {db}; free some space and run the same command again (nothing recorded is lost)"
            )
        if "readonly" in text or "read-only" in text:
            return BadRequest(_read_only_message(home) if home else f"{db} is read-only")
        if "disk i/o error" in text:
            return CtlError(f"I/O error on {db}: {err}; check the disk, then `ctl doctor`")
        if "locked" in text or "busy" in text:
            return CtlError(f"{db} stayed locked by another process ({err}); try again")
    if isinstance(err, sqlite3.DatabaseError):  # "database disk image is malformed" and the like
        return BadRequest(
            f"engine database {db} is damaged: {err}; nothing was written; `ctl doctor` says "
            f"what each run can still use"
        )
    if isinstance(err, OSError):
        if err.errno in DISK_FULL_ERRNOS:
            return DiskFull(
                f"disk full writing {err.filename or home}; free some space and run the same command "
                f"again (nothing recorded is lost)"
            )
        if err.errno == errno.EROFS or (err.errno in _READ_ONLY and home is not None):
            return BadRequest(_read_only_message(home) if home else f"read-only: {err.filename}")
    return None
