"""The launcher side of a distributed run (no torch here): ``tinyllm train`` of a spec with ``distributed``.

The process the train activity starts (``python -m tinyllm.cli train ...``, the same command line as
for a one-process spec) becomes the *launcher*: it refuses a resume at another world size before
anything starts, then runs::

    python -m tinyllm.distributed.agent --standalone --nproc-per-node N --max-restarts 0 \\
        --signals-to-handle SIGHUP,SIGQUIT -m tinyllm.cli train <the same arguments>

``tinyllm.distributed.agent`` is torchrun (``torch.distributed.run``) that passes a stop signal on to its ranks
(below). On several nodes (``TINYLLM_NNODES`` > 1, see ``Nodes``), each node's launcher runs its
share of the ranks with ``--nnodes K --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT``
instead of ``--standalone``.

and turns what the ranks report into the one exit code and result line of the subprocess contract
(0 done, 2 bad input, 74 disk full, 75 locked, 130 stopped after a checkpoint, 1 anything else: a
retryable failure). torchrun alone cannot: it exits 1 for any failed rank, and a second SIGTERM
while it shuts its workers down makes it exit at once, without waiting for the ranks' checkpoint.

Signals and process lifetime. The stop signals are SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL``
(tinyllm/errors.py). torchrun starts each rank in a session of its own (``start_new_session``), so a
signal to the launcher's process group (a terminal's Ctrl-C, ``kill -- -PGID``) reaches the launcher
and the agent but not the ranks; a platform that signals every process of the job (Slurm's step
cgroup; the engine's runner, every process carrying ``DURABLE_ATTEMPT``, which torchrun copies into
each rank's environment) reaches the ranks too. Either way every rank stops at the same step:

- The launcher passes a stop signal it receives on to every rank of its node that has started (and
  to one that starts later). The agent does the same for a signal sent to it alone (``kill <torchrun
  pid>``, one node's agent of a multi-node run): torchrun's own handling would SIGKILL the ranks 30 s
  after passing the signal on, and a stop signal it does not handle (SIGUSR1) would kill it and, by
  the parent-death signal, its ranks. The agent runs with the stop signals blocked (set here between
  fork and exec) and takes them in one thread (``sigtimedwait``), so its ranks start with them
  blocked too: a stop signal that reaches a rank before its handler is in place stays pending until
  the rank unblocks it (tinyllm/cli.py), never lost and never fatal.
- A rank that received a stop signal (from anyone: one rank only is enough) stops the others: at each
  step boundary the ranks all-reduce their stop flags (tinyllm/distributed/trainer.py), so all stop after the
  same step, rank 0 writes the ``stopping`` progress line at it, they write one checkpoint together
  and exit 130.
- Each rank has a parent-death SIGKILL too: SIGKILL of the launcher kills torchrun, which kills the
  ranks; SIGKILL of one rank makes torchrun stop the others (their next collective fails at once).
- ``RANK_STATUS_ENV`` names a temporary folder where each rank writes ``started-<rank>.json`` (its
  pid, once its handlers are in place) and ``rank-<rank>.json`` (its exit code, message, result).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dataclasses import dataclass

from contracts.exits import EXIT_BAD_INPUT, EXIT_CANCELED, EXIT_DISK_FULL, EXIT_FAILED, EXIT_LOCKED
from contracts.layout import LATEST, MANIFEST, STEP_PREFIX, RunHome

from ..errors import STOP, stop_signals
from ..runlock import pid_running
from ..spec import SpecError, TrainSpec
from ..world_size import check_world_size

RANK_STATUS_ENV = "TINYLLM_DDP_STATUS"
NNODES_ENV, NODE_RANK_ENV = "TINYLLM_NNODES", "TINYLLM_NODE_RANK"
RDZV_ENDPOINT_ENV, RDZV_ID_ENV = "TINYLLM_RDZV_ENDPOINT", "TINYLLM_RDZV_ID"
REPORTED_CODES = (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_LOCKED,
)  # a rank's own verdict the launcher passes on (bad input, disk full, locked)
PR_SET_PDEATHSIG = 1
POLL_S = 0.1
RANK_EXIT_WAIT_S = 30.0  # after torchrun ended: how long its ranks may take to disappear


def in_rank() -> bool:
    """True inside a process torchrun started (its rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def _resume_candidate(home: Path, spec: TrainSpec, resume: Path | None) -> Path | None:
    """The checkpoint the ranks will most likely resume from (the trainer's own choice verifies it)."""
    if resume is not None:
        return resume
    root = RunHome(home).run(spec.name).ckpt_root
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
        if name and "/" not in name and (root / name).is_dir():
            return root / name
    except (OSError, UnicodeDecodeError):
        pass
    try:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX))
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
        manifest = json.loads((candidate / MANIFEST).read_text(encoding="utf-8"))
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
        self.folder, self.rank, self.done = folder, rank, False
        self.result: dict | None = None

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
            self._write(
                f"rank-{self.rank}.json",
                {"rank": self.rank, "pid": os.getpid(), "code": code, "message": message, "result": self.result},
            )


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


