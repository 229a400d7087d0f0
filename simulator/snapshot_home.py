"""A killed run's home as files: committed transactions copied by SQLite, files linked, snapshots reused.

The snapshot sweep (simulator/snapshot_sweep.py) recovers each kill position from a copy of the
uninterrupted run's home at that position: ``copy_committed`` copies what the database had committed,
``link_tree`` hard-links the files, and ``SnapshotHome`` keeps one such folder in step with the source
as the run goes on, instead of a new copy per position.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from contracts.layout import RunHome

if TYPE_CHECKING:
    from .fakes import FakeActivities


def new_home(prefix: str = "sim-") -> Path:
    """A fresh home folder, on tmpfs when there is one (fsync is free there)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def remove_home(home: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)


def copy_committed(src: Path, dst: Path, workflow_id: str | None = None) -> int:
    """What a kill leaves of database ``src``: its committed transactions, copied by SQLite.

    Never a file copy: a Python open()/close() of a database file this process has open
    drops the live connection's POSIX locks (see engine/_store.py). A fresh connection sees
    only what was committed, as recovery after a crash would. Returns how many events of
    ``workflow_id`` were copied.
    """
    if not src.exists():
        return 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(src.resolve().as_uri() + "?mode=ro", uri=True)
    target = sqlite3.connect(dst)
    try:
        # read through a mapping, written through a small cache: a third less time and a third of the
        # memory pages touched of the default caches, for the same pages copied (measured, issue 15)
        source.execute("PRAGMA mmap_size=1073741824")
        target.execute("PRAGMA cache_size=16")
        source.backup(target)
        if workflow_id is None:
            return 0
        try:
            (n,) = target.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id=?", (workflow_id,)
            ).fetchone()
        except sqlite3.OperationalError:  # no schema yet
            return 0
        return n
    finally:
        target.close()
        source.close()


UNREAD = ("evals",)  # top-level folders the fakes only write and no check reads: a snapshot leaves them out
RESYNC = ("releases",)  # top-level folders a snapshot makes anew each time (publish deletes and renames there)


def unread_of(release: bool) -> tuple[str, ...]:
    """``UNREAD``, but none where a scenario's ``release`` reuses evaluation outputs (simulator/release.py)."""
    return () if release else UNREAD


def link_tree(src: str, dst: str, depth: int = 0, unread: tuple[str, ...] = UNREAD) -> None:
    """Copy the files of ``src`` (but the database and ``UNREAD``) into ``dst`` as hard links.

    The fakes never write a file in place (a temporary name, then a rename), so a recovery's
    writes never reach the uninterrupted run's files; linking instead of copying makes a
    snapshot cost one system call per file. The evaluation outputs (``evals/``) are written by
    the fake evaluations and read by nothing (not by the fakes, not by a check; their bytes are
    in the files digest, ``FakeActivities.files``, which a recovery inherits): leaving them out
    of the snapshot changes nothing any run reads, and keeps a snapshot's size independent of
    the number of evaluations so far.
    """
    if depth > 32:
        raise RuntimeError(f"{src}: folders nested too deep")
    with os.scandir(src) as entries:
        for e in entries:
            name = e.name
            if e.is_dir(follow_symlinks=False):
                if depth == 0 and name in unread:
                    continue
                sub = f"{dst}/{name}"
                os.mkdir(sub)
                link_tree(e.path, sub, depth + 1, unread)
            elif not name.startswith("engine.db"):
                os.link(e.path, f"{dst}/{name}")


def _listing(root: str, unread: tuple[str, ...] = UNREAD) -> list[tuple[str, bytes | None]]:
    """Every folder and file under ``root`` but the database and ``unread``, with the files' bytes."""
    out: list[tuple[str, bytes | None]] = []
    for path, dirs, files in os.walk(root):
        rel = os.path.relpath(path, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in unread]
        out.append((rel, None))
        for name in files:
            if not name.startswith("engine.db"):
                with open(os.path.join(path, name), "rb") as f:
                    out.append((os.path.join(rel, name), f.read()))
    return sorted(out)


