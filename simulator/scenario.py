"""One simulated TrainRun: the real engine and workflow code, fake activities, a virtual clock.

``run_scenario`` runs a ``Scenario`` in a home folder under a ``FaultPlan``. Whenever the plan
kills the worker (``SimulatedCrash``), the Engine object is dropped with everything it held in
memory (its store connection closed, as a dead process's would be) and a fresh Engine is opened
on the same database and files, which recovers and runs on, until the workflow ends. The
virtual clock and the ledger belong to the simulator and survive; nothing else does.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from contracts.layout import RunHome
from engine import Engine, Event, NotFound, VirtualClock, read_events
from engine import testing as leases  # the engine's testing door: lease owners marked dead or live
import workflows
from workflows.models import ACTIVITY_CORPUS, ACTIVITY_EVAL, ACTIVITY_TRAIN, WORKFLOW_TRAIN_RUN, TrainRunInput

from .convergence import CONVERGENCE_KIND, Converged
from .fakes import FakeActivities, FilesOverlay
from .faults import FaultPlan, FaultyClock, FaultyStore, SimulatedCrash
from .ledger import Ledger, TailLedger
from .prefix import use_prefix
from .release import publish_fake, run_releases
from .snapshot_home import SnapshotHome, copy_committed, link_tree, new_home, remove_home, unread_of

START_TIME = 1_700_000_000.0
MAX_LIVES = 10_000  # a scenario that never ends is a bug of the engine: stop and say so


@dataclass(frozen=True)
class Scenario:
    """A TrainRun to simulate (defaults: the seed's hand example, section 3)."""

    name: str = "tiny"
    steps: int = 1200
    eval_every: int = 500
    eval_interval_s: float = 30.0
    suites: tuple[str, ...] = ("ppl",)
    checkpoint_every: int = 100
    seed: int = 7
    corpus: bool = False  # CorpusBuild first (TrainRun's optional first step)
    fail_suites: tuple[str, ...] = ()  # suites that fail for good (pitfall 9)
    oom_at: tuple[tuple[int, int], ...] = ()  # (step, times): retryable trainer failures (pitfall 4)
    # early stopping (tinyllm/selection.py): the trainer stops at this checkpoint step (0: never), as a
    # metric that stopped improving would; its decision is in the checkpoint, so a resume there says it again
    stop_at: int = 0
    # ModelRelease requests after the TrainRun (simulator/release.py): one per entry, "pass" or "fail" (its gate)
    release: tuple[str, ...] = ()
    select: str = "latest"  # the release's candidate: "latest", or "best" (the early stop's best; needs stop_at)

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "steps": self.steps,
            "eval_every": self.eval_every,
            "eval_interval_seconds": self.eval_interval_s,
            "checkpoint_every": self.checkpoint_every,
            "seed": self.seed,
        }

    def input(self) -> dict[str, Any]:
        return TrainRunInput(
            spec=self.spec(),
            corpus={"name": "default"} if self.corpus else None,
            eval_suites=list(self.suites),
            eval_seed=self.seed,
        ).model_dump(mode="json")

    @property
    def workflow_id(self) -> str:
        return f"train/{self.name}"

    def ends(self) -> list[int]:
        """The seed's b_i = min(i*e, N) until b_i = N (section 2.1), written out independently; with
        ``stop_at``, those up to the first segment that reaches it (the later ones never run)."""
        if self.eval_every <= 0 or self.eval_every >= self.steps:
            out = [self.steps]
        else:
            out, b = [], self.eval_every
            while b < self.steps:
                out.append(b)
                b += self.eval_every
            out.append(self.steps)
        if self.stop_at:
            out = [b for b in out if b < self.stop_at] + [next(b for b in out if b >= self.stop_at)]
        return out

    def final_step(self) -> int:
        """Where the run ends: the early stop's step, else ``steps``."""
        return self.stop_at or self.steps

    def flags(self) -> str:
        """The command-line flags that rebuild this scenario."""
        out = (
            f"--steps {self.steps} --eval-every {self.eval_every} --eval-interval {self.eval_interval_s:g} "
            f"--suites {','.join(self.suites) or 'none'} --checkpoint-every {self.checkpoint_every} "
            f"--seed {self.seed}"
        )
        if self.corpus:
            out += " --corpus"
        if self.fail_suites:
            out += f" --fail-suites {','.join(self.fail_suites)}"
        if self.oom_at:
            out += " --oom-at " + ",".join(f"{s}x{n}" for s, n in self.oom_at)
        if self.stop_at:
            out += f" --stop-at {self.stop_at}"
        if self.release:
            out += f" --release --gate {','.join(self.release)} --select {self.select}"
        return out


