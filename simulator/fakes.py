"""Fake train, eval and corpus activities for the simulator: cheap, deterministic, real files.

They take and return the same shapes as the real activities (``workflows/models.py``:
``TrainActivityInput`` -> ``TrainActivityResult``, ``EvalActivityInput`` -> ``SuiteOutputs``,
``CorpusBuildInput`` -> ``CorpusBuildResult``) and follow tinyllm's file contract
(``contracts/subprocess-activity.md``): checkpoints under ``runs/<name>/ckpt/step-NNNNNN/``
written to a temporary name then renamed, ``LATEST`` replaced atomically, one heartbeat per
checkpoint whose details are the progress line (``checkpoint`` relative to the home). The fake
trainer resumes from the checkpoint the real train activity would pass as ``--resume``
(``contracts.resume.resume_argument``: the newer of LATEST and the last heartbeat's), else LATEST,
else fresh, exactly as ``tinyllm train`` does.

The fake trainer's "model" is (step, loss, h): ``loss`` follows a float recurrence seeded by
(seed, step) and the spec's learning-rate schedule, ``h`` a 64-bit hash chain of every step
taken. A skipped, repeated or reordered step, or a segment spec with another schedule, changes
the final ``loss`` bits and the digest. No fsync: crashes are simulated in-process at hook
points, so a write is never torn by a simulated kill.

Every step, checkpoint, heartbeat and evaluation is recorded in the simulator's ``Ledger``.
``plan.point(kind, label)`` is called at each position where the simulator may kill the
worker; a run of training steps with no kill among them is taken in bulk (``plan.free(n)``),
numbered as if each step had been its own position.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.layout import LATEST, RunHome, checkpoint_ref, ckpt_ref, step_dir_name
from contracts.resume import resume_argument
from engine import Canceled, NonRetryableError, Preempted

from .ledger import Ledger
from .release import COMPLETE, checkpoint_digest, reused_outputs


class FilesOverlay:
    """A recovery's file digests (``FakeActivities.files``): those of the run whose files it copied
    (``base``, read, never written: a forked recovery touches no more of it than it reads), then its own."""

    def __init__(self, base: dict[str, int], base_sum: int):
        self.base, self.base_sum = base, base_sum
        self.own: dict[str, int] = {}
        self._added = 0  # own paths not in base

    def get(self, rel: str, default: Any = None) -> Any:
        v = self.own.get(rel)
        return v if v is not None else self.base.get(rel, default)

    def __setitem__(self, rel: str, value: int) -> None:
        if rel not in self.own and rel not in self.base:
            self._added += 1
        self.own[rel] = value

    def __len__(self) -> int:
        return len(self.base) + self._added

    def __iter__(self):
        yield from self.base
        yield from (k for k in self.own if k not in self.base)

    def values(self):
        return [self.get(k) for k in self]

    def items(self):
        return [(k, self.get(k)) for k in self]


class NoFaults:
    """A plan with no positions to kill at (the fakes outside the simulator's sweep)."""

    def point(self, kind: str, label: str) -> None:
        pass

    def free(self, n: int) -> int:
        return n


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _noise(seed: int, step: int) -> float:
    """A number in [0, 1) fixed by (seed, step)."""
    return _mix((seed * 1_000_003 + step) & _MASK) / 18446744073709551616.0


_SCHEDULES: dict[tuple, tuple[list[float], list[float]]] = {}


def _schedule_key(spec: dict[str, Any]) -> tuple[int, int | None, int, float, float]:
    """The spec fields the trajectory depends on (never ``steps``, as in tinyllm)."""
    decay = spec.get("lr_decay_steps")
    return (
        int(spec.get("seed", 0)),
        None if decay is None else int(decay),
        int(spec.get("warmup_steps", 10)),
        float(spec.get("lr", 1e-3)),
        float(spec.get("min_lr", 1e-4)),
    )


def _schedule(spec: dict[str, Any], steps: int) -> tuple[list[float], list[float]]:
    """Per-step factors (a_k, b_k) of the recurrence loss_k = loss_{k-1} * a_k + b_k, k = 1..steps.

    They depend on the seed and on the learning rate of each step, computed as tinyllm's
    ``lr_at`` does (linear warmup, then a cosine decay to ``min_lr`` at ``lr_decay_steps``, or
    a constant rate when it is None). Cached: the simulator runs one spec thousands of times.
    """
    key = _schedule_key(spec)
    seed, decay, warmup, lr_max, lr_min = key
    a, b = _SCHEDULES.get(key) or ([1.0], [0.0])
    for k in range(len(a), steps + 1):
        i = k - 1  # tinyllm's 0-based index of the optimizer step
        if i < warmup:
            lr = lr_max * (i + 1) / warmup
        elif decay is None:
            lr = lr_max
        elif i >= decay:
            lr = lr_min
        else:
            ratio = (i - warmup) / max(1, decay - warmup)
            lr = lr_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr_max - lr_min)
        u = _noise(seed, k)
        a.append(1.0 - lr * (0.5 + u))
        b.append(lr * 1.5 * u)
    _SCHEDULES[key] = (a, b)
    return a, b


