"""The training loop with bitwise-exact resume.

Everything the next step depends on is in the checkpoint: weights, AdamW moments and step
counts, the torch CPU RNG (dropout), the data cursor (the stream is a function of seed and
cursor), and the step (the LR schedule is a function of the step and spec, never of ``steps``).
So a run killed anywhere and resumed from its last checkpoint takes the same steps on the same
batches and ends with the same loss and weights, bit for bit.

Hooks: ``Trainer.train_step`` builds a step's ``frame``; ``hooks.after_step(trainer, step, frame)``
may add keys before ``reporter.report``; ``hooks.checkpoint_components(trainer, step)`` adds
components to a checkpoint; ``hooks.on_resume(trainer, components)`` reads them back.

Held-out validation (``spec.validation``, tinyllm/validation/README.md) runs at optimizer
boundaries: at start (the fresh before-training pass, or the resume rules at the checkpoint step)
and after each due update, where ``_validation_step`` writes the planned checkpoint (a full one
carries the pending marker, before held-out data is read), validates, and reports the step's one
frame (train/* and val/*). Validation failures are ``SpecError``s (exit 2) and stop training.

A polite stop (SIGTERM, SIGINT, ``$DURABLE_STOP_SIGNAL``; tinyllm/stopping.py) only sets a flag; the loop
notices it at a step boundary, writes the ``stopping`` progress line, then the stop checkpoint at that
step. A stop during an evaluation abandons it (``ValidationAbandoned``): nothing recorded, the checkpoint
at the step carries the validation pending, and the resume runs it once.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch

from contracts.layout import RunDir, RunHome

from . import checkpoint as ckpt
from . import selection as sel
from .checkpoint_writer import CheckpointWriter, Done, async_enabled, snapshot
from . import faults, retention, runlock, runtime_env, tokenizer
from .corpus import open_corpus
from .world_size import check_world_size
from .data import TokenStream
from .errors import STOP, request_stop, signal_name, stop_signals
from .fsio import rel
from .sinks.metrics import Reporter, default_reporter
from .model import GPT, state_digest
from .objectives import build_objective
from .progress import ProgressFile
from .runtime_env import defer_dynamo_in_optimizers, optimizer_step, use_deterministic_algorithms
from .spec import SpecError, TrainSpec, lr_at  # lr_at re-exported: bench/ and tests use it from here
from .validation.errors import ValidationAbandoned
from .validation.transaction import read_journal

# Spec fields that do not change the trajectory: they may differ between a checkpoint and its resume.
NON_TRAJECTORY_FIELDS = {
    "steps",
    "eval_every",
    "eval_interval_seconds",
    "checkpoint_every",
    "log_every",
    "validation",
    "keep_checkpoints",
    "early_stopping",
    "sinks",
}


def with_vocab(spec: TrainSpec, tok: tokenizer.Tokenizer, source: str) -> TrainSpec:
    """``spec`` with ``model.vocab_size`` filled in from the tokenizer (None: its vocabulary); an explicit
    value below it is bad input (a wider one is allowed: its extra ids are never read)."""
    given = spec.model.vocab_size
    if given is None:
        return spec.model_copy(update={"model": spec.model.model_copy(update={"vocab_size": tok.vocab_size})})
    if given < tok.vocab_size:
        raise SpecError(
            f"invalid train spec: model.vocab_size {given} is smaller than the {tok.describe()} of "
            f"{source}; omit it (it follows the tokenizer) or give at least {tok.vocab_size}"
        )
    return spec


def trajectory_fields(spec: TrainSpec) -> dict:
    fields = spec.model_dump(mode="json", exclude=NON_TRAJECTORY_FIELDS)
    if fields.get("distributed") is None:  # a one-process run: the fields as before `distributed` existed
        fields.pop("distributed", None)
    return fields


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW in two groups (weight decay on matrices only). ``foreach=True``: on CPU the same per-tensor
    kernels in the same order as ``foreach=False`` (bitwise the same steps, tests/tinyllm/test_optimizer.py),
    looped in C++ instead of Python (about 0.5 ms of a 40-70 ms step). ``fused=True`` is faster again
    but rounds differently (its bits differ), so it is not used."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(0, spec),
        betas=(spec.beta1, spec.beta2),
        foreach=True,
    )


class TrainerHooks:
    """No-op hooks; validation (tinyllm/validation) subclasses this."""

    def on_start(self, trainer: "Trainer") -> None: ...

    def on_resume(self, trainer: "Trainer", components: dict[str, Any]) -> None: ...

    def after_step(self, trainer: "Trainer", step: int, frame: dict) -> None: ...

    def checkpoint_components(self, trainer: "Trainer", step: int) -> dict[str, Any]:
        return {}

    def on_checkpoint(self, trainer: "Trainer", step: int, path: Path) -> None: ...

    def on_end(self, trainer: "Trainer") -> None: ...


class Trainer:
    last_path: Path | None  # the newest checkpoint this run wrote or resumed from
    lock_file: IO[str] | None  # the run directory's lock (tinyllm/runlock.py) while held

    def __init__(
        self,
        spec: TrainSpec,
        home: Path,
        progress: Path | None = None,
        resume: Path | None = None,
        hooks: TrainerHooks | None = None,
        log=None,
        total_steps: int | None = None,
    ):
        """``spec.steps`` is where this invocation stops; ``total_steps`` (default: the same) is the
        run's last step when the invocation is one segment of a longer run (a TrainRun segment):
        validation's schedule, its final step and ``val/train_total_steps`` follow the run."""
        self.spec, self.home, self.progress = spec, Path(home), progress
        self.progress_file = ProgressFile(progress)  # checkpoint lines, and liveness lines every few seconds
        self.hooks = hooks or TrainerHooks()
        self.log = log or sys.stderr
        self.run_dir = RunHome(self.home).run(spec.name).path
        # Bad input is refused here (the spec itself was checked when parsed: tinyllm/spec.py), before anything is written.
        try:
            faults.arm_from_env()  # tests only: a misspelled TINYLLM_FAULT would run unarmed
        except faults.FaultError as e:
            raise SpecError(str(e)) from None
        try:
            self.async_checkpoints = self._async_checkpoints()
        except ValueError as e:  # a bad $TINYLLM_ASYNC_CHECKPOINTS: one line, exit 2, nothing written
            raise SpecError(str(e)) from None
        self.total_steps = spec.steps if total_steps is None else total_steps
        if self.total_steps < spec.steps:
            raise SpecError(f"--total-steps {self.total_steps} is below the spec's steps {spec.steps}")
        if resume is not None and not Path(resume).is_dir():
            raise SpecError(f"--resume checkpoint not found: {resume}")
        self.resume_arg = Path(resume) if resume is not None else None
        self.refused: list[dict] = []  # checkpoints choose_resume refused at the start, and why
        self.objective = None  # post-training (tinyllm/objectives): its data, init_from, ref, teacher
        if spec.objective != "lm":
            self.tok = tokenizer.BYTE  # post-training is byte-level (tinyllm/objectives)
            self.spec = spec = with_vocab(spec, self.tok, "post-training")
            self.objective = build_objective(spec, self.home, self.log)  # bad input: exit 2, nothing written
        else:
            tokens, self.corpus_meta = open_corpus(self.home, spec.corpus, "tokens")
            try:
                self.tok = tokenizer.from_corpus_meta(self.corpus_meta)
            except ValueError as e:
                raise SpecError(
                    f"corpus {spec.corpus!r}: its meta.json tokenizer is unusable ({e}); rebuild it"
                ) from None
            self.spec = spec = with_vocab(spec, self.tok, f"corpus {spec.corpus!r}")
            cfg = spec.model
            try:
                self.data = TokenStream(tokens, cfg.block_size, spec.batch_size, spec.seed)
            except ValueError as e:
                raise SpecError(f"corpus {spec.corpus!r}: {e}") from None
        best = spec.keep_checkpoints.best if spec.keep_checkpoints is not None else None
        # model selection (tinyllm/selection.py): best-k figures and early stopping, from recorded figures
        self.selection = sel.Tracker(best, spec.early_stopping) if best or spec.early_stopping else None
        self.stopped_early = False
        self.validator = None  # held-out validation (tinyllm/validation), when the spec enables it
        if spec.validation is not None and spec.validation.enabled:
            from .validation.runner import Validator

            self.validator = Validator(
                spec,
                self.home,
                self.run_dir,
                log=self.log,
                total_steps=self.total_steps,
                objective=self.objective,
                tok=self.tok,
            )  # bad held-out data: exit 2
            if self.objective is None:
                self.validator.check_corpus(tokens, f"corpus {spec.corpus!r}")  # overlap with training: exit 2
            elif spec.validation.objective != "lm":
                self.objective.check_heldout(self.validator.source)  # overlap with training data: exit 2

    # -- setup ---------------------------------------------------------------------------

    def _lock(self) -> None:
        self.lock_file = runlock.acquire(self.run_dir, self.spec.name)

    def _build(self) -> None:
        torch.set_num_threads(runtime_env.train_threads(self.spec.threads))  # by load, at most the spec's: same bits
        runtime_env.start_run(self.log)  # MKL's strict CNR mode applied and checked (tinyllm/runtime_env.py)
        use_deterministic_algorithms()
        defer_dynamo_in_optimizers()  # same optimizer; dynamo's import (seconds) skipped
        torch.manual_seed(self.spec.seed)
        self.model = GPT(self.spec.model)
        self.optimizer = make_optimizer(self.model, self.spec)
        self.step, self.cursor, self.loss = 0, 0, float("nan")
        if self.objective is not None:
            self.objective.attach(self)  # init_from weights; reference, teacher, rollout module

    def _resume(self) -> None:
        choice = ckpt.choose_resume(self.run_dir, self.resume_arg, max_step=self.spec.steps)
        self.resumed_from = choice.path
        self.refused = [{"checkpoint": self.rel(r.checkpoint), "reason": r.reason} for r in choice.refused]
        for line in ckpt.describe_choice(choice, self.rel):
            print(line, file=self.log, flush=True)
        if self.resumed_from is None:
            return
        components, manifest = ckpt.load_checkpoint(self.resumed_from)
        state = components["training_state"]
        if state["step"] > self.spec.steps:
            raise SpecError(
                f"checkpoint {self.resumed_from} is at step {state['step']}, beyond the spec's steps {self.spec.steps}"
            )
        self._check_tokenizer(manifest.get("meta", {}).get("tokenizer"))  # before the generic diff (vocab_size)
        saved = manifest.get("meta", {}).get("trajectory")
        check_world_size(saved, self.spec, self.rel(self.resumed_from))  # its own clear line, before the generic diff
        if saved is not None and saved != trajectory_fields(self.spec):
            diff = sorted(
                k
                for k in set(saved) | set(trajectory_fields(self.spec))
                if saved.get(k) != trajectory_fields(self.spec).get(k)
            )
            raise SpecError(
                f"checkpoint {self.resumed_from} was trained with a different spec (fields: {', '.join(diff)})"
            )
        if self.objective is not None:
            self.objective.check_identity(manifest.get("meta", {}).get("posttrain"), self.resumed_from)
        self.model.load_state_dict(components["model"])
        self.optimizer.load_state_dict(components["optimizer"])
        for group in self.optimizer.param_groups:  # a checkpoint saved before foreach was on: same bits, faster
            group["foreach"] = True
        torch.set_rng_state(state["torch_rng"])
        self.step, self.cursor, self.loss = state["step"], state["cursor"], state["loss"]
        self.resume_marker = components.get("validation")  # a validation journal's pending marker
        if self.selection is not None:
            self.selection.restore(components.get(sel.COMPONENT))
        if self.objective is not None:
            self.objective.on_resume(self, components)
        self.hooks.on_resume(self, components)
        print(
            f"tinyllm: resumed {self.spec.name} from {self.rel(self.resumed_from)} at step {self.step}",
            file=self.log,
            flush=True,
        )

    def _check_tokenizer(self, saved: dict | None) -> None:
        """The checkpoint's vocabulary must be the corpus's (absent: byte, as before the char tokenizer)."""
        try:
            theirs = tokenizer.from_identity(saved)
        except ValueError as e:
            raise SpecError(
                f"checkpoint {self.rel(self.resumed_from)}: its tokenizer record is unusable ({e})"
            ) from None
        if theirs.identity() != self.tok.identity():
            raise SpecError(
                f"checkpoint {self.rel(self.resumed_from)} was trained with the {theirs.describe()}, but "
                f"corpus {self.spec.corpus!r} now has the {self.tok.describe()}; resume it against the "
                "corpus it was trained on, or start another run"
            )

    def _report_resume(self) -> None:
        """One progress line saying where this invocation starts and which checkpoints it refused."""
        if self.resumed_from is None and not self.refused:
            return
        line = {
            "event": "resume",
            "step": self.step,
            "resumed_from": self.rel(self.resumed_from),
            "refused": self.refused,
        }
        if self.resumed_from is not None:  # a resume point: the runner records it as the heartbeat's details
            line["checkpoint"] = self.rel(self.resumed_from)
        self.progress_file.write(line, durable=True)

    def rel(self, path: Path | None) -> str | None:
        return rel(path, self.home)

    # -- the loop ------------------------------------------------------------------------

    def train_step(self) -> dict:
        """One optimizer step (with gradient accumulation); returns the step's frame."""
        if self.objective is not None:  # dpo: one update; grpo/opd: one collected batch (n_mini updates)
            return self.objective.train_step(self)
        t0 = time.perf_counter()
        lr = lr_at(self.step, self.spec)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum = self.spec.grad_accum_steps
        loss_sum = 0.0
        for _ in range(accum):
            x, y = self.shard(*self.data.batch(self.cursor))  # (B, T), (B, T); a rank's rows when distributed
            self.cursor += 1
            _, loss = self.model(x, y)
            (loss / accum).backward()
            loss_sum += loss.item()
        loss_sum = self.reduce_gradients(loss_sum)  # distributed: all-reduce (average) of gradients and loss
        max_norm = self.spec.grad_clip if self.spec.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm).item()
        optimizer_step(self.optimizer)  # optimizer.step() without importing torch._dynamo
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.loss = loss_sum / accum
        dt = time.perf_counter() - t0
        tokens = accum * self.spec.batch_size * self.spec.model.block_size
        return {
            "train/loss": self.loss,
            "train/tokens": self.cursor * self.spec.batch_size * self.spec.model.block_size,
            "optim/lr": lr,
            "optim/grad_norm": grad_norm,
            "timer/step_s": dt,
            "timer/tokens_per_s": tokens / dt,
        }

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows of a global batch (all of them; tinyllm/distributed/trainer.py splits by rank)."""
        return x, y

    def reduce_gradients(self, loss_sum: float) -> float:
        """The global batch's loss sum from this process's (one process: itself, gradients untouched)."""
        return loss_sum

    def components(self) -> dict[str, Any]:
        state = {
            "step": self.step,
            "cursor": self.cursor,
            "torch_rng": torch.get_rng_state(),
            "loss": self.loss,
            "loss_hex": float(self.loss).hex(),
        }
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "training_state": state,
            **(self.objective.components(self) if self.objective is not None else {}),
            **({sel.COMPONENT: self.selection.component()} if self.selection is not None else {}),
            **self.hooks.checkpoint_components(self, self.step),
        }

    def checkpoint_meta(self) -> dict:
        meta = {"name": self.spec.name, "trajectory": trajectory_fields(self.spec), "tokenizer": self.tok.identity()}
        if self.objective is not None:
            meta["posttrain"] = self.objective.identity()  # init/ref/teacher digests, sampling, tokenizer
        return meta

    def save(self, extra: dict[str, Any] | None = None, wait: bool = False) -> Path:
        """Checkpoint this step. Asynchronous (tinyllm/checkpoint_writer.py): the state is snapshotted
        here, exactly at the step, and persisted on the writer thread while training goes on; the
        checkpoint is announced (``last_path``, its progress line, pruning) once durable, by ``_poll``
        at a step boundary. ``wait`` (or synchronous writes): returns when it is durable and announced.
        Returns the checkpoint's directory (durable only once announced)."""
        step, loss = self.step, self.loss
        self._drain()  # at most one in flight: the one before is durable and announced (pruned) first
        components = {**self.components(), **(extra or {})}
        if self.writer.asynchronous:
            components = snapshot(components)  # before the next optimizer step changes anything
        meta = self.checkpoint_meta()
        self.last_saved = step
        self.writer.submit(lambda: self._write_checkpoint(components, step, meta), (step, loss))
        if wait or not self.writer.asynchronous:
            self._announce(self.writer.wait())
        return self._checkpoint_path(step, components)

    def _checkpoint_path(self, step: int, components: dict[str, Any]) -> Path:
        if ckpt.FULL_COMPONENTS <= set(components):
            return RunDir(self.run_dir, self.spec.name).step_dir(step)
        return RunDir(self.run_dir, self.spec.name).artifact_dir(step)

    def _announce(self, done: Done | None) -> None:
        """A checkpoint became durable: it is the result's checkpoint now; its progress line; pruning."""
        if done is None:
            return
        (step, loss), path = done.tag, done.result
        self.last_path = path
        self.hooks.on_checkpoint(self, step, path)
        self._checkpoint_line(path, step, loss)
        self._prune(step)

    def _poll(self) -> None:
        """At a step boundary: announce the checkpoint the writer finished (or raise its error)."""
        self._announce(self.writer.poll())

    def _drain(self) -> None:
        """Wait for the checkpoint in flight and announce it (before a stop's checkpoint, the end, validation)."""
        self._announce(self.writer.wait())

    def _checkpoint_line(self, path: Path, step: int | None = None, loss: float | None = None) -> None:
        """The fsynced progress line of the checkpoint ``path`` (at ``step``, default ``self.step``)."""
        step, loss = (self.step, self.loss) if step is None else (step, loss)
        assert loss is not None  # (a checkpoint's line has its loss: callers pass a step with its loss)
        self.progress_file.write(
            {"step": step, "loss": loss, "loss_hex": float(loss).hex(), "checkpoint": self.rel(path)}, durable=True
        )
        self.line_after_stop = getattr(self, "stop_noticed", False)

    def _stopping(self) -> None:
        """The loop noticed a stop request at this step boundary: the ``stopping`` liveness line (once),
        before the stop checkpoint (contracts/subprocess-activity.md). Written here, never in the handler."""
        if getattr(self, "stop_noticed", False):
            return
        self._drain()  # the checkpoint in flight first: its line before `stopping`, so the one after is at S
        self.stop_noticed = True
        name = signal_name(getattr(self, "_agreed_signal", None) or STOP["signal"])  # (on ranks: the agreed one)
        self.progress_file.write({"event": "stopping", "step": self.step, "signal": name}, durable=True)
        print(f"tinyllm: stopping at step {self.step} ({name}): checkpointing this step", file=self.log, flush=True)

    def _write_checkpoint(self, components: dict[str, Any], step: int | None = None, meta: dict | None = None) -> Path:
        """Persist ``components`` as the checkpoint of ``step`` (default: this step). On the writer
        thread for asynchronous saves: it reads only its arguments."""
        step = self.step if step is None else step
        return ckpt.save_checkpoint(
            self.run_dir, step, components, meta=self.checkpoint_meta() if meta is None else meta
        )

    def _recover(self) -> None:
        """Undo what a kill mid-write left (under the run lock)."""
        ckpt.recover_interrupted_writes(self.run_dir, self.log)

    def _prune(self, step: int | None = None) -> None:
        """keep_checkpoints (tinyllm/retention.py), after the new checkpoint's progress line; never fatal."""
        try:
            retention.prune(
                self.run_dir,
                self.home,
                self.spec.keep_checkpoints,
                step=self.step if step is None else step,
                eval_every=self.spec.eval_every,
                final_step=self.spec.steps,
                resumed_from=self.resumed_from,
                log=self.log,
                selected=self.selection.kept_steps() if self.selection is not None else None,
            )
        except OSError as e:
            print(
                f"tinyllm: warning: pruning checkpoints failed ({e}); all kept, training goes on",
                file=self.log,
                flush=True,
            )

    def _liveness(self, event: str | None = None) -> None:
        """A liveness line (tinyllm/progress.py): ``event`` now, else a timed ``progress`` line."""
        if event is None and not self.progress_file.due():
            return  # called every step: its fields (two path resolutions) only when a line is written
        fields: dict[str, Any] = {
            "step": self.step,
            "loss": None if math.isnan(self.loss) else self.loss,
            "last_checkpoint": self.rel(self.last_path),
        }
        if (
            event == "ready"
        ):  # threads, wait policy, MKL mode, heap: what this process runs with (tinyllm/runtime_env.py)
            fields.update(runtime_env.status())
            fields.setdefault("omp", {})["threads"] = runtime_env.train_threads(self.spec.threads)
        if event is None:
            self.progress_file.tick(**fields)
        else:
            self.progress_file.event(event, **fields)

    # -- validation (tinyllm/validation: schedule, planning, transaction) -------------------

    def _validation_at_start(self) -> None:
        """Fresh: the before-training pass at step 0 if due. Resumed: the resume rules at this step."""
        assert self.validator is not None  # (called only with validation enabled)
        if self.resumed_from is None:
            if self.validator.due(0):
                self._validation_step({}, regular_due=False)
            return
        step = self.step
        try:
            metrics = self.validator.resume(
                step, self.resumed_from, self.resume_marker, self.model, publish=lambda f: self.reporter.report(step, f)
            )
        except ValidationAbandoned:  # stopped while the resume rules evaluated: the checkpoint stays as it is
            self._stopping()
            self.validation_pending_exit = True
            return
        if metrics is None and self.selection is not None:  # completed before: its figures are in the journal
            journal = read_journal(self.resumed_from, self.resume_marker)
            metrics = journal.metrics() if journal is not None and journal.phase == "completed" else None
        self._record_validation(step, metrics)

    def _record_validation(self, step: int, metrics: dict | None) -> None:
        """Model selection's figures (tinyllm/selection.py): record, then decide early stopping."""
        if self.selection is None:
            return
        self.selection.record(step, metrics)
        decision = self.selection.decision()
        if decision is not None and decision.stopped and not self.stopped_early:
            assert self.spec.early_stopping is not None  # (a stop decision is early stopping's)
            self.stopped_early = True
            print(
                f"tinyllm: early stopping at step {decision.step}: {self.spec.early_stopping.metric} has not "
                f"improved for {decision.wait} check(s); best step {decision.best_step}",
                file=self.log,
                flush=True,
            )

    def _validation_step(self, frame: dict, regular_due: bool) -> bool:
        """Validate at ``self.step`` (an optimizer boundary) per its checkpoint plan; the step's
        frame is reported with the val/* metrics. False: stop (termination at this boundary)."""
        assert self.validator is not None  # (called only with validation enabled)
        step = self.step
        if any(p.grad is not None for p in self.model.parameters()):
            raise RuntimeError(f"validation at step {step} with gradients in flight (inside gradient accumulation)")
        self._drain()  # validation reads and seals checkpoints: none in flight meanwhile
        termination = self.stop_requested  # asked once (a collective on ranks)
        plan = self.validator.plan(
            step, regular_due=regular_due, fresh=self.resumed_from is None, termination_requested=termination
        )
        if termination:
            self._stopping()  # before the stop checkpoint
        publish = lambda f: self.reporter.report(step, f)  # noqa: E731
        if plan.kind == "full":  # the checkpoint, with the pending marker, before held-out data is read
            faults.point("validation.before_marker", step)
            path = self.save(extra={"validation": self.validator.marker(step, self.model, frame)}, wait=True)
            if plan.exit_before_validation:
                self.validation_pending_exit = True  # evaluated on resume, before the next update
                return False
            try:
                metrics = self.validator.run(step, self.model, ckpt_dir=path, frame=frame, publish=publish)
            except ValidationAbandoned:  # stopped mid-evaluation: the checkpoint's journal stays pending
                return self._abandoned(step, frame, saved=True)
            self._record_validation(step, metrics)
            return True
        if plan.exit_before_validation:
            return False  # fresh step 0 with a stop request: no evaluation, nothing saved
        try:
            metrics = self.validator.run(step, self.model, ckpt_dir=None, frame=frame, publish=publish)
        except ValidationAbandoned:
            return self._abandoned(step, frame, saved=False)
        self._record_validation(step, metrics)
        if plan.kind == "partial":  # non-resumable artifact, committed after validation; never LATEST
            comps = self.components()
            path = self._write_checkpoint({c: comps[c] for c in plan.components})
            self.validator.archive_artifact(path)
        return True

    def _abandoned(self, step: int, frame: dict, saved: bool) -> bool:
        """A stop arrived during the evaluation at ``step``: nothing of it was recorded or published
        (the step's frame neither: it is published with the val/* figures on resume). The stop
        checkpoint is the full one at this step with the validation pending, so the resume evaluates
        it once, before the next update; a fresh run's before-training pass writes nothing (rerun)."""
        self._stopping()
        assert self.validator is not None  # (a stop during validation: it is enabled)
        if not saved and step > 0:
            self.save(extra={"validation": self.validator.marker(step, self.model, frame)}, wait=True)
        self.validation_pending_exit = True
        return False

    def _selection_summary(self) -> dict:
        """``best_checkpoints`` / ``stopped_early`` of the result (tinyllm/selection.py); {} without selection."""
        if self.selection is None:
            return {}
        run = RunDir(self.run_dir, self.spec.name)
        return self.selection.summary(
            lambda s: self.rel(run.step_dir(s)) if s is not None and run.step_dir(s).is_dir() else None
        )

    @property
    def stop_requested(self) -> bool:
        """A stop signal arrived (the handler sets tinyllm.errors.STOP); the loop stops after its step.

        The signal (on ranks: the one agreed) is kept for the ``stopping`` line the loop writes at this step
        boundary, before the stop's checkpoint (``_stopping``; issue 39's contract)."""
        signum = self._stop_signal()
        if signum is None:
            return False
        self._agreed_signal = signum  # the stopping line's (``_stopping``, written by the loop at this boundary)
        return True

    def _held(self) -> None:
        """``trainer.hold``'s liveness: a held step is a test's fixed point, the checkpoint in flight durable
        (and announced) before anything else is said."""
        self._drain()
        self._liveness()

    def _async_checkpoints(self) -> bool:
        """Asynchronous checkpoints unless ``$TINYLLM_ASYNC_CHECKPOINTS`` is 0 (tinyllm/checkpoint_writer.py)."""
        return async_enabled()

    def _stop_signal(self) -> int | None:
        """None: no stop asked for; else the stop signal's number (0: a stop asked for without one)."""
        return int(STOP["signal"] or 0) if STOP["requested"] else None

    def run(self, reporter: Reporter | None = None) -> dict:
        """Train to ``spec.steps``; return the result object (``canceled`` when SIGTERM stopped it)."""
        previous = {s: signal.signal(s, request_stop) for s in stop_signals()}
        self.writer = CheckpointWriter(asynchronous=self.async_checkpoints)
        try:
            self._lock()
            self._recover()
            self._build()
            self._resume()
            self._report_resume()
            self.last_saved = self.step if self.resumed_from is not None else 0  # step 0 is never saved
            self.last_path = self.resumed_from
            # a fresh start drops every frame of a killed earlier attempt (its step-0 validation frame too)
            kept = self.step if self.resumed_from is not None else -1
            self.reporter = reporter or default_reporter(
                self.run_dir,
                kept,
                self.total_steps,
                self.spec.log_every,
                sinks=self.spec.sinks,
                spec=self.spec,
                home=self.home,
                corpus_checksum=(getattr(self, "corpus_meta", None) or {}).get("checksum"),
            )
            self.hooks.on_start(self)
            self._liveness("ready")
            self.validation_pending_exit = False
            self.stop_noticed = self.line_after_stop = False
            if self.validator is not None:
                self.validator.should_abandon = lambda: bool(STOP["requested"])  # this process's flag, no collective
                self._validation_at_start()
            self.model.train()
            while self.step < self.spec.steps and not self.stopped_early and not self.validation_pending_exit:
                if self.stop_requested:  # one check per step boundary (a collective on ranks)
                    self._stopping()
                    break
                self._poll()  # a checkpoint the writer finished: announced now (its line, pruning)
                if faults.hold(self.step, lambda: self.stop_requested, self._held) and self.stop_requested:
                    self._stopping()
                    break  # tests only (trainer.hold); no extra stop check otherwise (a collective on ranks)
                self._liveness()  # at most every few seconds: the loop itself says it is alive
                frame = self.train_step()
                self.hooks.after_step(self, self.step, frame)
                regular_due = self.step % self.spec.checkpoint_every == 0 or self.step == self.spec.steps
                if self.validator is not None and self.validator.due(self.step):
                    # model selection checkpoints every check, so each figure has a checkpoint to keep
                    regular_due = regular_due or self.selection is not None
                    if not self._validation_step(frame, regular_due) or self.stopped_early:
                        break
                    continue
                self.reporter.report(self.step, frame)
                if regular_due:
                    self.save()
            self._drain()  # the checkpoint in flight is durable (and its line written) before anything else
            if self.last_saved != self.step:  # stopped between checkpoints: the stop checkpoint, at this step
                self.save(extra=self.validator.completed_component(self.step) if self.validator else None, wait=True)
            elif self.stop_noticed and not self.line_after_stop and self.last_path is not None:
                self._checkpoint_line(
                    self.last_path
                )  # saved at this step before the stop: its line again, after `stopping`
            self.hooks.on_end(self)
            self.reporter.close()
            loss = None if math.isnan(self.loss) else self.loss  # nan only when stopped before step 1
            return {
                "name": self.spec.name,
                "steps": self.step,
                "checkpoint": self.rel(self.last_path),
                "final_loss": loss,
                "final_loss_hex": None if loss is None else loss.hex(),
                "digest": state_digest(self.model.state_dict()),
                "resumed_from": self.rel(self.resumed_from),
                "refused_checkpoints": self.refused,
                "canceled": (
                    (self.step < self.spec.steps and self.stop_requested and not self.stopped_early)
                    or self.validation_pending_exit
                ),
                **self._selection_summary(),
            }
        finally:
            # never release the run lock with a write in flight (a normal end has drained it already;
            # here an exception is on its way out, and it wins over the write's own error, if any)
            error = self.writer.close()
            if error is not None:
                print(f"tinyllm: the checkpoint in flight failed too: {error}", file=self.log, flush=True)
            for s, handler in previous.items():
                signal.signal(s, handler)
            lock = getattr(self, "lock_file", None)
            if lock is not None:
                lock.close()  # releases the flock (in-process callers run several trainers)
                self.lock_file = None
