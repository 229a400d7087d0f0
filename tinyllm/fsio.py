"""Small file-system pieces shared by tinyllm, workflows and ctl (standard library only, no torch).

``DISK_FULL_ERRNOS`` (what a full disk or quota raises), ``fsync_dir``, ``write_synced`` (write and
fsync one file), ``atomic_write`` (temp file, fsync, rename, dir fsync), ``resolve_home`` (``--home``,
else ``$CTL_HOME``, else the current directory; ``~`` expanded) and ``rel`` (a path as the home names it).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the entries of directory ``path`` durable (its descriptor is closed even when fsync fails)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(
    path: Path, data: bytes, *, write: Callable[[Path, bytes], None] = write_synced, cleanup: bool = False
) -> None:
    """Replace ``path`` with ``data`` atomically: ``.<name>.tmp-<pid>`` written by ``write`` (fsynced),
    ``os.replace``, then the directory fsynced. ``cleanup``: a failure removes the temporary first."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp, data)
        os.replace(tmp, path)
    except OSError:
        if cleanup:
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def resolve_home(home: str | os.PathLike | None) -> Path:
    """``home``, else ``$CTL_HOME``, else the current directory; ``~`` expanded, made absolute."""
    return Path(home or os.environ.get("CTL_HOME") or os.getcwd()).expanduser().absolute()


def rel(path: str | os.PathLike | None, home: Path) -> str | None:
    """``path`` relative to ``home`` when inside it, else absolute (both resolved); None stays None."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(Path(home).resolve()))
    except ValueError:
        return str(Path(path).resolve())
