"""Helpers of the bad-input tests: the real CLIs as subprocesses, snapshots of a home, damage."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "mini",
    "steps": 6,
    "eval_every": 0,
    "checkpoint_every": 3,
    "batch_size": 2,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    e.pop("CTL_HOME", None)
    return e


def ctl(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
        cwd=str(home) if home.is_dir() else None,
    )


def tinyllm(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit ``code``, exactly one line on stderr holding every needle, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in proc.stderr, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


def snapshot(home: Path) -> dict[str, str]:
    """Every file under ``home`` with its sha256 (directories as 'dir').

    SQLite's shared-memory index (``engine.db-shm``) and an empty ``engine.db-wal``, which a
    read-only connection may leave beside a WAL database, hold no data and are left out."""
    out = {}
    for p in sorted(home.rglob("*")):
        rel = str(p.relative_to(home))
        if rel.endswith("engine.db-shm") or (rel.endswith("engine.db-wal") and p.stat().st_size == 0):
            continue
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def copy_home(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def db_of(home: Path) -> Path:
    return home / ".ctl" / "engine.db"


def poke(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of a file that no process has open (test-side damage)."""
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def nth(raw: bytes, needle: bytes, n: int, start: int = 0) -> int:
    i = start - 1
    for _ in range(n + 1):
        i = raw.find(needle, i + 1)
        assert i >= 0, (needle, n)
    return i


def event_offsets(db: Path, workflow_id: str, needle: bytes) -> list[int]:
    """Offsets in the file of ``needle`` inside the events table's pages (found with dbstat)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        ps = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = [p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name='events'")]
    finally:
        conn.close()
    raw = db.read_bytes()
    out = []
    for p in pages:
        chunk = raw[(p - 1) * ps : p * ps]
        i = chunk.find(needle)
        while i >= 0:
            out.append((p - 1) * ps + i)
            i = chunk.find(needle, i + 1)
    return sorted(out)


class Tmpfs:
    """A real size-limited tmpfs (root only); ``ok`` is False with ``why`` where it cannot be mounted."""

    def __init__(self, path: Path, size: str):
        self.path, self.size, self.ok, self.why = path, size, False, ""

    def __enter__(self) -> "Tmpfs":
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.why = "mounting a tmpfs needs root"
            return self
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)], capture_output=True, text=True
        )
        self.ok = r.returncode == 0
        self.why = r.stderr.strip() or f"mount exited {r.returncode}"
        return self

    def remount_ro(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True, capture_output=True)

    def __exit__(self, *exc) -> None:
        if self.ok:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
