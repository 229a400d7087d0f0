"""``ctl logs train/NAME [--activity ID] [--attempt N] [--follow]``: a trainer's own output, per attempt.

Every attempt of every activity of a run (corpus build, training segment, evaluation) keeps its stdout and
stderr in the run's home: ``runs/<name>/activity/<activity-id>/logs/g<G>-a<N>/{stdout,stderr}.log`` (G: the
run's workflow generation, ``train/tiny`` 1, ``train/tiny/2`` 2; N: the attempt), bounded to the first 64 KiB
and the last 4 MiB of each stream (engine/_output.py), on success as on failure. Two files, not one: the
child writes straight into them (no pipe the worker must drain), and the runner still reads the last stdout
line as the result and the stderr tail as the error message.

Default: the newest attempt of the newest activity the run's history started; ``train/NAME/G`` looks at
the run's workflow generation G only (after a cancel or failure, ``train/tiny/2`` continues ``train/tiny``). Each file is printed after a
``==> PATH <==`` line (as ``tail`` does for several files). ``--follow`` prints what the attempt writes as it
writes it, until the history records the attempt's end, the run is no longer running, or no live worker
holds it (then one line on stderr says which), like ``kubectl logs -f``.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from contracts.layout import RunHome
from engine import OUTPUT_STREAMS as STREAMS, NotFound, output_log_path as log_path, read_kept_output as read_kept
from workflows.plan import activity_dir

import app
from app import Backend
from . import runstatus
from .cli_common import edge, home_option
from app.errors import BadRequest

_DIR = re.compile(r"^g(\d+)-a(\d+)(?:-(\d+))?$")
_NOT_AN_END = ("activity_scheduled", "activity_started", "activity_heartbeat")
FOLLOW_POLL_S = 0.25


class NoOutputYet(BadRequest):
    """The run has started no attempt with kept output yet (``--follow`` waits for one while the run runs)."""


@dataclass
class AttemptLogs:
    run: str  # the run's name
    activity_id: str
    generation: int
    attempt: int
    directory: Path


def attempt_dirs(home: Path, name: str, activity_id: str) -> list[AttemptLogs]:
    """Every attempt's output folder of one activity, oldest first (generation, attempt, repeat)."""
    root = activity_dir(home, name, activity_id) / "logs"
    found = []
    for p in root.iterdir() if root.is_dir() else []:
        m = _DIR.match(p.name)
        if m and p.is_dir():
            found.append(
                ((int(m[1]), int(m[2]), int(m[3] or 1)), AttemptLogs(name, activity_id, int(m[1]), int(m[2]), p))
            )
    return [a for _, a in sorted(found, key=lambda x: x[0])]


def run_logs(home: Path, name: str) -> list[AttemptLogs]:
    """Every kept attempt output of run ``name`` (for ``ctl show`` and the UI), by activity folder."""
    root = RunHome(home).run(name).activity_root
    out = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        out += attempt_dirs(home, name, p.name)
    return out


def _started(engine: Backend, base: str) -> list[tuple[str, str, int]]:
    """(workflow id, activity id, attempt) of every attempt the run's workflows started, in order."""
    out = []
    for st in app.run_generations(engine, base):
        for e in engine.history(st.workflow_id):
            if e.type == "activity_started":
                out.append((st.workflow_id, str(e.attrs.get("activity_id")), int(e.attrs.get("attempt") or 1)))
    return out


def _base(workflow_id: str) -> str:
    parts = workflow_id.rstrip("/").split("/")
    if len(parts) not in (2, 3) or parts[0] != "train" or not parts[1]:
        raise BadRequest(f"{workflow_id!r} is not a training run: give train/NAME")
    return f"train/{parts[1]}"


def choose(
    engine: Backend, home: Path, workflow_id: str, activity: str | None, attempt: int | None
) -> tuple[AttemptLogs, str | None]:
    """The attempt whose output to print, and the workflow that ran it (None: not one of the run's)."""
    base = _base(workflow_id)
    name = base.split("/", 1)[1]
    gens = {(app.generation(st.workflow_id, base) or 1): st.workflow_id for st in app.run_generations(engine, base)}
    if not gens:
        raise BadRequest(f"no workflow {base!r} (see `ctl list`)")
    only = app.generation(workflow_id, base) if workflow_id.rstrip("/") != base else None  # train/NAME/G: that one
    if workflow_id.rstrip("/") != base and only not in gens:
        raise BadRequest(f"no workflow {workflow_id!r} (workflows of this run: {', '.join(gens.values())})")
    started = [x for x in _started(engine, base) if only is None or x[0] == gens[only]]
    if activity is None:
        if not started:
            raise NoOutputYet(f"{base} has started no activity yet: no output to show")
        activity = started[-1][1]
    kept = [a for a in attempt_dirs(home, name, activity) if only is None or a.generation == only]
    if not kept:
        known = sorted({a.activity_id for a in run_logs(home, name)})
        raise (NoOutputYet if started and activity == started[-1][1] else BadRequest)(
            f"{base}: no output kept for activity {activity!r} (activities with output: {', '.join(known) or 'none'})"
        )
    if attempt is not None:
        picked = [a for a in kept if a.attempt == attempt]
        if not picked:
            raise BadRequest(
                f"{base}: activity {activity} has no attempt {attempt} (attempts: "
                f"{', '.join(str(a) for a in sorted({a.attempt for a in kept}))})"
            )
        chosen = picked[-1]
    else:
        mine = [(app.generation(w, base) or 1, n) for w, aid, n in started if aid == activity]
        chosen = next((a for a in reversed(kept) if mine and (a.generation, a.attempt) == mine[-1]), kept[-1])
    return chosen, gens.get(chosen.generation)


