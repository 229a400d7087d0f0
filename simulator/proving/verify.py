"""``ctl verify-resume``: prove that a trainer resumes exactly, or say what it fails to restore.

The trainer (tinyllm, or the spec's own ``trainer``) runs twice from scratch in scratch homes under
``<home>/.ctl/verify/<name>/``: once uninterrupted (``ref/``), once (``kills/``) with ``kills``
seeded interruptions -- SIGKILL or SIGTERM once the run has passed a seeded step, and, for trainers
built on ``tinyllm.durable``, SIGKILL in the middle of a checkpoint write -- each followed by a
restart that resumes from LATEST, as the contract says. Exact means: equal ``final_loss_hex``,
equal model ``digest`` and equal per-step records (``runs/<name>/metrics.jsonl``: the loss bits,
and where the trainer writes them the learning rates and the batch digest).

When they differ, ``diagnose`` names the first differing step, the resume it follows, and the state
most likely not restored, by comparing the state fingerprint the helper printed right after that
resume with the uninterrupted run's at the same step (``TINYLLM_FAULT=durable.fingerprint`` makes the reference
run record one at every step), then the pattern of what differs at the first step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeGuard

from contracts.exits import EXIT_BAD_INPUT, EXIT_CANCELED
from contracts.layout import RunHome
from engine import ATTEMPT_ENV, attempt_tag, dies_with_parent, kill_attempt, scope_of
from tinyllm.spec import SpecError
from tinyllm.trainer_spec import has_trainer, parse_run_spec
from workflows.trainer_command import invocation
from workflows.training import segments as train_segments

from . import contract
from . import record as verified
from .core import (
    BadInput,
    RunFailed,
    differing,
    last_step,
    latest_step,
    progress_lines,
    resumed_inside,
    signal_group,
    steps_lost as lost_since,
)
from .diagnose import diagnose, first_difference, step_records, tracked_and_kind
from .segments import diagnose_failed_segment, diagnose_segments, run_segments, segment_ends, segment_lines

SIGNALS = ("kill", "term", "both")


@dataclass
class Attempt:
    mode: str  # ref | kill | term | checkpoint-write | final
    target_step: int | None
    resumed_step: int  # the step of LATEST when it started (0: fresh)
    returncode: int
    reached_step: int | None
    resume_state: dict | None = None  # the helper's fingerprint right after its resume
    signaled_step: int | None = None  # the step its metrics showed when the signal was sent
    stopping_step: int | None = None  # its ``stopping`` progress line's step: steps done when it saw the stop
    resume_line_step: int | None = None  # the step its own resume line says it resumed from (0: a fresh start)


@dataclass
class Report:
    name: str
    exact: bool
    kills_planned: int
    kills_landed: int
    final_loss_hex: dict
    digest: dict
    steps_compared: int
    first_differing_step: int | None = None
    diagnosis: str = ""
    suspects: list[str] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)
    workdir: str = ""
    verdict: str = ""  # exact | not_exact | not_proven
    interruptions: list[dict] = field(default_factory=list)
    segments: dict = field(default_factory=dict)  # {"ends": [...], "exact": bool | None (not run)}

    def as_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The human report: the verdict, what was compared, each interruption, the run in segments (or
        that it was not tested), the diagnosis."""
        if self.verdict == "contract_broken":
            if not self.interruptions:
                return [f"{self.name}: CONTRACT BROKEN (nothing compared)", f"  {self.diagnosis}"]
            return [
                f"{self.name}: CONTRACT BROKEN after {self.kills_landed} interruption(s)",
                f"  {self.diagnosis}",
                *interruption_lines(self.interruptions),
            ]
        verdict = {"exact": "EXACT", "not_proven": "NOT PROVEN"}.get(self.verdict, "NOT EXACT")
        out = [
            f"{self.name}: {verdict} after {self.kills_landed} interruption(s) ({self.steps_compared} steps compared)",
            f"  final_loss_hex {self.final_loss_hex.get('uninterrupted')} vs {self.final_loss_hex.get('resumed')}",
            f"  digest         {str(self.digest.get('uninterrupted'))[:16]} vs {str(self.digest.get('resumed'))[:16]}",
        ]
        out += interruption_lines(self.interruptions)
        seg = self.segments
        if seg.get("exact") is not None:
            out.extend(segment_lines(seg, self.final_loss_hex, self.digest))
        elif self.verdict != "not_exact":  # a plan of one segment (--segments 1): EXACT says nothing of segments
            out.append(
                f"  segments (as ctl train runs it): not tested (one segment planned, {seg.get('ends')}; "
                f"--segments N compares a run in N)"
            )
        if self.diagnosis:
            out.append(f"  {self.diagnosis}")
        return out


