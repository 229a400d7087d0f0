"""The MLflow sink's delivery process: ``python -m tinyllm.sinks.mlflow_delivery <trainer pid>``.

Started by ``MlflowSink`` (tinyllm/sinks/mlflow_sink.py) in the trainer, one per attempt; it is the only process
that imports ``mlflow``. Why a process and not a thread: with a local ``sqlite:///`` store, MLflow's
SQLAlchemy store runs in the caller's process and holds the GIL the training loop needs between torch
ops (a delivery thread cost nanoGPT's CPU recipe +6.9% CPU and ~+36% wall per step: docs/benchmarks.md).

Protocol. stdin's first line is the sink's configuration (JSON: tracking URI, experiment, workflow id,
home, spec, resumed step, whether the attempt trains, corpus checksum); the next line ``stop`` asks it to
deliver what is left and exit. stdin's end without ``stop`` (the trainer died) ends it at once; so does
the trainer's death by any signal (``PR_SET_PDEATHSIG``, SIGKILL, checked against ``getppid`` for the
race). SIGTERM and SIGINT are ignored: the engine's stop and a terminal's ^C reach the trainer, which
checkpoints and then sends ``stop``. It inherits the attempt's ``DURABLE_ATTEMPT`` tag and process group,
so the engine's sweep finds it too. stdout is not the trainer's (its last line is the contract's result);
stderr is the trainer's (the sink's one warning line).

What it delivers: the frames of ``runs/<name>/metrics.jsonl`` (JsonlSink writes and flushes a line per
frame, and cut it back to the resumed step before the sink started), read on from where the last read
ended (a torn last line waits until complete), those after the delivered mark, in ``log_batch``
requests gathered for up to ``BATCH_WAIT_S``. The backlog stays in the file: at most ``BATCH_FRAMES``
frames are read ahead of delivery (what replaces the in-memory queue's bound, ``QUEUE_LIMIT``: nothing is
ever dropped). The state file (``runs/<name>/sinks/mlflow.json``) is written by this process and names
it (``pid``) beside the trainer (``trainer_pid``); ``last_step`` is the last step read from the file.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from contracts.layout import METRICS

from . import mlflow_sink as ms
from ..errors import SpecError, stop_signals

POLL_S = 0.1  # how often metrics.jsonl is read for new frames (and how soon a stop is noticed)
PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """SIGKILL this process when the trainer dies, however it dies (Linux); exit now if it already has.
    The kernel sends it when the trainer's *thread* that started this process ends: the sink is built and
    closed by the thread that runs the training loop (tinyllm/trainer.py), which outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: stdin's end still ends it
    if os.getppid() != parent_pid:  # the trainer died before the prctl took effect: no signal will come
        os._exit(0)


