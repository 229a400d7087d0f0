"""The launcher side of a distributed run (no torch here): ``tinyllm train`` of a spec with ``distributed``.

The process the train activity starts (``python -m tinyllm.cli train ...``, the same command line as
for a one-process spec) becomes the *launcher*: it refuses a resume at another world size before
anything starts, then runs::

    python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 0 \\
        --signals-to-handle SIGINT,SIGHUP,SIGQUIT -m tinyllm.cli train <the same arguments>

and turns what the ranks report into the one exit code and result line of the subprocess contract
(0 done, 2 bad input, 74 disk full, 75 locked, 130 stopped after a checkpoint, 1 anything else: a
retryable failure). torchrun alone cannot: it exits 1 for any failed rank, and a second SIGTERM
while it shuts its workers down makes it exit at once, without waiting for the ranks' checkpoint.

Signals and process lifetime:

- torchrun runs with SIGTERM *ignored* (inherited; ``--signals-to-handle`` leaves SIGTERM alone) and
  a parent-death SIGKILL; the ranks install their own SIGTERM handler at once. A SIGTERM for the
  attempt (the engine's runner signals every process carrying ``DURABLE_ATTEMPT``, which torchrun
  copies into each rank's environment) reaches the ranks directly, and the launcher forwards its own
  to every rank that has started; the ranks agree on the step to stop at (an all-reduce), checkpoint
  together and exit 130.
- Each rank has a parent-death SIGKILL too: SIGKILL of the launcher kills torchrun, which kills the
  ranks; SIGKILL of one rank makes torchrun stop the others (their next collective fails at once).
- ``RANK_STATUS_ENV`` names a temporary folder where each rank writes ``started-<rank>.json`` (its
  pid, once its handlers are in place) and ``rank-<rank>.json`` (its exit code, message, result).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import STOP
from .runlock import pid_running
from .spec import SpecError, TrainSpec

RANK_STATUS_ENV = "TINYLLM_DDP_STATUS"
EXIT_FAILED = 1
REPORTED_CODES = (2, 74, 75)  # a rank's own verdict the launcher passes on (bad input, disk full, locked)
PR_SET_PDEATHSIG = 1
POLL_S = 0.1
RANK_EXIT_WAIT_S = 30.0  # after torchrun ended: how long its ranks may take to disappear


def in_rank() -> bool:
    """True inside a process torchrun started (its rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def world_size_of(trajectory: dict | None) -> int | None:
    """The world size a checkpoint was trained at (None: a one-process run)."""
    d = (trajectory or {}).get("distributed")
    return int(d["world_size"]) if isinstance(d, dict) and "world_size" in d else None


def check_world_size(saved: dict | None, spec: TrainSpec, path: Path | str | None) -> None:
    """Refuse resuming ``path`` (trajectory ``saved``) at a world size other than its own."""
    if saved is None:
        return
    was, now = world_size_of(saved), spec.distributed.world_size if spec.distributed else None
    if was == now:
        return

    def words(n: int | None) -> str:
        return "one process (no distributed)" if n is None else f"world_size {n}"

    raise SpecError(f"checkpoint {path} was trained at {words(was)}, this spec asks for {words(now)}: resuming at "
                    f"another world size is refused (the batch shards, the gradient all-reduce and the ranks' "
                    f"RNG streams would change, so the run would not be bitwise the same); use {words(was)} "
                    f"or a new run name")


def _resume_candidate(home: Path, spec: TrainSpec, resume: Path | None) -> Path | None:
    """The checkpoint the ranks will most likely resume from (the trainer's own choice verifies it)."""
    if resume is not None:
        return resume
    root = home / "runs" / spec.name / "ckpt"
    try:
        name = (root / "LATEST").read_text(encoding="utf-8").strip()
        if name and "/" not in name and (root / name).is_dir():
            return root / name
    except (OSError, UnicodeDecodeError):
        pass
    try:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))
    except OSError:
        return None
    return dirs[-1] if dirs else None


def precheck(spec: TrainSpec, home: Path, resume: Path | None) -> None:
    """Bad input a distributed run can see before starting any process: one ``SpecError`` line."""
    d = spec.distributed
    assert d is not None
    if d.backend == "nccl":
        raise SpecError("distributed.backend nccl needs CUDA devices, and tinyllm trains on CPU: use gloo")
    check_resume_world_size(spec, home, resume)