def interruption_lines(interruptions: list[dict]) -> list[str]:
    """One line per interruption: where it landed, the checkpoint the next attempt resumed from, and the
    steps lost (a graceful stop must lose none; a SIGKILL may lose the steps after its last checkpoint)."""
    out = []
    for n, i in enumerate(interruptions, 1):
        lost = i.get("steps_lost")
        graceful = i["signal"] == "SIGTERM"
        verdict = "" if lost is None or not graceful else (" (graceful: none allowed)" if lost else "")
        out.append(
            f"  interruption {n}: {i['signal']} ({i['mode']}) at step {i['step_killed']}, resumed from "
            f"checkpoint step {i['resumed_from']}, {lost if lost is not None else '?'} step(s) lost{verdict}"
        )
    return out


def steps_lost(prev: Attempt, nxt: Attempt) -> tuple[int | None, int | None, int]:
    """``(steps lost, steps done when the signal came, checkpoint resumed from)`` of one interruption.

    Done: the trainer's ``stopping`` progress line (the steps it had completed when it saw the stop), else
    the step its per-step records reached when it exited (a trainer that trains on after the signal loses
    those steps too, so the larger counts); resumed from: the step of the next attempt's own resume line,
    else of LATEST when it started. None: nothing says how far it got."""
    resumed = nxt.resume_line_step if nxt.resume_line_step is not None else nxt.resumed_step
    lost, done = lost_since((prev.stopping_step, prev.reached_step), resumed)
    return lost, done, resumed


def graceful_loss(interruptions: list[dict]) -> str | None:
    """The contract's promise for a graceful stop: every step done when SIGTERM came is in the checkpoint the
    next attempt resumes from (0 steps lost). The first graceful interruption that lost any, in words."""
    for n, i in enumerate(interruptions, 1):
        if i["signal"] == "SIGTERM" and i.get("steps_lost"):
            return (
                f"a graceful stop lost {i['steps_lost']} step(s): SIGTERM at step {i['steps_done']}, checkpoint at "
                f"step {i['resumed_from']} (interruption {n}; the next attempt resumed from it): on SIGTERM finish "
                "the step in flight, checkpoint that very step (also off the checkpoint_every cadence), resume "
                "from it"
            )
    return None


# --- running the trainer -----------------------------------------------------------------------