class Tail:
    """The whole lines of metrics.jsonl, read on from where the last read ended."""

    def __init__(self, path: Path):
        self.path = path
        self.file: BinaryIO | None = None

    def frames(self, limit: int, final: bool = False) -> tuple[list[tuple[int, dict]], bool]:
        """Up to ``limit`` frames ``(step, frame)``, and whether the file's end was reached. A last line
        without its newline is being written: it waits for the next read (``final``: taken as it is)."""
        if self.file is None:
            try:
                self.file = open(self.path, "rb")
            except OSError:
                return [], True
        out: list[tuple[int, dict]] = []
        while len(out) < limit:
            start = self.file.tell()
            line = self.file.readline()
            if not line:
                return out, True
            if not line.endswith(b"\n") and not final:
                self.file.seek(start)
                return out, True
            try:
                frame = json.loads(line)
            except ValueError:
                continue  # a torn line of a killed attempt
            step = frame.get("step") if isinstance(frame, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                out.append((step, frame))
        return out, False


class Delivery:
    def __init__(self, cfg: dict, stop: threading.Event):
        self.cfg, self.stop = cfg, stop
        self.run_dir = Path(cfg["run_dir"])
        self.tail = Tail(self.run_dir / METRICS)
        self.state = {
            "tracking_uri": cfg["tracking_uri"],
            "experiment": cfg["experiment"],
            "workflow_id": cfg["workflow_id"],
            "run_id": None,
            "delivered_step": None,
            "last_step": cfg["resumed_step"],
            "error": None,
            "run_status": None,
            "pid": os.getpid(),
            "trainer_pid": cfg["trainer_pid"],
        }
        self._state_at = 0.0
        self._written: dict[str, Any] | None = None

    def run(self) -> None:
        try:
            self._deliver_all(*self._connect())
        except ImportError as e:
            self._fail(str(e))
        except Exception as e:  # a dead, refusing or failing server: this attempt's delivery ends here
            self._fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if self.state["error"]:
            self._follow()
        self._write_state(force=True)

    def _connect(self):
        MlflowClient, Metric, _, _ = ms._import_mlflow()
        cfg = self.cfg
        client = MlflowClient(tracking_uri=cfg["tracking_uri"])
        tags = {"durable.code_version": ms.code_version()}
        if cfg.get("corpus_checksum"):
            tags["durable.corpus_checksum"] = cfg["corpus_checksum"]
        run_id = ms.find_or_create_run(
            client, cfg["experiment"], cfg["workflow_id"], Path(cfg["home"]), ms.flatten(cfg["spec"]), tags
        )
        status = client.get_run(run_id).info.status
        if status != "RUNNING" and cfg["trains"]:  # a continuation of a failed or canceled run trains again
            client.update_run(run_id, status="RUNNING")
            status = "RUNNING"
        mark = ms.delivered_mark(client, run_id)
        self.state.update(run_id=run_id, delivered_step=mark, run_status=status)
        self._write_state(force=True)  # the run is found: the trainer's sink.state says so (bench/sinks.py)
        return client, Metric, run_id, mark

    def _deliver_all(self, client, Metric, run_id: str, mark: int) -> None:
        """Catch-up and live alike: every frame of metrics.jsonl after the mark, once (a step at or below
        the highest taken was redone after a resume: MLflow has it already), until ``stop`` and the end."""
        pending: list[tuple[int, dict]] = []
        taken, since = mark, 0.0
        while True:
            stopping = self.stop.is_set()  # before the read: what the trainer wrote before stop is in the file
            frames, at_end = self.tail.frames(ms.BATCH_FRAMES - len(pending), final=stopping)
            for step, frame in frames:
                self.state["last_step"] = max(self.state["last_step"], step)
                if step > taken:
                    if not pending:
                        since = time.monotonic()
                    pending.append((step, frame))
                    taken = step
            due = (
                len(pending) >= ms.BATCH_FRAMES
                or (stopping and at_end)
                or (pending and time.monotonic() - since >= ms.BATCH_WAIT_S)
            )
            if pending and due:
                metrics = [
                    m
                    for step, f in pending
                    for m in ms._metrics(step, f, int(float(f.get("time") or time.time()) * 1000), Metric)
                ]
                if metrics:
                    client.log_batch(run_id, metrics=metrics)
                self.state["delivered_step"] = pending[-1][0]
                pending = []
            self._write_state()  # what changed, at most every STATE_EVERY_S (idle too: never stale for long)
            if stopping and at_end and not pending:
                return
            if at_end:  # else more is in the file already (a catch-up): read on at once
                self.stop.wait(POLL_S)

    def _follow(self) -> None:
        """Delivery has failed: only keep ``last_step`` (for ctl show / doctor), until ``stop``."""
        while True:
            stopping = self.stop.is_set()
            frames, at_end = self.tail.frames(10_000, final=stopping)
            for step, _ in frames:
                self.state["last_step"] = max(self.state["last_step"], step)
            if stopping and at_end:
                return
            self._write_state()
            if at_end:
                self.stop.wait(1.0)

    def _fail(self, why: str) -> None:
        self.state["error"] = why
        ms.warn(
            f"failed ({why}); disabled for this attempt, training goes on; the next attempt catches up "
            "from metrics.jsonl",
            sys.stderr,
        )
        self._write_state(force=True)

    def _write_state(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (self.state == self._written or now - self._state_at < ms.STATE_EVERY_S):
            return
        self._state_at, self._written = now, dict(self.state)
        ms.write_state(self.run_dir, self.state)


def main(argv: list[str]) -> int:
    trainer_pid = int(argv[0])
    die_with(trainer_pid)
    try:
        stops = stop_signals()
    except SpecError:  # a bad $DURABLE_STOP_SIGNAL: the trainer says so; these two still hold
        stops = (signal.SIGTERM, signal.SIGINT)
    for sig in stops:  # the trainer's to act on (a group signal reaches us too); it sends stop when done
        signal.signal(sig, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    cfg = json.loads(stdin.readline() or b"null")
    if not isinstance(cfg, dict):
        return 0  # the trainer died before it said what to deliver
    stop = threading.Event()

    def watch() -> None:
        if stdin.readline().strip() == b"stop":
            stop.set()
        else:  # stdin's end without stop: the trainer died (or gave up on us): nothing more to do
            os._exit(0)

    threading.Thread(target=watch, name="stdin", daemon=True).start()
    Delivery(cfg, stop).run()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:  # never a traceback on the trainer's stderr: one line, as any failure of the sink
        ms.warn(
            f"failed ({type(e).__name__}: {e}); disabled for this attempt, training goes on; the next attempt "
            "catches up from metrics.jsonl",
            sys.stderr,
        )
        sys.exit(1)