def check_resume_world_size(spec: TrainSpec, home: Path, resume: Path | None) -> None:
    """Refuse, before torch is imported or the run locked, a resume at another world size (any spec)."""
    candidate = _resume_candidate(home, spec, resume)
    if candidate is None:
        return
    try:
        manifest = json.loads((candidate / "manifest.json").read_text(encoding="utf-8"))
        saved = manifest["meta"]["trajectory"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable: the ranks refuse it and choose another (tinyllm/checkpoint.py)
    if isinstance(saved, dict):
        check_world_size(saved, spec, home_relative(candidate, home))


def home_relative(path: Path, home: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(home.resolve()))
    except ValueError:
        return str(path)


# -- the rank side (no torch needed either) -------------------------------------------------

def _set_parent_death_signal(sig: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: torchrun's own shutdown still stops the ranks
        pass


class RankStatus:
    """What one rank tells the launcher: written once when it ends (``finish``)."""

    def __init__(self, folder: Path | None, rank: int):
        self.folder, self.rank, self.result, self.done = folder, rank, None, False

    def _write(self, name: str, body: dict) -> None:
        if self.folder is None:
            return
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(json.dumps(body), encoding="utf-8")
        os.replace(tmp, self.folder / name)

    def started(self) -> None:
        self._write(f"started-{self.rank}.json", {"rank": self.rank, "pid": os.getpid()})

    def finish(self, code: int, message: str | None = None) -> None:
        if not self.done:
            self.done = True
            self._write(f"rank-{self.rank}.json", {"rank": self.rank, "pid": os.getpid(), "code": code,
                                                   "message": message, "result": self.result})


def enter_rank() -> RankStatus:
    """Set up this torchrun rank: parent-death SIGKILL, and say it started (its handlers are in place)."""
    parent = os.getppid()
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # torchrun died before the death signal was armed
        os._exit(137)
    folder = os.environ.get(RANK_STATUS_ENV)
    status = RankStatus(Path(folder) if folder and os.path.isdir(folder) else None, int(os.environ["RANK"]))
    status.started()
    return status


# -- the launcher ----------------------------------------------------------------------------

def torchrun_argv(world_size: int, rank_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
            "--max-restarts", "0",  # the engine owns retries: a failed rank ends the attempt
            "--signals-to-handle", "SIGINT,SIGHUP,SIGQUIT",  # SIGTERM stays ignored in torchrun (see above)
            "-m", "tinyllm.cli", "train", *rank_args]


def _torchrun_setup(parent: int):
    def setup() -> None:  # in torchrun's process, between fork and exec
        _set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(137)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the ranks handle it; see the module docstring

    return setup


def _read(folder: Path, prefix: str) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for p in folder.glob(f"{prefix}-*.json"):
        try:
            body = json.loads(p.read_text(encoding="utf-8"))
            found[int(body["rank"])] = body
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def launch(spec: TrainSpec, home: Path, rank_args: list[str], resume: Path | None, log=None) -> tuple[int, dict | None, str | None]:
    """Run the ranks under torchrun; ``(exit code, result, message)`` of the whole run."""
    log = log or sys.stderr
    precheck(spec, home, resume)  # SpecError: nothing started
    ws = spec.distributed.world_size
    folder = Path(tempfile.mkdtemp(prefix="tinyllm-ddp-"))
    stop = {"signals": 1 if STOP["requested"] else 0}  # a SIGTERM before this point counts too
    signaled: set[int] = set()

    def on_signal(signum, frame) -> None:
        stop["signals"] += 1

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    env = {**os.environ, RANK_STATUS_ENV: str(folder)}
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's own warnings; its failure report still prints
    try:
        print(f"tinyllm: launching {ws} rank(s) with torchrun ({spec.distributed.backend})", file=log, flush=True)
        proc = subprocess.Popen(torchrun_argv(ws, rank_args), env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=_torchrun_setup(os.getpid()))
        while proc.poll() is None:
            if stop["signals"]:
                for rank, body in _read(folder, "started").items():
                    if body["pid"] not in signaled:  # forward once per rank (late starters too)
                        signaled.add(body["pid"])
                        try:
                            os.kill(body["pid"], signal.SIGTERM)
                        except ProcessLookupError:
                            pass
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
        # torchrun is gone; its ranks die with it (parent-death SIGKILL), wait until they have
        deadline = time.monotonic() + RANK_EXIT_WAIT_S
        started = _read(folder, "started")
        while any(pid_running(b["pid"]) for b in started.values()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return verdict(ws, _read(folder, "rank"), proc.returncode)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(folder, ignore_errors=True)


def verdict(world_size: int, ended: dict[int, dict], torchrun_rc: int) -> tuple[int, dict | None, str | None]:
    """One exit code from every rank's: all alike (0 or 130) pass on with rank 0's result; a rank's
    bad input, disk full or lock (rank 0's first) passes on with its message; anything else is 1."""
    codes = {r: b.get("code") for r, b in ended.items()}
    result = ended.get(0, {}).get("result")
    if len(codes) == world_size and set(codes.values()) == {0} and isinstance(result, dict):
        return 0, result, None
    if len(codes) == world_size and set(codes.values()) == {130} and isinstance(result, dict):
        return 130, result, None
    for r in sorted(codes):
        if codes[r] in REPORTED_CODES:
            return int(codes[r]), None, ended[r].get("message") or f"rank {r} exited {codes[r]}"
    parts = []
    for r in range(world_size):
        if r not in ended:
            parts.append(f"rank {r} ended without a verdict (killed, or lost a peer)")
        elif codes[r] not in (0, 130):
            parts.append(f"rank {r} exited {codes[r]}" + (f": {ended[r]['message']}" if ended[r].get("message") else ""))
    if not parts:
        parts.append(f"the ranks disagree ({', '.join(f'rank {r}: {c}' for r, c in sorted(codes.items()))})")
    return EXIT_FAILED, None, f"distributed run failed (torchrun exit {torchrun_rc}): {'; '.join(parts)}"


def rank_argv(spec_path: str, home: Path, progress: str | None, resume: Path | None, total_steps: int | None) -> list[str]:
    """The ranks' arguments: the launcher's own, with paths made absolute."""
    args = ["--spec", os.path.abspath(spec_path), "--home", str(home)]
    if progress:
        args += ["--progress", os.path.abspath(progress)]
    if resume is not None:
        args += ["--resume", str(resume)]
    if total_steps is not None:
        args += ["--total-steps", str(total_steps)]
    return args


