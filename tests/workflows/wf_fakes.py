"""Fake ``train``, ``eval`` and ``corpus`` activities for the workflow tests.

The real trainer is not the point of these tests (tests/ctl and tinyllm's own tests run
it): the fakes keep the contract that matters to the workflows. ``FakeTrainer`` resumes
from ``--resume`` (the last heartbeated checkpoint on a redelivery), else the run's LATEST,
else fresh; it takes deterministic steps whose loss depends on the whole state (so a
resume from the wrong state gives another loss), writes checkpoints as real files under
``<home>/runs/<name>/ckpt/step-NNNNNN.json`` with ``LATEST``, heartbeats each one, and
counts every step it takes. Time comes from the engine's VirtualClock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine import Canceled, NonRetryableError
from contracts.resume import resume_argument as choose_resume
from workflows.models import (
    CorpusBuildInput,
    CorpusBuildResult,
    EvalActivityInput,
    SuiteOutputs,
    TrainActivityInput,
    TrainActivityResult,
)

MOD = 2**61 - 1


class Crash(BaseException):
    """Stands for a SIGKILL of the worker: nothing catches it, the engine object is dropped."""


def step_state(x: int, loss: float, k: int, seed: int) -> tuple[int, float]:
    """One deterministic optimizer step ``k -> k+1``: new RNG-like state and loss."""
    x = (x * 6364136223846793005 + 1442695040888963407 + k * 7919 + seed) % MOD
    loss = loss * 0.995 + (x % 1009) * 1e-6
    return x, loss


def reference_loss(steps: int, seed: int) -> float:
    """The loss an uninterrupted run reaches at ``steps`` (computed here, independently)."""
    x, loss = seed + 1, 4.0
    for k in range(steps):
        x, loss = step_state(x, loss, k, seed)
    return loss


@dataclass
class Call:
    name: str
    activity_id: str
    attempt: int
    input: dict


@dataclass
class Fakes:
    """Shared, in-memory record of what the fake activities did (survives engine 'crashes')."""

    home: Path
    clock: Any = None
    calls: list[Call] = field(default_factory=list)
    steps_taken: int = 0
    resumed_from: list[str | None] = field(default_factory=list)
    # hooks: called as hook(fakes, activity_id, attempt, step) after each train step / at events
    on_step: Callable[["Fakes", str, int, int], None] | None = None
    on_event: Callable[["Fakes", str], None] | None = None
    fail_train: dict[tuple[str, int], int] = field(default_factory=dict)  # (id, attempt) -> crash step
    fail_eval: set[str] = field(default_factory=set)  # suites that fail for good
    fail_corpus: bool = False
    engine: Any = None

    # --- helpers -----------------------------------------------------------------------

    def event(self, what: str) -> None:
        if self.on_event is not None:
            self.on_event(self, what)

    def ckpt_dir(self, name: str) -> Path:
        return self.home / "runs" / name / "ckpt"

    def save(self, name: str, step: int, x: int, loss: float) -> str:
        d = self.ckpt_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        rel = f"runs/{name}/ckpt/step-{step:06d}"
        (self.home / f"{rel}.json").write_text(json.dumps({"step": step, "x": x, "loss_hex": loss.hex()}))
        Path(self.home / rel).mkdir(exist_ok=True)  # a checkpoint is a directory, like the real one
        (d / "LATEST").write_text(f"step-{step:06d}")
        return rel

    def load(self, rel: str) -> tuple[int, int, float]:
        d = json.loads((self.home / f"{rel}.json").read_text())
        return d["step"], d["x"], float.fromhex(d["loss_hex"])

    def now(self) -> float:
        return self.clock.now() if self.clock is not None else 0.0

    # --- the activities ------------------------------------------------------------------

    def train(self, ctx: Any, input: Any) -> dict:
        inp = TrainActivityInput.model_validate(input)
        spec = inp.spec
        name, until, seed, every = spec["name"], spec["steps"], spec.get("seed", 0), spec.get("checkpoint_every", 100)
        self.calls.append(Call("train", ctx.activity_id, ctx.attempt, spec))
        self.event(f"start {ctx.activity_id}#{ctx.attempt}")
        resume = choose_resume(self.home, name, until, ctx.attempt, ctx.last_heartbeat_details)
        if resume is None:
            latest = self.ckpt_dir(name) / "LATEST"
            resume = f"runs/{name}/ckpt/{latest.read_text()}" if latest.exists() else None
        self.resumed_from.append(resume)
        step, x, loss = self.load(resume) if resume else (0, seed + 1, 4.0)
        ckpt = resume
        while step < until:
            x, loss = step_state(x, loss, step, seed)
            step += 1
            self.steps_taken += 1
            crash_at = self.fail_train.get((ctx.activity_id, ctx.attempt))
            if crash_at is not None and step == crash_at:
                raise RuntimeError(f"CUDA out of memory at step {step} (fake)")
            if self.on_step is not None:
                self.on_step(self, ctx.activity_id, ctx.attempt, step)
            if step % every == 0 or step == until or ctx.cancel_requested:
                ckpt = self.save(name, step, x, loss)
                ctx.heartbeat({"step": step, "loss_hex": loss.hex(), "checkpoint": ckpt, "time": self.now()})
                self.event(f"ckpt {ctx.activity_id}#{ctx.attempt}@{step}")
                if ctx.cancel_requested and step < until:
                    raise Canceled(f"train canceled at step {step} after checkpoint {ckpt}")
        if ckpt is None or not ckpt.endswith(f"{until:06d}"):  # nothing to train: report the checkpoint
            ckpt = self.save(name, step, x, loss)
        self.event(f"done {ctx.activity_id}#{ctx.attempt}")
        return TrainActivityResult(
            name=name,
            steps=step,
            checkpoint=ckpt,
            final_loss=loss,
            final_loss_hex=loss.hex(),
            digest=f"{x:016x}",
            resumed_from=resume,
        ).model_dump(mode="json")

    def eval(self, ctx: Any, input: Any) -> dict:
        spec = EvalActivityInput.model_validate(input).spec
        self.calls.append(Call("eval", ctx.activity_id, ctx.attempt, spec))
        self.event(f"start {ctx.activity_id}#{ctx.attempt}")
        if spec["suite"] in self.fail_eval:
            raise NonRetryableError(f"suite {spec['suite']} failed (fake)", type="EvalFailed")
        run = f"{spec['name']}-{spec['tag']}" if spec.get("tag") else spec["name"]
        metrics = {s["id"]: {"fake/score": float(len(s["model"]) + len(spec["suite"]))} for s in spec["subjects"]}
        self.event(f"done {ctx.activity_id}#{ctx.attempt}")
        return SuiteOutputs(
            suite=spec["suite"],
            run=run,
            results=f"evals/{spec['suite']}/{run}/results.jsonl",
            summary_path=f"evals/{spec['suite']}/{run}/summary.json",
            summary={"metrics": metrics},
        ).model_dump(mode="json")

    def corpus(self, ctx: Any, input: Any) -> dict:
        spec = CorpusBuildInput.model_validate(input).spec
        self.calls.append(Call("corpus", ctx.activity_id, ctx.attempt, spec))
        self.event(f"start {ctx.activity_id}#{ctx.attempt}")
        if self.fail_corpus:
            raise NonRetryableError("source file not found (fake)", type="BadInput")
        path = self.home / "corpora" / spec["name"]
        path.mkdir(parents=True, exist_ok=True)
        (path / "meta.json").write_text("{}")
        self.event(f"done {ctx.activity_id}#{ctx.attempt}")
        return CorpusBuildResult(
            name=spec["name"], path=f"corpora/{spec['name']}", tokens=1000, heldout_tokens=100, checksum="0" * 64
        ).model_dump(mode="json")

    def activities(self) -> dict[str, Callable[[Any, Any], Any]]:
        return {"train": self.train, "eval": self.eval, "corpus": self.corpus}

    def ids(self, name: str | None = None) -> list[str]:
        """Activity ids in the order their attempts started."""
        return [c.activity_id for c in self.calls if name is None or c.name == name]
