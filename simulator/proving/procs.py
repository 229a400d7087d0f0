"""Real ``ctl`` processes for the kill loop, the fault campaign and their tests.

Everything here starts or inspects real processes through the command line, never the
engine's database directly: a reader is ``ctl history --json`` in another process, exactly
as a user would run it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CTL = [sys.executable, "-m", "ctl.cli"]
READ_TIMEOUT_S = 120.0


def env() -> dict[str, str]:
    """The environment of a child ``ctl``: this one, no CTL_HOME, fixed hash seed, one thread."""
    out = dict(os.environ)
    out.pop("CTL_HOME", None)
    out.setdefault("PYTHONHASHSEED", "0")
    out.setdefault("OMP_NUM_THREADS", "1")
    return out


def spawn(home: Path, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.Popen:
    """``ctl ARGS --home HOME`` in the background, in its own process group (``killpg`` reaches it all)."""
    return subprocess.Popen(
        [*CTL, *args, "--home", str(home)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env(),
    )


def run(home: Path, *args: str, timeout_s: float = READ_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``ctl ARGS --home HOME`` to its end."""
    return subprocess.run(
        [*CTL, *args, "--home", str(home)], capture_output=True, text=True, timeout=timeout_s, env=env()
    )


def history(home: Path, workflow_id: str) -> list[dict] | None:
    """The events of ``workflow_id`` as ``ctl history --json`` in another process prints them (None: none yet)."""
    p = run(home, "history", workflow_id, "--json")
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["events"]


def db_files(pid: int) -> list[str]:
    """The engine.db* files process ``pid`` holds open (one connection: engine.db once, its -wal, -shm)."""
    out: list[str] = []
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "engine.db" in target:
            out.append(target)
    return sorted(out)


def deleted_db_files(pid: int) -> list[str]:
    """Files named engine.db* that process ``pid`` holds open although they were deleted.

    A process writing into a deleted WAL commits into a file nobody else will ever read:
    the symptom of a dropped POSIX lock (see engine/_store.py).
    """
    return [f for f in db_files(pid) if f.endswith("(deleted)")]


def missing_events(seen: list[dict], final: list[dict]) -> list[str]:
    """Events a reader saw that the final history lacks or has differently (same seq)."""
    by_seq = {e["seq"]: e for e in final}
    bad = []
    for e in seen:
        f = by_seq.get(e["seq"])
        if f is None or (f["type"], f["attrs"]) != (e["type"], e["attrs"]):
            bad.append(
                f"seq {e['seq']} {e['type']} {e['attrs'].get('activity_id', '')}: "
                f"{'missing' if f is None else 'now ' + f['type']}"
            )
    return bad


def processes_in(home: Path) -> list[tuple[int, str]]:
    """Live processes (not zombies) whose command line names ``home``: (pid, command line)."""
    out = []
    needle = str(home).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state not in ("Z", "X"):
            out.append((int(d.name), cmd.replace(b"\0", b" ").decode(errors="replace").strip()))
    return out


def trainer_pids(home: Path) -> list[int]:
    """The ``tinyllm train`` processes of ``home`` (cold or forked warm: both carry the real command line)."""
    return [pid for pid, cmd in processes_in(home) if "tinyllm" in cmd and " train " in f" {cmd} "]


def killpg(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """``sig`` to ``p``'s whole process group (it was started with its own session); reap it on SIGKILL."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    if sig == signal.SIGKILL:
        p.wait()


def wait_for(what: str, cond, *, timeout_s: float, poll_s: float = 0.2, alive: subprocess.Popen | None = None):
    """Poll ``cond()`` until it is truthy (its value is returned); fail after ``timeout_s`` or if ``alive`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if alive is not None and alive.poll() is not None:
            err = alive.stderr.read() if alive.stderr else ""
            raise AssertionError(f"while waiting for {what}: process exited {alive.returncode}: {err[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
