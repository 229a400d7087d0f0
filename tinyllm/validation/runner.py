"""The trainer-facing side of validation: one ``Validator`` per ``tinyllm train`` process.

The trainer calls, in order:
- ``Validator(spec, home, run_dir)`` at start: loads the held-out source (bad data: exit 2, nothing
  written), then ``check_corpus(training_tokens)`` (overlap with training: exit 2);
- at a resume from checkpoint step k: ``resume(k, ckpt_dir, marker, model, publish)`` before the
  next update (the five resume rules, see transaction.py);
- after update k (and at step 0 before the first update): ``plan(...)``; when the plan is full,
  ``marker(k, model, frame)`` goes into the checkpoint as component ``validation``; then
  ``run(k, model, ckpt_dir=..., frame=..., publish=...)`` evaluates, records and publishes.
``publish(frame)`` is the trainer's single reporter: the step's frame with train/* and val/*.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .. import faults, tokenizer
from ..model import state_digest
from ..objective_config import effective_validation_reward, effective_validation_sampling
from ..validation_config import ValidationConfig, declared_schema
from .errors import ArchiveError, ValidationAbandoned, ValidationIdentityError
from .metric_schema import check_rollout_count, check_schema
from .generation import evaluate_generation
from .isolation import isolated
from .lm import evaluate_lm
from .planning import StepPlan, plan_step
from .schedule import is_validation_step
from .source import HeldOutSource, check_disjoint, check_encodes, load_source, resolve_path, verify_unchanged
from .transaction import Journal, ValidationTransaction, check_identity, read_journal, resume_action

Publish = Callable[[dict], None]


class Validator:
    def __init__(
        self,
        spec,
        home: str | Path,
        run_dir: str | Path,
        log=None,
        objective=None,
        total_steps: int | None = None,
        tok: tokenizer.Tokenizer = tokenizer.BYTE,
    ):
        self.spec = spec
        self.tok = tok  # the run's tokenizer (its corpus's): held-out text and prompts encode with it
        self.total_steps = spec.steps if total_steps is None else total_steps  # the run's, not the segment's
        self.cfg: ValidationConfig = spec.validation
        assert self.cfg is not None and self.cfg.enabled
        self.home = Path(home)
        self.run_dir = Path(run_dir)
        self.log = log or sys.stderr
        # post-training (tinyllm/objectives): trainer step k is model step k * scale (grpo/opd: n_mini
        # updates per collected batch); generation goes through the objective's rollout module
        self.objective = objective
        self.scale = objective.updates_per_step if objective is not None else 1
        self.reward = effective_validation_reward(spec)
        self.sampling = effective_validation_sampling(spec)
        self.source: HeldOutSource = load_source(self.cfg, self.home, self.spec.model.block_size)
        check_encodes(self.source, self.tok)  # a character outside a char vocabulary: exit 2, before work
        self.rollouts: list[dict] = []  # generation: the last pass's rollouts (for inspection)
        # the trainer's stop flag: asked before the pass and after each batch (a stop abandons the pass:
        # ValidationAbandoned, nothing recorded); a distributed run's collective evaluation never asks
        self.should_abandon: Callable[[], bool] = lambda: False

    # -- start ---------------------------------------------------------------------------------
    def check_corpus(self, training_tokens: np.ndarray, corpus: str = "training corpus") -> None:
        check_disjoint(self.source, training_tokens, corpus, self.tok)

    def due(self, step: int) -> bool:
        return is_validation_step(step * self.scale, self.total_steps * self.scale, self.cfg)

    def plan(self, step: int, *, regular_due: bool, fresh: bool, termination_requested: bool = False) -> StepPlan:
        return plan_step(
            step,
            self.total_steps,
            validation_due=self.due(step),
            regular_due=regular_due,
            cfg=self.cfg,
            fresh=fresh,
            termination_requested=termination_requested,
        )

    # -- identity ------------------------------------------------------------------------------
    def identity(self, model: torch.nn.Module) -> dict:
        return {
            "config": {**self.cfg.identity(), "sampling": self.sampling, "reward": self.reward},
            "source": self.source.identity(),
            "model": {
                "config": self.spec.model.model_dump(mode="json"),
                "tokenizer": "byte" if self.tok.kind == "byte" else self.tok.identity(),
                **({"posttrain": self.objective.identity()} if self.objective is not None else {}),
            },
            "weights_digest": state_digest(model.state_dict()),
        }

    def marker(self, step: int, model: torch.nn.Module, frame: dict) -> dict:
        """The pending-evaluation marker component for the full checkpoint at ``step``."""
        return ValidationTransaction(step, self.identity(model), frame=frame).marker()

    # -- one pass ------------------------------------------------------------------------------
    def run(
        self,
        step: int,
        model: torch.nn.Module,
        *,
        ckpt_dir: Path | None,
        frame: dict,
        publish: Publish,
        journal: Journal | None = None,
    ) -> dict:
        """Evaluate at ``step``; durable when ``ckpt_dir`` (its marker already written) is given.

        Returns the val/* and timer/validation_s metrics (already published with ``frame``).
        """
        identity = self.identity(model)
        if journal is not None:
            check_identity(journal.identity, identity, step)
        tx = ValidationTransaction(step, identity, ckpt_dir, frame=frame, journal=journal)
        if tx.durable:
            faults.point("validation.after_marker", step)
        tx.begin()
        try:
            t0 = time.perf_counter()
            self.source = load_source(self.cfg, self.home, self.spec.model.block_size)  # read the held-out data now
            verify_unchanged(self.source, identity["source"], step)
            metrics = self._evaluate(step, model)
            metrics["timer/validation_s"] = time.perf_counter() - t0
            check_schema(metrics, declared_schema(self.cfg, self.reward), step)  # keys/types: fatal
            if self.cfg.objective == "generation":
                check_rollout_count(metrics, len(self._rows()) * self.cfg.sampling.n_generation, step)
            if state_digest(model.state_dict()) != identity["weights_digest"]:  # pinned weight version
                raise ValidationIdentityError(
                    f"validation at step {step}: the model's weights changed during evaluation"
                )
            tx.evaluated(metrics)  # non-finite: raises, nothing recorded, nothing published
        except BaseException:
            tx.failed()
            raise
        if tx.durable:
            faults.point("validation.after_evaluation", step)
        return self._publish(tx, publish)

    def _rows(self) -> list:
        rows = self.source.prompts
        return rows[: self.cfg.max_samples] if self.cfg.max_samples is not None else rows

    def _evaluate(self, step: int, model: torch.nn.Module) -> dict:
        cfg, block = self.cfg, self.spec.model.block_size

        def on_batch(n: int) -> None:
            if n == 1:
                faults.point("validation.during_evaluation", step)
            faults.hold_validation(step, n, self.should_abandon)  # tests only (TINYLLM_FAULT=validation.hold@S)
            if self.should_abandon():
                raise ValidationAbandoned(f"validation at step {step} abandoned after {n} batch(es): stop requested")

        if self.should_abandon():
            raise ValidationAbandoned(f"validation at step {step} abandoned before its first batch: stop requested")
        with isolated(model):
            if cfg.objective == "lm":
                metrics = evaluate_lm(
                    model,
                    self.tok.encode(self.source.text),
                    block_size=block,
                    batch_size=cfg.batch_size,
                    max_samples=cfg.max_samples,
                    on_batch=on_batch,
                )
            elif cfg.objective == "dpo":  # the training objective, in inference mode, over held-out pairs
                metrics = self.objective.evaluate(model, self.source.pairs, cfg.batch_size, cfg.max_samples, on_batch)
            else:
                generate_fn = None
                rollout = self.objective.validation_model() if self.objective is not None else None
                if rollout is not None:  # pinned to the scheduled model step: another version is fatal
                    generate_fn = partial(rollout.generate_texts, expected_version=step * self.scale)
                metrics, self.rollouts = evaluate_generation(
                    model,
                    self.source.prompts,
                    block_size=block,
                    batch_size=cfg.batch_size,
                    tok=self.tok,
                    sampling=self.sampling,
                    rewards=self.reward,
                    seed=cfg.seed,
                    max_samples=cfg.max_samples,
                    on_batch=on_batch,
                    generate_fn=generate_fn,
                )
                metrics["val/step"] = step * self.scale
                metrics["val/train_total_steps"] = self.total_steps * self.scale
        return metrics

    def _publish(self, tx: ValidationTransaction, publish: Publish) -> dict:
        """Archive (strict for durable full checkpoints), record completion, emit the frame once."""
        archive = None
        if tx.ckpt_dir is not None and self.cfg.checkpoint.archive_dir:  # (tx.durable)
            archive = self._archive(tx.ckpt_dir, strict=True)
        tx.completed(archive)
        self.completed = tx.journal
        metrics = tx.journal.metrics()
        if tx.durable:  # the checkpoint is authoritative: a kill here loses this frame, never repeats the pass
            faults.point("validation.before_frame", tx.step)
        publish({**tx.journal.frame, **metrics})
        if tx.durable:
            faults.point("validation.after_publication", tx.step)
        return metrics

    def completed_component(self, step: int) -> dict | None:
        """For a checkpoint written at ``step`` after its (ephemeral) validation completed in this
        process (a stop between checkpoints): a completed journal, so a resume does not repeat it."""
        done = getattr(self, "completed", None)
        if done is None or done.step != step:
            return None
        return {"validation": {"json": done.model_dump_json()}}

    # -- partial artifacts and archive -----------------------------------------------------------
    def archive_artifact(self, artifact_dir: Path) -> str | None:
        """Best-effort archive of a partial (non-resumable) artifact: a failure is a warning only."""
        if not self.cfg.checkpoint.archive_dir:
            return None
        try:
            return self._archive(artifact_dir, strict=False)
        except ArchiveError as e:
            print(f"tinyllm: warning: {e} (best-effort for partial artifacts; training goes on)", file=self.log)
            return None

    def _archive(self, src: Path, strict: bool) -> str:
        assert self.cfg.checkpoint.archive_dir is not None  # (the callers check it is set)
        root = resolve_path(self.cfg.checkpoint.archive_dir, self.home) / self.spec.name
        dest = root / src.name
        tmp = root / f".tmp-{src.name}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            shutil.copytree(src, tmp)
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except OSError as e:
            kind = "strict archive copy" if strict else "archive copy"
            raise ArchiveError(f"{kind} of {src} to {dest} failed: {e}") from None
        return str(dest)

    # -- resume --------------------------------------------------------------------------------
    def resume(
        self,
        step: int,
        ckpt_dir: Path,
        marker: dict | None,
        model: torch.nn.Module,
        publish: Publish,
        frame: dict | None = None,
    ) -> dict | None:
        """Apply the resume rules at checkpoint ``step`` before the next update; val metrics or None."""
        journal = read_journal(ckpt_dir, marker)
        action = resume_action(journal, ckpt_step=step, due=self.due(step))
        if action == "none":
            return None
        if action == "publish":
            assert journal is not None  # (only a journal's phase says publish)
            check_identity(journal.identity, self.identity(model), step)
            tx = ValidationTransaction(step, journal.identity, ckpt_dir, journal=journal)
            tx.resume_publication()
            return self._publish(tx, publish)
        if journal is None:  # due, no marker: the step's validation never ran
            return self.run(step, model, ckpt_dir=None, frame=frame or {}, publish=publish)
        return self.run(step, model, ckpt_dir=ckpt_dir, frame=journal.frame, publish=publish, journal=journal)