class Trainer:
    """Starts the trainer of one spec in a scratch home, as the activity would (the contract's args)."""

    def __init__(self, spec_raw: dict, workdir: Path, *, python: str = sys.executable, run_steps: int | None = None):
        self.spec = spec_raw
        self.run_steps = run_steps  # a segment's run: the run's last step (tinyllm --total-steps, CTL_RUN_STEPS)
        self.name = spec_raw["name"]
        self.workdir = workdir
        self.python = python
        self.spec_path = workdir / "spec.json"
        self.spec_path.write_text(json.dumps(spec_raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        self.custom = has_trainer(spec_raw)

    def argv(self, home: Path, progress: Path) -> tuple[list[str], str, dict]:
        default = [self.python, "-m", "tinyllm.cli", "train"]
        how = invocation(
            self.spec, "train", home=home, python=self.python, env=None, default=default, run_steps=self.run_steps
        )
        argv = [*how.argv, "--spec", str(self.spec_path), "--home", str(home), "--progress", str(progress)]
        if not how.custom and self.run_steps is not None and self.run_steps != self.spec["steps"]:
            argv += ["--total-steps", str(self.run_steps)]  # as the train activity passes it to tinyllm
        return argv, how.cwd, dict(how.env if how.env is not None else os.environ)

    def start(self, home: Path, progress: Path, extra_env: dict[str, str]) -> subprocess.Popen:
        argv, cwd, env = self.argv(home, progress)
        env.update(extra_env)
        log = open(home / f"{progress.stem}.stderr", "wb")
        out = open(home / f"{progress.stem}.stdout", "wb")
        try:
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=log,
                start_new_session=True,
                preexec_fn=dies_with_parent(),
            )  # never an orphan
        except OSError as e:  # no such command, not executable: the spec's trainer.command (bad input)
            raise BadInput(f"cannot start the trainer {argv[0]!r} (in {cwd}): {e.strerror or e}") from None
        finally:
            log.close()
            out.close()


def _result(home: Path, stem: str) -> dict | None:
    try:
        lines = [ln for ln in (home / f"{stem}.stdout").read_text(encoding="utf-8").splitlines() if ln.strip()]
        value = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _stderr_last(home: Path, stem: str) -> str:
    try:
        lines = [
            ln
            for ln in (home / f"{stem}.stderr").read_text(encoding="utf-8", errors="replace").splitlines()
            if ln.strip()
        ]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RunFailed(f"the trainer ran longer than {timeout_s:.0f} s; stopped it") from None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _run_attempt(
    trainer: Trainer,
    home: Path,
    index: int,
    mode: str,
    target: int | None,
    timeout_s: float,
    fingerprint: bool,
    log: Callable[[str], None],
    heartbeat_s: float = 60.0,
) -> Attempt:
    """One run of the trainer; a kill/term attempt signals it once its metrics reach ``target``. Trainers that
    honour ``TINYLLM_FAULT=trainer.hold@S`` (tinyllm, ``tinyllm.durable``) hold at ``target`` until the signal, so it lands at
    exactly that step whatever the machine's speed; others are signalled at the first poll (10 ms) that sees it.
    A run whose progress file stays unchanged past ``heartbeat_s`` breaks the contract's liveness rule."""
    progress = home / f"attempt-{index}.jsonl"
    resumed = latest_step(home, trainer.name)
    armed = ["durable.fingerprint"] if fingerprint else []
    if mode == "checkpoint-write":
        armed.append("durable.checkpoint_write@1")
    if mode in ("kill", "term") and target is not None:
        armed.append(f"trainer.hold@{target}")  # the trainer holds there until the signal
    env = {"TINYLLM_FAULT": ",".join(armed)} if armed else {}  # tinyllm/faults.py
    # every process of this attempt carries the tag, also one that leaves the process group (setsid: torchrun's
    # ranks, a daemonized loader); the sweep below kills them all before the next attempt starts
    tag = attempt_tag(scope_of(home), "verify-resume", home.name, index)
    env[ATTEMPT_ENV] = tag
    proc = trainer.start(home, progress, env)
    metrics = RunHome(home).run(trainer.name).metrics
    deadline = time.monotonic() + timeout_s
    signaled: int | None = None
    size, changed = _size(progress), time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            now = time.monotonic()
            if _size(progress) != size:
                size, changed = _size(progress), now
            elif now - changed > heartbeat_s and signaled is None:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
                raise contract.silent(now - changed, heartbeat_s, last_step(metrics))
            if mode in ("kill", "term") and target is not None and signaled is None:
                step = last_step(metrics)
                if step is not None and step >= target:
                    signaled = step
                    signal_group(proc.pid, signal.SIGKILL if mode == "kill" else signal.SIGTERM)
            time.sleep(0.01 if signaled is None and mode in ("kill", "term") else 0.05)
        rc = _wait(proc, max(1.0, deadline - time.monotonic()))
    finally:
        signal_group(proc.pid, signal.SIGKILL)  # nothing of the attempt outlives it (Ctrl-C of verify-resume too)
        kill_attempt(tag)  # nor a process of it that left the group
    lines = progress_lines(progress)
    resume_state = next((ln.get("state") for ln in lines if ln.get("event") in ("resume", "start")), None)
    stopping = [s for ln in lines if ln.get("event") == "stopping" and _is_int(s := ln.get("step"))]
    said = next(
        (
            0 if ln.get("event") == "start" else ln.get("step")
            for ln in lines
            if ln.get("event") in ("resume", "start") and (ln.get("event") == "start" or _is_int(ln.get("step")))
        ),
        None,
    )
    attempt = Attempt(
        mode,
        target,
        resumed,
        rc,
        last_step(metrics),
        resume_state,
        signaled,
        stopping_step=max(stopping) if stopping else None,
        resume_line_step=said,
    )
    what = {
        "kill": f"SIGKILL after step {target}",
        "term": f"SIGTERM after step {target}",
        "checkpoint-write": "SIGKILL inside its first checkpoint write",
        "segment": f"steps {trainer.spec['steps']}",
    }.get(mode, mode)
    log(
        f"  {'segment' if mode == 'segment' else 'attempt'} {index} ({what}): resumed at step {resumed}, reached step {attempt.reached_step}, exit {rc}"
    )
    return attempt


def _check_attempt(trainer: Trainer, home: Path, index: int, a: Attempt, steps: int) -> None:
    """The contract's rules on one finished attempt (``ContractBroken``), before anything is compared."""
    stem = f"attempt-{index}"
    latest = latest_step(home, trainer.name)
    if a.mode == "term" and a.signaled_step is not None:
        contract.check_sigterm(
            home / f"{stem}.stdout", rc=a.returncode, signaled_step=a.signaled_step, latest=latest, steps=steps
        )
    if a.returncode == 0:
        contract.check_done(
            home / f"{stem}.stdout", home / f"{stem}.jsonl", home=home, name=trainer.name, steps=steps, latest=latest
        )


def plan_kills(
    kills: int, steps: int, seed: int, signal_mode: str, helper: bool, checkpoint_every: int = 1
) -> list[tuple[str, int]]:
    """Seeded (mode, step) interruptions, each a known number of steps after a durable checkpoint: target =
    a checkpoint step c (0 < c < steps) plus 1..checkpoint_every-1, distinct checkpoints, increasing; every
    third a checkpoint-write kill for trainers built on the helper; ``both`` alternates SIGKILL and SIGTERM.
    With checkpoint_every 1 the target is c + 1 (resumed from c or c + 1). Empty when the cadence allows
    none (checkpoint_every >= steps)."""
    rng = random.Random(seed)
    every = max(1, checkpoint_every)
    ckpts = [c for c in range(every, steps, every) if c + 1 <= steps - 1]
    count = min(kills, len(ckpts))
    chosen = sorted(rng.sample(ckpts, count)) if count else []
    plan = []
    for i, c in enumerate(chosen):
        target = min(steps - 1, c + (rng.randint(1, every - 1) if every > 1 else 1))
        mode = {"kill": "kill", "term": "term"}.get(signal_mode) or ("kill" if rng.random() < 0.5 else "term")
        if helper and signal_mode != "term" and i % 3 == 2:
            mode = "checkpoint-write"
        plan.append((mode, target))
    return plan


def _prepare_home(home: Path, user_home: Path, spec: Any, custom: bool, python: str) -> None:
    home.mkdir(parents=True)
    if custom:
        return
    corpus = spec.corpus
    source = RunHome(user_home).corpus(corpus)
    if not source.is_dir():  # tinyllm's built-in text under that name, as ctl train would build it
        corpus_spec = home.parent / "corpus.json"
        corpus_spec.write_text(json.dumps({"name": corpus}), encoding="utf-8")
        done = subprocess.run(
            [python, "-m", "tinyllm.cli", "corpus", "--home", str(user_home), "--spec", str(corpus_spec)],
            capture_output=True,
        )
        if done.returncode != 0:
            raise BadInput(f"cannot build corpus {corpus!r}: {done.stderr.decode(errors='replace').strip()[-300:]}")
    RunHome(home).corpora.mkdir()
    os.symlink(source, RunHome(home).corpus(corpus))


def check_options(kills: int, signal_mode: str) -> None:
    """``BadInput`` for an option out of range (checked before the spec is read)."""
    if kills < 0:
        raise BadInput(f"--kills must be >= 0, got {kills}")
    if signal_mode not in SIGNALS:
        raise BadInput(f"--signal must be one of {', '.join(SIGNALS)}, got {signal_mode!r}")


def verify_resume(
    raw: dict,
    user_home: Path,
    *,
    kills: int = 3,
    seed: int = 0,
    signal_mode: str = "both",
    timeout_s: float = 600.0,
    heartbeat_s: float = 60.0,
    segments: int | None = None,
    python: str = sys.executable,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> Report:
    """Run the comparison (module docstring) on the train spec ``raw`` (as loaded; a spec's own trainer with
    its ``cwd`` absolute, as ``ctl train`` records it); ``BadInput`` for bad input, before anything runs. A
    broken rule of the trainer contract ends it with the verdict ``contract_broken`` (contract.py)."""
    check_options(kills, signal_mode)
    try:
        spec = parse_run_spec(raw)
    except SpecError as e:
        raise BadInput(str(e)) from None
    name = spec.name
    ends = segment_ends(spec.steps, int(raw.get("eval_every") or 0), segments)
    workdir = RunHome(user_home).ctl_dir / "verify" / name
    try:
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        trainer = Trainer(raw, workdir, python=python)
        ref_home, kill_home, seg_home = workdir / "ref", workdir / "kills", workdir / "segments"
        for home in (ref_home, kill_home, seg_home):
            _prepare_home(home, user_home, spec, trainer.custom, python)
    except OSError as e:
        raise BadInput(f"cannot prepare the scratch folder {workdir}: {e.strerror or e}") from None

    try:
        report = _compare(
            trainer,
            spec,
            ref_home,
            kill_home,
            workdir,
            kills=kills,
            seed=seed,
            signal_mode=signal_mode,
            timeout_s=timeout_s,
            heartbeat_s=heartbeat_s,
            log=log,
        )
        if report.verdict not in ("not_exact", "contract_broken") and len(ends) > 1:
            _compare_segments(report, trainer, raw, spec.steps, ref_home, seg_home, ends, timeout_s, heartbeat_s, log)
        else:
            report.segments = {"ends": ends, "exact": None}
            _segments_untested(report, spec.steps, int(raw.get("eval_every") or 0))
    except contract.ContractBroken as e:
        log(f"verify-resume {name}: {e}")
        report = Report(
            name=name,
            verdict="contract_broken",
            exact=False,
            kills_planned=0,
            kills_landed=0,
            final_loss_hex={},
            digest={},
            steps_compared=0,
            diagnosis=str(e),
            suspects=[e.rule],
            workdir=str(workdir),
        )
    # what was exercised (the interruptions that landed), not what was asked: ctl status/show print it
    verified.record(
        user_home,
        raw,
        report.verdict,
        kills=report.kills_landed,
        kills_asked=kills,
        seed=seed,
        segments=report.segments.get("ends"),
    )
    return report


def _segments_untested(report: Report, steps: int, eval_every: int) -> None:
    """No run in segments was compared (--segments 1): if ctl train would run this spec in several segments
    (its eval_every), the way it runs was not tested, so EXACT is not earned: NOT PROVEN (issue 24)."""
    if report.verdict != "exact" or not (0 < eval_every < steps):
        return
    ctl_ends = train_segments(steps, eval_every)
    if len(ctl_ends) > 1:
        report.exact, report.verdict = False, "not_proven"
        report.diagnosis = (
            f"the spec's ctl train runs {len(ctl_ends)} segments (eval_every {eval_every}); "
            "--segments 1 did not compare them"
        )


def _compare_segments(
    report: Report,
    trainer: Trainer,
    raw: dict,
    steps: int,
    ref_home: Path,
    seg_home: Path,
    ends: list[int],
    timeout_s: float,
    heartbeat_s: float,
    log: Callable[[str], None],
) -> None:
    """Run the trainer in segments, as ``ctl train`` does, and compare it bit for bit with the uninterrupted
    run; a difference makes the report NOT EXACT, diagnosed as segment dependence (segments.py)."""
    name = report.name
    log(f"verify-resume {name}: run in segments ending at {ends} (as ctl train runs it) in {seg_home}")

    def make(seg_raw: dict, folder: Path) -> Trainer:
        folder.mkdir(parents=True, exist_ok=True)
        return Trainer(seg_raw, folder, python=trainer.python, run_steps=steps)

    def attempt(t: Trainer, home: Path, index: int, mode: str, target: int | None) -> Attempt:
        return _run_attempt(t, home, index, mode, target, timeout_s, False, log, heartbeat_s)

    done = run_segments(make, raw, seg_home, ends, attempt, _check_attempt)
    _, kind = tracked_and_kind(progress_lines(ref_home / "attempt-0.jsonl"))
    if done[-1].returncode != 0:  # as ctl train would fail it: NOT EXACT, with the verdict line and the diagnosis
        index, rc = len(done), done[-1].returncode
        error = _stderr_last(seg_home, f"attempt-{index}")
        report.segments = {
            "ends": ends,
            "exact": False,
            "failed": {"segment": index, "end": ends[index - 1], "exit": rc, "error": error},
        }
        report.exact, report.verdict, report.suspects = False, "not_exact", ["segments"]
        report.diagnosis = diagnose_failed_segment(index, ends, rc, error, kind)
        return
    ref_steps = step_records(RunHome(ref_home).run(name).metrics)
    seg_steps = step_records(RunHome(seg_home).run(name).metrics)
    ref_result, seg_result = _result(ref_home, "attempt-0") or {}, _result(seg_home, f"attempt-{len(ends)}") or {}
    step, what = first_difference(ref_steps, seg_steps) if ref_steps else (None, [])
    equal = step is None and not differing(seg_result, ref_result)
    report.segments = {
        "ends": ends,
        "exact": equal,
        "final_loss_hex": seg_result.get("final_loss_hex"),
        "digest": seg_result.get("digest"),
        "first_differing_step": step,
    }
    if equal:
        return
    report.exact, report.verdict, report.suspects = False, "not_exact", ["segments"]
    report.first_differing_step = step
    report.diagnosis = (
        diagnose_segments(step, what, ends, kind)
        if step is not None
        else "the run in segments ends with another final loss or model digest though every step's "
        "record is equal: " + diagnose_segments(steps, [], ends, kind).split(": ", 1)[1]
    )


def _compare(
    trainer: Trainer,
    spec: Any,
    ref_home: Path,
    kill_home: Path,
    workdir: Path,
    *,
    kills: int,
    seed: int,
    signal_mode: str,
    timeout_s: float,
    heartbeat_s: float,
    log: Callable[[str], None],
) -> Report:
    name = spec.name
    log(f"verify-resume {name}: uninterrupted run ({spec.steps} steps) in {ref_home}")
    ref = _run_attempt(trainer, ref_home, 0, "ref", None, timeout_s, True, log, heartbeat_s)
    if ref.returncode != 0:
        why = _stderr_last(ref_home, "attempt-0")
        err = BadInput if ref.returncode == EXIT_BAD_INPUT else RunFailed
        raise err(f"the uninterrupted run failed (exit {ref.returncode}): {why}")
    _check_attempt(trainer, ref_home, 0, ref, spec.steps)
    ref_result = _result(ref_home, "attempt-0") or {}
    ref_lines = progress_lines(ref_home / "attempt-0.jsonl")
    helper = any("tracked" in ln for ln in ref_lines)
    end = contract.stopped_at(ref_result) or spec.steps  # an early stop ends the run there: plan before it
    if end != spec.steps:
        log(f"verify-resume {name}: the uninterrupted run stopped early at step {end}")
    plan = plan_kills(kills, end, seed, signal_mode, helper, spec.checkpoint_every)
    log(f"verify-resume {name}: interrupted run, {len(plan)} interruption(s) (seed {seed}) in {kill_home}")
    attempts: list[Attempt] = []
    for i, (mode, target) in enumerate(plan, 1):
        a = _run_attempt(trainer, kill_home, i, mode, target, timeout_s, False, log, heartbeat_s)
        attempts.append(a)
        _check_attempt(trainer, kill_home, i, a, spec.steps)
        if a.returncode == 0 and latest_step(kill_home, name) >= end:
            break  # finished before this interruption landed
        if a.returncode not in (0, EXIT_CANCELED, -signal.SIGKILL, -signal.SIGTERM):
            raise RunFailed(f"attempt {i} failed (exit {a.returncode}): {_stderr_last(kill_home, f'attempt-{i}')}")
    if not attempts or latest_step(kill_home, name) < end or attempts[-1].returncode != 0:
        final = _run_attempt(trainer, kill_home, len(attempts) + 1, "final", None, timeout_s, False, log, heartbeat_s)
        attempts.append(final)
        if final.returncode != 0:
            raise RunFailed(
                f"the resumed run failed (exit {final.returncode}): "
                f"{_stderr_last(kill_home, f'attempt-{len(attempts)}')}"
            )
        _check_attempt(trainer, kill_home, len(attempts), final, spec.steps)
    got_result = _result(kill_home, f"attempt-{len(attempts)}") or {}
    landed = sum(1 for a in attempts if a.mode != "final" and a.returncode != 0)

    ref_steps = step_records(RunHome(ref_home).run(name).metrics)
    got_steps = step_records(RunHome(kill_home).run(name).metrics)
    ref_states = {s: r["state"] for s, r in ref_steps.items() if "state" in r}
    start = next((ln.get("state") for ln in ref_lines if ln.get("event") == "start"), None)
    if start is not None:
        ref_states[0] = start
    resumes = [(a.resumed_step, a.resume_state) for a in attempts[1:]]  # the restarts (attempt 1 starts fresh)
    tracked, kind = tracked_and_kind(ref_lines)
    step, text, suspects = diagnose(ref_steps, got_steps, resumes, ref_states, tracked, kind)
    differs = differing(got_result, ref_result)
    loss_equal, digest_equal = "final_loss_hex" not in differs, "digest" not in differs
    if step is None and not (loss_equal and digest_equal):
        text = (
            "the per-step records are equal but the final "
            + ("loss" if not loss_equal else "model digest")
            + " differs: state changed after the last step (or the result line is wrong)"
        )
        suspects = ["final"]
    exact = step is None and loss_equal and digest_equal and bool(ref_steps)
    if not ref_steps:
        text = text or f"no per-step records in runs/{name}/metrics.jsonl: only the final loss and digest compared"
        exact = loss_equal and digest_equal
    interruptions: list[dict[str, Any]] = []
    for prev, nxt in zip(attempts, attempts[1:]):
        if prev.mode != "final" and prev.returncode != 0:
            lost, done, resumed = steps_lost(prev, nxt)
            interruptions.append(
                {
                    "signal": {"term": "SIGTERM"}.get(prev.mode, "SIGKILL"),
                    "mode": prev.mode,
                    "step_killed": prev.reached_step,
                    "stopping_step": prev.stopping_step,
                    "steps_done": done,
                    "resumed_from": resumed,
                    "steps_lost": lost,
                    "steps_redone": max(0, (prev.reached_step or 0) - resumed),
                }
            )
    # proven only by a resume from a mid-run checkpoint: one from step 0 restarts, one from ``steps`` (a kill
    # after the last checkpoint) trains nothing after it
    proven = any(resumed_inside(i["resumed_from"], [end]) for i in interruptions)
    verdict = "not_exact" if not exact else ("exact" if proven else "not_proven")
    if verdict == "not_proven":
        exact = False
        text = text or (
            "no interruption resumed from a mid-run checkpoint"
            if plan
            else "no interruption resumed from a mid-run checkpoint: --kills 0 plans none"
            if kills == 0
            else f"no interruption resumed from a mid-run checkpoint: steps {end} / checkpoint_every "
            f"{spec.checkpoint_every} allow no kill after a mid-run checkpoint"
        )
    lost_text = graceful_loss(interruptions)
    if lost_text is not None:  # a graceful stop that lost steps broke the contract's SIGTERM rule, exact or not
        verdict, exact, suspects = "contract_broken", False, ["SIGTERM"]
        text = f"trainer broke the contract (SIGTERM): {lost_text}"
    return Report(
        name=name,
        verdict=verdict,
        interruptions=interruptions,
        exact=exact,
        kills_planned=len(plan),
        kills_landed=landed,
        final_loss_hex={"uninterrupted": ref_result.get("final_loss_hex"), "resumed": got_result.get("final_loss_hex")},
        digest={"uninterrupted": ref_result.get("digest"), "resumed": got_result.get("digest")},
        steps_compared=len(set(ref_steps) & set(got_steps)),
        first_differing_step=step,
        diagnosis=text,
        suspects=suspects,
        attempts=[asdict(a) for a in [ref, *attempts]],
        workdir=str(workdir),
    )
