"""The real-process fault campaign: ``python -m simulator campaign --seed S [--runs N] [--trainer examples]``.

Each campaign run trains a tiny spec (two segments, an evaluation of each, a durable wait
between them) to its end with real ``ctl train`` or ``ctl train --detach`` + ``ctl worker``
processes, while seeded random faults hit it at random moments. The trainer is tinyllm (ppl
evaluations), or with ``--trainer examples`` / ``--spec FILE`` a user's own trainer named by the
spec (simulator/proving/campaign_targets.py):

- ``readers``: ``ctl status``, ``ctl list``, ``ctl history --json`` in other processes;
- ``cancel``: ``ctl cancel`` from another process, then the same command continues the run;
- ``kill-ctl`` / ``kill-worker``: SIGKILL of the process running the workflow, then it is started again;
- ``kill-trainer``: SIGKILL of the trainer child in flight (train, eval or corpus);
- ``stop-trainer``: SIGSTOP of that child for up to two seconds, then SIGCONT;
- ``second-train``: a second ``ctl train`` of the same spec, concurrently;
- ``kill-in-checkpoint-write`` (user trainers on ``tinyllm.durable``): once the run has a checkpoint,
  the next checkpoint write of a train child SIGKILLs it after some files are written, before the
  manifest (its retry resumes from the checkpoint before);
- ``preempt`` / ``preempt-group``: a graceful preemption, SIGTERM to ctl (or the worker) alone, or to
  every process of the job at once as Slurm sends it; ctl must exit 143 within the stop's grace, and the
  same command runs again (simulator/proving/campaign_preempt.py).

Faults are due at steps of the run (a plain step, a checkpoint, a segment boundary: drawn by the
seed, simulator/proving/campaign_progress.py), so they land inside the run whatever the machine's speed; one
due at a checkpoint or a segment boundary waits until that checkpoint exists (LATEST).
Each run's line counts, from the engine's history (capped by the trainer's own resume lines, when it
prints them), the trainer attempts that resumed from a checkpoint inside a segment; a run with none
is ``untested`` (it proves no resume): its faults count as "in untested runs", never as "survived",
and the campaign then exits 3 unless ``--allow-untested``.

The oracle, after every run (``Run.check``):

- every event any reader printed is still in the final history of its workflow, unchanged, and
  no ctl process of the run ever holds a deleted engine.db* file open (a dropped lock, defect 1);
- a cancel that ``ctl cancel`` reported as recorded ends that workflow canceled;
- each evaluation completed exactly once over all of the run's workflows, and its output files
  were never rewritten after they first appeared;
- no two trainer attempts wrote checkpoints during overlapping intervals (one trainer at a time),
  and no checkpoint step was written twice (no step redone beyond the newest checkpoint);
- the final ``final_loss_hex`` and digest (and each segment's) equal an uninterrupted run's;
- a graceful preemption lost no step: each preempted training attempt saved every step it had done, and
  the next attempt resumed from that checkpoint (simulator/proving/campaign_preempt.py);
- no process of the run is left when it ends.

A failure prints its seed and fault sequence; ``--seed S --runs N`` replays the same faults in
the same order at the same steps. Exit 0 when every run passed and was tested, 1 on any
violation (or when the uninterrupted run itself fails: a trainer that fails every attempt ends
the campaign at once instead of being restarted until RUN_TIMEOUT_S), 3 when a run passed untested
(without ``--allow-untested``), 2 on bad arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from contracts.activity_ids import TRAIN_PREFIX, is_eval, is_train
from contracts.exits import EXIT_CANCELED
from contracts.layout import RunHome

from . import campaign_preempt, procs
from .campaign_reference import Reference, ReferenceFailed
from .campaign_progress import fault_points, history_resumes, progress_step
from .campaign_targets import ARMED, NAME, TINYLLM, Target
from .core import compare_results, latest_step

WID = f"train/{NAME}"
RUN_TIMEOUT_S = 900.0
ARM_TIMEOUT_S = 30.0  # an armed checkpoint-write fault no trainer claimed by then is disarmed (missed)
POLL_S = 0.1
SKIPPED = (": missed", "(no child", "(nothing running)", "(not recorded")  # faults that found nothing to hit
CHILD_WAIT_S = 10.0  # a trainer fault due at a step waits this long for a child in flight (a retry's start)
MAX_CHILD_KILLS = 2  # per activity: below every step's max_attempts, so the run can always finish
MAX_UNASKED_EXITS = 2  # ctl train / ctl worker exiting on its own this often: the run cannot finish, give up
# (each is already a violation; restarting a run whose trainer fails every attempt only spun until RUN_TIMEOUT_S)


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class Monitor:
    """Watches the run's files from outside (never the database): progress lines and eval outputs."""

    def __init__(self, home: Path, pids=lambda: []):
        self.home = home
        self.pids = pids  # the run's live ctl processes: none may hold a deleted engine.db* open
        self.deleted: dict[int, list[str]] = {}
        self.progress: dict[tuple[str, float], list[dict]] = {}  # (file, first line's time) -> its lines
        self.outputs: dict[str, tuple] = {}  # eval output -> (inode, mtime_ns, size, sha, complete) when first seen
        self.rewritten: list[str] = []
        self.resumes: dict[tuple[str, object], int | None] = {}  # a trainer's resume from a checkpoint -> its step
        self.segment_ends: set[int] = {0}  # from the train activities' ids (train-000020: a segment ends at 20)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="campaign-monitor", daemon=True)

    def __enter__(self) -> "Monitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.sample()

    def sample(self) -> None:
        for pid in self.pids():
            gone = procs.deleted_db_files(pid)
            if gone and pid not in self.deleted:
                self.deleted[pid] = gone
        for f in RunHome(self.home).run(NAME).activity_root.glob(f"{TRAIN_PREFIX}*/progress-*.jsonl"):
            try:
                lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip().endswith("}")]
            except (OSError, ValueError):
                continue
            self.segment_ends.add(int(f.parent.name.split("-")[-1]))
            for x in lines:
                if isinstance(x, dict) and x.get("event") == "resume" and x.get("resumed_from"):
                    self.resumes[(str(f), x.get("time"))] = x.get("step")
            lines = [
                x
                for x in lines
                if isinstance(x, dict)
                and "checkpoint" in x  # not liveness or resume lines
                and x.get("event", "checkpoint") == "checkpoint"
            ]  # (tinyllm's have no event, DurableRun's say so)
            if not lines:
                continue
            key = (str(f), lines[0]["time"])  # one attempt's file (a redelivery replaces it)
            if len(lines) >= len(self.progress.get(key, [])):
                self.progress[key] = lines
        for f in list(self.home.glob("evals/*/*/summary.json")) + list(self.home.glob("evals/*/*/results.jsonl")):
            try:
                st = f.stat()
            except OSError:
                continue
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            first = self.outputs.get(str(f))
            if first is None:  # with whether its evaluation was complete (tinyllm's marker) when first seen
                self.outputs[str(f)] = (*sig, _sha(f), (f.parent / "complete.json").exists())
            elif first[:3] != sig and str(f) not in self.rewritten:
                # an evaluation killed after writing its files but before its complete marker is run again
                # (tinyllm/evals.py finished_before): the same bytes again are not a rewrite; anything else is
                if first[4] or _sha(f) != first[3]:
                    self.rewritten.append(str(f))
                else:
                    self.outputs[str(f)] = (*sig, first[3], (f.parent / "complete.json").exists())

    def mid_segment_resumes(self) -> int:
        """Trainer attempts that resumed from a checkpoint inside a segment (not from the previous segment's end)."""
        return sum(1 for step in self.resumes.values() if step not in self.segment_ends)

    def violations(self) -> list[str]:
        bad = [f"eval output rewritten after it first appeared: {p}" for p in self.rewritten]
        bad += [
            f"ctl process {pid} commits into a deleted file: {', '.join(files)}" for pid, files in self.deleted.items()
        ]
        spans: list[tuple[float, float, str]] = []
        steps: dict[int, str] = {}
        for (path, t0), lines in sorted(self.progress.items()):
            who = f"{Path(path).parent.name}/{Path(path).name}@{t0:.3f}"
            spans.append((lines[0]["time"], lines[-1]["time"], who))
            for ln in lines:
                if ln["step"] in steps and steps[ln["step"]] != who:
                    bad.append(f"checkpoint step {ln['step']} written by {steps[ln['step']]} and again by {who}")
                steps.setdefault(ln["step"], who)
        spans.sort()
        for (_a0, a1, wa), (b0, _b1, wb) in zip(spans, spans[1:]):
            if b0 < a1:
                bad.append(f"two trainers at once: {wa} wrote checkpoints until {a1:.3f}, {wb} from {b0:.3f}")
        return bad