@dataclass
class FakeState:
    """The fake model: everything the next step depends on (like a real checkpoint).

    ``loss`` is a float recurrence over the steps taken: a skipped, repeated or reordered step
    changes its bits, so the final loss and the digest are a bitwise check of exact resume.
    """

    step: int
    loss: float

    @classmethod
    def fresh(cls, seed: int) -> "FakeState":
        return cls(step=0, loss=5.5 + _noise(seed, 0))

    def digest(self, name: str) -> str:
        return hashlib.sha256(f"{name}:{self.step}:{self.loss.hex()}".encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "loss_hex": self.loss.hex()}

    @staticmethod
    def trajectory(spec: dict[str, Any]) -> list:
        return list(_schedule_key(spec))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FakeState":
        return cls(step=int(d["step"]), loss=float.fromhex(d["loss_hex"]))


_REFERENCE: dict[tuple, list[float]] = {}


def reference_state(spec: dict[str, Any], steps: int) -> FakeState:
    """The fake model after ``steps`` uninterrupted steps of ``spec`` (the simulator's oracle).

    A plain loop over the recurrence, from step 0, with no engine, no files and no resume;
    the losses of every step are cached per spec.
    """
    seed = int(spec.get("seed", 0))
    a, b = _schedule(spec, steps)
    losses = _REFERENCE.setdefault(_schedule_key(spec), [FakeState.fresh(seed).loss])
    for k in range(len(losses), steps + 1):
        losses.append(losses[-1] * a[k] + b[k])
    return FakeState(steps, losses[steps])


def _spec_of(input: Any) -> dict[str, Any]:
    spec = input.get("spec") if isinstance(input, dict) else getattr(input, "spec", None)
    if not isinstance(spec, dict):
        raise NonRetryableError("fake activity: input has no spec object", type="BadInput")
    return spec


