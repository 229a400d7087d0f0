"""The real activities: ``tinyllm train|eval|corpus`` as subprocesses through the engine's runner.

Nothing of tinyllm runs here (no torch in the worker; only its stdlib-only tinyllm.fsio): everything crosses as a command
line, files under the home folder and an exit code (contracts/subprocess-activity.md).
Each activity writes its spec (atomically), its progress file and each attempt's stdout and stderr
(``logs/g<generation>-a<attempt>/{stdout,stderr}.log``, bounded, kept on success too; ``ctl logs`` shows
them) under ``runs/<name>/activity/<activity-id>/`` (a corpus build keeps its spec and progress in
``.ctl/activity/<activity-id>/``, shared by the runs on that corpus, and its output with the run that
asked for it); ``train`` passes ``--resume`` with the last
heartbeated checkpoint when its attempt is a redelivery.

A spec that names its own ``trainer`` runs that command instead of tinyllm's (same arguments, same
contract; workflows/trainer_command.py builds the command line and checks the contract's rules).

Warm starts (``warm``): a segment's ``tinyllm train`` is forked by a server that has torch and the
trainer imported (engine/_forkserver.py, preloading tinyllm/warm.py) instead of starting a fresh
interpreter, and so is an evaluation's ``tinyllm eval``; each attempt is still a fresh process. Only
tinyllm's own command (of a single-process spec, for train) goes warm, and only an activity's first
attempt; a redelivered attempt, a spec's own trainer, a distributed spec, and anything the server
declines (another environment, a crashed server) start cold. ``warm``: ``"lazy"``
(the default) starts the server at the first attempt that may go warm, ``"eager"`` now, ``"off"`` never
(an eager server's imports compete for the CPUs with a restart's cold redelivered trainer: measured
slower on 2 CPUs, docs/ctl.md); ``CTL_WARM_START=0`` turns it off whatever the caller asked (docs/ctl.md, "Warm segment starts").

``attempt_env`` (optional): ``fn(ctx) -> dict`` of variables added to each attempt's environment;
``ctl train`` of a traced run passes ``TRACEPARENT`` (the attempt's span) this way (app/traces.py).

The implementations are pluggable: ``workflows.register(engine, activities=...)`` takes any
mapping of activity name to ``fn(ctx, input)``; ``tinyllm_activities(home)`` builds this one.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from contracts.layout import RunHome, progress_name
from contracts.layout import parse_step_dir as checkpoint_step
from contracts.resume import resume_argument
from contracts.resume import resume_argument as choose_resume  # noqa: F401  (the name callers knew)
from engine import ActivityContext, ForkServer, NonRetryableError, SubprocessFailed, run_subprocess
from tinyllm.fsio import DISK_FULL_ERRNOS, atomic_write  # standard library only: no torch in the worker
from tinyllm.warm import MODULES as WARM_MODULES, PRELOAD as WARM_PRELOAD  # names only: no torch either

from .models import (
    ACTIVITY_CORPUS,
    ACTIVITY_EVAL,
    ACTIVITY_TRAIN,
    CorpusBuildInput,
    CorpusBuildResult,
    EvalActivityInput,
    SuiteOutputs,
    TrainActivityInput,
    TrainActivityResult,
)
from .trainer_command import (
    Invocation,
    check_eval_result,
    check_progress,
    check_train_result,
    invocation,
    rejected_arguments,
)
from .release import ACTIVITY_PUBLISH, publish_activity
from .plan import activity_dir, progress_path  # noqa: F401 (re-exported)
from .repeats import check_repeat

WARM_ENV = "CTL_WARM_START"  # 0/off/no/false: every trainer starts cold (the documented switch)
WARM_CHOICES = ("eager", "lazy", "off")


def warm_choice(asked: str | bool | None) -> str:
    """The warm-start mode after ``$CTL_WARM_START`` (which can only turn it off)."""
    if os.environ.get(WARM_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return "off"
    mode = "lazy" if asked is True or asked is None else "off" if asked is False else str(asked)
    if mode not in WARM_CHOICES:
        raise ValueError(f"warm must be one of {WARM_CHOICES}, got {asked!r}")
    return mode


def warm_fits(spec: dict) -> bool:
    """A spec whose train attempts may start warm: tinyllm's own trainer without ``distributed`` (which
    launches torchrun ranks, even one)."""
    return not spec.get("trainer") and spec.get("distributed") is None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync and rename (never a torn file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text.encode("utf-8"), cleanup=True)
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS:
            raise NonRetryableError(f"disk full writing {path}", type="DiskFull") from None
        raise


def workflow_generation(workflow_id: str) -> int:
    """1 for ``train/tiny``, 2 for ``train/tiny/2`` (a continued run's workflow; app/runs.py)."""
    parts = str(workflow_id).split("/")
    return int(parts[-1]) if len(parts) >= 3 and parts[-1].isdigit() else 1


def output_dir(work: Path, workflow_id: str, attempt: int) -> Path:
    """Where one attempt's stdout.log and stderr.log are kept: ``<activity dir>/logs/g<G>-a<N>/`` (G: the
    run's workflow generation, N: the attempt; a folder already there, e.g. a release's evaluation asked
    for again by another release workflow, is never overwritten: ``-2``, ``-3``... is added)."""
    base = work / "logs" / f"g{workflow_generation(workflow_id)}-a{attempt}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def failure_point(home: Path, name: str, until: int) -> int | None:
    """The step of the newest checkpoint of run ``name`` at or before ``until`` (None: none yet): where a failed
    attempt's successor resumes (workflows/repeats.py compares two failures' points)."""
    try:
        steps = [
            s
            for p in RunHome(home).run(name).ckpt_root.iterdir()
            if p.is_dir() and (s := checkpoint_step(p)) is not None and s <= until
        ]
    except OSError:
        return None
    return max(steps) if steps else None


class TinyllmActivities:
    """``train``, ``eval`` and ``corpus`` over ``tinyllm`` subprocesses in one home folder."""

    def __init__(
        self,
        home: str | Path,
        *,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        attempt_env: Callable[[ActivityContext], dict[str, str]] | None = None,
        warm: str | bool | None = "lazy",
    ):
        self.home = Path(home).resolve()
        self.python = python
        self.env = env
        self.attempt_env = attempt_env
        self.warm = warm_choice(warm)
        self._server: ForkServer | None = None
        if self.warm == "eager":
            self.warm_server()

    def _launcher(self, ctx: ActivityContext, fits: bool) -> ForkServer | None:
        """The fork server for this attempt, or None (cold): only a first attempt goes warm. A redelivery
        (after a crash, a hang, a stop, or a restart after a kill) starts cold: whatever ended the attempt
        before it, the retry does not depend on the server (and after a restart the server, started with
        ctl, would not be ready sooner than a cold trainer: docs/ctl.md, "Warm segment starts")."""
        return self.warm_server() if fits and ctx.attempt == 1 else None

    def warm_server(self) -> ForkServer | None:
        """The fork server of this home's trainers (started on first call), or None when warm starts are off."""
        if self.warm == "off":
            return None
        if self._server is None:
            self._server = ForkServer(
                WARM_PRELOAD, WARM_MODULES, cwd=self.home, python=self.python, env=self.env
            ).start()
            atexit.register(self._server.close)
        return self._server

    def close(self) -> None:
        """End the fork server (if any); later attempts start it again when they need it."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _argv(self, command: str, spec_path: Path, *extra: str) -> list[str]:
        return [self.python, "-m", "tinyllm.cli", command, "--spec", str(spec_path), "--home", str(self.home), *extra]

    def _workdir(self, name: str, activity_id: str) -> Path:
        return activity_dir(self.home, name, activity_id)

    def _run(
        self,
        ctx: ActivityContext,
        argv: list[str],
        progress_path: Path,
        how: Invocation | None = None,
        logs_in: Path | None = None,
        launcher: ForkServer | None = None,
    ) -> Any:
        """Run one attempt; its output is kept under ``logs_in`` (default: the progress file's folder)."""
        progress_path.unlink(missing_ok=True)  # an attempt's heartbeats come from its own lines
        cwd, env = (how.cwd, how.env) if how is not None else (str(self.home), self.env)
        extra = self.attempt_env(ctx) if self.attempt_env is not None else None
        if extra:
            env = {**(env if env is not None else os.environ), **extra}
        done = run_subprocess(
            ctx,
            argv,
            progress_path=str(progress_path),
            cwd=cwd,
            env=env,
            output_dir=output_dir(logs_in or progress_path.parent, ctx.workflow_id, ctx.attempt),
            launcher=launcher,
        )
        if how is not None and how.custom:  # a spec's own trainer: the contract's rules, named when broken
            return done.result
        if not isinstance(done.result, dict):
            raise RuntimeError(f"{argv[3]} printed no JSON result line; stderr: {done.stderr_tail[-500:]}")
        return done.result

    def _invocation(
        self, spec: dict, kind: str, spec_path: Path, *extra: str, run_steps: int | None = None
    ) -> tuple[list[str], Invocation]:
        """tinyllm's command line, or the spec's own trainer's (workflows/trainer_command.py)."""
        how = invocation(
            spec,
            kind,
            home=self.home,
            python=self.python,
            env=self.env,
            default=self._argv(kind, spec_path, *extra),
            run_steps=run_steps,
        )
        if not how.custom:
            return how.argv, how
        return [*how.argv, "--spec", str(spec_path), "--home", str(self.home), *extra], how

    def train(self, ctx: ActivityContext, input: Any) -> TrainActivityResult:
        inp = TrainActivityInput.model_validate(input)
        name, until = str(inp.spec["name"]), int(inp.spec["steps"])
        work = self._workdir(name, ctx.activity_id)
        spec_path = work / "spec.json"
        atomic_write_text(spec_path, json.dumps(inp.spec, indent=2, sort_keys=True) + "\n")
        resume = resume_argument(self.home, name, until, ctx.attempt, ctx.last_heartbeat_details)
        progress = progress_path(self.home, name, ctx.activity_id, ctx.attempt)
        extra = ["--progress", str(progress)]
        if resume:
            extra += ["--resume", resume]
        argv, how = self._invocation(inp.spec, "train", spec_path, *extra, run_steps=inp.total_steps)
        if not how.custom and inp.total_steps is not None and inp.total_steps != until:
            argv = [*argv, "--total-steps", str(inp.total_steps)]  # tinyllm's; not in the public contract
        launcher = self._launcher(ctx, not how.custom and warm_fits(inp.spec))  # any doubt: a cold start
        try:
            out = self._run(ctx, argv, progress, how, launcher=launcher)
        except SubprocessFailed as e:
            bad = (
                how.custom
                and e.type != "ProgressTimeout"
                and rejected_arguments(
                    ctx.attempt, e.returncode, progress, argv[len(how.argv) :], str(e.details.get("stderr_tail", ""))
                )
            )
            if bad:
                raise bad from None
            repeated = (
                None
                if e.type == "ProgressTimeout"
                else check_repeat(work, ctx.attempt, e, failure_point(self.home, name, until))
            )
            if repeated:  # the same failure at the same point twice in a row: not retried blindly
                raise repeated from None
            raise
        if how.custom:
            check_progress(progress, home=self.home)
            out = check_train_result(out, home=self.home, name=name)
        return TrainActivityResult.model_validate(out)

    def eval(self, ctx: ActivityContext, input: Any) -> SuiteOutputs:
        inp = EvalActivityInput.model_validate(input)
        work = self._workdir(str(inp.spec["name"]), ctx.activity_id)
        spec_path = work / "spec.json"
        atomic_write_text(spec_path, json.dumps(inp.spec, indent=2, sort_keys=True) + "\n")
        progress = progress_path(self.home, str(inp.spec["name"]), ctx.activity_id, ctx.attempt)
        argv, how = self._invocation(inp.spec, "eval", spec_path, "--progress", str(progress))
        out = self._run(ctx, argv, progress, how, launcher=self._launcher(ctx, not how.custom))  # tinyllm eval
        if how.custom:
            out = check_eval_result(out)
        return SuiteOutputs.model_validate(out)

    def corpus(self, ctx: ActivityContext, input: Any) -> CorpusBuildResult:
        inp = CorpusBuildInput.model_validate(input)
        work = RunHome(self.home).ctl_activity_dir(ctx.activity_id)
        spec_path = work / "spec.json"
        atomic_write_text(spec_path, json.dumps(inp.spec, indent=2, sort_keys=True) + "\n")
        run = str(ctx.workflow_id).split("/")
        logs_in = activity_dir(self.home, run[1], ctx.activity_id) if len(run) >= 2 and run[0] == "train" else None
        out = self._run(
            ctx, self._argv("corpus", spec_path), work / progress_name(ctx.attempt), logs_in=logs_in
        )  # its output: in the run's home, beside the run's other activities
        return CorpusBuildResult.model_validate(out)

    def as_dict(self) -> dict[str, Callable[[ActivityContext, Any], Any]]:
        return {
            ACTIVITY_TRAIN: self.train,
            ACTIVITY_EVAL: self.eval,
            ACTIVITY_CORPUS: self.corpus,
            ACTIVITY_PUBLISH: publish_activity(self.home),
        }  # ModelRelease's (workflows/release.py)


def tinyllm_activities(home: str | Path, **kwargs: Any) -> dict[str, Callable[[ActivityContext, Any], Any]]:
    """The real activities of one home folder, by name, for ``workflows.register``."""
    return TinyllmActivities(home, **kwargs).as_dict()
