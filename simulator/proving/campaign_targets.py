"""What a fault campaign trains: tinyllm (the default) or a user's own trainer (a spec naming one).

``python -m simulator campaign --trainer tinyllm`` trains the campaign's tiny tinyllm spec;
``--trainer examples`` trains examples/durable_train.py (a plain PyTorch loop on
``tinyllm.durable.DurableRun``), its checkpoints evaluated by examples/eval_spirals.py (suite
``acc``); ``--spec FILE`` trains any spec that names its own trainer. The campaign drives each the
same way and holds each to the same oracle; only the spec, ``ctl train``'s arguments, how a trainer
process is recognised and the fault kinds differ. A user trainer built on ``DurableRun`` also gets
``kill-in-checkpoint-write``: once the run has a checkpoint, the campaign arms a file
(``TINYLLM_FAULT=durable.checkpoint_write@armed:FILE``, set in the spec's trainer env) and the next checkpoint
write of any of its trainers SIGKILLs itself after some of the checkpoint's files are written, before
its manifest. A trainer that does not use
the helper never claims the file: the fault reads ``missed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyllm.trainer_spec import SpecError, parse_run_spec, trainer_of

NAME = "camp"
ROOT = Path(__file__).resolve().parents[2]  # the project (simulator/proving/ is two below it); examples/ lives here
ARMED = "campaign-fault-armed"  # relative to a run's home: its presence arms a kill inside a checkpoint write
FAULT_ENV = {"TINYLLM_FAULT": f"durable.checkpoint_write@armed:{ARMED}"}  # tinyllm/faults.py

TINYLLM_SPEC = {  # two segments of a tiny model; a checkpoint every 2 steps; a durable 1 s wait between segments
    "name": NAME,
    "steps": 20,
    "seed": 11,
    "eval_every": 10,
    "eval_interval_seconds": 1,
    "checkpoint_every": 2,
    "batch_size": 2,
    "lr": 0.003,
    "warmup_steps": 2,
    "lr_decay_steps": 20,
    "threads": 1,
    "log_every": 10,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16, "dropout": 0.0},
}
BASE_FAULTS = ("readers", "cancel", "kill-ctl", "kill-trainer", "stop-trainer", "second-train")
PREEMPT_FAULTS = ("preempt", "preempt-group")  # graceful preemption (simulator/proving/campaign_preempt.py)
FAULTS = (*BASE_FAULTS, *PREEMPT_FAULTS)  # tinyllm's campaign draws them all
# a user's trainer: the preemptions only with --kinds (so that the seeds of the framework campaigns, whose
# tests name what each draws, keep their plans); e.g. --kinds kill-trainer,preempt,preempt-group
USER_FAULTS = (*BASE_FAULTS, "kill-in-checkpoint-write")
EXAMPLE_STEP_SLEEP_S = 0.1  # the example trains in milliseconds: a stand-in for a bigger model, so faults land


class TargetError(ValueError):
    """A --spec the campaign cannot train (one line for the command's exit 2)."""


@dataclass(frozen=True)
class Target:
    """One kind of trainer for the campaign."""

    label: str  # in the campaign's lines
    spec: dict[str, Any]
    train_args: tuple[str, ...]
    faults: tuple[str, ...]
    custom: bool  # a spec's own trainer (its processes are whatever is not ctl)
    cli: str = ""  # the campaign's options that choose it (to rerun a failure)

    def is_trainer(self, cmd: str) -> bool:
        """Is this process (its command line, naming the run's home) a trainer or evaluator child?"""
        if "ctl.cli" in cmd:
            return False
        return self.custom or "tinyllm" in cmd


TINYLLM = Target("tinyllm", TINYLLM_SPEC, ("--eval-max-items", "2", "--json"), FAULTS, custom=False)


def user_target(spec: dict[str, Any], *, label: str, base_dir: Path, cli: str, suite: str = "acc") -> Target:
    """A campaign over ``spec``'s own trainer: renamed ``camp``, its cwd made absolute (relative to
    ``base_dir``), the armed checkpoint-write fault added to its env; evaluated when it has an eval_command."""
    trainer = trainer_of(spec)
    if trainer is None or not trainer.get("command"):
        raise TargetError(f'{label}: the spec names no trainer command ("trainer": {{"command": [...]}})')
    try:
        parse_run_spec(spec)  # what ctl train would refuse, refused before anything starts
    except SpecError as e:
        raise TargetError(f"{label}: {e}") from None
    cwd = Path(trainer.get("cwd") or base_dir)
    cwd = cwd if cwd.is_absolute() else base_dir / cwd
    if not cwd.is_dir():
        raise TargetError(f"{label}: the trainer's cwd {cwd} is not a directory")
    env = {**dict(trainer.get("env") or {}), **FAULT_ENV}
    spec = {**spec, "name": NAME, "trainer": {**trainer, "cwd": str(cwd), "env": env}}
    args = ("--suite", suite) if trainer.get("eval_command") and spec.get("eval_every") else ()
    return Target(label, spec, (*args, "--json"), USER_FAULTS, custom=True, cli=cli)


def examples_target() -> Target:
    """examples/specs/durable.json (two segments of 20 steps, each evaluated), slowed to be hit."""
    spec = json.loads((ROOT / "examples" / "specs" / "durable.json").read_text())
    spec["config"] = {**spec.get("config", {}), "step_sleep_s": EXAMPLE_STEP_SLEEP_S}
    spec.setdefault("eval_interval_seconds", 1)
    return user_target(spec, label="examples/durable_train.py", base_dir=ROOT, cli=" --trainer examples")


def spec_target(path: str, suite: str = "acc") -> Target:
    """``--spec FILE``: a spec naming its own trainer (its relative cwd is taken from where the campaign runs)."""
    p = Path(path)
    try:
        spec = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TargetError(f"spec file not found: {path}") from None
    except (OSError, ValueError) as e:
        raise TargetError(f"spec file {path} is not readable JSON: {e}") from None
    if not isinstance(spec, dict):
        raise TargetError(f"spec file {path}: expected a JSON object")
    return user_target(spec, label=str(path), base_dir=Path.cwd(), cli=f" --spec {path} --suite {suite}", suite=suite)


def choose(trainer: str, spec: str | None, suite: str = "acc") -> Target:
    """The command line's ``--trainer`` / ``--spec`` / ``--suite``."""
    if spec is not None:
        return spec_target(spec, suite)
    if trainer == "examples":
        return examples_target()
    if trainer == "tinyllm":
        return TINYLLM
    raise TargetError(f"unknown trainer {trainer!r} (known: tinyllm, examples)")