@dataclass
class Outcome:
    """What one simulated run left behind."""

    scenario: Scenario
    workflow_id: str
    home: Path
    state: str
    result: Any
    error: dict | None
    events: list[Event]
    ledger: Ledger
    plan: FaultPlan
    lives: int
    clock: VirtualClock | None = None
    cancel_done: bool = False  # a cancel was requested and recorded while the run was running
    continued: "Outcome | None" = None  # the same spec started again after a cancel
    extra: dict[str, Any] = field(default_factory=dict)


def _open_engine(
    db: Path, clock, plan: FaultPlan, fakes: FakeActivities, workflow_fn: Callable | dict | None
) -> Engine:
    """``workflow_fn``: a mutant of TrainRun, or of the release (a dict: ``ModelRelease`` -> its workflow
    function, ``publish`` -> a replacement of ``workflows.release.publish``; simulator/mutants.py)."""
    eng = Engine(store=FaultyStore(db, plan), clock=FaultyClock(clock, plan), inline_activities=True)
    mutant = workflow_fn if isinstance(workflow_fn, dict) else {}
    workflows.register(
        eng,
        activities={
            ACTIVITY_TRAIN: fakes.train,
            ACTIVITY_EVAL: fakes.eval,
            ACTIVITY_CORPUS: fakes.corpus,
            workflows.ACTIVITY_PUBLISH: publish_fake(fakes, mutant.get(workflows.ACTIVITY_PUBLISH)),
        },
    )
    if callable(workflow_fn):  # a mutant replaces TrainRun
        eng.register_workflow(WORKFLOW_TRAIN_RUN, workflow_fn, input_type=TrainRunInput)
    if workflows.WORKFLOW_MODEL_RELEASE in mutant:
        eng.register_workflow(
            workflows.WORKFLOW_MODEL_RELEASE,
            mutant[workflows.WORKFLOW_MODEL_RELEASE],
            input_type=workflows.ModelReleaseInput,
        )
    return eng


def _crash_cleanup(eng: Engine | None) -> None:
    """The process died: its connection goes away (any open transaction is rolled back)."""
    if eng is None:
        return
    leases.mark_dead(eng.owner)
    eng.store.close()