class SnapshotHome:
    """One recovery folder, reused for the snapshots of one source home: O(changed files) each.

    A snapshot is the source's files as they stand (``_link_tree``: a hard link per file). Between
    two recoveries, only the files written since differ: those the source's fakes wrote since the
    last snapshot and those the last recovery's fakes wrote (``FakeActivities.log``; the fakes are
    the only writers of files but the database and ``UNREAD``, and never write in place). So the
    folder is made the source's again by linking those files anew from the source, or removing
    them (and the folders that leaves empty) where the source has none; the database is copied
    afresh each time. A recovery forked off a shared replay (simulator/prefix.py) syncs and uses the
    same folder and hands back what it did (``state``, ``adopt``); a child that dies leaves the
    folder unknown: it is made anew. ``verify`` (tests): after each sync, the folder's listing
    (every folder, every file's bytes) must equal the source's, else the recovery raises.
    """

    def __init__(self, src_home: Path, unread: tuple[str, ...] = UNREAD):
        self.src = os.fspath(src_home)
        self.unread = unread  # () where a release reads evaluation outputs back (simulator/release.py)
        self.home: Path | None = None
        self.verify = False
        self._seen = 0  # how much of the source's log the folder has
        self._own: list[str] = []  # what the last recovery wrote

    def take(self, src_fakes: FakeActivities) -> Path:
        """The folder, holding the source's files as they are now (its ``.ctl`` empty)."""
        log = src_fakes.log
        if self.home is None:
            self.home = new_home()
            link_tree(self.src, os.fspath(self.home), unread=self.unread)
        else:
            home = os.fspath(self.home)
            ctl = os.fspath(RunHome(home).ctl_dir)
            if os.path.isdir(ctl):
                for name in os.listdir(ctl):
                    os.unlink(os.path.join(ctl, name))
            changed = set(log[self._seen :])
            changed.update(self._own)
            if any(rel.split("/", 1)[0] in self.unread for rel in self._own):
                for top in self.unread:
                    shutil.rmtree(os.path.join(home, top), ignore_errors=True)
            for rel in sorted(changed):
                if rel.split("/", 1)[0] not in self.unread:
                    self._sync(home, rel)
            for top in RESYNC:  # (also deletes and renames there: made the source's again whole)
                shutil.rmtree(os.path.join(home, top), ignore_errors=True)
                if os.path.isdir(os.path.join(self.src, top)):
                    os.mkdir(os.path.join(home, top))
                    link_tree(os.path.join(self.src, top), os.path.join(home, top), 1)
        self._seen, self._own = len(log), []
        if self.verify and _listing(os.fspath(self.home), self.unread) != _listing(self.src, self.unread):
            raise RuntimeError(f"snapshot folder {self.home} differs from its source {self.src}")
        return self.home

    def _sync(self, home: str, rel: str) -> None:
        dst, src = os.path.join(home, rel), os.path.join(self.src, rel)
        try:
            os.unlink(dst)
        except FileNotFoundError:
            pass
        try:
            os.link(src, dst)
            return
        except FileNotFoundError:
            if os.path.exists(src):  # its folder is not in the snapshot yet
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.link(src, dst)
                return
        d = os.path.dirname(dst)  # not in the source: the folders this leaves empty go too
        while len(d) > len(home):
            try:
                os.rmdir(d)
            except OSError:  # not empty (or gone)
                break
            d = os.path.dirname(d)

    def returned(self, fakes: FakeActivities | None) -> None:
        """The recovery in the folder ended; ``fakes``: its fakes (None: the folder is given up)."""
        if fakes is None:
            self.drop()
        else:
            self._own = list(fakes.log)

    def state(self) -> tuple:
        """What a forked child did with the folder, for the parent's ``adopt``."""
        return self.home, self._seen, list(self._own)

    def adopt(self, state: tuple | None) -> None:
        """The folder as a forked recovery left it (None: unknown, e.g. the child died: made anew)."""
        if state is None:
            self.drop()
        elif state[0] is None:  # the child kept it for a mismatch, or gave it up
            self.home = None
        elif self.home is None or state[0] == self.home:  # (the child may have made it)
            self.home, self._seen, self._own = state
        else:  # not expected: neither folder is known to be the source's
            remove_home(state[0])
            self.drop()

    def release(self) -> None:
        """Leave the folder as it is (kept for a mismatch); the next snapshot makes a new one."""
        self.home = None

    def drop(self) -> None:
        if self.home is not None:
            remove_home(self.home)
        self.home = None
