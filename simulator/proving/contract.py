"""The trainer contract's rules as ``ctl verify-resume`` checks them on every run it starts.

A trainer that breaks a rule of contracts/subprocess-activity.md ("Rules") is never EXACT: the
comparison stops with ``ContractBroken``, one line ``trainer broke the contract (<rule>): <what>``
in the words ``ctl train``'s activity uses (workflows/trainer_command.py), and exit 4. Checked here:

- ``exit codes``: exit 0 only when the spec's ``steps`` are done (LATEST and the result at ``steps``), or at
  an early stop (the result's ``stopped_early`` at its ``steps``, LATEST there);
- ``result line``: after exit 0 the last stdout line is the result object, its fields as the activity
  checks them (``check_train_result``): a missing, malformed or not-last result line is named;
- ``SIGTERM``: a SIGTERM is answered by a checkpoint at or after the step in flight, the result line
  with ``"canceled": true`` and exit 130; and (checked in verify.py once the next attempt resumed) it
  loses no step: every step done when it came (its ``stopping`` line, else its per-step records) is in
  the checkpoint the next attempt resumes from;
- ``liveness``: no run is silent (no new progress line) for longer than the heartbeat timeout, start-up
  included; ``progress lines``: every line is JSON, with an integer ``step`` unless it is a liveness line.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine import NonRetryableError
from workflows.trainer_command import check_progress, check_train_result

from contracts.exits import EXIT_CANCELED

from .core import RESULT_KEYS, ProofError  # an object with RESULT_KEYS is a result line wherever it sits


class ContractBroken(ProofError):
    """The trainer broke a rule of the contract: no verdict on exactness (``ctl verify-resume`` exits 4)."""

    def __init__(self, rule: str, what: str):
        super().__init__(f"trainer broke the contract ({rule}): {what}")
        self.rule = rule


def _stdout_lines(path: Path) -> list[str]:
    try:
        return [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def _json_object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def result_line(stdout: Path, *, rc: int) -> dict:
    """The result object, the last stdout line; ``ContractBroken`` (result line) when it is missing,
    not a JSON object, or printed before other output."""
    lines = _stdout_lines(stdout)
    if not lines:
        raise ContractBroken(
            "result line",
            f"it exited {rc} with nothing on stdout: print the result JSON object as the last stdout line",
        )
    last = _json_object(lines[-1])
    if last is not None:
        return last
    for number, line in enumerate(lines[:-1], 1):
        earlier = _json_object(line)
        if earlier is not None and all(k in earlier for k in RESULT_KEYS):
            raise ContractBroken(
                "result line",
                f"the result line is line {number} of {len(lines)} on stdout, not "
                f"the last; after it came {lines[-1][:60]!r}: print nothing to stdout "
                "after the result line",
            )
    raise ContractBroken(
        "result line", f"it exited {rc}, but its last stdout line is not a JSON object: {lines[-1][:60]!r}"
    )


def check_done(stdout: Path, progress: Path, *, home: Path, name: str, steps: int, latest: int) -> dict:
    """The rules on a run that exited 0: trained to ``steps``, a valid result line last, valid progress lines."""
    result = result_line(stdout, rc=0)
    _activity_checks(progress, result, home=home, name=name)
    done = result.get("steps")
    if stopped_at(result) is not None and latest == done:
        return result  # an early stop: exit 0 before steps, as TrainRun accepts it (workflows/training.py)
    if latest < steps or done != steps:
        raise ContractBroken(
            "exit codes",
            f"it exited 0 at step {done if isinstance(done, int) else latest} of "
            f"{steps}: exit 0 means the spec's steps are done (under ctl train it "
            "would pass for a finished segment)",
        )
    return result


def stopped_at(result: dict) -> int | None:
    """The step an early stop ended the run at: the result's ``stopped_early`` at its ``steps`` (TrainRun's rule,
    workflows/training.py ``stopped_early``), else None; ``ContractBroken`` for a ``stopped_early`` elsewhere."""
    stop = result.get("stopped_early")
    if stop is None:
        return None
    if not isinstance(stop, dict) or stop.get("step") != result.get("steps") or not isinstance(stop.get("step"), int):
        raise ContractBroken(
            "result line",
            f"stopped_early {str(stop)[:80]!r} is not an object whose step is the "
            f"result's steps {result.get('steps')!r}",
        )
    return stop["step"]


def check_sigterm(stdout: Path, *, rc: int, signaled_step: int | None, latest: int, steps: int) -> None:
    """SIGTERM, answered: a checkpoint at or after the step it arrived in, ``canceled``, exit 130. An exit 0
    that finished every step, or stopped early, before the signal is no break (the race of a signal at the
    very end)."""
    if rc == 0 and latest >= steps:
        return
    if rc == 0:
        try:
            if stopped_at(result_line(stdout, rc=rc)) == latest:
                return  # an early stop before the signal (check_done checks the rest)
        except ContractBroken:
            pass  # named below, as an exit 0 that did not answer the SIGTERM
    at = f" at step {signaled_step}" if signaled_step is not None else ""
    if rc != EXIT_CANCELED:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
        raise ContractBroken(
            "SIGTERM",
            f"SIGTERM{at} was answered with {how}, not a checkpoint and exit 130 (finish "
            'the step, checkpoint, print the result line with "canceled": true)',
        )
    if signaled_step is not None and latest < signaled_step:
        raise ContractBroken(
            "SIGTERM",
            f"it exited 130 after SIGTERM{at}, but LATEST is at step {latest} (a graceful "
            f"stop lost {signaled_step - latest} step(s)): write a checkpoint (and LATEST) "
            "of the step in flight before exiting",
        )
    result = result_line(stdout, rc=rc)
    if result.get("canceled") is not True:
        raise ContractBroken(
            "SIGTERM",
            f"it exited 130 after SIGTERM{at}, but its result line has canceled {result.get('canceled')!r}, not true",
        )


def silent(since_s: float, heartbeat_s: float, step: int | None) -> ContractBroken:
    where = f"after step {step}" if step is not None else "at start-up (no step yet)"
    return ContractBroken(
        "liveness",
        f"no progress line for {since_s:.1f} s {where}, past the heartbeat timeout "
        f"{heartbeat_s:g} s: write a progress line at least every few seconds, "
        "start-up included (ctl train would stop it and start it again)",
    )


def _activity_checks(progress: Path, result: dict, *, home: Path, name: str) -> None:
    """The activity's own checks (the same words ``ctl train`` fails with)."""
    try:
        check_progress(progress, home=home)
        check_train_result(result, home=home, name=name)
    except NonRetryableError as e:
        rule = (e.details or {}).get("rule", "result line") if isinstance(e.details, dict) else "result line"
        raise ContractBroken(rule, str(e).split("): ", 1)[-1]) from None