def run_scenario(
    scn: Scenario,
    home: Path,
    plan: FaultPlan,
    *,
    workflow_fn: Callable | dict[str, Callable] | None = None,
    cancel_at: int | None = None,
    stop_at: int | None = None,
    workflow_id: str | None = None,
    ledger: Ledger | None = None,
    clock: VirtualClock | None = None,
    oom_left: dict[int, int] | None = None,
    live: dict | None = None,
    files: dict[str, int] | FilesOverlay | None = None,
    prefix=None,
    noting: bool = False,
    index=None,
) -> Outcome:
    """Run ``scn`` to its end under ``plan``, restarting the worker after every simulated kill.

    ``cancel_at``: at that position (or the first one after it outside a transaction) a cancel
    of the workflow is recorded, as ``ctl cancel`` would from another process.
    ``stop_at``: at that position (or the first one after it where an engine is running) the engine is
    asked to stop politely (``Engine.request_stop``, what ctl's SIGTERM handler does); at a timer wait
    the wait is cut in half (the signal came in the middle of it). The life ends when the engine
    returns with the workflow still running (ctl exits 143: ledger ``ctl-exit``), and the same
    command starts again (a fresh engine), as a scheduler brings a preempted job back.
    ``oom_left``: the trainer failures still to come (default: the scenario's).
    ``live``: filled with the current ``engine`` and ``fakes`` (for ``snapshot``).
    ``files``: the digests of the files already in ``home`` (``FakeActivities.files``).
    ``prefix``: a ``simulator.prefix.ReplayPrefix`` the engine's first replay may start from.
    ``noting``: fresh replayers note reads of ``is_replaying`` (``simulator.prefix.NotingRuntime``).
    ``index``: a ``ReplayPrefix`` whose indexes a replay from scratch may copy (``prefix.use_prefix``).
    """
    ledger = ledger if ledger is not None else Ledger()
    clock = clock if clock is not None else VirtualClock(START_TIME)
    wid = workflow_id or scn.workflow_id
    db = RunHome(home).engine_db
    fakes = FakeActivities(
        home,
        ledger,
        plan,
        fail_suites=scn.fail_suites,
        oom_at=dict(scn.oom_at) if oom_left is None else oom_left,
        files=files,
        stop_at=scn.stop_at,
    )
    live = live if live is not None else {}
    live["fakes"] = fakes
    out = {"cancel_done": False}

    def request_cancel(kind: str) -> bool:
        if kind == "before-commit":
            return False  # a transaction is open on the worker's connection; ctl waits for it
        other = Engine(db, clock=clock)
        try:
            try:
                done = other.cancel(wid)
            except NotFound:
                return False  # not started yet: cancel right after it is
        finally:
            other.close()
        out["cancel_done"] = out["cancel_done"] or done
        ledger.record("cancel", wf=wid, recorded=done)
        return True

    if cancel_at is not None:
        plan.actions[cancel_at] = request_cancel
    current: dict[str, Engine | None] = {"engine": None}  # the engine of this life (None between lives)

    def request_stop(kind: str) -> bool:
        eng = current["engine"]
        if eng is None:
            return False  # no ctl running yet (opening one): the signal comes once it runs
        eng.request_stop("SIGTERM")
        plan.short_wait = kind == "timer-wait"
        ledger.record("stop", position=plan.count - 1, where=kind)
        return True

    if stop_at is not None:
        plan.actions[stop_at] = request_stop
    lives = 0
    released = None
    while True:
        lives += 1
        if lives > MAX_LIVES:
            raise RuntimeError(f"{wid}: still running after {MAX_LIVES} worker lives")
        eng = current["engine"] = None
        try:
            eng = _open_engine(db, clock, plan, fakes, workflow_fn)
            current["engine"] = eng
            if prefix is not None or noting or index is not None:
                use_prefix(eng, prefix, index)
            live["engine"] = eng
            eng.start(WORKFLOW_TRAIN_RUN, wid, scn.input())
            status = eng.run_until_complete(wid)
            if eng.stop is not None and status.state == "running":  # stopped politely: ctl exits 143
                ledger.record("ctl-exit", position=plan.count - 1, code=143)
                eng.close()
                continue
            if scn.release and status.state == "completed":  # then the release requests (simulator/release.py)
                live.setdefault("release_from", plan.count)  # the first position after the TrainRun
                released = run_releases(eng, scn, home, status.result)
            break
        except SimulatedCrash as crash:
            ledger.record("crash", position=crash.position, where=f"{crash.kind} {crash.label}")
            _crash_cleanup(eng)
    events = eng.history(wid)
    eng.close()
    return Outcome(
        scenario=scn,
        workflow_id=wid,
        home=home,
        state=status.state,
        result=status.result,
        error=status.error,
        events=events,
        ledger=ledger,
        plan=plan,
        lives=lives,
        clock=clock,
        cancel_done=out["cancel_done"],
        extra={} if released is None else {"releases": released},
    )


