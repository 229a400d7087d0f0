"""Hugging Face ``transformers.Trainer`` under the trainer contract (extra ``[hf]``; docs/integrations.md).

The whole change to a Trainer script::

    run = DurableRun.from_args()                           # --spec --home [--progress] [--resume]
    cfg = run.config
    ...
    trainer = DurableTrainer(run, model=model, args=args, train_dataset=data)   # was Trainer(...)
    trainer.train()                                        # resumes; checkpoints; SIGTERM -> 130

``DurableTrainer`` is a ``Trainer`` whose arguments follow the spec (``max_steps`` = the spec's
``steps``, ``save_steps`` = ``checkpoint_every``, ``seed``; its own checkpoints go to a staging
folder ``runs/<name>/hf/``), whose LR schedule spans ``config["schedule_steps"]`` instead of
``max_steps`` (``ctl train`` runs a spec in segments that change ``steps``), and whose every
checkpoint is mirrored byte for byte into ``runs/<name>/ckpt/step-NNNNNN/`` (atomic, checksummed,
then LATEST; ``save_total_limit`` applies there). ``train()`` resumes from the contract's checkpoint
through HF's own ``resume_from_checkpoint`` (model, optimizer, scheduler, scaler, HF's RNG file,
the data position by skipping the trained batches), writes each step's exact loss, learning rates and
batch digest to ``metrics.jsonl``, turns SIGTERM into "save at the next step boundary, exit 130" and
prints the contract's result line last on stdout (HF's own printer callbacks are removed: they print
dicts to stdout; the run's log lines go to stderr). DeepSpeed, FSDP and more than one process are
refused (exit 2). ``track_generators={"name": g}`` registers generators of the script's own
(``torch.Generator``, ``random.Random``, NumPy's: HF's RNG file holds the global ones only): saved in
each checkpoint (``durable_generators.pt``) and restored before training continues. A schedule that
runs past its last step ("Tried to step N times") ends the attempt with one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import io
import shutil
from typing import Any, Mapping

from .contract import FrameworkRun, fail, require, schedule_overrun

require("transformers", "hf")  # the [hf] extra; without it, MissingExtra: one line naming the extra

import torch
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .. import faults, stopping
from ..durable import DurableRun
from ..durable.state import (
    capture_generators,
    capture_rng,
    check_generators,
    digest_of_snapshots,
    restore_generators,
    restore_rng,
    snapshot,
)

FORMAT = "durable-hf/1"
# schedules whose shape does not depend on the number of training steps
HORIZON_FREE = frozenset({"constant", "constant_with_warmup", "reduce_lr_on_plateau"})
OPTIMIZER_FILES = ("optimizer", "scheduler", "scaler")
MODEL_FILES = ("config.json", "generation_config.json")
GENERATORS_FILE = "durable_generators.pt"  # track_generators' states, beside HF's rng_state.pth
HORIZON = (
    "build it over config.schedule_steps (the run's total steps; DurableTrainer's own schedules span it) "
    "or run.run_steps, never max_steps or the spec's steps (a segment's end under ctl train)"
)


def classify(name: str) -> str:
    """Which contract piece an HF checkpoint file belongs to (all are restored together)."""
    base = name.rsplit("/", 1)[-1]
    if base.startswith(OPTIMIZER_FILES):
        return "optimizer"
    if base.startswith(("model", "pytorch_model", "adapter_model")) or base in MODEL_FILES:
        return "model"
    return "training_state"  # trainer_state.json, rng_state.pth, training_args.bin, ...


def _schedule_name(args: Any) -> str:
    value = args.lr_scheduler_type
    return str(getattr(value, "value", value))


class _EvaluationAbandoned(Exception):
    """A stop signal arrived during HF's evaluation loop: abandoned between two batches, nothing logged."""


class _StoppedAtResume(Exception):
    """A stop signal abandoned the pending evaluation a resume runs first: the checkpoint stays as it is."""


def _quiet(loader: Any) -> Any:
    """The loader's worker processes ignore stop signals (accelerate wraps the torch DataLoader)."""
    stopping.quiet_workers(getattr(loader, "base_dataloader", loader))
    return loader


