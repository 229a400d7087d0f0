"""The MLflow sink: one MLflow run per TrainRun, every frame delivered once across kills and resumes.

Armed by the train spec's ``"sinks": {"mlflow": {...}}`` (``tracking_uri``, else ``$MLFLOW_TRACKING_URI``;
``experiment``, else the run's name). Delivery runs in a child process of the trainer, the *delivery
process* (tinyllm/sinks/mlflow_delivery.py), the only one that imports ``mlflow`` (the ``[mlflow]`` extra): the
trainer never does. Not a thread: with a local ``sqlite:///`` store MLflow's SQLAlchemy store runs in the
caller's process and holds the GIL the training loop needs between torch ops (a delivery thread cost
nanoGPT's CPU recipe +6.9% CPU and ~+36% wall per step: docs/benchmarks.md). The trainer's ``write``
records the step and nothing else; the delivery process reads the frames from ``metrics.jsonl`` (the
JSONL sink writes and flushes a line per frame), so neither mlflow's import nor a slow or dead server
costs training a step. It dies with the trainer (a parent-death signal; stdin's end).

The run is found again, never created anew, by two tags: ``durable.workflow_id`` (``train/<name>``,
the id a continuation ``/2`` shares) and ``durable.home``. Params are the spec, flattened; tags add the
corpus checksum and the code version.

Exactly once per step. The checkpoint is authoritative and metrics.jsonl is this attempt's local copy of
what training produced (cut back to the resumed step, so it reads as one run). The *delivered mark* is
read from MLflow itself when the sink starts: the highest step in the run's metric histories (frames
go in ``log_batch`` requests of whole frames, so a step is in MLflow whole or not at all). Then:
- catch-up: frames of metrics.jsonl after the mark, up to the resumed step, are delivered first (what
  an earlier attempt produced but never delivered: a dead server, a kill with frames not yet delivered);
- live: frames after the mark are delivered as metrics.jsonl receives them, gathered for up to
  ``BATCH_WAIT_S`` into one request (a request per step costs a fast step several percent: a store
  transaction each); a redone step (at or below the mark, after a resume) is not delivered twice: an exact
  resume gives it the same bits anyway.
Catch-up and live are one read of the file from its start: whatever is after the mark, once.

Best effort, at most once, never fatal (the seed's rule for reporters): the first failure (a dead or
failing server) prints one warning line, and the sink stops delivering for this attempt; training and
its bits are unaffected; the next attempt catches up from metrics.jsonl. Nothing is queued in memory:
the delivery process reads at most ``BATCH_FRAMES`` frames ahead of delivery, the backlog waits in the
file, and no frame is dropped. ``close()`` sends ``stop``: the rest of the file is delivered, waited for up
to ``flush_timeout_s``; then the process is killed with one warning line, and the next attempt catches up.

The sink's state (run id, delivered step, last step read, last error, the delivery process's and the
trainer's pids) is written by the delivery process to ``runs/<name>/sinks/mlflow.json`` (temp file, fsync,
rename; at most every ``STATE_EVERY_S`` and at the end), which ``ctl show`` and
``ctl doctor`` read to say whether the sink fell behind: they never contact the server.

Evaluation figures: ``tinyllm eval`` of a checkpoint of such a run logs each suite's figures at the
checkpoint's step, with the checkpoint's path and digest as params (``log_evaluation``), once.

The run's status follows the TrainRun's workflow, not a trainer: a segment's trainer does not know
whether it is the run's last (evaluations follow it, early stopping or a failure may end the run), so
``ctl`` sets it once the workflow has ended (``set_run_status``: completed -> ``FINISHED``, failed ->
``FAILED``, canceled -> ``KILLED``), from the recorded end, again by every later ``ctl train`` of the run
until it is done (a kill between the workflow's end and the status costs nothing). A trainer attempt
that trains (a continuation ``/2`` of a failed or canceled run) sets it back to ``RUNNING``; one that
resumes at its segment's end and trains nothing leaves it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from contracts.layout import step_dir_name

from ..fsio import atomic_write

STATE_FILE = "mlflow.json"
BATCH_FRAMES = 100  # frames per log_batch (MLflow takes at most 1000 metrics a request; a frame has ~10), and
# the most the delivery process reads ahead of delivery (the backlog waits in metrics.jsonl: nothing is dropped)
BATCH_WAIT_S = 1.0  # a request waits this long for more frames: one request a second, not one a step
STATE_EVERY_S = 2.0  # the state file is rewritten at most this often (and at the end)
STOP_FLUSH_S = 2.0  # on a polite stop close() waits no longer than this: the stop's grace is for the checkpoint
FLUSH_TIMEOUT_S = (
    60.0  # close() waits this long for undelivered frames (sinks.mlflow.flush_timeout_s); the rest: next attempt
)
HTTP_RETRIES = "2"  # MLflow's HTTP retries (its default, 7 with backoff, waits minutes on a dead server)
HTTP_TIMEOUT_S = "10"
RUN_STATUS = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "canceled": "KILLED",
    "running": "RUNNING",
    "preempted": "KILLED",
}
"""The MLflow run's status for each state of the TrainRun's workflow (``set_run_status``); ``preempted``
(a polite stop saved the step, ctl exited 143) is KILLED, MLflow having no status for it, and the run's
next ``ctl train`` sets it back to RUNNING."""


def state_path(run_dir: Path) -> Path:
    return run_dir / "sinks" / STATE_FILE


def read_state(run_dir: Path) -> dict | None:
    """The sink's last written state (for ctl show / doctor), or None when the run has no MLflow sink."""
    try:
        return json.loads(state_path(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def tracking_uri(config: Any) -> str:
    uri = getattr(config, "tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError("sinks.mlflow: no tracking_uri in the spec and MLFLOW_TRACKING_URI is not set")
    return uri


def _import_mlflow():
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRIES)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
    try:
        from mlflow.entities import Metric, Param, RunTag  # lazy: the optional [mlflow] extra
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ImportError("the MLflow sink needs the mlflow extra: pip install -e '.[mlflow]'") from None
    for name in ("mlflow", "alembic"):  # their INFO lines (database migrations) would interleave the progress
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient, Metric, Param, RunTag


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """The spec as MLflow params: ``model.n_layer`` -> ``"4"`` (lists and None as JSON)."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    value = d if isinstance(d, str) else json.dumps(d, sort_keys=True)
    out[prefix[:-1]] = value[:6000]  # MLflow's param value limit
    return out


def code_version() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, text=True, capture_output=True, timeout=5
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version  # ~15 ms: not for readers (ctl show, doctor)

    try:
        return version("durable-train")
    except PackageNotFoundError:
        return "unknown"


def find_or_create_run(
    client, experiment: str, workflow_id: str, home: Path, params: dict[str, str], tags: dict[str, str]
) -> str:
    """The MLflow run of ``workflow_id`` in ``home`` (created once, with its params and tags)."""
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`durable.workflow_id` = '{workflow_id}' and tags.`durable.home` = '{home}'",
        max_results=2,
        order_by=["attributes.start_time ASC"],
    )
    if found:
        return found[0].info.run_id
    run = client.create_run(
        exp_id,
        tags={"durable.workflow_id": workflow_id, "durable.home": str(home), "mlflow.runName": workflow_id, **tags},
    )
    _, _, Param, _ = _import_mlflow()
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow's batch limit for params
        client.log_batch(run.info.run_id, params=items[i : i + 100])
    return run.info.run_id


def delivered_mark(client, run_id: str) -> int:
    """The highest step MLflow holds a training frame's metric at (each frame is one log_batch: whole or
    absent). Read over every key the run has, so a frame without ``train/loss`` (validation only) counts."""
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("eval/")]
    return max((m.step for k in keys for m in client.get_metric_history(run_id, k)), default=-1)


def _metrics(step: int, frame: dict, when_ms: int, Metric) -> list:
    out = []
    for key, value in frame.items():
        if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        v = float(value)
        out.append(Metric(key, v if math.isfinite(v) else float("nan"), when_ms, step))
    return out


def warn(text: str, stream) -> None:
    print(f"tinyllm: warning: metrics sink 'mlflow' {text}", file=stream, flush=True)


def write_state(run_dir: Path, state: dict) -> None:
    """The sink's state file (temp file, fsync, rename): written by the delivery process."""
    try:
        path = state_path(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps({**state, "updated": time.time()}, sort_keys=True) + "\n").encode())
    except OSError:
        pass  # the state file is a convenience for ctl show; a full disk is reported by training itself


