"""PyTorch Lightning under the trainer contract (extra ``[lightning]``; docs/integrations.md).

The whole change to a Lightning script::

    run = DurableRun.from_args()                                  # --spec --home [--progress] [--resume]
    loader = DataLoader(data, batch_size=..., sampler=DurableSampler(len(data), seed=run.seed))  # was shuffle=True
    trainer = L.Trainer(max_steps=..., callbacks=[DurableCallback(run)], ...)
    fit(trainer, model, loader)                                   # was trainer.fit(model, loader)

What it adds to Lightning's own checkpoint and ``ckpt_path`` resume (which restores the weights,
optimizers, schedulers and loop counters): every RNG state (Python, NumPy, torch CPU and CUDA,
captured at the step boundary, restored right before training continues), the loader's position
(the ``DurableSampler``'s epoch and the batches the finished steps consumed; the loader draws its
per-epoch seed from a private generator, so starting an epoch leaves the global RNG alone), SIGTERM
-> the `stopping` line and a checkpoint at the step boundary -> exit 130 (Lightning's own handler would end in
``SystemExit``; a stop during Lightning's validation abandons it, nothing logged, and the stop checkpoint
carries it pending), a validation after a checkpointed step run at the resume (Lightning's restart from a
step's end would skip it), the contract's progress lines, exact per-step losses in ``metrics.jsonl`` and the
result line. Each checkpoint is Lightning's ``.ckpt`` file, mirrored byte for byte into
``runs/<name>/ckpt/step-NNNNNN/`` (atomic, checksummed, then LATEST). Training stops at the spec's
``steps`` (a segment's end under ``ctl train``). One process only: DDP, DeepSpeed and FSDP strategies are refused (exit 2).

The schedule's horizon: ``fit()`` gives Lightning the run's full length as ``max_steps``
(``run.run_steps``: ``CTL_RUN_STEPS`` under ``ctl train``, the same in every segment), so
``trainer.estimated_stepping_batches`` and ``trainer.max_steps`` (Lightning's documented OneCycleLR
pattern) span the run, and the callback itself stops the loop at the spec's ``steps`` (a segment's end).
A schedule that still runs past its last step (torch's OneCycleLR: "Tried to step N times") ends the
attempt with one ``durable:`` line and exit 2: the same crash would come back on every retry.
``track_generators={"name": g}`` registers generators of the script's own (``torch.Generator``,
``random.Random``, NumPy's), saved and restored with the global RNGs. Lightning's own files (its default
logger's ``lightning_logs/version_N`` and its default ``ModelCheckpoint``'s ``.ckpt`` files), when the
script left their place to Lightning (no ``default_root_dir``), go to ``runs/<name>/lightning_logs/``
in the home instead of the trainer's working folder; the contract's checkpoints stay in ``ckpt/``.

``forget`` (test-only: the broken variants verify-resume diagnoses): ``"rng"`` leaves the RNG states
out, ``"data"`` the loader position (both: Lightning's own resume).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Mapping

from .contract import FrameworkRun, fail, require, schedule_overrun

require("lightning", "lightning")  # the [lightning] extra; without it, MissingExtra: one line naming the extra

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from .. import faults, stopping
from ..durable import DurableRun, DurableSampler
from ..durable.state import (
    capture_rng,
    capture_rng_raw,
    check_generators,
    digest_of_snapshots,
    restore_rng,
    restore_rng_raw,
    snapshot,
)

FORMAT = "durable-lightning/1"
CKPT_NAME = "lightning.ckpt"
LOGS = "lightning_logs"  # Lightning's own files, in the run's folder (module docstring)
# where a schedule built over a segment's steps should take its horizon from (the exit-2 line says it)
HORIZON = (
    "build it over trainer.estimated_stepping_batches or trainer.max_steps (under fit() both are the run's "
    "full length), run.run_steps, or a fixed length in the spec's config, never the spec's steps (a "
    "segment's end under ctl train)"
)


class _ValidationAbandoned(Exception):
    """A stop signal arrived during Lightning's validation loop: abandoned between two batches, nothing logged
    (Lightning ends ``fit`` through its exception path: ``on_exception``, not ``on_train_end``)."""


def _loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"]
    return None


class DurableCallback(pl.Callback):
    """The contract for one ``lightning.Trainer.fit`` of the ``DurableRun`` ``run`` (see the module docstring)."""

    def __init__(
        self, run: DurableRun, *, forget: tuple[str, ...] = (), track_generators: Mapping[str, Any] | None = None
    ):
        if not isinstance(run, DurableRun):
            raise TypeError(f"DurableCallback(run): run must be a tinyllm.durable.DurableRun, got {type(run).__name__}")
        try:
            check_generators(track_generators or {})
        except TypeError as e:
            raise TypeError(f"DurableCallback(track_generators=...): {e}") from None
        self.run = run
        self.forget = tuple(forget)
        self.generators = dict(track_generators or {})  # saved and restored with the global RNGs
        run.generators.update(self.generators)  # the run's tracked pieces and fingerprints name them
        self.durable = FrameworkRun(run, fmt=FORMAT, trainer="tinyllm.integrations.lightning")
        self.staging = run.run_dir / "lightning"
        self.sampler: DurableSampler | None = None
        self.batch_size = 1
        self._pending: dict | None = None
        self._losses: list[torch.Tensor] = []
        self._batches: list[Any] = []  # the step's batches (snapshots, hashed by the frame writer)
        self._consumed = 0  # batches of the current epoch that finished steps consumed
        self._last_step = 0
        self._at_step: tuple[dict, dict] | None = None  # (RNG, loops' state) at the last step boundary
        self._loops: dict | None = None  # the loops' state the next save records instead of the current one
        self._validates = False  # trainer.enable_validation, asked once a fit (each ask costs tens of microseconds)

    # -- Lightning's checkpoint: what Lightning leaves out --------------------------------------

    def state_dict(self) -> dict:
        data = None
        if self.sampler is not None and "data" not in self.forget:
            state = self.sampler.state_dict()  # what the finished steps consumed, should the fetcher run ahead
            state["position"] = min(
                self.sampler.n, self._consumed * self.batch_size
            )  # = its own count unless Lightning ran ahead
            data = state
        rng = None if "rng" in self.forget else capture_rng(self.generators)
        return {"format": FORMAT, "rng": rng, "data": data}

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        if self._loops is not None:  # an abandoned validation's stop checkpoint: the loops as at the step's end
            checkpoint["loops"]["fit_loop"] = self._loops

    def load_state_dict(self, state_dict: dict) -> None:
        self._pending = dict(state_dict)
        if self.sampler is not None:  # known from fit()'s loader: restored before Lightning makes its iterator
            self._restore_data()

    def _restore_data(self) -> None:
        """The sampler's saved position, once. It must come before the loader's first iterator: with
        ``num_workers > 0`` making the iterator already sends the next batches' indices to the workers,
        and Lightning makes it before ``on_train_start`` (seen: a resume re-read its epoch's first 4 batches)."""
        pending = self._pending or {}
        if pending.get("data") is not None and self.sampler is not None:
            self.sampler.load_state_dict(pending["data"])
            self._consumed = pending["data"]["position"] // self.batch_size
            pending["data"] = None

    # -- hooks ---------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        strategy = type(trainer.strategy).__name__
        if trainer.world_size > 1 or any(s in strategy for s in ("DDP", "DeepSpeed", "FSDP", "ModelParallel")):
            fail(
                f"DurableCallback runs one process; the {strategy} strategy (world size {trainer.world_size}) "
                "is not supported"
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.run.install_signal_handlers()  # after Lightning's own (which would end in SystemExit): stop at a step boundary
        loader = trainer.train_dataloader
        if not isinstance(loader, torch.utils.data.DataLoader):
            fail(
                "DurableCallback needs one torch DataLoader for training (got "
                f"{type(loader).__name__}); combined loaders are not supported"
            )
        stopping.quiet_workers(loader)  # a loader fit() was not given: quiet from its next workers on
        if loader.generator is None:  # starting an epoch draws a seed from it instead of the global RNG
            loader.generator = torch.Generator().manual_seed(self.run.seed)
        if isinstance(loader.sampler, DurableSampler):
            self.sampler, self.batch_size = loader.sampler, int(loader.batch_size or 1)
        elif isinstance(loader.sampler, torch.utils.data.RandomSampler) and "data" not in self.forget:
            fail(
                "the training DataLoader shuffles with a RandomSampler, whose position a resume cannot restore: "
                "use sampler=DurableSampler(len(dataset), seed=run.seed) instead of shuffle=True"
            )
        self._validates = bool(trainer.enable_validation)
        self.run.model = pl_module
        self.run.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        configs = trainer.lr_scheduler_configs
        self.run.scheduler = configs[0].scheduler if configs else None
        self.run.data = self.sampler
        self._last_step = trainer.global_step
        pending, self._pending = self._pending, None
        if pending is not None:
            self._pending = pending
            self._restore_data()  # when fit() was not given the loader (a LightningModule's train_dataloader())
            self._pending = None
            if pending.get("rng") is not None:
                try:
                    restore_rng(pending["rng"], self.generators)
                except KeyError as e:  # a generator registered now that the checkpoint lacks
                    fail(
                        f"checkpoint {self.run.rel(self.run.resumed_from)}: {e.args[0]} (registered with "
                        "track_generators after it was written)"
                    )
        if self.durable.eval_pending_at_resume() is not None:
            self._validate_first(trainer)
        self.durable.start_line()

    @staticmethod
    def _validate_first(trainer: Any) -> None:
        """The validation pending at the resumed step (after it, or abandoned by a stop) runs now, once, before
        the next step. The checkpoint is the step's end (``on_train_batch_end``), from which Lightning's restart would skip that
        step's validation (``increment_progress_to_evaluation_end``); as a restart in the middle of a
        validation it runs it instead, from its first batch. Lightning's restart from the step's end also
        counts the step for its loggers (``_batches_that_stepped``), which the validation's end counts again:
        one less here, so the validation's figures carry the uninterrupted run's logger step."""
        from lightning.pytorch.loops.evaluation_loop import RestartStage

        loop = trainer.fit_loop.epoch_loop
        if not loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            return
        loop.val_loop._restart_stage = RestartStage.RESTARTED_MID_EVALUATION
        loop.val_loop.batch_progress.reset_on_run()
        loop._batches_that_stepped -= 1

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        for loader in _loaders(trainer.val_dataloaders):  # (fit()'s were quiet from the start)
            stopping.quiet_workers(loader)
        if not trainer.sanity_checking and self._abandon(trainer):  # (a stop since the step's end)
            raise _ValidationAbandoned()

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """After each validation batch: a stop signal abandons the validation here (tests can hold it after
        its first batch, TINYLLM_FAULT=validation.hold@S, until the signal lands); at the run's end it runs on."""
        if trainer.sanity_checking:
            return
        faults.hold_validation(trainer.global_step, batch_idx + 1, lambda: self.durable.stop_requested)
        if self._abandon(trainer):
            raise _ValidationAbandoned()

    def _abandon(self, trainer: Any) -> bool:
        """Whether the validation after this step is abandoned: a stop before the run's end."""
        return self.durable.stop_requested and trainer.global_step < self.run.total_steps

    def abandoned(self, trainer: Any) -> None:
        """After an abandoned validation: the stop checkpoint at the step, as the step's end left it (the RNG
        and loops' state before the validation), with the validation pending (the resume runs it once);
        none when the step was saved already (the stop noticed at its end, or at the resumed step)."""
        step = self.run.step
        self.durable.notice_stop()
        if self.durable.last_saved == step or self._at_step is None:
            return
        rng, self._loops = self._at_step
        restore_rng_raw(rng, self.generators)
        self.durable.eval_pending = step
        try:
            self._save(trainer, step)
        finally:
            self._loops = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.current.ready == 0:
            self._consumed = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = _loss_of(outputs)
        if loss is not None:
            self._losses.append(loss.detach())
        self._batches.append(snapshot(batch))
        self._consumed = batch_idx + 1
        step = trainer.global_step
        if step == self._last_step:  # accumulating gradients: no optimizer step yet
            return
        self._last_step = step
        losses = self._losses  # one batch a step: its loss as it is (the mean of one, bit for bit)
        value = (
            float(losses[0].item())
            if len(losses) == 1
            else float(torch.stack(losses).mean().item())
            if losses
            else float("nan")
        )
        snaps = self._batches
        self.durable.step_end(step, value, lambda: digest_of_snapshots(snaps))
        self._losses, self._batches = [], []
        # the step's end, for a validation a stop abandons (``abandoned``): only where one can run
        self._at_step = (capture_rng_raw(self.generators), trainer.fit_loop.state_dict()) if self._validates else None
        if (
            self._validates and step < self.run.run_steps and _validation_due(trainer)
        ):  # saved now, the checkpoint is before it:
            self.durable.eval_pending = step  # a resume from it runs this step's validation (Lightning's would skip it)
        if self.durable.should_save(step):
            self._save(trainer, step)
        if self.durable.stop_requested or step >= self.run.total_steps:  # Lightning's max_steps is the run's
            trainer.should_stop = True
            if step < self.run.run_steps:  # a stop or a segment's end: this step's validation, if due, is the
                # resume's (pending in the checkpoint); none where the uninterrupted run has none, though
                # Lightning's should_stop would force one
                trainer.fit_loop.epoch_loop._skip_next_val = True

    def _save(self, trainer: Any, step: int) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        path = self.staging / CKPT_NAME
        trainer.save_checkpoint(path)
        self.durable.save(step, path, lambda name: "model")
        path.unlink(missing_ok=True)


def _validation_due(trainer: Any) -> bool:
    """Whether Lightning validates after this step (asked at the step's end, before any stop is set; only
    where it validates at all: ``trainer.enable_validation``)."""
    loop = trainer.fit_loop.epoch_loop
    return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def _loaders(value: Any) -> list:
    """The torch DataLoaders in what fit() or a trainer holds (one, a list/tuple, a dict, or None)."""
    if isinstance(value, torch.utils.data.DataLoader):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _loaders(v)]
    return []


def fit(trainer: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    """``trainer.fit(model, ...)`` resumed from the contract's checkpoint through Lightning's ``ckpt_path``;
    ends with the contract's result line (exit 130 after SIGTERM)."""
    found = [c for c in trainer.callbacks if isinstance(c, DurableCallback)]
    if len(found) != 1:
        fail("fit(trainer, ...) needs exactly one DurableCallback(run) in Trainer(callbacks=[...])")
    if "ckpt_path" in kwargs:
        fail("fit() resumes from the contract's checkpoint (--resume, else LATEST): drop ckpt_path")
    cb = found[0]
    run = cb.run
    for given in (*args, *kwargs.values()):  # their workers ignore stop signals from the first one on
        for each in _loaders(given):
            stopping.quiet_workers(each)
    loader = kwargs.get("train_dataloaders", args[0] if args else None)
    if isinstance(loader, torch.utils.data.DataLoader) and isinstance(loader.sampler, DurableSampler):
        cb.sampler, cb.batch_size = loader.sampler, int(loader.batch_size or 1)  # its position restored in time
    run.model = model  # the fingerprint's model even when Lightning runs no step (resumed at the end)
    comps = cb.durable.begin()
    # max_steps: the run's full length, so that a schedule over trainer.estimated_stepping_batches or
    # trainer.max_steps spans the run in every segment; the callback stops at the spec's steps (a segment's
    # end). Resumed at that end: nothing to train, so Lightning's own max_steps stops it before any step.
    at_end = comps is not None and run.step >= run.total_steps
    trainer.fit_loop.epoch_loop.max_steps = run.total_steps if at_end else run.run_steps
    _keep_files_in_home(trainer, run)
    if cb.staging.exists():  # a killed attempt's half-written checkpoint: the mirror is the truth
        shutil.rmtree(cb.staging)
    ckpt_path = None
    if comps is not None:
        ckpt_path = FrameworkRun.materialize(comps, cb.staging / "resume") / CKPT_NAME
    try:
        trainer.fit(model, *args, ckpt_path=str(ckpt_path) if ckpt_path else None, **kwargs)
    except _ValidationAbandoned:  # Lightning tore down its loops; the stop checkpoint at the step, if not yet
        cb.abandoned(trainer)
    except BaseException as e:
        cb.durable.close()
        overrun = schedule_overrun(e, run, HORIZON)
        if overrun:
            fail(overrun)  # exit 2: deterministic, the same at every retry
        raise
    cb.durable.notice_stop()  # a stop noticed after the last step's save decision: the line first
    if cb.durable.last_saved != run.step:
        cb._save(trainer, run.step)
    shutil.rmtree(cb.staging, ignore_errors=True)
    cb.durable.finish(model.state_dict())


def _keep_files_in_home(trainer: Any, run: DurableRun) -> None:
    """Lightning's own files under ``runs/<name>/lightning_logs/`` instead of the trainer's working folder,
    when the script left their place to Lightning (``default_root_dir`` not given): the default logger
    (``logger`` left at its default: a TensorBoardLogger, or a CSVLogger without tensorboard) becomes the same
    logger there, one ``version_N`` per attempt as Lightning numbers them; a ``ModelCheckpoint`` without
    ``dirpath`` follows (the logger's ``version_N/checkpoints``, else ``lightning_logs/checkpoints``).
    A place the script chose (``default_root_dir``, a logger's ``save_dir``, a ``dirpath``) is kept."""
    default = trainer.default_root_dir
    if os.path.abspath(default) != os.path.abspath(os.getcwd()):
        return
    root = str(run.run_dir / LOGS)
    loggers = []
    for logger in trainer.loggers:
        kind = type(logger)
        if (
            kind in (pl.loggers.TensorBoardLogger, pl.loggers.CSVLogger)
            and logger.save_dir == default
            and logger.name == LOGS
        ):  # Lightning's default logger (logger_connector.configure_logger)
            logger = kind(save_dir=root, name="", version=SLURMEnvironment.job_id())
        loggers.append(logger)
    trainer.loggers = loggers
    trainer._default_root_dir = root  # Lightning's fallback place (a ModelCheckpoint without loggers, profilers)
