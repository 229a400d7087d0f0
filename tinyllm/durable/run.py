"""Make your own PyTorch training loop durable and exactly resumable (torch only).

``from tinyllm.durable import DurableRun, DurableSampler`` imports torch and a few torch-only
tinyllm modules (checkpoint, run lock, digest, metrics file), nothing else of the project (no
pydantic, click or engine). A loop that uses it follows the trainer contract
(contracts/subprocess-activity.md), so ``ctl train`` can run it durably and ``ctl verify-resume``
can prove it exact::

    run = DurableRun.from_args()               # --spec FILE [--progress FILE] [--resume CKPT] [--home DIR]
    cfg = run.config                           # the spec's "config" object (your hyperparameters)
                                               # (Python random, NumPy and torch are seeded with run.seed)
    model, opt, sched = ..., ..., ...
    sampler = DurableSampler(len(dataset), seed=run.seed)        # shuffles; remembers its position
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler)
    run.track(model=model, optimizer=opt, scheduler=sched, data=sampler)
    batches = run.batches(loader)              # epoch after epoch, never touching the global RNG
    for step in run.steps():                   # resumes, checkpoints, stops cleanly on SIGTERM
        x, y = next(batches)
        loss = ...; loss.backward(); opt.step(); opt.zero_grad(); sched.step()
        run.log(loss, batch=(x, y))            # the step's loss (and, optionally, its batch)
    # the loop's end printed the result line (stdout); print nothing else to stdout after it

What a checkpoint holds (``runs/<name>/ckpt/step-NNNNNN/``, written with tinyllm's atomic,
checksummed protocol, then ``LATEST``): ``model``, ``optimizer``, ``scheduler`` and ``scaler`` (when
tracked), and ``training_state``: step, loss, the data position (``data.state_dict()`` of a sampler or
``StatefulDataLoader``-style object, and ``run.cursor``, an int you may use instead), and every RNG
state (Python ``random``, NumPy's global generator, torch CPU and CUDA, and each registered
generator). Resuming puts all of it back before the first step.

Progress (the contract's liveness rule): one line on start/resume, one per checkpoint (fsynced),
and a line at least every ``progress_interval_s`` (1 s) while steps complete, so a trainer is
heartbeated only while it makes progress. Each step's frame goes to ``runs/<name>/metrics.jsonl``.
SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL``'s signal (e.g. ``SIGUSR1``; a bad name: one line, exit 2):
the step in flight finishes, the ``stopping`` progress line names the step, a checkpoint is written AT
that step, the result line says ``"canceled": true`` and the process exits 130; more signals meanwhile
change nothing. ``run.batches(loader)`` makes the loader's worker processes ignore those signals (a
group signal from Slurm or a terminal reaches them too; the stop is the main process's) and saves a
``DurableSampler``'s position as what the steps took, not what the workers read ahead.

Test-only switches (``ctl verify-resume`` sets them; tinyllm/faults.py): ``TINYLLM_FAULT=durable.fingerprint``
adds the state fingerprint to every step's frame; ``TINYLLM_FAULT=durable.checkpoint_write@N`` SIGKILLs
the process in the middle of its N-th checkpoint write (after some files are written, before the
manifest); ``TINYLLM_FAULT=durable.checkpoint_write@armed:FILE`` does so in the first checkpoint write
that finds FILE (relative to the home) and claims it by renaming it to ``FILE.fired-<pid>``: one
process fires once, at a moment another process chose (the fault campaign arms it). ``TINYLLM_FAULT=trainer.hold@S`` holds the
loop after step S (and its checkpoint, if due) until SIGTERM/SIGINT, as tinyllm's loop does, so
verify-resume's kill lands at that very step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, NoReturn, SupportsIndex

import torch

from contracts.exits import EXIT_BAD_INPUT, EXIT_CANCELED, EXIT_LOCKED  # the trainer contract's exit codes
from contracts.layout import METRICS, RunDir, RunHome

from .. import checkpoint as ckpt
from .. import faults, runlock, runtime_env, stopping
from ..digest import state_digest
from .state import (
    capture_rng,
    check_generators,
    digest,
    fingerprint_of,
    restore_rng,
)
from .state import snapshot as batch_snapshot
from ..checkpoint_writer import CheckpointWriter, Done, async_enabled, snapshot
from ..errors import RunLocked
from .frames import FrameWriter
from ..fsio import rel, resolve_home
from ..names import IDENTIFIER_PATTERN, DuplicateKeyError, refuse_duplicate_keys

# Spec keys that may change between a checkpoint and its resume (the rest is the trajectory).
# "threads" stays a trajectory key here: a user's own loop is not thread-invariant as tinyllm's model is.
NON_TRAJECTORY_KEYS = frozenset(
    {"steps", "eval_every", "eval_interval_seconds", "checkpoint_every", "log_every", "trainer"}
)
RUN_STEPS_ENV = "CTL_RUN_STEPS"  # the run's full length (contracts/subprocess-activity.md, "segments")


class DurableError(Exception):
    """Bad input to the helper (spec, arguments, checkpoint contents): exit 2 with this one line."""


def _fail(message: str, code: int) -> NoReturn:
    print(f"durable: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2: the contract's bad input
        _fail(f"bad arguments: {message}", EXIT_BAD_INPUT)


def parse_contract_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The trainer contract's arguments: ``--spec FILE [--progress FILE] [--resume CKPT] [--home DIR]``."""
    p = _ArgParser(prog=Path(sys.argv[0]).name, description="A durable training loop (trainer contract).")
    p.add_argument("--spec", required=True, help="train spec (JSON object with name, steps, ...)")
    p.add_argument("--progress", default=None, help="append JSON progress lines to this file")
    p.add_argument("--resume", default=None, help="checkpoint directory (relative to the home unless absolute)")
    p.add_argument("--home", default=None, help="home folder (default: $CTL_HOME, else the current directory)")
    return p.parse_args(argv)


