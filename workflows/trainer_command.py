"""A spec's own trainer (``"trainer": {...}``) as an activity's command line, and the contract's checks.

Kept apart from workflows/activities.py: the activities ask ``invocation()`` which command to run
(tinyllm's unless the spec names a trainer) and hand what came back to ``check_train_result`` /
``check_eval_result`` / ``check_progress``, which name the contract rule a trainer broke
(contracts/subprocess-activity.md, "Rules"). A broken rule does not mend itself on a retry, so it
is a ``NonRetryableError(type="ContractViolation")``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from contracts.exits import EXIT_BAD_INPUT, EXIT_CANCELED, EXIT_DISK_FULL, EXIT_LOCKED
from contracts.layout import LATEST, MANIFEST, RunHome
from contracts.progress import int_step, is_liveness
from engine import NonRetryableError
from tinyllm.trainer_spec import trainer_of

PYTHON_WORDS = ("python", "python3")  # as a command's first word: the interpreter running the worker


@dataclass(frozen=True)
class Invocation:
    """What to run: ``argv`` (to which the contract's arguments are appended), where, with what env."""

    argv: list[str]
    cwd: str
    env: dict[str, str] | None
    custom: bool  # a spec's own trainer (not tinyllm)


def contract_violation(rule: str, message: str) -> NonRetryableError:
    return NonRetryableError(
        f"trainer broke the contract ({rule}): {message}", type="ContractViolation", details={"rule": rule}
    )


RUN_STEPS_ENV = "CTL_RUN_STEPS"  # the run's full length, the same in every segment (the contract's "segments" rule)


def invocation(
    spec: Mapping[str, Any],
    kind: str,
    *,
    home: Path,
    python: str,
    env: dict[str, str] | None,
    default: list[str],
    run_steps: int | None = None,
) -> Invocation:
    """The command of ``kind`` (``train`` or ``eval``) for ``spec``: its trainer's, else ``default``. A spec's
    own trainer gets ``CTL_RUN_STEPS`` = ``run_steps`` (default: the spec's ``steps``): the run's last step,
    which a segment's spec (``steps`` = the segment's end) does not say."""
    trainer = trainer_of(spec)
    if trainer is None:
        return Invocation(list(default), str(home), env, custom=False)
    words = trainer.get("command") if kind == "train" else trainer.get("eval_command")
    if not words:
        raise NonRetryableError(
            f"the spec's trainer has no {'command' if kind == 'train' else 'eval_command'}", type="BadInput"
        )
    argv = [python if words[0] in PYTHON_WORDS else words[0], *words[1:]]
    cwd = Path(trainer.get("cwd") or home)
    if not cwd.is_absolute():
        cwd = home / cwd
    if not cwd.is_dir():
        raise NonRetryableError(f"the trainer's cwd {cwd} is not a directory", type="BadInput")
    merged = {**(env if env is not None else os.environ), **dict(trainer.get("env") or {})}
    length = run_steps if run_steps is not None else spec.get("steps")
    if kind == "train" and isinstance(length, int):
        merged[RUN_STEPS_ENV] = str(length)
    return Invocation(argv, str(cwd), merged, custom=True)


def rejected_arguments(
    attempt: int, returncode: int, progress: Path, args: list[str], stderr_tail: str
) -> NonRetryableError | None:
    """A spec's own trainer that, on its first attempt, exits non-zero (not killed by a signal) before writing
    any progress line has most likely refused the contract's arguments (an own argument parser, nanoGPT's
    configurator.py): retrying cannot mend it, so it is the ``arguments`` rule, named once, not retried."""
    if attempt != 1 or returncode <= 0 or returncode in (EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_LOCKED, EXIT_CANCELED):
        return None
    try:
        if progress.exists() and progress.read_bytes().strip():
            return None
    except OSError:
        return None
    last = next((ln.strip() for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    return contract_violation(
        "arguments",
        f"on its first attempt it exited {returncode} before writing any progress "
        f"line, given {' '.join(args)}: a trainer must accept --spec FILE --home DIR "
        "[--progress FILE] [--resume CKPT] (contracts/subprocess-activity.md)"
        + (f"; its stderr ended: {last[-200:]}" if last else ""),
    )


def _result_object(result: Any) -> dict:
    if not isinstance(result, dict):
        raise contract_violation("result line", "it exited 0, but its last stdout line is not a JSON object")
    return result


def check_train_result(result: Any, *, home: Path, name: str) -> dict:
    """The rules on ``train``'s result line: fields, ``float.hex`` loss, the checkpoint and LATEST."""
    result = _result_object(result)
    for key, kind in (("name", str), ("steps", int), ("checkpoint", str), ("final_loss_hex", str), ("digest", str)):
        if not isinstance(result.get(key), kind) or isinstance(result.get(key), bool):
            raise contract_violation("result line", f"field {key!r} must be a {kind.__name__}, got {result.get(key)!r}")
    loss = result.get("final_loss")
    if not isinstance(loss, (int, float)) or isinstance(loss, bool) or not math.isfinite(loss):
        raise contract_violation("result line", f"field 'final_loss' must be a finite number, got {loss!r}")
    if float(loss).hex() != result["final_loss_hex"]:
        raise contract_violation(
            "result line",
            f"final_loss_hex {result['final_loss_hex']!r} is not float.hex(final_loss) = {float(loss).hex()!r}",
        )
    if result["name"] != name:
        raise contract_violation("result line", f"name {result['name']!r} is not the spec's name {name!r}")
    ckpt = home / result["checkpoint"]
    if not (ckpt / MANIFEST).is_file():
        raise contract_violation(
            "checkpoint layout", f"the result's checkpoint {result['checkpoint']} is not there (no {MANIFEST})"
        )
    run = RunHome(home).run(name)
    ckpt_root = run.ckpt_root.relative_to(home)
    if Path(result["checkpoint"]).parent != ckpt_root:
        raise contract_violation(
            "checkpoint layout", f"the result's checkpoint {result['checkpoint']} is not under {ckpt_root}/"
        )
    latest_ref = run.latest.relative_to(home)
    try:
        latest = run.latest.read_text(encoding="utf-8").strip()
    except OSError:
        raise contract_violation(LATEST, f"{latest_ref} is missing") from None
    if latest != ckpt.name:
        raise contract_violation(LATEST, f"{latest_ref} names {latest!r}, not the final checkpoint {ckpt.name!r}")
    return result


def check_eval_result(result: Any) -> dict:
    result = _result_object(result)
    if not isinstance(result.get("suite"), str):
        raise contract_violation("result line", f"the eval result needs a string 'suite', got {result.get('suite')!r}")
    return result


def check_progress(path: Path, *, home: Path) -> None:
    """Every progress line is a JSON object with an integer ``step`` (a liveness line with an ``event``
    may omit it); a named checkpoint exists."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return
    last_ckpt = None
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            raise contract_violation(
                "progress lines", f"line {number} of {path.name} is not JSON: {raw[:80].decode('utf-8', 'replace')!r}"
            ) from None
        if isinstance(line, dict) and is_liveness(line) and "step" not in line:
            continue  # a liveness line (contracts/progress.py)
        if not isinstance(line, dict):
            raise contract_violation("progress lines", f"line {number} of {path.name} is not a JSON object")
        if ("step" in line or not is_liveness(line)) and int_step(line) is None:
            raise contract_violation(
                "progress lines",
                f"line {number} of {path.name} has no integer 'step' "
                "(only a liveness line with an 'event' may omit it)",
            )
        if line.get("checkpoint"):
            last_ckpt = str(line["checkpoint"])
    if last_ckpt is not None and not (home / last_ckpt).is_dir():
        raise contract_violation(
            "progress lines", f"the last progress line names checkpoint {last_ckpt}, which is not there"
        )