@contextlib.contextmanager
def _owner_dead(owner: dict):
    """While a snapshot recovers, the paused uninterrupted worker counts as dead (it "crashed").

    The engine tells a dead in-process owner by its instance id missing from the live set
    (``engine.leases``); the paused worker's id is put back before it resumes.
    """
    leases.mark_dead(owner)
    try:
        yield
    finally:
        leases.mark_live(owner)


def recover_from_snapshot(
    scn: Scenario,
    src_home: Path,
    position: int,
    where: str,
    live: dict,
    ledger: Ledger,
    clock: VirtualClock,
    *,
    workflow_fn: Callable | dict[str, Callable] | None = None,
    watch: Callable | None = None,
    prefix=None,
    pool: SnapshotHome | None = None,
    index=None,
    timing=None,
) -> Outcome:
    """The worker of ``src_home`` dies at ``position``: a new worker recovers from a copy of its files.

    What survives a kill is exactly the files (the database with what was committed, the
    checkpoints) and the simulator's own ledger and clock: so a run killed at ``position``
    is the files copied at that moment, then a fresh Engine on them, run to the end. The
    uninterrupted run is paused meanwhile and carries on afterwards, untouched.

    ``watch(live, clock, label)``, when given, is called at every convergence point of the recovery
    (simulator/convergence.py) and may stop it by raising ``Converged``: then the Outcome is
    the run so far (state ``running``): ``events`` holds only the events recorded after the
    copied ones, ``extra`` the ``converged`` target and ``copied_events`` (their count).
    """
    c0 = time.process_time()
    if pool is not None:
        home = pool.take(live["fakes"])
    else:
        home = new_home()
        link_tree(os.fspath(src_home), os.fspath(home), unread=unread_of(bool(scn.release)))
    copied = copy_committed(RunHome(src_home).engine_db, RunHome(home).engine_db, scn.workflow_id)
    if timing is not None:  # (``timing``: a Counter of CPU seconds by part, the sweep's)
        timing["cpu: snapshots (files, database copy)"] += time.process_time() - c0
    led = TailLedger(ledger.entries)  # (the uninterrupted run is paused: its entries do not change meanwhile)
    led.record("crash", position=position, where=where)
    plan = FaultPlan(count=position + 1)
    rlive: dict = {"copied_events": copied}
    rclock = VirtualClock(clock.now())
    if watch is not None:
        plan.observer = lambda n, kind, label: watch(rlive, rclock, label)
        plan.observe_only = (CONVERGENCE_KIND,)
    with _owner_dead(live["engine"].owner):
        try:
            o = run_scenario(
                scn,
                home,
                plan,
                workflow_fn=workflow_fn,
                ledger=led,
                clock=rclock,
                oom_left=dict(live["fakes"].oom_left),
                live=rlive,
                files=FilesOverlay(live["fakes"].files, live["fakes"]._files_sum),
                prefix=prefix,
                noting=True,
                index=index,
            )
            if pool is not None:
                pool.returned(rlive["fakes"])
            return o
        except Converged as stop:
            if pool is not None:
                pool.returned(rlive["fakes"])
            eng = rlive["engine"]
            try:
                with leases.store_lock(eng):
                    events = read_events(eng.store.conn, scn.workflow_id, copied)
            finally:
                _crash_cleanup(eng)
            return Outcome(
                scenario=scn,
                workflow_id=scn.workflow_id,
                home=home,
                state="running",
                result=None,
                error=None,
                events=events,
                ledger=led,
                plan=plan,
                lives=1,
                clock=rclock,
                extra={"converged": stop.target, "copied_events": copied},
            )
        except Exception:  # the sweep reports it (with the command that reruns it): no home left behind
            eng = rlive.get("engine")
            if eng is not None:
                _crash_cleanup(eng)
            if pool is not None:
                pool.drop()
            else:
                remove_home(home)
            raise