def load_spec(path: str | Path) -> dict:
    """Read and check the parts of a train spec the helper relies on (``DurableError`` otherwise)."""
    p = Path(path)
    try:
        spec = json.loads(p.read_text(encoding="utf-8"), object_pairs_hook=refuse_duplicate_keys)
    except DuplicateKeyError as e:
        raise DurableError(f"train spec file {p}: {e} (strict JSON: each key once)") from None
    except FileNotFoundError:
        raise DurableError(f"train spec file not found: {p}") from None
    except OSError as e:
        raise DurableError(f"cannot read train spec file {p}: {e.strerror}") from None
    except ValueError as e:
        raise DurableError(f"train spec file {p} is not valid JSON: {e}") from None
    if not isinstance(spec, dict):
        raise DurableError(f"train spec {p}: expected a JSON object")
    name = spec.get("name")
    if not isinstance(name, str) or not re.match(IDENTIFIER_PATTERN, name) or len(name) > 128:
        raise DurableError(f"train spec {p}: name: {name!r} is not a plain identifier ([A-Za-z0-9][A-Za-z0-9._-]*)")
    for key, default, low in (
        ("steps", None, 1),
        ("checkpoint_every", 100, 1),
        ("seed", 0, None),
        ("log_every", 10, 1),
    ):
        value = spec.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
            raise DurableError(
                f"train spec {p}: {key}: expected an integer" + (f" >= {low}" if low else "") + f", got {value!r}"
            )
    if not isinstance(spec.get("config", {}), dict):
        raise DurableError(f"train spec {p}: config: expected a JSON object")
    return spec


def seed_everything(seed: int) -> None:
    """Seed Python ``random``, NumPy's global generator and torch (CPU and CUDA) with ``seed``."""
    random.seed(seed)
    try:  # numpy is optional for the helper (tinyllm/durable/state.py)
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass
    torch.manual_seed(seed)


def trajectory(spec: Mapping[str, Any]) -> dict:
    return {k: v for k, v in spec.items() if k not in NON_TRAJECTORY_KEYS}