def _atomic_write(path: Path, data: str | bytes) -> None:
    """Write to a temporary name, then rename (never in place: recoveries share files by hard links)."""
    tmp = path.with_name(f".{path.name}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def _file_hash(rel: str, data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(rel.encode() + b"\0" + data, digest_size=16).digest(), "big")


class FakeActivities:
    """The three fake activities over one home folder, reporting to one ledger and one plan.

    ``fail_suites``: suites whose evaluation fails for good (non-retryable).
    ``oom_at``: {step: times}: the trainer raises a retryable error at that step, ``times`` times.
    ``fail_corpus``: the corpus build fails for good.
    ``stop_at``: the trainer stops early when it reaches this checkpoint step (tinyllm/selection.py's
    decision, recorded in that checkpoint: a resume from it stops at once); 0: never.
    ``cancel_poll_steps``: the trainer asks ``ctx.cancel_requested`` (a database read) after each
    checkpoint and every this many steps, as the real runner polls for a cancel before it sends
    SIGTERM; a cancel that comes after the last poll of the last segment loses the race: the
    run completes. A polite stop of the worker (``ctx.stop_request``, engine/_stop.py; the real runner
    then SIGTERMs the trainer) is seen at the next step boundary: the trainer checkpoints the step it is
    at and the attempt ends ``Preempted``, as ``run_subprocess`` raises it for a trainer that exited 130
    on the stop; an evaluation stopped in the middle ends ``Preempted`` with nothing written (its next
    attempt evaluates from the start).
    """

    CANCEL_POLL_STEPS = 50

    def __init__(
        self,
        home: str | Path,
        ledger: Ledger,
        plan: Any = None,
        *,
        fail_suites: tuple[str, ...] = (),
        oom_at: dict[int, int] | None = None,
        fail_corpus: bool = False,
        cancel_poll_steps: int = 50,
        files: dict[str, int] | FilesOverlay | None = None,
        stop_at: int = 0,
    ):
        self.home = Path(home)
        self.ledger = ledger
        self.plan = plan if plan is not None else NoFaults()
        self.hook = self.plan.point
        self.fail_suites = set(fail_suites)
        self.oom_left = dict(oom_at or {})
        self.fail_corpus = fail_corpus
        self.cancel_poll_steps = max(1, cancel_poll_steps)
        self.stop_at = int(stop_at)
        self.writes = 0  # file writes so far (checkpoints, eval outputs, corpora): part of a state's identity
        # every file written under home (relative path -> hash of path and bytes), and their sum: an
        # order-independent digest of the files (simulator/convergence.py); a recovery inherits the
        # dict of the run whose files it copied
        self.files: dict[str, int] | FilesOverlay
        if isinstance(files, FilesOverlay):
            self.files, self._files_sum = files, files.base_sum
        else:
            self.files = dict(files or {})
            self._files_sum = sum(self.files.values())
        self.log: list[str] = []  # the relative path of every file written, in order (snapshot_home.SnapshotHome)

    def _wrote(self, rel: str, data: bytes) -> None:
        self.log.append(rel)
        new = _file_hash(rel, data)
        self._files_sum += new - self.files.get(rel, 0)
        self.files[rel] = new

    def files_digest(self) -> tuple[int, int]:
        return len(self.files), self._files_sum % (1 << 128)

    # --- train ------------------------------------------------------------------------------

    def _load(self, rel: str, trajectory: list | None = None) -> FakeState:
        """A checkpoint's state; like tinyllm, refuse one of another trajectory (exit 2)."""
        with open(os.path.join(self.home, rel, "state.json")) as f:
            d = json.load(f)
        if trajectory is not None and d.get("trajectory") != trajectory:
            raise NonRetryableError(
                f"checkpoint {rel} was trained with another spec ({d.get('trajectory')} != {trajectory})",
                type="BadInput",
            )
        return FakeState.from_json(d)

    def _checkpoint(self, name: str, state: FakeState, trajectory: list) -> str:
        """``runs/<name>/ckpt/step-NNNNNN/state.json`` via a temporary directory, then LATEST."""
        self.writes += 1
        run = RunHome(self.home).run(name)
        rel_dir = str(run.ckpt_root.relative_to(self.home))
        ckpt_dir = str(run.ckpt_root)
        os.makedirs(ckpt_dir, exist_ok=True)
        base = step_dir_name(state.step)
        final, tmp = os.path.join(ckpt_dir, base), os.path.join(ckpt_dir, f".tmp-{base}")
        os.makedirs(tmp, exist_ok=True)
        text = json.dumps({**state.to_json(), "trajectory": trajectory}, sort_keys=True)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            f.write(text)
        self._wrote(f"{rel_dir}/{base}/state.json", text.encode())
        if os.path.exists(final):  # a step redone after a kill: same bits, replace the old copy
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = os.path.join(ckpt_dir, ".LATEST.tmp")
        with open(latest_tmp, "w") as f:
            f.write(base)
        os.replace(latest_tmp, run.latest)
        self._wrote(f"{rel_dir}/{LATEST}", base.encode())
        return f"{rel_dir}/{base}"

    def train(self, ctx: Any, input: Any) -> dict[str, Any]:
        """The fake ``tinyllm train --spec S --progress P [--resume CKPT]``."""
        spec = _spec_of(input)
        name, steps = str(spec["name"]), int(spec["steps"])
        every = int(spec.get("checkpoint_every", 100))
        seed = int(spec.get("seed", 0))
        wf, aid = ctx.workflow_id, ctx.activity_id
        # the real activity's choice of --resume (workflows.activities), then tinyllm's own rule
        resume = resume_argument(self.home, name, steps, ctx.attempt, ctx.last_heartbeat_details)
        latest = RunHome(self.home).run(name).latest
        if resume is None and latest.exists():
            resume = ckpt_ref(name, latest.read_text().strip())
        self._trajectory = FakeState.trajectory(spec)
        state = self._load(resume, self._trajectory) if resume else FakeState.fresh(seed)
        if state.step > steps:  # as tinyllm: a spec below its checkpoint is bad input (exit 2)
            raise NonRetryableError(
                f"spec steps {steps} is below checkpoint {resume}'s step {state.step}", type="BadInput"
            )
        record, hook, poll = self.ledger.record, self.hook, self.cancel_poll_steps
        record("train-start", wf=wf, run=name, activity=aid, attempt=ctx.attempt, from_step=state.step)
        a, b = _schedule(spec, steps)
        checkpoint, k, loss = resume, state.step, state.loss
        start, free, oom = k, self.plan.free, self.oom_left
        saved = k if resume else None  # the step of the newest checkpoint on disk
        stops = 0 < self.stop_at <= steps
        while k < steps and not (stops and k == self.stop_at):
            stop = getattr(ctx, "stop_request", None)
            if stop is not None:  # SIGTERM from the runner: the step in flight is done; checkpoint it, exit 130
                if saved != k and k > 0:
                    checkpoint = self._checkpoint_and_heartbeat(ctx, name, FakeState(k, loss))
                record("train-preempted", wf=wf, run=name, activity=aid, step=k)
                raise Preempted(
                    f"{aid} stopped by {stop.signal} at step {k}",
                    signal=stop.signal,
                    checkpoint=checkpoint,
                    step=k if checkpoint else None,
                    stopping_step=k,
                    last_step=k,
                )
            if ((k - start) % poll == 0 or saved == k) and ctx.cancel_requested:
                # the runner saw the cancel and sent SIGTERM: checkpoint, exit 130
                if saved != k:
                    checkpoint = self._checkpoint_and_heartbeat(ctx, name, FakeState(k, loss))
                record("train-canceled", wf=wf, run=name, activity=aid, step=k)
                raise Canceled(f"{aid} stopped by cancel at step {k}")
            # the steps up to the next cancel poll, checkpoint or end: one position each
            stop = min(steps, (k // every + 1) * every, k + poll - (k - start) % poll)
            n = 0 if oom and any(oom.get(s, 0) > 0 for s in range(k + 1, stop + 1)) else free(stop - k)
            if n:  # no kill among these positions: take them in bulk
                first, last = k + 1, k + n
                for k in range(first, last + 1):
                    loss = loss * a[k] + b[k]
                record("steps", wf=wf, run=name, activity=aid, first=first, last=k)
            else:  # one position, one step
                hook("step", f"{aid}:{k + 1}")
                if oom.get(k + 1, 0) > 0:
                    oom[k + 1] -= 1
                    record("oom", wf=wf, run=name, activity=aid, step=k + 1)
                    raise RuntimeError(f"simulated out of memory at step {k + 1}")
                k += 1
                loss = loss * a[k] + b[k]
                record("steps", wf=wf, run=name, activity=aid, first=k, last=k)
            if k % every == 0 or k == steps:
                checkpoint = self._checkpoint_and_heartbeat(ctx, name, FakeState(k, loss))
                saved = k
        state = FakeState(k, loss)
        if checkpoint is None:  # nothing to train and nothing to resume: checkpoint step 0
            checkpoint = self._checkpoint_and_heartbeat(ctx, name, state)
        stopped = None
        if stops and k == self.stop_at:  # decided at this checkpoint (or read back from it on a resume)
            record("train-stopped-early", wf=wf, run=name, activity=aid, step=k)
            best = max(every, k - 2 * every)
            stopped = {
                "step": k,
                "metric": "val/loss",
                "mode": "min",
                "patience": 2,
                "best_step": best,
                "best_checkpoint": checkpoint_ref(name, best),
            }
        return {
            "name": name,
            "steps": state.step,
            "checkpoint": checkpoint,
            "final_loss": state.loss,
            "final_loss_hex": state.loss.hex(),
            "digest": state.digest(name),
            "resumed_from": resume,
            "canceled": False,
            **({"stopped_early": stopped} if stopped else {}),
        }

    def _checkpoint_and_heartbeat(self, ctx: Any, name: str, state: FakeState) -> str:
        rel = self._checkpoint(name, state, self._trajectory)
        wf, aid = ctx.workflow_id, ctx.activity_id
        self.ledger.record("ckpt", wf=wf, run=name, activity=aid, step=state.step)
        self.hook("ckpt", f"{aid}:{state.step}")
        line = {"step": state.step, "loss": state.loss, "loss_hex": state.loss.hex(), "checkpoint": rel}
        ctx.heartbeat(line)
        self.ledger.record("hb", wf=wf, run=name, activity=aid, step=state.step)
        return rel

    # --- eval ------------------------------------------------------------------------------

    def eval(self, ctx: Any, input: Any) -> dict[str, Any]:
        """The fake ``tinyllm eval --spec S``: one suite over its subjects.

        A spec with ``suites`` (a list) instead of ``suite`` runs them all in this one
        activity; only the pitfall-8 mutant sends that.
        """
        spec = _spec_of(input)
        if "suites" in spec:
            return {"suites": [self._one_suite(ctx, spec, s) for s in spec["suites"]]}
        return self._one_suite(ctx, spec, str(spec["suite"]))

    def _one_suite(self, ctx: Any, spec: dict[str, Any], suite: str) -> dict[str, Any]:
        name, tag, seed = str(spec["name"]), spec.get("tag") or None, int(spec.get("seed", 0))
        run = f"{name}-{tag}" if tag else name
        aid = ctx.activity_id
        evaluated = []
        for subject in spec["subjects"]:
            state = self._load(subject["model"])
            evaluated.append((subject, state))
        steps = [s.step for _, s in evaluated]
        release = {}  # a release's evaluation (simulator/release.py): keyed by the model's digest, reused
        if ctx.workflow_id.startswith("release/"):
            release = {"digest": checkpoint_digest(self.home, spec["subjects"][0]["model"])}
            earlier = reused_outputs(self.home, suite, run, spec)
            if earlier is not None:  # as tinyllm eval: complete outputs of the same spec are the result
                self.ledger.record("eval-reused", wf=ctx.workflow_id, run=run, suite=suite, activity=aid, **release)
                self.hook("eval-reused", f"{aid}:{suite}")
                return earlier
        self.ledger.record(
            "eval-start",
            wf=ctx.workflow_id,
            run=run,
            suite=suite,
            activity=aid,
            attempt=ctx.attempt,
            steps=steps,
            **release,
        )
        self.hook("eval", f"{aid}:{suite}")
        stop = getattr(ctx, "stop_request", None)
        if stop is not None:  # SIGTERM in the middle of the evaluation: it exits 130, nothing written
            self.ledger.record("eval-preempted", wf=ctx.workflow_id, run=run, suite=suite, activity=aid)
            raise Preempted(f"{aid} stopped by {stop.signal} during suite {suite}", signal=stop.signal)
        if suite in self.fail_suites:
            self.ledger.record("eval-failed", wf=ctx.workflow_id, run=run, suite=suite, activity=aid)
            raise NonRetryableError(f"simulated failure of suite {suite}", type="EvalFailed")
        results = []
        for subject, state in evaluated:
            u = _noise(seed, state.step)
            value = math.exp(state.loss) if suite == "ppl" else 1.0 / (1.0 + state.loss + u)
            metric = "ppl" if suite == "ppl" else "acc"
            results.append(
                {
                    "suite": suite,
                    "run": run,
                    "subject": subject["id"],
                    "model": subject["model"],
                    "step": state.step,
                    "task": "heldout" if suite == "ppl" else "fake",
                    "metric": metric,
                    "value": value,
                    "value_hex": value.hex(),
                    "n": 1,
                }
            )
        out_dir = RunHome(self.home).eval_dir(suite, run)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.writes += 1
        rel = f"evals/{suite}/{run}"
        lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in results)
        _atomic_write(out_dir / "results.jsonl", lines)
        self._wrote(f"{rel}/results.jsonl", lines.encode())
        summary = {
            "suite": suite,
            "run": run,
            "name": name,
            "tag": tag,
            "seed": seed,
            "results": results,
            "metrics": {r["subject"]: {f"{r['task']}/{r['metric']}": r["value"]} for r in results},
        }
        text = json.dumps(summary, sort_keys=True)
        _atomic_write(out_dir / "summary.json", text)
        self._wrote(f"{rel}/summary.json", text.encode())
        if release:
            marker = json.dumps(spec, sort_keys=True)
            _atomic_write(out_dir / COMPLETE, marker)
            self._wrote(f"{rel}/{COMPLETE}", marker.encode())
        self.ledger.record("eval-done", wf=ctx.workflow_id, run=run, suite=suite, activity=aid, steps=steps, **release)
        self.hook("eval-done", f"{aid}:{suite}")
        return {
            "suite": suite,
            "run": run,
            "results": f"{rel}/results.jsonl",
            "summary_path": f"{rel}/summary.json",
            "summary": summary,
        }

    # --- corpus ----------------------------------------------------------------------------

    def corpus(self, ctx: Any, input: Any) -> dict[str, Any]:
        """The fake ``tinyllm corpus --spec S``: idempotent, tiny files."""
        spec = _spec_of(input)
        name = str(spec.get("name", "default"))
        self.hook("corpus", f"{ctx.activity_id}")
        self.ledger.record("corpus", wf=ctx.workflow_id, name=name, activity=ctx.activity_id, attempt=ctx.attempt)
        if self.fail_corpus:
            raise NonRetryableError(f"simulated failure of corpus {name}", type="CorpusFailed")
        out = RunHome(self.home).corpus(name)
        out.mkdir(parents=True, exist_ok=True)
        tokens = bytes(range(256)) * 4
        checksum = hashlib.sha256(tokens).hexdigest()
        rel = f"corpora/{name}"
        meta = json.dumps({"name": name, "checksum": checksum})
        for file, data in (("tokens.bin", tokens), ("heldout.bin", tokens[:128]), ("meta.json", meta.encode())):
            _atomic_write(out / file, data)
            self._wrote(f"{rel}/{file}", data)
        self.writes += 1
        return {
            "name": name,
            "path": str(out.relative_to(self.home)),
            "tokens": len(tokens),
            "heldout_tokens": 128,
            "checksum": checksum,
        }