class MlflowSink:
    """A metrics sink (tinyllm/sinks/metrics.py) whose frames reach MLflow from a delivery process
    (tinyllm/sinks/mlflow_delivery.py) that reads them from metrics.jsonl: ``write`` only records the step."""

    name = "mlflow"

    def __init__(
        self,
        config: Any,
        *,
        run_dir: Path,
        home: Path,
        spec: dict,
        resumed_step: int,
        corpus_checksum: str | None = None,
        warn_stream=None,
    ):
        self.config, self.run_dir, self.home, self.spec = config, run_dir, Path(home).resolve(), spec
        self.uri = tracking_uri(config)
        self.experiment = getattr(config, "experiment", None) or spec["name"]
        self.flush_timeout_s = float(getattr(config, "flush_timeout_s", None) or FLUSH_TIMEOUT_S)
        self.workflow_id = f"train/{spec['name']}"
        self.resumed_step = resumed_step
        self.trains = resumed_step < int(spec.get("steps") or 0)  # False: resumed at the segment's end
        self.corpus_checksum = corpus_checksum
        self.warn_stream = warn_stream or sys.stderr
        self.last_step = resumed_step
        self._state: dict = {"run_id": None}
        self._state_at = 0.0
        self._relay: threading.Thread | None = None
        cfg = {
            "tracking_uri": self.uri,
            "experiment": self.experiment,
            "workflow_id": self.workflow_id,
            "home": str(self.home),
            "run_dir": str(Path(run_dir).resolve()),
            "spec": spec,
            "resumed_step": resumed_step,
            "trains": self.trains,
            "corpus_checksum": corpus_checksum,
            "trainer_pid": os.getpid(),
        }
        try:  # the warning line goes to the trainer's stderr itself; a stream without a descriptor: relayed
            stderr = self.warn_stream.fileno()
            self.warn_stream.flush()
        except (AttributeError, OSError, ValueError):
            stderr = subprocess.PIPE
        root = str(Path(__file__).resolve().parents[1])  # the child imports this tinyllm, wherever it is
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tinyllm.sinks.mlflow_delivery", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
            )
            if stderr == subprocess.PIPE:
                self._relay = threading.Thread(target=self._relay_warnings, name="mlflow-sink-stderr", daemon=True)
                self._relay.start()
            assert self.proc.stdin is not None  # (stdin=PIPE)
            self.proc.stdin.write((json.dumps(cfg) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:  # no process to start (out of memory, no descriptors): off, training goes on
            warn(
                f"failed ({type(e).__name__}: {e}); disabled for this attempt, training goes on; the next "
                "attempt catches up from metrics.jsonl",
                self.warn_stream,
            )
            self._end()
            self.proc = None

    @property
    def pid(self) -> int | None:
        """The delivery process's pid (None: none started)."""
        return self.proc.pid if self.proc is not None else None

    @property
    def state(self) -> dict:
        """The delivery process's state file once it has written one (``run_id`` set: the run is found)."""
        now = time.monotonic()
        if self._state.get("run_id") is None and self.proc is not None and now - self._state_at >= 0.1:
            self._state_at = now
            found = read_state(self.run_dir)
            if found and found.get("pid") == self.proc.pid:
                self._state = found
        return self._state

    # the training thread's side: nothing reaches MLflow from here (the delivery process reads metrics.jsonl)
    def write(self, step: int, frame: dict) -> None:
        self.last_step = step

    def close(self) -> None:
        """Ask the delivery process to deliver the rest of metrics.jsonl (written and closed before this) and
        wait up to ``flush_timeout_s``; then it is killed, with one warning line."""
        if self.proc is None:
            return
        try:
            assert self.proc.stdin is not None  # (stdin=PIPE)
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        except OSError:
            pass  # it has exited already
        # a polite stop (SIGTERM, the preemption signal) has a grace to keep: the frames not delivered by then
        # wait in metrics.jsonl for the next attempt, which catches up (issue 39: a stop is never killed for them)
        from ..errors import STOP  # tinyllm.stopping (multiprocessing): the trainer's, not a reader's (ctl show)

        wait_s = min(self.flush_timeout_s, STOP_FLUSH_S) if STOP["requested"] else self.flush_timeout_s
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            state = read_state(self.run_dir)
            if not (state and state.get("pid") == self.proc.pid and state.get("error")):  # failed: said so already
                warn(
                    f"not all frames reached {self.uri} within {wait_s:.0f} s; the next attempt "
                    "catches up from metrics.jsonl",
                    self.warn_stream,
                )
        self._end()

    def _end(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # stdin's end: a delivery process still running exits at once
            except OSError:
                pass
        if self._relay is not None:
            self._relay.join(10)  # the pipe ends with the process: every line it wrote is relayed

    def _relay_warnings(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None  # (started with stderr=PIPE)
        for line in self.proc.stderr:
            print(line.decode(errors="replace"), end="", file=self.warn_stream, flush=True)


def behind(state: dict | None, last_step: int | None = None) -> str | None:
    """One line saying how far the sink fell behind (None: up to date or no sink)."""
    if state is None:
        return None
    upto = state.get("delivered_step")
    last = last_step if last_step is not None else state.get("last_step")
    if state.get("error"):
        return (
            f"mlflow sink fell behind: delivered up to step {upto if upto is not None else 'none'} of "
            f"{last} ({state['error']}); the next attempt catches up"
        )
    if upto is not None and last is not None and upto < last:
        return f"mlflow sink fell behind: delivered up to step {upto} of {last}; the next attempt catches up"
    return None


def set_run_status(run_dir: Path, workflow_state: str) -> str | None:
    """Give the run's MLflow run the status of its TrainRun's workflow (``RUN_STATUS``): called by ctl once
    the workflow ended, and with ``running`` when a continuation starts. Does nothing (and imports nothing)
    when the run has no MLflow sink, when the sink's state already records that status, or for
    ``running`` unless it records a terminal one. Never fatal: a warning's text (without a prefix) when
    the store could not be reached, else None; the status is recorded in the sink's state file."""
    status = RUN_STATUS.get(workflow_state)
    state = read_state(run_dir)
    if status is None or not state or not state.get("run_id") or state.get("run_status") == status:
        return None
    if status == "RUNNING" and state.get("run_status") in (None, "RUNNING"):
        return None  # never closed (or a state file from before statuses): nothing to reopen
    try:
        MlflowClient, _, _, _ = _import_mlflow()
        client = MlflowClient(tracking_uri=state["tracking_uri"])
        if status == "RUNNING":
            client.update_run(state["run_id"], status=status)
        else:
            client.set_terminated(state["run_id"], status=status)
    except Exception as e:  # a dead or failing store: the next ctl train of the run sets it
        return (
            f"mlflow: run {state['run_id']} not set to {status} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); the next `ctl train` of the run sets it"
        )
    try:
        atomic_write(
            state_path(run_dir),
            (json.dumps({**state, "run_status": status, "updated": time.time()}, sort_keys=True) + "\n").encode(),
        )
    except OSError:
        pass  # set in MLflow; the next ctl train sets it again (the same status)
    return None


def log_evaluation(
    run_dir: Path,
    step: int,
    suite: str,
    figures: dict[str, float],
    checkpoint: str,
    digest: str | None,
    warn_stream=None,
) -> bool:
    """Log one evaluation's figures at its checkpoint's step to the run's MLflow run (named by the sink's
    state file; no state file: the run has no MLflow sink and nothing happens). Once: a figure already
    in the history at that step is not logged again. Never fatal: False (and one warning) on failure."""
    state = read_state(run_dir)
    if not state or not state.get("run_id"):
        return False
    try:
        MlflowClient, Metric, Param, _ = _import_mlflow()
        client = MlflowClient(tracking_uri=state["tracking_uri"])
        run_id = state["run_id"]
        now_ms = int(time.time() * 1000)
        metrics = []
        for key, value in sorted(figures.items()):
            name = f"eval/{suite}/{key}"
            if any(m.step == step for m in client.get_metric_history(run_id, name)):
                continue
            metrics.append(Metric(name, float(value), now_ms, step))
        run = client.get_run(run_id)
        params = [
            Param(k, v)
            for k, v in (
                (f"eval.{suite}.{step_dir_name(step)}.checkpoint", checkpoint),
                (f"eval.{suite}.{step_dir_name(step)}.digest", digest or ""),
            )
            if k not in run.data.params
        ]
        if metrics or params:
            client.log_batch(run_id, metrics=metrics, params=params)
        return True
    except Exception as e:  # best effort, as the training sink
        print(
            f"tinyllm: warning: mlflow: evaluation figures of step {step} not delivered ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})",
            file=warn_stream or sys.stderr,
            flush=True,
        )
        return False