def _rel(home: Path, path: Path) -> str:
    try:
        return str(path.relative_to(home))
    except ValueError:
        return str(path)


class Printer:
    """Prints what is new in an attempt's two files, each part after a ``==> PATH <==`` line when the file
    it comes from changes."""

    def __init__(self, home: Path, logs: AttemptLogs):
        self.paths = {s: log_path(logs.directory, s) for s in STREAMS}
        self.home = home
        self.offsets = {s: 0 for s in STREAMS}
        self.last: str | None = None

    def pump(self) -> None:
        out = sys.stdout.buffer
        for stream, path in self.paths.items():
            try:
                data, _, size = read_kept(path, self.offsets[stream])
            except FileNotFoundError:
                continue
            if size < self.offsets[stream]:  # cut back to its head (a filesystem without hole punching)
                self.offsets[stream] = 0
                continue
            self.offsets[stream] = size
            if not data:
                continue
            if self.last != stream:
                if self.last is not None:
                    out.write(b"\n")
                out.write(f"==> {_rel(self.home, path)} <==\n".encode())
                self.last = stream
            out.write(data)
        out.flush()


def _ended(engine: Backend, workflow_id: str, logs: AttemptLogs) -> str | None:
    """Why a followed attempt is over, or None while it runs."""
    try:
        st = engine.status(workflow_id)
        events = engine.history(workflow_id)
    except NotFound:
        return "its workflow is gone"
    for e in events:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        if (
            e.type not in _NOT_AN_END
            and a.get("activity_id") == logs.activity_id
            and int(a.get("attempt") or 0) == logs.attempt
        ):
            return e.type.removeprefix("activity_")
    if st.state != "running":
        return f"{workflow_id} is {st.state}"
    worker = runstatus.worker_info(engine, workflow_id, time.time(), {})
    if worker.get("live") is False and worker.get("activity_id") in (None, logs.activity_id):
        return f"no live worker ({worker.get('reason')})"
    if worker.get("activity_id") == logs.activity_id and (worker.get("attempt") or 0) > logs.attempt:
        return f"attempt {worker['attempt']} started"
    return None


def _first(
    engine: Backend, home: Path, workflow_id: str, activity: str | None, attempt: int | None, follow: bool
) -> tuple[AttemptLogs, str | None]:
    """``choose``; with ``follow``, waits while the run is running and has no output yet (a detached run
    waiting for its worker), as ``kubectl logs -f`` waits for its container."""
    while True:
        try:
            return choose(engine, home, workflow_id, activity, attempt)
        except NoOutputYet:
            newest = app.latest_run(engine, _base(workflow_id))
            if not follow or newest is None or newest.state != "running":
                raise
        time.sleep(FOLLOW_POLL_S)


@click.command()
@click.argument("workflow_id", metavar="train/NAME")
@click.option(
    "--activity",
    "activity",
    default=None,
    metavar="ID",
    help="The activity (train-000100, eval-000100-ppl, corpus-NAME; default: the newest started).",
)
@click.option(
    "--attempt",
    "attempt",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Its attempt N (default: the newest).",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing while the attempt runs; end when it ends.")
@home_option
@edge
def logs(workflow_id: str, activity: str | None, attempt: int | None, follow: bool, home: str | None) -> None:
    """Print a run's trainer output (stdout and stderr) of one activity attempt.

    Kept per attempt in runs/<name>/activity/<activity-id>/logs/g<G>-a<N>/{stdout,stderr}.log (G: the
    workflow generation of the run, N: the attempt; bounded: the first 64 KiB and the last 4 MiB of each,
    a line says how much was dropped between), on success too. Default: the newest attempt of the newest
    activity; train/NAME/G: of the run's workflow G only (train/tiny/2 continued train/tiny after a cancel
    or a failure). --follow prints new output as it comes until the attempt ends (one line on stderr says
    how); on a running run with no output yet (detached, no worker yet) it waits for the first attempt.

    \b
    Exit codes: 0; 2 an unknown run, activity or attempt, or nothing kept yet.
    \b
    Examples:
      ctl logs train/tiny
      ctl logs train/tiny --activity train-000200 --attempt 1
      ctl logs train/tiny -f
      ctl logs train/tiny/1 --activity train-000200   # its first workflow's attempts
    """
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=False, readonly=True)
    try:
        chosen, wid = _first(engine, home_dir, workflow_id, activity, attempt, follow)
        printer = Printer(home_dir, chosen)
        printer.pump()
        if not follow or wid is None:
            return
        while (why := _ended(engine, wid, chosen)) is None:
            time.sleep(FOLLOW_POLL_S)
            printer.pump()
        printer.pump()
        click.echo(f"ctl logs: {chosen.activity_id}#{chosen.attempt} of {wid} ended: {why}", err=True)
    finally:
        engine.close()