class DurableSampler(torch.utils.data.Sampler):
    """A shuffling sampler that remembers where it is: its ``state_dict`` is (seed, epoch, position).

    Epoch ``e`` visits ``randperm(n)`` drawn from its own generator seeded with ``seed + e`` (the global
    RNG is never touched); ``position`` counts the indices handed out in the epoch, so after a resume
    the loader continues with the next batch (single-process loading: ``num_workers=0``; for worker
    processes use a ``StatefulDataLoader``-style object as ``data``). ``shuffle=False`` keeps order.
    """

    def __init__(self, n: int, *, seed: int = 0, shuffle: bool = True):
        if n < 1:
            raise ValueError(f"DurableSampler needs at least one item, got n={n}")
        self.n, self.seed, self.shuffle = int(n), int(seed), bool(shuffle)
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        if self.position >= self.n:  # the previous epoch was used up: (e, n) is (e + 1, 0)
            self.epoch, self.position = self.epoch + 1, 0
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(self.n))
        while self.position < self.n:
            index = order[self.position]
            self.position += 1
            yield index

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "shuffle": self.shuffle, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (state["n"], state["seed"], state["shuffle"]) != (self.n, self.seed, self.shuffle):
            raise DurableError(
                f"data sampler state is for n={state['n']} seed={state['seed']} shuffle={state['shuffle']}, "
                f"this sampler has n={self.n} seed={self.seed} shuffle={self.shuffle}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class _FaultOnSave:
    """Test-only: pickling this object (while a checkpoint is being written) SIGKILLs the process."""

    def __reduce_ex__(self, protocol: SupportsIndex):
        os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("unreachable")  # pragma: no cover


def _run_steps(steps: int) -> int:
    value = os.environ.get(RUN_STEPS_ENV, "")
    return int(value) if value.isdigit() and int(value) >= steps else steps


def checked_state(run: "DurableRun", comps: dict, manifest: dict, where: str | None, *, fmt: str, writer: str) -> dict:
    """The training state of a loaded checkpoint, checked for ``run``: written by ``writer`` (its
    ``format`` ``fmt``), not beyond the spec's steps, and of the same trajectory (``DurableError`` else).
    Shared by the helper and the framework integrations (tinyllm/integrations/contract.py)."""
    state = comps.get("training_state")
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise DurableError(f"checkpoint {where} was not written by {writer}")
    if state["step"] > run.total_steps:
        raise DurableError(f"checkpoint {where} is at step {state['step']}, beyond the spec's steps {run.total_steps}")
    saved = manifest.get("meta", {}).get("trajectory")
    if saved is not None and saved != trajectory(run.spec):
        keys = sorted(k for k in set(saved) | set(trajectory(run.spec)) if saved.get(k) != run.spec.get(k))
        raise DurableError(f"checkpoint {where} was trained with a different spec (fields: {', '.join(keys)})")
    return state


class DurableRun:
    # set when the steps start (_start)
    metrics: FrameWriter
    last_saved: int
    lock_file: IO[str]
    _last_line: float
    _logged: float | None  # the loss log() was given this step, if any
    """One run of a user's training loop under the trainer contract (see the module docstring)."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        *,
        home: str | Path | None = None,
        progress: str | Path | None = None,
        resume: str | Path | None = None,
        progress_interval_s: float = 1.0,
        console=None,
        seed_rngs: bool = True,
        async_checkpoints: bool | None = None,
    ):
        self.spec = dict(spec)
        self.name: str = self.spec["name"]
        self.total_steps: int = int(self.spec["steps"])  # this invocation's last step (a segment's end)
        # the run's last step, the same in every segment (CTL_RUN_STEPS, set by ctl): build schedules over it
        self.run_steps: int = _run_steps(self.total_steps)
        self.checkpoint_every: int = int(self.spec.get("checkpoint_every", 100))
        self.log_every: int = int(self.spec.get("log_every", 10))
        self.seed: int = int(self.spec.get("seed", 0))
        self.config: dict = dict(self.spec.get("config", {}))
        self.home = resolve_home(home)
        self.run_dir = RunHome(self.home).run(self.name).path
        self.progress = Path(progress).absolute() if progress else None
        self.resume_arg = None
        if resume is not None:
            self.resume_arg = Path(resume) if os.path.isabs(resume) else self.home / resume
            if not self.resume_arg.is_dir():
                raise DurableError(f"--resume checkpoint not found: {resume}")
        self.progress_interval_s = float(progress_interval_s)
        self.console = console or sys.stderr
        self.step, self.cursor, self.loss = 0, 0, float("nan")
        self.model: torch.nn.Module | None = None  # what track() registers (the others: anything with state_dict)
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.scaler: Any = None
        self.data: Any = None
        self.generators: dict[str, Any] = {}
        self.resumed_from: Path | None = None
        self.refused: list[dict] = []  # checkpoints choose_resume refused, and why
        self.last_path: Path | None = None
        self._stop = False
        self._stop_signal: str | None = None  # the first stop signal's name (the `stopping` line's)
        self._stop_noticed = self._line_after_stop = False
        self._ahead: tuple | None = None  # (sampler, batch size, first position, batches taken): workers read ahead
        self._started = False
        try:
            faults.arm_from_env()  # tests only (TINYLLM_FAULT): a typo must not run unarmed
        except faults.FaultError as e:
            raise DurableError(str(e)) from None
        self._fingerprint_steps = faults.switch("durable.fingerprint")
        self._saves = 0
        try:  # asynchronous checkpoints (tinyllm/checkpoint_writer.py) unless the argument or the variable says not
            self.async_checkpoints = async_enabled() if async_checkpoints is None else bool(async_checkpoints)
        except ValueError as e:
            raise DurableError(str(e)) from None
        self._checkpoint_writer: CheckpointWriter | None = None
        runtime_env.start_run(self.console)  # MKL's strict CNR mode applied and checked: warns once if too late
        if seed_rngs:  # a fresh run is reproducible; a resume restores every RNG from the checkpoint anyway
            seed_everything(self.seed)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_args(cls, argv: list[str] | None = None, **kwargs: Any) -> "DurableRun":
        """Parse the contract's arguments and the spec; bad input exits 2 with one line on stderr.

        Installs the stop handler at once (SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL``'s signal), so a
        stop during setup still ends in a clean 130; a bad ``$DURABLE_STOP_SIGNAL`` exits 2 (one line).
        """
        run_stop: dict[str, Any] = {"requested": False, "signal": None}

        def early(signum: int, frame: Any) -> None:
            run_stop["signal"] = run_stop["signal"] or stopping.signal_name(signum)
            run_stop["requested"] = True

        try:
            stopping.install(early)
        except stopping.StopSignalError as e:
            _fail(str(e), EXIT_BAD_INPUT)
        args = parse_contract_args(argv)
        try:
            run = cls(load_spec(args.spec), home=args.home, progress=args.progress, resume=args.resume, **kwargs)
        except DurableError as e:
            _fail(str(e), EXIT_BAD_INPUT)
        run._stop, run._stop_signal = run_stop["requested"], run_stop["signal"]
        run.install_signal_handlers()
        return run

    # -- the seam a framework's loop uses (tinyllm/integrations/contract.py): public, not internals --

    def install_signal_handlers(self) -> None:
        """SIGTERM, SIGINT and ``$DURABLE_STOP_SIGNAL``'s signal ask the run to stop at the next step
        boundary (``stop_requested``), which then checkpoints and exits 130. The handler only sets the
        flag: a second or third signal (Slurm's CONT+TERM, a terminal's Ctrl-C reaching the group, ctl's
        own) can never interrupt a checkpoint being written. A framework that installs its own handlers
        (Lightning turns SIGTERM into ``SystemExit``) calls this again after it."""

        def stop(signum: int, frame: Any) -> None:
            self._stop_signal = self._stop_signal or stopping.signal_name(signum)
            self._stop = True

        try:
            stopping.install(stop)
        except stopping.StopSignalError as e:
            _fail(str(e), EXIT_BAD_INPUT)

    @property
    def stop_requested(self) -> bool:
        """A SIGTERM/SIGINT arrived: checkpoint at this step and exit 130."""
        return self._stop

    @property
    def fingerprint_every_step(self) -> bool:
        """Each step's metrics frame carries the state fingerprint (ctl verify-resume's diagnosis asks for it)."""
        return self._fingerprint_steps

    def emit(self, extra: Mapping[str, Any], *, sync: bool = False) -> None:
        """Append one progress line: the contract's fields (step, loss, checkpoint, tracked) plus ``extra``
        (``{"event": ...}``); ``sync`` fsyncs it (a checkpoint's line)."""
        self._emit(extra, sync)

    def stopping_line(self) -> None:
        """The ``stopping`` progress line, once, when the loop notices the stop at a step boundary, before
        the stop checkpoint (contracts/subprocess-activity.md); never written from the signal handler."""
        if self._stop_noticed:
            return
        self._drain()  # the checkpoint in flight first: its line before `stopping`, so the one after is at S
        self._stop_noticed = True
        self.flush_frames()  # the steps' console lines before this one
        self._emit({"event": "stopping", "signal": self._stop_signal or "SIGTERM"}, sync=True)
        print(
            f"{self.name}: stopping at step {self.step} ({self._stop_signal or 'SIGTERM'}): checkpointing this step",
            file=self.console,
            flush=True,
        )

    def checkpoint_line_written(self) -> None:
        """A checkpoint's line was just emitted (a framework's mirror): after ``stopping``, none is repeated."""
        self._line_after_stop = self._stop_noticed

    def stop_checkpoint_line(self) -> None:
        """After the ``stopping`` line, when the step it names was checkpointed before the stop: that
        checkpoint's line again, so every stop reads ``stopping`` then a checkpoint line at that step."""
        if self._stop_noticed and not self._line_after_stop and self.last_path is not None:
            self._emit({"event": "checkpoint", "state": self.fingerprint()}, sync=True)

    def heartbeat(self) -> None:
        """A ``step`` progress line when none was written for ``progress_interval_s`` (progress, not a timer:
        call it from the loop)."""
        if time.monotonic() - self._last_line >= self.progress_interval_s:
            self._emit({"event": "step"})

    def flush_frames(self) -> None:
        """Write the queued per-step frames to metrics.jsonl now (before a checkpoint, a hold, the end)."""
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.flush()

    def count_save(self) -> int:
        """This process's checkpoint writes so far, this one included (the test-only fault point counts them)."""
        self._saves += 1
        return self._saves

    def track(
        self,
        *,
        model: torch.nn.Module,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        data: Any = None,
        generators: Mapping[str, Any] | None = None,
    ) -> "DurableRun":
        """Register what a checkpoint saves and a resume restores (call once, before ``steps()``)."""
        if self._started:
            raise RuntimeError("track() must be called before steps()")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        for what, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler), ("data", data)):
            if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"{what} must have state_dict() and load_state_dict(), got {type(obj).__name__}")
        check_generators(generators or {})
        self.model, self.optimizer, self.scheduler, self.scaler, self.data = model, optimizer, scheduler, scaler, data
        self.generators = dict(generators or {})
        return self

    def _model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError("track(model, ...) must be called before steps()")
        return self.model

    # -- the loop ----------------------------------------------------------------------------

    def batches(self, loader: Iterable) -> Iterator[Any]:
        """Batches of ``loader`` epoch after epoch, forever. Starting each epoch's iterator leaves the
        global torch RNG as it was (a DataLoader draws a seed from it), so a resume mid-epoch and an
        uninterrupted run see the same random numbers."""
        stopping.quiet_workers(loader)  # worker processes ignore stop signals: the stop is this process's
        sampler = s if isinstance(s := getattr(loader, "sampler", None), DurableSampler) else None
        batch_size = getattr(loader, "batch_size", None)
        ahead = getattr(loader, "num_workers", 0) > 0 and sampler is not None and batch_size is not None
        empty = 0
        while empty < 2:
            state = torch.get_rng_state()
            first = sampler.position if ahead and sampler is not None and sampler.position < sampler.n else 0
            it = iter(loader)  # with workers, this already hands the next batches' indices to them
            torch.set_rng_state(state)
            got = False
            for taken, batch in enumerate(it, start=1):
                got = True
                if ahead:  # the position a checkpoint saves: what the steps took, not what workers read ahead
                    self._ahead = (sampler, int(batch_size or 0), first, taken)
                yield batch
            empty = 0 if got else empty + 1
        raise RuntimeError("the data loader yields no batches")

    def log(self, loss: Any, *, batch: Any = None) -> None:
        """Record this step's loss (a float or a 0-d tensor) and, optionally, its batch's digest (of a
        snapshot taken now, hashed off the training thread: tinyllm/durable/frames.py)."""
        value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        self._logged = value
        self._batch = None if batch is None else batch_snapshot(batch)

    def steps(self) -> Iterator[int]:
        """Yield the steps still to run (1-based): resumes first; after each step, frames, checkpoints,
        progress lines and the SIGTERM stop; at the end the final checkpoint and the result line."""
        if self.model is None:
            raise RuntimeError("call run.track(model=..., ...) before run.steps()")
        if self._started:
            raise RuntimeError("steps() runs once per process")
        self._started = True
        try:
            self.lock_file = runlock.acquire(self.run_dir, self.name)
        except RunLocked as e:
            _fail(str(e), EXIT_LOCKED)
        try:
            ckpt.recover_interrupted_writes(self.run_dir, self.console)
            try:
                self._resume()
            except DurableError as e:
                _fail(str(e), EXIT_BAD_INPUT)
            self.last_saved = self.step if self.resumed_from is not None else 0
            self.last_path = self.resumed_from
            self.metrics = FrameWriter(
                self.run_dir / METRICS,
                self.step if self.resumed_from else -1,
                name=self.name,
                total_steps=self.total_steps,
                console=self.console,
            )
            self._last_line = time.monotonic()
            self._emit(
                {
                    "event": "resume" if self.resumed_from else "start",
                    "state": self.fingerprint(),
                    "resumed_from": self.rel(self.resumed_from),
                    "refused": self.refused,
                }
            )
            while self.step < self.total_steps and not self._stop:
                self._logged = None
                yield self.step + 1
                if self._logged is None:
                    raise RuntimeError(f"step {self.step + 1}: call run.log(loss) once in every step")
                self.step += 1
                self.loss = self._logged
                self._poll_checkpoint()  # a checkpoint the writer finished: its line now (before this step's save)
                self._after_step()
                faults.hold(
                    self.step, lambda: self._stop, self._hold_alive
                )  # tests only (TINYLLM_FAULT=trainer.hold@S)
            self._finish()
        finally:
            if self._checkpoint_writer is not None:  # never release the run lock with a write in flight
                error = self._checkpoint_writer.close()
                if error is not None:  # (an exception is on its way out already: it wins)
                    print(f"durable: the checkpoint in flight failed too: {error}", file=self.console, flush=True)
            metrics = getattr(self, "metrics", None)
            if metrics is not None:
                metrics.close()
            self.lock_file.close()

    def _after_step(self) -> None:
        opt = self._optimizer_seen()
        lrs = None if opt is None else [float(g["lr"]) for g in opt.param_groups]  # now: a tensor lr changes in place
        snap = self._batch
        self.metrics.put(
            self.step,
            self.loss,
            lrs,
            None if snap is None else (lambda: digest(snap)),
            {"state": self.fingerprint()} if self._fingerprint_steps else None,
            self.step % self.log_every == 0 or self.step == self.total_steps,
        )
        stop = self._stop and self.step < self.total_steps  # asked once: the save below follows the line
        if stop:
            self.stopping_line()
        if self.step % self.checkpoint_every == 0 or self.step == self.total_steps or stop:
            self.save()
        else:
            self.heartbeat()

    def _hold_alive(self) -> None:
        # a held step is a test's fixed point: the checkpoint in flight is durable (and announced) before the
        # step's frame, which the poller holding this trainer waits for before it kills or stops it
        self._drain()
        self.flush_frames()
        self.heartbeat()

    def _finish(self) -> None:
        self.flush_frames()  # every step's frame in the file before the result line
        if self._stop and self.step < self.total_steps:
            self.stopping_line()  # noticed after the step's save decision (or before the first step)
        self._drain()  # the checkpoint in flight is durable and its line written before anything else
        if self.last_saved != self.step:
            self.save(wait=True)
        else:
            self.stop_checkpoint_line()
        canceled = self._stop and self.step < self.total_steps
        loss = None if math.isnan(self.loss) else self.loss
        result = {
            "name": self.name,
            "steps": self.step,
            "checkpoint": self.rel(self.last_path),
            "final_loss": loss,
            "final_loss_hex": None if loss is None else loss.hex(),
            "digest": state_digest(self._model().state_dict()),
            "resumed_from": self.rel(self.resumed_from),
            "refused_checkpoints": self.refused,
            "canceled": canceled,
        }
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        sys.stdout.flush()
        if canceled:
            print(f"{self.name}: stopped by signal after checkpointing step {self.step}", file=self.console, flush=True)
            self.metrics.close()
            self.lock_file.close()
            sys.exit(EXIT_CANCELED)

    # -- checkpoints ---------------------------------------------------------------------------

    def _optimizer_seen(self) -> Any:
        """The optimizer, tracked or reachable through the scheduler (seen in fingerprints only)."""
        return self.optimizer if self.optimizer is not None else getattr(self.scheduler, "optimizer", None)

    def tracked(self) -> list[str]:
        pieces = ["model"] + [n for n in ("optimizer", "scheduler", "scaler", "data") if getattr(self, n) is not None]
        return pieces + [f"rng/{n}" for n in sorted(self.generators)]

    def components(self) -> dict[str, Any]:
        state = {
            "format": "durable/1",
            "step": self.step,
            "loss": self.loss,
            "loss_hex": float(self.loss).hex(),
            "cursor": int(self.cursor),
            "rng": capture_rng(self.generators),
            "data": None if self.data is None else self._data_state(),
        }
        comps: dict[str, Any] = {
            "model": self._model().state_dict(),
            "optimizer": {} if self.optimizer is None else self.optimizer.state_dict(),
            "training_state": state,
        }
        if self.scheduler is not None:
            comps["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            comps["scaler"] = self.scaler.state_dict()
        return comps

    def _data_state(self) -> Any:
        """The data position; a ``DurableSampler`` read ahead by loader workers: where the steps are."""
        state = self.data.state_dict()
        if self._ahead is not None and self._ahead[0] is self.data:
            sampler, batch_size, first, taken = self._ahead
            state["position"] = min(sampler.n, first + taken * batch_size)
        return state

    def save(self, wait: bool = False) -> Path:
        """Checkpoint this step (atomic; then LATEST) and, once durable, its progress line.

        Asynchronous by default (tinyllm/checkpoint_writer.py): the state is snapshotted here, exactly at
        the step; the writer thread persists it and computes its fingerprint while the loop goes on; the
        loop announces it (``last_path``, the line) at the next step boundary after it is durable.
        ``wait`` (or ``async_checkpoints=False``): returns once it is durable and announced."""
        self.flush_frames()  # every frame up to this step is in metrics.jsonl before LATEST can name it
        self._drain()  # at most one in flight: the one before is durable and its line written first
        comps = self.components()
        step, loss = self.step, self.loss
        writer = self._writer()
        opt = self._optimizer_seen()
        seen_opt = comps["optimizer"] if self.optimizer is not None else None if opt is None else opt.state_dict()
        parts = {
            "optimizer": seen_opt,
            "scheduler": comps.get("scheduler"),
            "scaler": comps.get("scaler"),
            "data": comps["training_state"]["data"] if self.data is not None else None,
        }
        if writer.asynchronous:
            comps, parts = snapshot((comps, parts))  # one copy, shared tensors shared
        if faults.fires("durable.checkpoint_write", self.count_save(), self.home):  # tests only (tinyllm/faults.py)
            comps["zz_fault"] = _FaultOnSave()  # sorted last: the other files are written, no manifest yet
        meta = {
            "name": self.name,
            "trainer": "tinyllm.durable",
            "tracked": self.tracked(),
            "trajectory": trajectory(self.spec),
        }

        def persist() -> tuple[Path, dict]:
            path = ckpt.save_checkpoint(self.run_dir, step, comps, meta=meta)
            state = comps["training_state"]
            return path, fingerprint_of(
                comps["model"],
                state["cursor"],
                parts["optimizer"],
                scheduler=parts["scheduler"],
                scaler=parts["scaler"],
                data=parts["data"],
                rng=state["rng"],
            )

        self.last_saved = step
        writer.submit(persist, (step, loss))
        if wait or not writer.asynchronous:
            self._announce(writer.wait())
        return RunDir(self.run_dir, self.name).step_dir(step)

    def _writer(self) -> CheckpointWriter:
        if self._checkpoint_writer is None:
            self._checkpoint_writer = CheckpointWriter(self.async_checkpoints, name="durable-checkpoint-writer")
        return self._checkpoint_writer

    def _announce(self, done: Done | None) -> None:
        """A checkpoint became durable: the result's checkpoint now, and its fsynced progress line."""
        if done is None:
            return
        (step, loss), (path, state) = done.tag, done.result
        self.last_path = path
        loss_value = None if math.isnan(loss) else loss
        self._emit(
            {
                "event": "checkpoint",
                "state": state,
                "step": step,
                "loss": loss_value,
                "loss_hex": None if loss_value is None else loss_value.hex(),
            },
            sync=True,
        )
        self.checkpoint_line_written()

    def _poll_checkpoint(self) -> None:
        """At a step boundary: announce a checkpoint the writer finished (or raise its error)."""
        if self._checkpoint_writer is not None:
            self._announce(self._checkpoint_writer.poll())

    def _drain(self) -> None:
        """Wait for the checkpoint in flight and announce it."""
        if self._checkpoint_writer is not None:
            self._announce(self._checkpoint_writer.wait())

    def _resume(self) -> None:
        choice = ckpt.choose_resume(self.run_dir, self.resume_arg, max_step=self.total_steps)
        self.resumed_from = choice.path
        self.refused = [{"checkpoint": self.rel(r.checkpoint), "reason": r.reason} for r in choice.refused]
        for line in ckpt.describe_choice(choice, self.rel):
            print(line, file=self.console, flush=True)
        if self.resumed_from is None:
            return
        try:
            comps, manifest = ckpt.load_checkpoint(self.resumed_from)
        except ckpt.CheckpointError as e:
            raise DurableError(str(e)) from None
        where = self.rel(self.resumed_from)
        state = checked_state(self, comps, manifest, where, fmt="durable/1", writer="tinyllm.durable")
        for piece in ("scheduler", "scaler"):
            obj = getattr(self, piece)
            if obj is not None and piece not in comps:
                raise DurableError(f"checkpoint {where} has no {piece} state, but a {piece} is tracked now")
            if obj is None and piece in comps:
                print(
                    f"durable: warning: checkpoint {where} has {piece} state but no {piece} is tracked: not restored",
                    file=self.console,
                    flush=True,
                )
        if self.data is not None and state.get("data") is None:
            raise DurableError(f"checkpoint {where} has no data position, but data is tracked now")
        if self.data is None and state.get("data") is not None:
            print(
                f"durable: warning: checkpoint {where} has a data position but no data is tracked: not restored",
                file=self.console,
                flush=True,
            )
        self._model().load_state_dict(comps["model"])
        if self.optimizer is not None:
            if not comps["optimizer"]:
                raise DurableError(f"checkpoint {where} has no optimizer state, but an optimizer is tracked now")
            self.optimizer.load_state_dict(comps["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(comps["scheduler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(comps["scaler"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        try:
            restore_rng(state["rng"], self.generators)
        except KeyError as e:
            raise DurableError(f"checkpoint {where}: {e.args[0]}") from None
        self.step, self.cursor, self.loss = int(state["step"]), int(state["cursor"]), float(state["loss"])
        print(f"durable: resumed {self.name} from {where} at step {self.step}", file=self.console, flush=True)

    # -- progress and fingerprints -------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """Short digests of every piece of state the helper can see now (tracked or reachable)."""
        opt = self._optimizer_seen()
        return fingerprint_of(
            self._model().state_dict(),
            self.cursor,
            None if opt is None else opt.state_dict(),
            scheduler=None if self.scheduler is None else self.scheduler.state_dict(),
            scaler=None if self.scaler is None else self.scaler.state_dict(),
            data=None if self.data is None else self._data_state(),
            rng=capture_rng(self.generators),
        )

    def rel(self, path: Path | None) -> str | None:
        return rel(path, self.home)

    def _emit(self, extra: Mapping[str, Any], sync: bool = False) -> None:
        """Append one progress line (the contract's fields plus ``extra``)."""
        self._last_line = time.monotonic()
        if self.progress is None:
            return
        loss = None if math.isnan(self.loss) else self.loss
        line = {
            "step": self.step,
            "loss": loss,
            "loss_hex": None if loss is None else loss.hex(),
            "checkpoint": self.rel(self.last_path),
            "time": time.time(),
            "tracked": self.tracked(),
            **extra,
        }
        self.progress.parent.mkdir(parents=True, exist_ok=True)
        with open(self.progress, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            if sync:
                os.fsync(f.fileno())