class DurableTrainer(Trainer):
    """``transformers.Trainer`` following the trainer contract for the ``DurableRun`` ``run``.

    ``track_generators``: generators of the script's own, by name, saved and restored with each checkpoint.
    ``forget`` (test-only: the broken variants verify-resume diagnoses) names pieces not restored:
    ``"rng"`` drops HF's RNG file (and the registered generators' states) from the resume.
    """

    def __init__(
        self,
        run: DurableRun,
        *args: Any,
        forget: tuple[str, ...] = (),
        track_generators: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        if not isinstance(run, DurableRun):
            raise TypeError(
                f"DurableTrainer(run, ...): run must be a tinyllm.durable.DurableRun, got {type(run).__name__}"
            )
        try:
            check_generators(track_generators or {})
        except TypeError as e:
            raise TypeError(f"DurableTrainer(track_generators=...): {e}") from None
        targs = kwargs.pop("args", None) if "args" in kwargs else (args[1] if len(args) > 1 else None)
        if targs is None:
            fail("DurableTrainer needs args=TrainingArguments(...)")
        if getattr(targs, "deepspeed", None) or getattr(targs, "fsdp", None):
            fail(
                "DurableTrainer does not support DeepSpeed or FSDP (their sharded checkpoints are not mirrored); "
                "train on one process, or use tinyllm's own distributed trainer"
            )
        if getattr(targs, "world_size", 1) > 1:
            fail("DurableTrainer runs one process (world_size 1); got a distributed launch")
        horizon = run.config.get("schedule_steps")
        if horizon is None and _schedule_name(targs) not in HORIZON_FREE:
            fail(
                f"config.schedule_steps is required for the {_schedule_name(targs)!r} LR schedule: HF spans it over "
                "max_steps, which is each segment's end under ctl train (set it to the run's total steps)"
            )
        if horizon is not None and (not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1):
            fail(f"config.schedule_steps: expected an integer >= 1, got {horizon!r}")
        self.durable = FrameworkRun(
            run, fmt=FORMAT, trainer="tinyllm.integrations.hf", save_total_limit=targs.save_total_limit
        )
        self.durable_horizon = horizon
        self.durable_forget = tuple(forget)
        self.durable_generators = dict(track_generators or {})
        run.generators.update(self.durable_generators)  # the run's tracked pieces and fingerprints name them
        self.staging = run.run_dir / "hf"
        targs = dataclasses.replace(
            targs,
            output_dir=str(self.staging),
            max_steps=run.total_steps,
            save_strategy="steps",
            save_steps=run.checkpoint_every,
            save_total_limit=None,
            save_only_model=False,
            seed=run.seed,
            ignore_data_skip=False,
            report_to="none",
            disable_tqdm=True,
        )
        if len(args) > 1:
            args = (args[0], targs, *args[2:])
        else:
            kwargs["args"] = targs
        super().__init__(*args, **kwargs)
        for printer in (PrinterCallback, ProgressCallback):  # they print to stdout, after the result line too
            self.remove_callback(printer)
        self.add_callback(_ContractCallback(self))
        self._durable_loss: torch.Tensor | None = None
        self._durable_batches: list[Any] = []  # the step's micro-batches (snapshots, hashed by the frame writer)
        self._durable_eval_batches = 0
        self._durable_eval_done = False
        self.durable.resuming_eval = False

    # -- what the contract changes in Trainer -----------------------------------------------------

    def get_train_dataloader(self) -> Any:
        """HF's loader, its worker processes ignoring stop signals (a group SIGTERM is the main process's)."""
        return _quiet(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        return _quiet(super().get_eval_dataloader(eval_dataset))

    def _evaluate(self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False) -> dict:
        """HF's in-training evaluation, abandoned when a stop signal arrives (before it or between two of its
        batches): nothing logged (no figure in the log history the checkpoint holds), the RNG put back as
        it was before it, and the stop checkpoint written at this step with the evaluation pending, so the
        resume runs it once, before the next step, as the uninterrupted run did."""
        step = self.state.global_step
        rng = capture_rng({})
        self._durable_eval_batches = 0
        try:
            if self.durable.stop_requested:
                raise _EvaluationAbandoned()
            return super()._evaluate(trial, ignore_keys_for_eval, skip_scheduler)
        except _EvaluationAbandoned:
            restore_rng(rng, {})
            if self.durable.resuming_eval:
                raise _StoppedAtResume() from None
            self.durable.eval_pending = step
            self.durable.notice_stop()
            self.control.should_save = True  # the stop checkpoint, at this step
            self.control.should_training_stop = True
            self.control.should_evaluate = False  # (on_evaluate, which resets it, never ran) not again at the epoch end
            self._durable_abandoned = True
            return {}

    def _determine_best_metric(self, metrics: dict, trial: Any) -> bool:
        if getattr(self, "_durable_abandoned", False):  # no figures: nothing to compare
            return False
        return super()._determine_best_metric(metrics, trial)

    def _load_rng_state(self, checkpoint: Any) -> None:
        """HF puts the RNG back right before the resumed step; an evaluation a stop abandoned at this
        step runs now, from the same RNG the uninterrupted run's evaluation started from."""
        super()._load_rng_state(checkpoint)
        if self.durable.eval_pending_at_resume() is not None and not self._durable_eval_done:
            self._durable_eval_done = True
            self.durable.resuming_eval = True
            try:
                self._evaluate(None, None)
            finally:
                self.durable.resuming_eval = False

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The schedule spans the run (``config.schedule_steps``), not this invocation's ``max_steps``."""
        return super().create_scheduler(self.durable_horizon or num_training_steps, optimizer)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._durable_loss = loss if self._durable_loss is None else self._durable_loss + loss
        self._durable_batches.append(snapshot(inputs))
        return loss

    def train(
        self, resume_from_checkpoint: Any = None, trial: Any = None, ignore_keys_for_eval: list[str] | None = None
    ) -> Any:
        """HF's ``train()``, resumed from the contract's checkpoint; ends with the contract's result line."""
        if resume_from_checkpoint not in (None, False):
            fail(
                "DurableTrainer.train() resumes from the contract's checkpoint (--resume, else LATEST): "
                "drop resume_from_checkpoint"
            )
        run = self.durable.run
        comps = self.durable.begin()
        if self.staging.exists():  # a killed attempt's half-written HF checkpoints: the mirror is the truth
            shutil.rmtree(self.staging)
        resume = None
        if comps is not None:
            resume = FrameworkRun.materialize(comps, self.staging / f"checkpoint-{run.step}")
            if "rng" in self.durable_forget:
                for f in resume.glob("rng_state*.pth"):
                    f.unlink()
            else:
                self._restore_generators(resume)
        if resume is not None and run.step >= run.total_steps:  # resumed at the end (a kill after the last save):
            # nothing to train; HF's train() would take one more step from a checkpoint at max_steps
            assert isinstance(self.model, PreTrainedModel)  # (HF's checkpoint folders are save_pretrained's)
            # (typeshed's functools.wraps type does not bind as a method: the wrapped PreTrainedModel.to looks unbound)
            self.model = self.model.__class__.from_pretrained(str(resume)).to(self.model.device)  # type: ignore[arg-type]
            run.model = self.model
            shutil.rmtree(self.staging, ignore_errors=True)
            self.durable.finish(self.model.state_dict())
            return None
        try:
            out = super().train(
                resume_from_checkpoint=str(resume) if resume else None,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
            )
        except _StoppedAtResume:  # the pending evaluation abandoned again: the checkpoint resumed from stays
            out = None
            self.durable.notice_stop()
        except BaseException as e:
            self.durable.close()
            overrun = schedule_overrun(e, run, HORIZON)
            if overrun:
                fail(overrun)  # exit 2: deterministic, the same at every retry
            raise
        self.durable.notice_stop()  # a stop noticed after the last step's save decision: the line first
        if self.durable.last_saved != run.step:  # e.g. resumed at the end: nothing left to train
            self._mirror(run.step)
        shutil.rmtree(self.staging, ignore_errors=True)
        assert self.model is not None  # (HF's Trainer holds the model it trained)
        self.durable.finish(self.model.state_dict())
        return out

    def _restore_generators(self, folder: Any) -> None:
        """The registered generators' states from a resumed checkpoint, before HF's loop draws anything."""
        if not self.durable_generators:
            return
        where = self.durable.run.rel(self.durable.run.resumed_from)
        path = folder / GENERATORS_FILE
        try:
            saved = torch.load(io.BytesIO(path.read_bytes()), weights_only=True) if path.is_file() else {}
            restore_generators(saved, self.durable_generators)
        except KeyError as e:
            fail(f"checkpoint {where}: {e.args[0]} (registered with track_generators after it was written)")

    def _mirror(self, step: int) -> None:
        source = self.staging / f"checkpoint-{step}"
        if not source.is_dir():
            assert self.model is not None  # (HF's Trainer holds the model it trains)
            self._save_checkpoint(self.model, trial=None)
        if self.durable_generators:
            buffer = io.BytesIO()
            torch.save(capture_generators(self.durable_generators), buffer)
            (source / GENERATORS_FILE).write_bytes(buffer.getvalue())
        self.durable.save(step, source, classify)
        shutil.rmtree(source, ignore_errors=True)


class _ContractCallback(TrainerCallback):
    """Per optimizer step: the frame, the save decision, SIGTERM; per HF save: the mirror."""

    def __init__(self, trainer: DurableTrainer):
        self.trainer = trainer

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        run = self.trainer.durable.run
        run.model, run.optimizer, run.scheduler = model, optimizer, lr_scheduler

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.durable.start_line()  # after HF restored everything, before the first step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        t = self.trainer
        loss = t._durable_loss
        snaps = t._durable_batches
        batch = (lambda: digest_of_snapshots(snaps)) if snaps else None
        t._durable_loss, t._durable_batches = None, []
        t.durable.step_end(state.global_step, float(loss.item()) if loss is not None else float("nan"), batch)
        if t.durable.should_save(state.global_step):
            control.should_save = True
        if t.durable.stop_requested:
            control.should_training_stop = True
        return control

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After each evaluation batch: a stop signal abandons the evaluation here (tests can hold it
        after its first batch, TINYLLM_FAULT=validation.hold@S, until the signal lands)."""
        t = self.trainer
        t._durable_eval_batches += 1
        faults.hold_validation(state.global_step, t._durable_eval_batches, lambda: t.durable.stop_requested)
        if t.durable.stop_requested:
            raise _EvaluationAbandoned()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._mirror(state.global_step)