@dataclass(frozen=True)
class Nodes:
    """Where this launcher's ranks sit among the run's nodes (from the environment, not the spec: the
    node count and the rendezvous address are where a run is placed, not what it computes).

    ``TINYLLM_NNODES`` (default 1), ``TINYLLM_NODE_RANK`` (0..K-1), ``TINYLLM_RDZV_ENDPOINT`` (HOST:PORT
    of the c10d rendezvous, reachable from every node; needed when K > 1), ``TINYLLM_RDZV_ID`` (one id
    shared by the run's nodes; default ``tinyllm-<spec name>``). Each node runs ``world_size / K``
    ranks; torchrun's c10d rendezvous numbers the ranks (the node with ``--node-rank 0`` need not hold
    rank 0). The bits depend on the global rank only, so the same spec on 1 node or K nodes of the
    same machine gives the same loss bits; a resume needs the same world size, not the same K.
    """

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None
    rdzv_id: str | None = None

    def per_node(self, world_size: int) -> int:
        return world_size // self.nnodes


def _env_int(name: str, default: int, lowest: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < lowest:
        raise SpecError(f"{name}={raw!r}: want a whole number >= {lowest}")
    return int(raw)


def nodes_from_env(spec: TrainSpec) -> Nodes:
    """This launcher's ``Nodes``; a bad value or one that does not fit the spec is one ``SpecError`` line."""
    nnodes = _env_int(NNODES_ENV, 1, 1)
    node_rank = _env_int(NODE_RANK_ENV, 0, 0)
    assert spec.distributed is not None  # (a distributed spec: the caller launched ranks for it)
    ws = spec.distributed.world_size
    if nnodes == 1:
        if node_rank != 0:
            raise SpecError(f"{NODE_RANK_ENV}={node_rank} with one node ({NNODES_ENV} unset or 1)")
        return Nodes()
    if node_rank >= nnodes:
        raise SpecError(f"{NODE_RANK_ENV}={node_rank}: want 0..{nnodes - 1} ({NNODES_ENV}={nnodes})")
    if ws % nnodes:
        raise SpecError(f"world_size {ws} is not a multiple of {NNODES_ENV}={nnodes} (each node runs as many ranks)")
    endpoint = os.environ.get(RDZV_ENDPOINT_ENV, "").strip()
    if not re.fullmatch(r"\[?[A-Za-z0-9.:_-]+\]?:[0-9]{1,5}", endpoint):
        raise SpecError(
            f"{NNODES_ENV}={nnodes} needs {RDZV_ENDPOINT_ENV}=HOST:PORT, the c10d rendezvous every "
            f"node reaches (got {endpoint!r})"
        )
    rdzv_id = os.environ.get(RDZV_ID_ENV, "").strip() or f"tinyllm-{spec.name}"
    return Nodes(nnodes, node_rank, endpoint, rdzv_id)


def torchrun_argv(world_size: int, rank_args: list[str], nodes: Nodes = Nodes()) -> list[str]:
    if nodes.nnodes == 1:
        where = ["--standalone", "--nproc-per-node", str(world_size)]
    else:
        assert nodes.endpoint is not None and nodes.rdzv_id is not None  # (nodes_from_env: set for K > 1)
        where = [
            "--nnodes",
            str(nodes.nnodes),
            "--node-rank",
            str(nodes.node_rank),
            "--nproc-per-node",
            str(nodes.per_node(world_size)),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            nodes.endpoint,
            "--rdzv-id",
            nodes.rdzv_id,
        ]
    return [
        sys.executable,
        "-m",
        "tinyllm.distributed.agent",
        *where,
        "--max-restarts",
        "0",  # the engine owns retries: a failed rank ends the attempt
        "--signals-to-handle",
        "SIGHUP,SIGQUIT",  # the stop signals are the agent's own (see above)
        "-m",
        "tinyllm.cli",
        "train",
        *rank_args,
    ]


def _torchrun_setup(parent: int, stops: tuple[int, ...]):
    def setup() -> None:  # in the agent's process, between fork and exec
        _set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(137)
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # the agent takes them in one thread; see above

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


def forward_stop(folder: Path, signum: int, signaled: set[int]) -> None:
    """Send ``signum`` once to every rank of this node that has started (its handlers are in place)."""
    for body in _read(folder, "started").values():
        if body["pid"] not in signaled:  # once per rank (late starters too: called again while waiting)
            signaled.add(body["pid"])
            try:
                os.kill(body["pid"], signum)
            except ProcessLookupError:
                pass


def launch(
    spec: TrainSpec, home: Path, rank_args: list[str], resume: Path | None, log=None
) -> tuple[int, dict | None, str | None]:
    """Run this node's ranks under torchrun; ``(exit code, result, message)`` of the whole run."""
    log = log or sys.stderr
    precheck(spec, home, resume)  # SpecError: nothing started
    nodes = nodes_from_env(spec)
    stops = stop_signals()
    assert spec.distributed is not None  # (a distributed spec: the caller launched ranks for it)
    ws = spec.distributed.world_size
    folder = Path(tempfile.mkdtemp(prefix="tinyllm-ddp-"))
    stop = {"signal": (STOP["signal"] or signal.SIGTERM) if STOP["requested"] else 0}  # one before this point too
    signaled: set[int] = set()

    def on_signal(signum, frame) -> None:
        stop["signal"] = stop["signal"] or signum

    previous = {s: signal.signal(s, on_signal) for s in stops}
    env = {**os.environ, RANK_STATUS_ENV: str(folder)}
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's own warnings; its failure report still prints
    try:
        where = (
            "" if nodes.nnodes == 1 else f" ({nodes.per_node(ws)} of {ws} on node {nodes.node_rank} of {nodes.nnodes})"
        )
        print(
            f"tinyllm: launching {ws} rank(s){where} with torchrun ({spec.distributed.backend})", file=log, flush=True
        )
        proc = subprocess.Popen(
            torchrun_argv(ws, rank_args, nodes),
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_torchrun_setup(os.getpid(), stops),
        )
        while proc.poll() is None:
            if stop["signal"]:
                forward_stop(folder, stop["signal"], signaled)
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
        # torchrun is gone; its ranks die with it (parent-death SIGKILL), wait until they have
        deadline = time.monotonic() + RANK_EXIT_WAIT_S
        started = _read(folder, "started")
        while any(pid_running(b["pid"]) for b in started.values()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        local = list(range(ws)) if nodes.nnodes == 1 else sorted(set(started) | set(_read(folder, "rank")))
        return verdict(ws, _read(folder, "rank"), proc.returncode, local, nodes.per_node(ws))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(folder, ignore_errors=True)


def verdict(
    world_size: int,
    ended: dict[int, dict],
    torchrun_rc: int,
    local: list[int] | None = None,
    per_node: int | None = None,
) -> tuple[int, dict | None, str | None]:
    """One exit code from the ranks of this node (``local``, all ``world_size`` on one node): all alike (0
    or 130) pass on with the lowest local rank's result (rank 0's on its node; the same figures on every
    rank); a rank's bad input, disk full or lock (the lowest rank's first) passes on with its message;
    anything else is 1."""
    local = list(range(world_size)) if local is None else local
    per_node = world_size if per_node is None else per_node
    codes = {r: b.get("code") for r, b in ended.items()}
    result = ended.get(min(local), {}).get("result") if local else None
    complete = len(local) == per_node and set(codes) == set(local)
    if complete and set(codes.values()) == {0} and isinstance(result, dict):
        return 0, result, None
    if complete and set(codes.values()) == {EXIT_CANCELED} and isinstance(result, dict):
        return EXIT_CANCELED, result, None
    for r in sorted(codes):
        if (code := codes[r]) is not None and code in REPORTED_CODES:
            return int(code), None, ended[r].get("message") or f"rank {r} exited {codes[r]}"
    parts = []
    if len(local) < per_node:
        parts.append(f"{per_node - len(local)} rank(s) of this node never started")
    for r in local:
        if r not in ended:
            parts.append(f"rank {r} ended without a verdict (killed, or lost a peer)")
        elif codes[r] not in (0, EXIT_CANCELED):
            parts.append(
                f"rank {r} exited {codes[r]}" + (f": {ended[r]['message']}" if ended[r].get("message") else "")
            )
    if not parts:
        parts.append(f"the ranks disagree ({', '.join(f'rank {r}: {c}' for r, c in sorted(codes.items()))})")
    return EXIT_FAILED, None, f"distributed run failed (torchrun exit {torchrun_rc}): {'; '.join(parts)}"


def rank_argv(
    spec_path: str, home: Path, progress: str | None, resume: Path | None, total_steps: int | None
) -> list[str]:
    """The ranks' arguments: the launcher's own, with paths made absolute."""
    args = ["--spec", os.path.abspath(spec_path), "--home", str(home)]
    if progress:
        args += ["--progress", os.path.abspath(progress)]
    if resume is not None:
        args += ["--resume", str(resume)]
    if total_steps is not None:
        args += ["--total-steps", str(total_steps)]
    return args
