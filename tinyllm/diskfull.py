"""A full disk: one clear failure (exit 74) that names the file, and no temporary left behind.

Writers wrap their writes in ``writing(path)``; an ``ENOSPC``/``EDQUOT`` becomes ``DiskFull(path)``.
The CLI then removes this process's own temporaries (names carrying ``tmp-``/``.replaced-`` and
ending in ``-<pid>``) and exits 74; what was written before (checkpoints, ``LATEST``) is untouched,
so the same command resumes once space is freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from .fsio import DISK_FULL_ERRNOS

MAX_ENTRIES = 200_000  # bound on the clean-up walk


class DiskFull(OSError):
    """No space left while writing ``path``."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(errno.ENOSPC, "disk full", os.fspath(path))

    def __str__(self) -> str:
        return f"disk full writing {self.filename}"


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk inside the block into ``DiskFull(path)`` (other errors pass unchanged)."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as e:
        if is_disk_full(e):
            raise DiskFull(e.filename or path) from None
        raise


def is_own_temporary(name: str, pid: int | None = None) -> bool:
    pid = os.getpid() if pid is None else pid
    return ("tmp-" in name or name.startswith(".replaced-")) and name.endswith(f"-{pid}")


def remove_own_temporaries(home: Path, pid: int | None = None) -> list[Path]:
    """Delete this process's temporaries under ``home`` (never ``.ctl``); return what went."""
    removed: list[Path] = []
    seen = 0
    for root, dirs, files in os.walk(home):
        dirs[:] = [d for d in dirs if not (root == str(home) and d == ".ctl")]
        for name in list(dirs) + files:
            seen += 1
            if seen > MAX_ENTRIES:
                return removed
            if is_own_temporary(name, pid):
                p = Path(root) / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                    dirs.remove(name) if name in dirs else None
                else:
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                removed.append(p)
    return removed
