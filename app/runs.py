"""Runs: home folder, engine, generations, the start-request diff and outcomes; no click.

Domain problems are raised as ``CtlError`` (``BadRequest`` for bad input, exit 2); only
``ctl/cli.py`` turns them into messages and exit codes.

Run ids: ``ctl train`` of spec ``tiny`` is workflow ``train/tiny``. A run that ended
canceled or failed is continued by a fresh workflow ``train/tiny/2`` (then ``/3``...)
over the same run directory: its segments resume from the checkpoints already written, and
segments and evaluations the earlier workflows finished are passed in its input, not rerun.
``train/tiny`` given to status/cancel/history names the newest of these; ``train/tiny/1``
names the first one itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from contracts.layout import RunHome
import workflows
from engine import BadInput, NotFound, Reader, Store, WorkflowStatus, check_id
from tinyllm import fsio

from . import backends
from .backend import Backend
from .errors import (  # noqa: F401 (the exit codes and errors are re-exported)
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_OK,
    BadRequest,
    CtlError,
    DiskFull,
)
from .homecheck import check_home_writable, refuse_lost_history

ENDED = ("completed", "failed", "canceled")


# --- home and engine ---------------------------------------------------------------------


def resolve_home(home: str | None) -> Path:
    """``--home``, else ``$CTL_HOME``, else the current directory."""
    path = fsio.resolve_home(home)
    if path.exists() and not path.is_dir():
        raise BadRequest(f"home {path} is not a directory")
    return path


def db_path(home: Path) -> Path:
    return RunHome(home).engine_db


def stopped(engine: Backend) -> bool:
    """A polite stop ended this engine's work (``Engine.request_stop``, engine/_stop.py); a backend without
    ``polite_stop`` has none (its polite stop is ctl/interrupt.py's: the trainers below ctl checkpoint, ctl exits 143)."""
    return engine.stop is not None


def open_engine(
    home: Path,
    *,
    create: bool,
    readonly: bool = False,
    attempt_env: Any = None,
    warm: str = "lazy",
    **engine_kwargs: Any,
) -> Backend:
    """The engine of ``home`` with the workflows and the real activities registered.

    ``create=False`` (read-only commands) refuses a home without a database, so that
    ``ctl status`` in the wrong folder writes nothing.
    ``readonly=True`` (status, list, history) opens the database so that it can never be
    written, which also works in a read-only home.
    ``attempt_env``: ``fn(ctx) -> dict`` added to each attempt's environment (a traced run's TRACEPARENT).
    ``warm``: when the trainers' fork server starts (workflows/activities.py): ``eager`` (now), ``lazy``, ``off``.
    """
    if backends.chosen().name == backends.TEMPORAL:  # the run's files stay in home; the state on the cluster
        if not readonly:
            check_home_writable(home)
        return backends.open_temporal(home)
    path = db_path(home)
    if not create and not path.exists():
        raise BadRequest(f"no ctl database in {home} (looked for {path}); pass --home or set CTL_HOME")
    if not readonly:
        check_home_writable(home)
        if create:
            refuse_lost_history(home, path)
    try:
        if readonly and not engine_kwargs and attempt_env is None:
            # status, history, show, logs, ui: nothing registered; the read side of a Backend only
            return cast(Backend, Reader(Store(path, readonly=True)))
        if readonly:
            engine_kwargs = {"store": Store(path, readonly=True), **engine_kwargs}
        from engine import Engine  # the running side: only where workflows run (ctl train, eval, worker...)

        engine = Engine(path, **engine_kwargs)
    except BadInput as e:
        raise BadRequest(str(e)) from None
    workflows.register(
        engine, activities=workflows.tinyllm_activities(home, attempt_env=attempt_env, warm="off" if readonly else warm)
    )
    return engine


def train_workflow_id(name: str) -> str:
    return f"train/{name}"


# --- runs --------------------------------------------------------------------------------


def generation(workflow_id: str, base: str) -> int | None:
    if workflow_id == base:
        return 1
    if workflow_id.startswith(base + "/") and workflow_id[len(base) + 1 :].isdigit():
        return int(workflow_id[len(base) + 1 :])
    return None


def latest_run(engine: Backend, base: str) -> WorkflowStatus | None:
    """The newest workflow of run ``base`` (``train/tiny``, ``train/tiny/2``, ...), or None."""
    found = engine.generations(base)  # Temporal: read by id, not from its (eventually consistent) list
    return found[-1] if found else None


def readable_workflows(engine: Backend) -> list[WorkflowStatus]:
    """Every workflow whose record can be read (damaged ones are reported where they are asked for)."""
    return engine.list_readable()[0]


def resolve_id(engine: Backend, workflow_id: str) -> str:
    """An id as given, or for a run's base id its newest workflow; BadRequest when unknown."""
    try:
        check_id(workflow_id)
    except BadInput as e:
        raise BadRequest(str(e)) from None
    st = latest_run(engine, workflow_id)
    if st is not None:
        return st.workflow_id
    try:
        engine.status(workflow_id)
    except NotFound:
        first = workflow_id[: -len("/1")] if workflow_id.endswith("/1") else None
        if first and _exists(engine, first):  # train/tiny/1: the run's first workflow itself
            return first
        raise BadRequest(f"no workflow {workflow_id!r} (see `ctl list`)") from None
    return workflow_id


def _exists(engine: Backend, workflow_id: str) -> bool:
    try:
        engine.status(workflow_id)
        return True
    except (NotFound, BadInput):
        return False


def recorded_input(engine: Backend, workflow_id: str) -> dict:
    events = engine.history(workflow_id)
    return (events[0].attrs.get("input") or {}) if events else {}  # (a workflow without input: {})


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


@dataclass
class Started:
    workflow_id: str
    new: bool  # False: attached to a running or finished workflow
    reused: list[str] = field(default_factory=list)  # activity ids an earlier workflow finished (continued run)


def run_generations(engine: Backend, base: str) -> list[WorkflowStatus]:
    """Every workflow of run ``base`` (``train/tiny``, ``train/tiny/2``, ...), oldest first."""
    return engine.generations(base)


OPERATIONAL = (
    "prior",
    "train_heartbeat_timeout_s",
    "eval_heartbeat_timeout_s",
    "trace",
    "heartbeat_timeout_s",
    "restart",
)
"""Input fields that are not the run's identity: the work already done, and settings of how it is run
that change no result (a rerun with another ``--heartbeat-timeout`` or ``--eval-heartbeat-timeout`` continues
the run with it; the
trace a run records is read back, so a rerun with or without tracing continues it; a release's publish
heartbeat timeout: the recorded one applies; a restarted run's count, carried from the workflow it continues)."""

FLAGS = {
    "eval_seed": "--eval-seed",
    "eval_max_items": "--eval-max-items",
    "eval_suites": "--suite/--no-eval",
    "corpus": "--corpus-spec",
}
"""The ``ctl train`` option behind each identity field of TrainRunInput (named in a refusal)."""


def _without_prior(raw: Any) -> Any:
    return {k: v for k, v in raw.items() if k not in OPERATIONAL} if isinstance(raw, dict) else raw


def _difference_text(diff: list[str], old: Any, new: Any) -> str:
    """``--eval-seed 3 (was 0)`` for a field a flag sets, else the field's path."""
    out = []
    for path in diff[:5]:
        top = path.split(".", 1)[0]
        if top in FLAGS and isinstance(old, dict) and isinstance(new, dict):
            out.append(f"{FLAGS[top]}: {json.dumps(new.get(top))} now, {json.dumps(old.get(top))} when started")
        else:
            out.append(path)
    return "; ".join(out)


def start_run(engine: Backend, workflow: str, base: str, inp: Any, *, restart: int | None = None) -> Started:
    """Start run ``base`` with input ``inp``, or attach to it; refuse a different input.

    Running or completed: attach. Canceled or failed: a fresh workflow continues the run;
    for a TrainRun its input carries the work earlier workflows finished since the run's last restart
    (``prior``), so finished segments and evaluations are not run again.
    ``restart`` (``ctl train --restart``, after ctl/restart.py ended the newest workflow and moved the run's
    files aside): a fresh workflow with the next id, from scratch, recording that restart count.
    """
    from workflows.models import TrainRunInput  # pydantic: the request (inp) loaded it already

    current = latest_run(engine, base)
    if restart is not None:
        gen = (generation(current.workflow_id, base) or 1) if current is not None else 0
        workflow_id = f"{base}/{gen + 1}" if gen else base
        inp = inp.model_copy(update={"restart": restart})
        try:
            engine.start(workflow, workflow_id, inp)
        except BadInput as e:
            raise BadRequest(str(e)) from None
        return Started(workflow_id, new=True)
    new_raw = json.loads(inp.model_dump_json())
    if current is not None:
        old_raw = recorded_input(engine, current.workflow_id)
        diff = _differences(_without_prior(old_raw), _without_prior(new_raw))
        if diff:
            flagged = [d for d in diff if d.split(".", 1)[0] in FLAGS]
            fix = (
                "give the same options as when it was started"
                if flagged and len(flagged) == len(diff)
                else f"use another name, or the recorded spec (`ctl history {current.workflow_id} --json`)"
                + (
                    ", or start it over with `ctl train --spec FILE --restart`"
                    if isinstance(inp, TrainRunInput)
                    else ""
                )
            )
            raise BadRequest(
                f"{current.workflow_id} was started with a different request "
                f"({_difference_text(diff, old_raw, new_raw)}); {fix}"
            )
        if current.state in ("running", "completed"):
            return Started(current.workflow_id, new=False)
        gen = generation(current.workflow_id, base) or 1
        workflow_id = f"{base}/{gen + 1}"
        if isinstance(inp, TrainRunInput):
            epoch = int(old_raw.get("restart") or 0) if isinstance(old_raw, dict) else 0
            earlier = [
                events
                for st in run_generations(engine, base)
                if int(((events := engine.history(st.workflow_id))[0].attrs.get("input") or {}).get("restart") or 0)
                == epoch
            ]  # only the work done since the run's last restart
            inp = inp.model_copy(update={"prior": workflows.collect_prior(earlier), "restart": epoch})
    else:
        workflow_id = base
    try:
        engine.start(workflow, workflow_id, inp)
    except BadInput as e:
        raise BadRequest(str(e)) from None
    prior = getattr(inp, "prior", None)
    return Started(workflow_id, new=True, reused=sorted([*prior.train, *prior.evals]) if prior else [])


def heartbeat_override(
    workflow_id: str, heartbeat_timeout_s: float | None, eval_heartbeat_timeout_s: float | None = None
):
    """The engine's ``attempt_options`` hook of a ``ctl train`` running ``workflow_id`` here: its train
    attempts run with this command's ``--heartbeat-timeout``, its evaluations with its
    ``--eval-heartbeat-timeout`` (the scheduled value stays recorded; the started event records the one used),
    whatever the run was started with."""
    wanted = {workflows.ACTIVITY_TRAIN: heartbeat_timeout_s, workflows.ACTIVITY_EVAL: eval_heartbeat_timeout_s}

    def hook(wid: str, name: str, scheduled: Any) -> Any:
        value = wanted.get(name)
        if wid != workflow_id or value is None or scheduled.heartbeat_timeout_s == value:
            return scheduled
        return replace(scheduled, heartbeat_timeout_s=value)

    return hook


def heartbeat_in_use(
    engine: Backend,
    workflow_id: str,
    activity: str = workflows.ACTIVITY_TRAIN,
    field: str = "train_heartbeat_timeout_s",
) -> float | None:
    """The heartbeat timeout the run's ``activity`` attempts (train; eval with ``field``
    ``eval_heartbeat_timeout_s``) last ran with (or were scheduled with), or None."""
    try:
        events = engine.history(workflow_id)
    except (NotFound, BadInput):
        return None
    value, scheduled = None, {}
    for e in events:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        aid = str(a.get("activity_id", ""))
        if e.type == "workflow_started" and isinstance(a.get("input"), dict):
            value = a["input"].get(field, value)
        elif e.type == "activity_scheduled" and a.get("name") == activity:
            scheduled[aid] = (a.get("options") or {}).get("heartbeat_timeout_s")
        elif e.type == "activity_started" and aid in scheduled:
            value = a.get("heartbeat_timeout_s", scheduled[aid])
    return value


def outcome_json(st: Any) -> dict:
    """``--json`` of an ended (or running) workflow: ``{workflow_id, workflow, state, result, error}``."""
    error = None
    if st.error:
        error = {k: v for k, v in st.error.items() if k != "traceback"}
    return {
        "workflow_id": st.workflow_id,
        "workflow": st.workflow,
        "state": st.state,
        "cancel_requested": st.cancel_requested,
        "result": st.result,
        "error": error,
    }


def exit_code(state: str) -> int:
    return {"completed": EXIT_OK, "canceled": EXIT_CANCELED, "failed": EXIT_FAILED}.get(state, EXIT_OK)


def disk_full_message(error: Any) -> str | None:
    """The "disk full writing <path>" line of a recorded failure (any cause level), or None."""
    for _ in range(8):
        if not isinstance(error, dict):
            return None
        if error.get("type") == "DiskFull":
            msg = str(error.get("message", "disk full"))
            return msg.split("tinyllm: ", 1)[-1].split("; free some space")[0]
        error = error.get("cause")
    return None


PERMISSION_DENIED = "permission denied writing "  # tinyllm's line for a write this user may not do (exit 2)


def permission_message(error: Any) -> str | None:
    """The "permission denied writing <path>: ..." line of a recorded failure (any cause level), or None."""
    for _ in range(8):
        if not isinstance(error, dict):
            return None
        msg = str(error.get("message", ""))
        if PERMISSION_DENIED in msg:
            return PERMISSION_DENIED + msg.split(PERMISSION_DENIED, 1)[1].strip()
        error = error.get("cause")
    return None


def check_run_writable(home: Path, name: str) -> None:
    """``BadRequest`` (nothing started) when a folder of run ``name`` exists but this user may not write it:
    every attempt would fail on it, and a retry cannot help. A read-only home says so first (its own message)."""
    check_home_writable(home)
    run = RunHome(home).run(name)
    for path in (RunHome(home).runs, run.path, run.ckpt_root, run.activity_root, RunHome(home).corpora):
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise BadRequest(
                f"{path} is not writable by this user (uid {os.getuid()}): make it writable (e.g. "
                f"`chmod u+w {path}`, or run as its owner) and run the same command again; nothing "
                f"was started"
            )


def error_line(error: dict | None) -> str:
    """One readable line of a recorded workflow error (its cause included)."""
    if not error:
        return ""
    line = f"{error.get('type', 'error')}: {error.get('message', '')}"
    cause = error.get("cause")
    if isinstance(cause, dict) and cause.get("message") and str(cause["message"]).strip() not in line:
        line += f" (cause: {cause.get('type', '')}: {cause['message']})"
    details = error.get("details")
    if isinstance(details, dict) and details.get("stderr_tail"):
        last = details["stderr_tail"].strip().splitlines()[-1]
        if last.strip() not in line:  # (a trainer's one line often is the message itself: not twice)
            line += f" | stderr: {last}"
    return line
