"""The trainer contract for frameworks that own their loop (HF ``Trainer``, Lightning): shared mechanics.

``tinyllm.durable.DurableRun`` runs a loop the user owns (``run.steps()``); a framework calls back
instead, so ``FrameworkRun`` wraps a ``DurableRun`` (spec, arguments, SIGTERM flag, progress lines,
fingerprints, test-only faults) and offers the same contract in callback form:

- ``begin()``: the run lock, interrupted writes recovered, the checkpoint to resume from chosen
  (``--resume``, else LATEST, else the newest valid one; refusals reported) and verified;
- ``step_end(step, loss, batch_digest)``: the step's frame in ``metrics.jsonl`` (exact loss bits,
  learning rates, batch digest), a stderr line every ``log_every`` steps, liveness lines;
- ``save(step, files)``: the framework's own checkpoint files mirrored into
  ``runs/<name>/ckpt/step-NNNNNN/`` with tinyllm's atomic, checksummed protocol, then LATEST, then the
  fsynced progress line; ``save_total_limit`` retention of the mirrored checkpoints;
- ``finish()``: the result line, last on stdout, and exit 130 after a SIGTERM.

A mirrored checkpoint holds the framework's files byte for byte: components ``model``, ``optimizer``
and ``training_state`` are each ``{file name: bytes}``; ``training_state`` also has ``format``,
``step``, ``loss``, ``loss_hex``. ``materialize`` writes them back as the framework's own checkpoint,
which the framework's own resume then loads.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable, Mapping, NoReturn

from contracts.layout import CKPT, METRICS

from .. import checkpoint as ckpt
from .. import faults, runlock
from ..digest import state_digest
from ..durable.frames import FrameWriter
from ..durable.run import (
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    EXIT_LOCKED,
    DurableError,
    DurableRun,
    _FaultOnSave,
    checked_state,
    trajectory,
)
from ..checkpoint_writer import CheckpointWriter, Done
from ..errors import RunLocked

PIECES = ("model", "optimizer", "training_state")


class MissingExtra(SystemExit):
    """The framework of an integration is not installed: one line on stderr naming the extra, exit 2
    (the contract's bad input, not retried; a SystemExit, so an interactive session can catch it)."""


def require(module: str, extra: str) -> Any:
    """Import ``module``, or print one line naming ``pip install 'durable-train[extra]'`` and raise
    ``MissingExtra`` (exit 2)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        print(
            f"durable: {module} is not installed ({e.msg}): pip install 'durable-train[{extra}]' "
            f"(in a checkout: pip install -e '.[{extra}]')",
            file=sys.stderr,
            flush=True,
        )
        raise MissingExtra(EXIT_BAD_INPUT) from None


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    print(f"durable: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def schedule_overrun(exc: BaseException, run: DurableRun, horizon: str) -> str | None:
    """The one line for an LR schedule stepped past its last step (torch's OneCycleLR raises ``ValueError:
    Tried to step N times. The specified number of total steps is M``), else None. Built over a segment's
    ``steps``, it crashes at the first step of the next segment, identically at every retry: the attempt
    ends with this line and exit 2 (the contract's bad input, not retried). ``horizon``: where to take it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not isinstance(exc, ValueError) or not text.startswith("Tried to step"):
        return None
    return (
        f"the LR schedule ran past its last step at step {run.step + 1} of {run.run_steps} ({text}): it was "
        f"built over fewer steps than the run has: {horizon}"
    )


class FrameworkRun:
    """The contract around a framework's loop, for one process (see the module docstring)."""

    def __init__(self, run: DurableRun, *, fmt: str, trainer: str, save_total_limit: int | None = None):
        self.run, self.fmt, self.trainer = run, fmt, trainer
        self.save_total_limit = save_total_limit
        self.lock_file: IO[str] | None = None
        self.metrics: FrameWriter | None = None
        self.resume_comps: dict | None = None
        self.resuming_eval = False  # (the HF integration: the evaluation pending at resume is being replayed)
        self.started_line = False
        self.last_saved = 0
        self.save_seconds: list[float] = []  # each mirror's time on the training thread (bench/integrations.py)
        self.writer: CheckpointWriter | None = None  # the mirrors' background writer (created at the first save)
        self.eval_pending: int | None = None  # the step whose evaluation a stop abandoned (saved with it)
        # liveness: the framework's set-up (before its first step) can be long; ``trainer`` names the
        # integration, so that ctl verify-resume's diagnosis names the calls this trainer has
        run.emit({"event": "ready", "trainer": trainer})

    # -- start ---------------------------------------------------------------------------------

    def begin(self) -> dict | None:
        """Lock, recover, choose and load the checkpoint to resume from: its components, or None."""
        run = self.run
        try:
            self.lock_file = runlock.acquire(run.run_dir, run.name)
        except RunLocked as e:
            fail(str(e), EXIT_LOCKED)
        ckpt.recover_interrupted_writes(run.run_dir, run.console)
        choice = ckpt.choose_resume(run.run_dir, run.resume_arg, max_step=run.total_steps)
        run.resumed_from = choice.path
        run.refused = [{"checkpoint": run.rel(r.checkpoint), "reason": r.reason} for r in choice.refused]
        for line in ckpt.describe_choice(choice, run.rel):
            print(line, file=run.console, flush=True)
        comps = None
        if choice.path is not None:
            try:
                comps = self._load(choice.path)
            except DurableError as e:
                fail(str(e))
        self.last_saved = run.step if comps is not None else 0
        run.last_path = run.resumed_from
        self.metrics = FrameWriter(
            run.run_dir / METRICS,
            run.step if comps is not None else -1,
            name=run.name,
            total_steps=run.total_steps,
            console=run.console,
        )
        run.metrics = self.metrics
        self.resume_comps = comps
        return comps

    def _load(self, path: Path) -> dict:
        run = self.run
        where = run.rel(path)
        try:
            comps, manifest = ckpt.load_checkpoint(path)
        except ckpt.CheckpointError as e:
            raise DurableError(str(e)) from None
        state = checked_state(run, comps, manifest, where, fmt=self.fmt, writer=self.trainer)
        run.step, run.loss = int(state["step"]), float(state["loss"])
        print(f"durable: resuming {run.name} from {where} at step {run.step}", file=run.console, flush=True)
        return comps

    @staticmethod
    def materialize(comps: Mapping[str, Any], folder: Path) -> Path:
        """Write a mirrored checkpoint's files back as the framework's own checkpoint in ``folder``."""
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for piece in PIECES:
            files = comps[piece]["files"] if piece == "training_state" else comps[piece]
            for name, data in files.items():
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        return folder

    def start_line(self) -> None:
        """The ``start``/``resume`` progress line with the state fingerprint (once, before the first step)."""
        if self.started_line:
            return
        self.started_line = True
        run = self.run
        run.emit(
            {
                "event": "resume" if run.resumed_from else "start",
                "state": run.fingerprint(),
                "resumed_from": run.rel(run.resumed_from),
                "refused": run.refused,
                "trainer": self.trainer,
            }
        )

    # -- steps ---------------------------------------------------------------------------------

    def step_end(self, step: int, loss: float, batch: str | Callable[[], str] | None = None) -> None:
        """The step's frame (queued: tinyllm/durable/frames.py; ``batch`` is its digest, or a callable the writer
        calls for it: the digest of snapshots taken at the step), the console line, liveness."""
        run = self.run
        self.start_line()
        run.step, run.loss = int(step), float(loss)
        opt = run.optimizer
        lrs = None if opt is None else [float(g["lr"]) for g in opt.param_groups]  # now: a tensor lr changes in place
        assert self.metrics is not None  # (begin() opened it)
        self.metrics.put(
            run.step,
            run.loss,
            lrs,
            batch,
            {"state": run.fingerprint()} if run.fingerprint_every_step else None,
            run.step % run.log_every == 0 or run.step == run.total_steps,
        )  # and its console line
        self.poll()  # a mirror the writer finished: its line now
        run.heartbeat()
        faults.hold(run.step, lambda: run.stop_requested, self._hold_alive)  # tests only (TINYLLM_FAULT=trainer.hold@S)

    def _hold_alive(self) -> None:
        # a held step is a test's fixed point: the mirror in flight is durable (and announced) before the step's
        # frame, which the poller holding this trainer waits for before it kills or stops it
        self.drain()
        self.run.flush_frames()
        self.run.heartbeat()

    def should_save(self, step: int) -> bool:
        """Checkpoint after this step: every ``checkpoint_every``, at the end, and when a stop signal asked
        to stop (then the ``stopping`` line first, at this step)."""
        run = self.run
        stop = self.notice_stop()
        return step % run.checkpoint_every == 0 or step >= run.total_steps or stop

    def notice_stop(self) -> bool:
        """Whether a stop is requested before the run's end; the first time, the ``stopping`` progress line
        at ``run.step`` (before the stop checkpoint; never from the signal handler)."""
        run = self.run
        if not run.stop_requested or run.step >= run.total_steps:
            return False
        self.drain()  # the mirror in flight first: its line before `stopping`, so the one after is at the step
        run.stopping_line()
        return True

    @property
    def stop_requested(self) -> bool:
        return self.run.stop_requested

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, step: int, source: Path, classify: Callable[[str], str]) -> Path:
        """Mirror the framework's checkpoint ``source`` (a folder or one file) as the contract's
        ``step-NNNNNN``; ``classify(relative name)`` says which piece each file belongs to."""
        run = self.run
        t0 = time.perf_counter()
        run.flush_frames()  # every frame up to this step is in metrics.jsonl before LATEST can name it
        comps: dict[str, Any] = {
            "model": {},
            "optimizer": {},
            "training_state": {
                "format": self.fmt,
                "step": int(step),
                "loss": float(run.loss),
                "loss_hex": float(run.loss).hex(),
                "files": {},
            },
        }
        if self.eval_pending == int(step):  # a stop abandoned this step's evaluation: the resume runs it once
            comps["training_state"]["eval_pending"] = int(step)
        paths = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for p in paths:
            name = p.name if source.is_file() else p.relative_to(source).as_posix()
            piece = classify(name)
            target = comps["training_state"]["files"] if piece == "training_state" else comps[piece]
            target[name] = p.read_bytes()
        if faults.fires("durable.checkpoint_write", run.count_save(), run.home):  # tests only (tinyllm/faults.py)
            comps["zz_fault"] = _FaultOnSave()  # test-only: dies after the other files, before the manifest
        meta = {"name": run.name, "trainer": self.trainer, "tracked": run.tracked(), "trajectory": trajectory(run.spec)}
        run.step = int(step)
        self.last_saved = int(step)
        state = run.fingerprint()  # the live state at this step (the line is written once the mirror is durable)
        # the framework's files are in memory now (bytes: the snapshot); the mirror's write, fsync and LATEST
        # run on the writer thread (docs/checkpoints.md), announced at a later step_end or at finish
        writer = self._writer()
        writer.submit(
            lambda: ckpt.save_checkpoint(run.run_dir, int(step), comps, meta=meta), (int(step), float(run.loss), state)
        )
        if not writer.asynchronous:
            self._announce(writer.wait())
        self.save_seconds.append(time.perf_counter() - t0)  # the training thread's share
        return run.run_dir / CKPT / ckpt.step_dir_name(int(step))

    def _writer(self) -> CheckpointWriter:
        if self.writer is None:
            self.writer = CheckpointWriter(self.run.async_checkpoints, name="durable-mirror-writer")
        self._announce(self.writer.wait())  # at most one in flight: the one before is announced first
        return self.writer

    def _announce(self, done: Done | None) -> None:
        """A mirrored checkpoint is durable: the result's checkpoint, its fsynced line, then retention."""
        if done is None:
            return
        (step, loss, state), path = done.tag, done.result
        run = self.run
        run.last_path = path
        loss_value = None if math.isnan(loss) else loss
        run.emit(
            {
                "event": "checkpoint",
                "state": state,
                "step": step,
                "loss": loss_value,
                "loss_hex": None if loss_value is None else loss_value.hex(),
            },
            sync=True,
        )
        run.checkpoint_line_written()  # (after the `stopping` line, if any)
        self._retain()

    def poll(self) -> None:
        """A mirror the writer finished: announced now (called at each step's end)."""
        if self.writer is not None:
            self._announce(self.writer.poll())

    def drain(self) -> None:
        """Wait for the mirror in flight and announce it."""
        if self.writer is not None:
            self._announce(self.writer.wait())

    def _retain(self) -> None:
        """``save_total_limit``: keep that many newest mirrored checkpoints (never fewer than 2, so the
        one a redelivered attempt's ``--resume`` may still name survives a kill right after a save)."""
        if not self.save_total_limit:
            return
        keep = max(2, int(self.save_total_limit))
        for old in ckpt.list_step_dirs(self.run.run_dir / CKPT)[keep:]:
            shutil.rmtree(old, ignore_errors=True)

    # -- end -----------------------------------------------------------------------------------

    def finish(self, model_state: Mapping[str, Any]) -> None:
        """The result line (last on stdout; later prints go to stderr), then exit 130 after SIGTERM."""
        run = self.run
        self.start_line()
        run.flush_frames()  # every step's frame in the file before the result line
        self.drain()  # the result names only a durable checkpoint
        canceled = run.stop_requested and run.step < run.total_steps
        if canceled:
            self.notice_stop()
            run.stop_checkpoint_line()  # the step was saved before the stop was noticed: its line again
        loss = None if math.isnan(run.loss) else run.loss
        result = {
            "name": run.name,
            "steps": run.step,
            "checkpoint": run.rel(run.last_path),
            "final_loss": loss,
            "final_loss_hex": None if loss is None else loss.hex(),
            "digest": state_digest(dict(model_state)),
            "resumed_from": run.rel(run.resumed_from),
            "refused_checkpoints": run.refused,
            "canceled": canceled,
        }
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        sys.stdout.flush()
        sys.stdout = sys.stderr  # the result line stays the last line on stdout, whatever the script prints next
        self.close()
        if canceled:
            print(f"{run.name}: stopped by signal after checkpointing step {run.step}", file=run.console, flush=True)
            sys.exit(EXIT_CANCELED)

    def eval_pending_at_resume(self) -> int | None:
        """The step whose evaluation the checkpoint resumed from says a stop abandoned (to run once, now)."""
        state = (self.resume_comps or {}).get("training_state") or {}
        pending = state.get("eval_pending")
        return int(pending) if pending is not None and int(pending) == self.run.step else None

    def close(self) -> None:
        if self.writer is not None:  # never release the run lock with a mirror in flight
            error = self.writer.close()
            if error is not None:
                print(f"durable: the checkpoint in flight failed: {error}", file=self.run.console, flush=True)
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.lock_file is not None:
            self.lock_file.close()
            self.lock_file = None