@dataclass(eq=False)
class Run:
    """One campaign run: its home, processes, the faults applied and what readers saw."""

    index: int
    seed: int
    base: Path
    spec: Path
    rng: random.Random
    worker_mode: bool
    target: Target = TINYLLM
    home: Path = field(init=False)
    primary: subprocess.Popen | None = None
    extras: list = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    seen: list[tuple[str, list[dict]]] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)
    child_kills: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    result: dict | None = None
    mid_resumes: int = 0  # trainer attempts that resumed from a checkpoint inside a segment (engine history)
    unasked: int = 0  # exits of ctl train / ctl worker that no fault asked for
    reference_failed: Callable[[], str | None] = lambda: (
        None
    )  # the uninterrupted run's failure, once it failed (Reference.failed)
    preempted: list[dict] = field(default_factory=list)  # the training attempts a preemption fault stopped

    def __post_init__(self) -> None:
        self.home = self.base / f"run-{self.index}"

    # ---- processes ------------------------------------------------------------------------

    def start(self) -> None:
        """(Re)start what runs the workflow: ``ctl train``, or ``ctl train --detach`` then a ``ctl worker``."""
        if _STOPPING.is_set():
            raise KeyboardInterrupt("campaign interrupted")
        if self.worker_mode:
            p = procs.run(self.home, "train", "--spec", str(self.spec), *self.target.train_args, "--detach")
            if p.returncode != 0:
                self.problems.append(f"ctl train --detach exited {p.returncode}: {p.stderr.strip()[-300:]}")
            if self.primary is None or self.primary.poll() is not None:
                self.primary = procs.spawn(self.home, "worker", stdout=subprocess.DEVNULL)
        else:
            self.primary = procs.spawn(self.home, "train", "--spec", str(self.spec), *self.target.train_args)

    def children(self) -> list[tuple[int, str]]:
        """Live trainer children of this home (train, eval, corpus), with the activity id each serves."""
        out = []
        for pid, cmd in procs.processes_in(self.home):
            if self.target.is_trainer(cmd):
                parts = [p for p in cmd.split() if p.endswith("spec.json")]
                out.append((pid, Path(parts[0]).parent.name if parts else "?"))
        return out

    def _wait_gone(self, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.children() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self.children():
            self.problems.append(f"{what}: trainer processes {self.children()} outlived it")

    # ---- faults ---------------------------------------------------------------------------

    def fault(self, kind: str) -> str:
        """Apply one fault now; what was done, in words (or why nothing could be)."""
        if kind == "readers":
            for args in (("status", WID), ("list",), ("status",)):
                p = procs.run(self.home, *args)
                if (
                    p.returncode not in (0, EXIT_CANCELED)
                    and "no workflow" not in p.stderr
                    and "no ctl database" not in p.stderr
                ):
                    self.problems.append(f"ctl {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
            p = procs.run(self.home, "history", WID, "--json")
            if p.returncode == 0:
                out = json.loads(p.stdout)
                self.seen.append((out["workflow_id"], out["events"]))
                return f"readers (saw {len(out['events'])} events of {out['workflow_id']})"
            return "readers (no workflow yet)"
        if kind == "cancel":
            p = procs.run(self.home, "cancel", WID)
            if p.returncode == 0 and "cancel requested for " in p.stdout:
                wid = p.stdout.split("cancel requested for ", 1)[1].split(";")[0].strip()
                self.canceled.append(wid)
                self._after_cancel()
                return f"cancel of {wid}, then continued"
            return f"cancel (not recorded: {(p.stdout + p.stderr).strip()[-120:]})"
        if kind == "kill-ctl":
            if self.primary is None or self.primary.poll() is not None:
                return "kill-ctl (nothing running)"
            self.primary.kill()
            self.primary.wait()
            what = "worker" if self.worker_mode else "ctl train"
            if not self.extras_alive():
                self._wait_gone(f"SIGKILL of {what}")
            self.start()
            return f"SIGKILL of {what}, started again"
        if kind in ("kill-trainer", "stop-trainer"):
            deadline = time.monotonic() + CHILD_WAIT_S  # due at a step: the trainer there (or its retry, its eval)
            while True:
                kids = [(pid, aid) for pid, aid in self.children() if self.child_kills.get(aid, 0) < MAX_CHILD_KILLS]
                if kids or time.monotonic() > deadline or self.finished():
                    break
                time.sleep(POLL_S)
            if not kids:
                return f"{kind} (no child in flight)"
            pid, aid = self.rng.choice(kids)
            if kind == "kill-trainer":
                self.child_kills[aid] = self.child_kills.get(aid, 0) + 1
                _signal(pid, signal.SIGKILL)
                return f"SIGKILL of {self.who} {aid} (pid {pid})"
            pause = round(self.rng.uniform(0.2, 2.0), 2)
            _signal(pid, signal.SIGSTOP)
            time.sleep(pause)
            _signal(pid, signal.SIGCONT)
            return f"SIGSTOP of {self.who} {aid} (pid {pid}) for {pause} s, then SIGCONT"
        if kind == "kill-in-checkpoint-write":
            return self._kill_in_checkpoint_write()
        if kind in campaign_preempt.KINDS:
            if _STOPPING.is_set():
                raise KeyboardInterrupt("campaign interrupted")
            return campaign_preempt.preempt(self, kind, NAME, WID)
        if kind == "second-train":
            if _STOPPING.is_set():
                raise KeyboardInterrupt("campaign interrupted")
            self.extras.append(procs.spawn(self.home, "train", "--spec", str(self.spec), *self.target.train_args))
            return "a second ctl train of the same spec"
        raise ValueError(kind)

    @property
    def who(self) -> str:
        return "trainer" if self.target.custom else "tinyllm"

    def _kill_in_checkpoint_write(self) -> str:
        """Arm the helper's fault file; the next checkpoint write of a train child claims it and dies
        inside that write (tinyllm.durable, ``TINYLLM_FAULT=durable.checkpoint_write@armed:FILE``)."""
        kind = "kill-in-checkpoint-write"
        seen = dict(self.children())  # (a train child not yet started claims it too)
        if any(self.child_kills.get(aid, 0) >= MAX_CHILD_KILLS for aid in seen.values() if is_train(aid)):
            return f"{kind} (no child in flight that may be killed again)"
        deadline = time.monotonic() + ARM_TIMEOUT_S
        latest = RunHome(self.home).run(NAME).latest
        while not latest.exists() and time.monotonic() < deadline:  # so that the killed write is not the first:
            time.sleep(POLL_S)  # its retry resumes from a checkpoint (the partial one cleaned up)
        if not latest.exists():
            return f"{kind}: missed, no checkpoint within {ARM_TIMEOUT_S:.0f} s"
        armed = self.home / ARMED
        armed.write_text("")
        fired: list[Path] = []
        while not fired and time.monotonic() < deadline:
            seen.update(self.children())
            fired = list(self.home.glob(f"{ARMED}.fired-*"))
            if not fired:
                time.sleep(POLL_S)
        if not fired:
            try:
                armed.unlink()  # disarm; gone already means a trainer claimed it just now
            except FileNotFoundError:
                fired = list(self.home.glob(f"{ARMED}.fired-*"))
        if not fired:
            return f"{kind}: missed, no checkpoint write within {ARM_TIMEOUT_S:.0f} s"
        pid = int(fired[0].name.rsplit("-", 1)[1])
        fired[0].unlink()
        aid = seen.get(pid, "?")
        self.child_kills[aid] = self.child_kills.get(aid, 0) + 1
        return f"SIGKILL inside a checkpoint write of {self.who} {aid} (pid {pid})"

    def pids(self) -> list[int]:
        """The run's ctl processes still alive (the one running the workflow and any second ctl train)."""
        return [p.pid for p in [self.primary, *self.extras] if p is not None and p.poll() is None]

    def extras_alive(self) -> bool:
        return any(p.poll() is None for p in self.extras)

    def _after_cancel(self) -> None:
        """A recorded cancel: the run's process ends it (ctl train exits 130); the same command continues."""
        if not self.worker_mode and self.primary is not None:
            try:
                self.primary.wait(timeout=RUN_TIMEOUT_S / 3)
            except subprocess.TimeoutExpired:
                self.problems.append("ctl train did not exit after a recorded cancel")
                return
            if self.primary.returncode not in (EXIT_CANCELED, 0):
                self.problems.append(f"ctl train exited {self.primary.returncode} after a cancel (expected 130)")
        else:
            deadline = time.monotonic() + RUN_TIMEOUT_S / 3
            while time.monotonic() < deadline:
                st = procs.run(self.home, "status", self.canceled[-1], "--json")
                if json.loads(st.stdout or "{}").get("state") != "running":
                    break
                time.sleep(0.5)
        self.start()

    # ---- the run -----------------------------------------------------------------------------

    def drive(self, n_faults: int) -> None:
        plan = [self.rng.choice(self.target.faults) for _ in range(n_faults)]
        if self.worker_mode:
            plan = ["kill-worker" if k == "kill-ctl" else k for k in plan]
        spec = self.target.spec
        points = fault_points(
            self.rng,
            len(plan),
            int(spec["steps"]),
            int(spec.get("checkpoint_every", 100)),
            int(spec.get("eval_every", 0) or 0),
        )
        self.start()
        for kind, (what, step) in zip(plan, points):
            when = f"at {what} {step}"
            if not self._reach(step, checkpointed=what != "step"):
                self.faults.append(f"{kind} {when}: missed, the run had ended")
                continue
            self.faults.append(f"{kind} {when}: " + self.fault("kill-ctl" if kind == "kill-worker" else kind))
        self.finish()

    def _reach(self, step: int, checkpointed: bool = False) -> bool:
        """Wait until the run's trainer has reached ``step`` (its progress, not the clock), or with
        ``checkpointed`` until its checkpoint at ``step`` exists (LATEST); False if the run ended."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        reached = latest_step if checkpointed else progress_step
        while time.monotonic() < deadline and not _STOPPING.is_set():
            if self.gave_up():
                return False  # (the uninterrupted run failed, or ctl kept exiting unasked)
            if reached(self.home, NAME) >= step:
                return not self.finished()
            if self.finished() or (
                not self.worker_mode and self.primary is not None and self.primary.poll() is not None
            ):
                return False  # ended (finish() records an unasked exit and starts it again)
            time.sleep(POLL_S / 5)
        return False

    def gave_up(self) -> bool:
        """The run cannot pass: the uninterrupted run failed, or ctl exited unasked MAX_UNASKED_EXITS times."""
        return self.unasked >= MAX_UNASKED_EXITS or self.reference_failed() is not None

    def _unasked_exit(self, what: str) -> None:
        self.unasked += 1
        self.problems.append(what)
        if self.unasked >= MAX_UNASKED_EXITS:
            self.problems.append(f"gave up after {self.unasked} exits no fault asked for (the run cannot finish)")
        elif self.reference_failed() is None:
            self.start()

    def finished(self) -> bool:
        if self.worker_mode:
            st = procs.run(self.home, "status", WID, "--json")
            return st.returncode == 0 and json.loads(st.stdout).get("state") == "completed"
        return self.primary is not None and self.primary.poll() == 0

    def finish(self) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        assert self.primary is not None  # (start() made it, and each restart a new one)
        while time.monotonic() < deadline:
            if self.gave_up():
                break
            if self.worker_mode:
                if self.finished():
                    self.primary.send_signal(signal.SIGTERM)
                    self.primary.wait(timeout=60)
                    break
                if self.primary.poll() is not None:
                    self._unasked_exit(f"ctl worker exited {self.primary.returncode} on its own")
                time.sleep(0.5)
                continue
            try:  # (in slices: an uninterrupted run failing meanwhile ends the wait)
                out, err = self.primary.communicate(timeout=min(10.0, max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                continue
            if self.primary.returncode == 0:
                break
            self._unasked_exit(f"ctl train exited {self.primary.returncode} unasked: {err.strip()[-300:]}")
        else:
            self.problems.append(f"the run did not finish within {RUN_TIMEOUT_S} s")
        if self.gave_up():
            self.stop_all()  # what still runs of a run that cannot pass (a second ctl train, the worker)
        for p in [] if self.gave_up() else self.extras:  # (killed just now when it gave up)
            try:
                _, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                self.problems.append("a second ctl train did not end after the run completed")
                continue
            if p.returncode not in (0, EXIT_CANCELED):
                self.problems.append(f"a second ctl train exited {p.returncode}: {err.strip()[-300:]}")
        st = procs.run(self.home, "status", WID, "--json")
        out = json.loads(st.stdout or "{}")
        if out.get("state") == "completed":
            self.result = out["result"]
        else:
            self.problems.append(f"{WID} ended {out.get('state')}: {out.get('error')}")

    def stop_all(self) -> None:
        for p in [self.primary, *self.extras]:
            if p is not None and p.poll() is None:
                procs.killpg(p)
        for pid, _ in procs.processes_in(self.home):
            _signal(pid, signal.SIGKILL)

    # ---- the oracle ----------------------------------------------------------------------------

    def check(self, monitor: Monitor, want: dict) -> list[str]:
        bad = list(self.problems)
        self._wait_gone("the end of the run", timeout_s=30)
        left = procs.processes_in(self.home)
        bad += [f"process left at the end: {pid} {cmd[:120]}" for pid, cmd in left]
        histories: dict[str, list[dict]] = {}
        for st in json.loads(procs.run(self.home, "list", "--json").stdout or "[]"):
            wid = st["workflow_id"]  # the run's first workflow is train/camp/1 to ctl (train/camp: the newest)
            histories[wid] = procs.history(self.home, wid + "/1" if wid == WID else wid) or []
            if st["workflow_id"] in self.canceled and st["state"] != "canceled":
                bad.append(f"ctl cancel recorded a cancel of {st['workflow_id']}, which ended {st['state']}")
        for wid, events in self.seen:
            bad += [f"{wid}: a reader saw {m}" for m in procs.missing_events(events, histories.get(wid, []))]
        evals: dict[str, int] = {}
        for events in histories.values():
            for e in events:
                aid = e["attrs"].get("activity_id", "")
                if e["type"] == "activity_completed" and is_eval(aid):
                    evals[aid] = evals.get(aid, 0) + 1
        bad += [f"{aid} completed {n} times" for aid, n in sorted(evals.items()) if n != 1]
        bad += monitor.violations()
        bad += campaign_preempt.resume_violations(histories)
        self.mid_resumes = len(history_resumes(histories))
        if monitor.resumes:  # the trainer prints its resumes: one at LATEST, newer than the heartbeated
            # checkpoint the history knows (a kill between a segment's last checkpoint and its heartbeat),
            # resumed at the segment's end, not inside it
            self.mid_resumes = min(self.mid_resumes, monitor.mid_segment_resumes())
        if self.result is not None:
            bad += compare_results(self.result, want)
            got_evals = [
                [s["summary"] for s in (seg.get("evals") or {}).get("suites", [])] for seg in self.result["segments"]
            ]
            want_evals = [
                [s["summary"] for s in (seg.get("evals") or {}).get("suites", [])] for seg in want["segments"]
            ]
            if len(evals) != sum(map(len, want_evals)) or got_evals != want_evals:  # (a spec may evaluate nothing)
                bad.append(f"evaluations differ from the uninterrupted run's ({len(evals)} completed)")
        return bad


_STOPPING = threading.Event()  # the campaign was interrupted: runs start no more processes
_ACTIVE: set = set()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def one_run(
    seed: int, i: int, base: Path, spec: Path, ref: Reference, faults_per_run: int, target: Target = TINYLLM
) -> tuple[Run, list[str]]:
    """Campaign run ``i`` of ``seed``: drawn mode and faults, driven to its end, checked by the oracle."""
    rng = random.Random(f"{seed}:{i}")
    run = Run(i, seed, base, spec, rng, worker_mode=rng.random() < 0.3, target=target)
    run.reference_failed = ref.failed
    _ACTIVE.add(run)
    try:
        with Monitor(run.home, run.pids) as monitor:
            run.drive(faults_per_run)
        return run, run.check(monitor, ref.result())
    finally:
        run.stop_all()
        _ACTIVE.discard(run)


def campaign(
    seed: int,
    runs: int,
    *,
    faults_per_run: int = 4,
    keep: bool = False,
    jobs: int = 1,
    only: int | None = None,
    want: dict | None = None,
    log=print,
    target: Target = TINYLLM,
    allow_untested: bool = False,
) -> int:
    """The command ``python -m simulator campaign``: 0 when every run passed the oracle and was tested
    (a fault made a trainer resume from a checkpoint inside a segment), 1 when any run failed, 3 when
    one passed untested (unless ``allow_untested``).

    ``jobs`` runs that many campaign runs at once (each in its own home); ``only`` runs just that
    one (a failure's reproduction); ``want`` is the uninterrupted result when already known;
    ``target`` is what is trained (tinyllm, or a spec's own trainer: campaign_targets).
    """
    _STOPPING.clear()  # (a previous campaign of this process may have been stopped)
    base = Path(tempfile.mkdtemp(prefix="campaign-"))
    spec = base / f"{NAME}.json"
    spec.write_text(json.dumps(target.spec))
    ref = Reference(base, spec, want, train_args=target.train_args)
    tally = {"injected": 0, "survived": 0, "failed": 0, "runs": 0, "resumes": 0, "untested": 0, "in_untested": 0}
    lock = threading.Lock()

    def job(i: int) -> None:
        run, bad = one_run(seed, i, base, spec, ref, faults_per_run, target)
        applied = sum(1 for f in run.faults if not any(x in f for x in SKIPPED))
        mode = "ctl worker" if run.worker_mode else "ctl train"
        with lock:
            tally["runs"] += 1
            tally["injected"] += applied
            tally["resumes"] += run.mid_resumes
            if bad:
                tally["failed"] += 1
                log(
                    f"run {i} ({mode}) FAILED (seed {seed}; rerun: python -m simulator campaign{target.cli} "
                    f"--seed {seed} --only {i}); faults in order:"
                )
                for f in run.faults:
                    log(f"    {f}")
                for b in bad:
                    log(f"  - {b}")
                if keep:
                    log(f"  its files are kept in {run.home}")
            else:
                # a fault "survived" only in a run that proved a resume; an untested run's faults are
                # counted apart (issue 24: a verdict names only what was exercised)
                if run.mid_resumes:
                    tally["survived"] += applied
                else:
                    tally["in_untested"] += applied
                untested = "" if run.mid_resumes else ", UNTESTED (no fault made a trainer resume inside a segment)"
                tally["untested"] += 0 if run.mid_resumes else 1
                log(
                    f"run {i} ({mode}): {applied} faults, {run.mid_resumes} resumed mid-segment, oracle passed{untested} (so far {tally['runs']} runs, "
                    f"{tally['injected']} injected, {tally['survived']} survived, {tally['in_untested']} in untested runs): "
                    + "; ".join(run.faults)
                )
                shutil.rmtree(run.home, ignore_errors=True)

    indices = [only] if only is not None else list(range(runs))
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        for f in [pool.submit(job, i) for i in indices]:
            f.result()
        log(
            f"campaign seed {seed} ({target.label}): {tally['runs']} runs, {tally['injected']} faults injected, "
            f"{tally['survived']} survived, {tally['in_untested']} in untested runs, {tally['resumes']} resumed mid-segment, "
            f"{tally['failed']} runs failed, {tally['untested']} untested"
        )
        if tally["failed"]:
            return 1
        if tally["untested"] and not allow_untested:
            log(
                f"campaign seed {seed}: {tally['untested']} run(s) passed without a resume from a mid-segment "
                "checkpoint: nothing proves they resume exactly (more --faults, another --seed, or --allow-untested)"
            )
            return 3
        return 0
    except ReferenceFailed as e:  # nothing to compare with: every run would fail the same way
        _STOPPING.set()
        for run in list(_ACTIVE):
            run.stop_all()
        log(f"campaign seed {seed} ({target.label}) FAILED: {e}")
        return 1
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: kill what the runs started, keep nothing running
        _STOPPING.set()
        for run in list(_ACTIVE):
            run.stop_all()
        log(
            f"campaign seed {seed} interrupted after {tally['runs']} runs: {tally['injected']} faults injected, "
            f"{tally['survived']} survived, {tally['failed']} runs failed"
        )
        return 130
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        ref.close()
        if not (keep and tally["failed"]):
            shutil.rmtree(base, ignore_errors=True)
