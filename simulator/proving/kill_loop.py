"""The real kill loop: SIGKILL ``ctl train`` (its whole process group) at seeded moments, then compare.

1. An uninterrupted ``ctl train --spec FILE --json`` in its own home folder gives the reference
   (it runs meanwhile, in the background).
2. In another home, ``ctl train`` is started, and killed with SIGKILL after a seeded number (1
   to 3) of new checkpoint lines in the trainer's progress files plus a seeded 0 to 0.1 s (so
   kills land between checkpoints too), ``kills`` times; after each kill, no trainer of that
   home may outlive its worker (the runner's parent-death signal).
3. The same command then runs to the end; its ``final_loss_hex`` and ``digest`` (and each
   segment's) must equal the reference's, bit for bit. Exit 0 equal, 1 a mismatch, 2 bad input, 3 not
   tested: no kill landed (every ``ctl train`` finished before it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contracts.layout import ACTIVITY, RunHome

from . import procs
from .core import compare_results

POLL_S = 0.05


def _ctl(spec: Path, home: Path) -> list[str]:
    return [sys.executable, "-m", "ctl.cli", "train", "--spec", str(spec), "--home", str(home), "--json"]


def start(spec: Path, home: Path) -> subprocess.Popen:
    """``ctl train --json`` in the background (its own process group)."""
    return subprocess.Popen(
        _ctl(spec, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=procs.env(),
    )


def outcome(p: subprocess.Popen, timeout_s: float) -> dict:
    """The JSON result of a ``ctl train --json`` run to its end (raises on a non-JSON or failed run)."""
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    try:
        out = json.loads(stdout[stdout.index("{") :])
    except ValueError:
        raise RuntimeError(f"ctl train exited {p.returncode} without a JSON outcome:\n{stderr[-2000:]}") from None
    if out.get("state") != "completed":
        raise RuntimeError(f"ctl train ended {out.get('state')} (exit {p.returncode}): {out.get('error')}")
    return out["result"]


def checkpoint_lines(home: Path) -> int:
    """Checkpoint lines written so far by every trainer attempt of this home."""
    n = 0
    for f in RunHome(home).runs.glob(f"*/{ACTIVITY}/*/progress-*.jsonl"):
        try:
            # liveness lines ({"event": ...}, tinyllm/progress.py) carry no "checkpoint" key
            n += sum(b'"checkpoint"' in line for line in f.read_bytes().splitlines())
        except OSError:
            pass
    return n


def trainers_of(home: Path) -> list[int]:
    """Pids of live ``tinyllm`` processes working in ``home``."""
    return [pid for pid, cmd in procs.processes_in(home) if "tinyllm" in cmd]


def kill_once(spec: Path, home: Path, rng: random.Random, deadline: float) -> str:
    """Start ``ctl train``, SIGKILL its process group at a seeded moment; what happened, in words."""
    lines_before = checkpoint_lines(home)
    wait_lines = rng.randint(1, 3)
    extra_s = rng.random() * 0.1  # a fraction of a checkpoint interval: kills land between checkpoints
    p = subprocess.Popen(
        _ctl(spec, home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=procs.env()
    )
    try:
        while time.monotonic() < deadline:
            if p.poll() is not None:
                return f"finished on its own (exit {p.returncode}) before the kill"
            if checkpoint_lines(home) >= lines_before + wait_lines:
                break
            time.sleep(POLL_S)
        time.sleep(extra_s)
        if p.poll() is not None:
            return f"finished on its own (exit {p.returncode}) before the kill"
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    orphans_until = time.monotonic() + 10.0
    while trainers_of(home) and time.monotonic() < orphans_until:
        time.sleep(POLL_S)
    left = trainers_of(home)
    if left:
        raise RuntimeError(f"trainer processes {left} outlived their killed worker")
    return f"SIGKILL after {checkpoint_lines(home) - lines_before} new checkpoint lines (+{extra_s:.2f}s)"


def kill_loop(spec: str, *, kills: int, seed: int, home: str | None = None, timeout_s: float = 900.0) -> int:
    """The command ``python -m simulator kill-loop``: 0 when bitwise equal after at least one kill, 1 on a
    mismatch, 3 when no kill landed (not tested)."""
    spec_path = Path(spec).resolve()
    if not spec_path.is_file():
        print(f"simulator: spec file not found: {spec}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + timeout_s
    base = Path(tempfile.mkdtemp(prefix="kill-loop-"))
    ref_home = base / "uninterrupted"
    kill_home = Path(home).resolve() if home else base / "killed"
    kill_home.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    ref = start(spec_path, ref_home)  # the uninterrupted run goes on meanwhile, in its own home
    landed = 0
    try:
        for i in range(kills):
            what = kill_once(spec_path, kill_home, rng, deadline)
            landed += what.startswith("SIGKILL")
            print(f"kill {i + 1}/{kills}: {what}")
        got = outcome(start(spec_path, kill_home), max(1.0, deadline - time.monotonic()))
        want = outcome(ref, max(1.0, deadline - time.monotonic()))
        print(
            f"uninterrupted: {want['steps']} steps, final_loss_hex {want['final_loss_hex']} "
            f"digest {want['digest'][:16]}"
        )
        bad = compare_results(got, want)
        print(f"after {landed} kill(s): final_loss_hex {got['final_loss_hex']} digest {got['digest'][:16]}")
        if bad:
            print(
                f"MISMATCH (seed {seed}; rerun: python -m simulator kill-loop --spec {spec} "
                f"--kills {kills} --seed {seed}); killed run's files kept in {kill_home}:"
            )
            for line in bad:
                print(f"  - {line}")
            home = str(kill_home)  # keep it
            return 1
        if not landed:  # every run finished before its kill: nothing resumed, nothing proven
            print(
                "kill-loop: no kill landed: a resume after a kill is not tested (every ctl train finished "
                "first; a longer run or another --seed)"
            )
            return 3
        print(f"kill-loop: {landed} kill(s), final loss and digest bitwise equal to the uninterrupted run")
        return 0
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)
            ref.wait()
        shutil.rmtree(ref_home, ignore_errors=True)
        if not home:
            shutil.rmtree(base, ignore_errors=True)
        elif not any(base.iterdir()):
            base.rmdir()
