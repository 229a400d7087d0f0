"""ValidationTransaction: the lifecycle of one validation pass, and the five resume rules.

Every pass goes begin -> evaluated -> completed in memory. A *durable* pass (its step has a full
checkpoint) also persists its phases in that checkpoint directory:

1. ``pending_evaluation``: the marker (config/source/model identity and the weights' digest, and
   the step's train/* frame) is a component of the checkpoint itself (``validation.pt``), so it
   becomes durable atomically with the checkpoint -- before any held-out data is read.
2. ``publication_pending``: after a successful evaluation, its metrics (exact, as float.hex) are
   recorded in ``validation_phase.json`` before anything is published: a sealed checkpoint sidecar
   (checkpoint.write_sidecar: checksummed, atomically replaced), so a corrupt one refuses the
   checkpoint like any corrupt checkpoint file.
3. ``completed``: after the strict archive copy (when configured) succeeded; then the frame is
   emitted once (at most once: a kill between the two loses that frame, never repeats the pass).

Resume rules (``resume_action``), for a process starting at checkpoint step k:
1. completed validation recorded in a full checkpoint is not repeated (and before_training is not
   replayed: resuming at k >= 1 never revisits step 0);
2. a fresh start (no checkpoint) before the first update reruns the ephemeral before-training pass;
3. init_from (weights only, a new run) starts at step 0 with a fresh schedule, journal ignored;
4. a pending evaluation backed by the full checkpoint reruns, deterministically, before update k+1
   (after checking that every identity still matches: a mismatch is fatal);
5. a completed evaluation whose publication was interrupted retries only the publication, with the
   recorded metrics (no held-out data is read again).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..checkpoint import CheckpointError, read_sidecar, write_sidecar
from .errors import NonFiniteMetricError, ValidationIdentityError

Phase = Literal["pending_evaluation", "publication_pending", "completed"]
MARKER_COMPONENT = "validation"  # validation.pt in the checkpoint: the pending marker
PHASE_FILE = "validation_phase.json"  # later phases, atomically replaced


class Journal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    phase: Phase
    identity: dict  # {"config", "source", "model", "weights_digest"}
    frame: dict = {}  # the step's train/* etc. metrics, emitted with val/* in one frame
    metrics_hex: dict[str, str] = {}  # val metrics as float.hex (exact)
    evaluated_pid: int | None = None
    completed_pid: int | None = None
    archive: str | None = None

    def metrics(self) -> dict[str, float]:
        return {k: _unhex(v) for k, v in self.metrics_hex.items()}


def _unhex(v: str):
    return int(v[4:]) if v.startswith("int:") else float.fromhex(v)


def _hex(v) -> str:
    return f"int:{v}" if isinstance(v, int) else float(v).hex()


def read_journal(ckpt_dir: Path, marker: dict | None) -> Journal | None:
    """The journal of a checkpoint: its phase file if any, else its marker component, else None.

    A phase file that fails its seal or its schema raises ``CheckpointError`` (the checkpoint is corrupt)."""
    body = read_sidecar(ckpt_dir, PHASE_FILE)
    if body is not None:
        try:
            return Journal.model_validate(body)
        except ValidationError as e:
            raise CheckpointError(
                f"{ckpt_dir}: {PHASE_FILE} is not a validation journal: {e.errors()[0].get('msg', e)}"
            ) from None
    if marker is not None:
        return Journal.model_validate(json.loads(marker["json"]))
    return None


def check_finite(metrics: dict, step: int) -> None:
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise NonFiniteMetricError(
            f"validation at step {step} produced non-finite {', '.join(f'{k}={metrics[k]}' for k in bad)}; "
            "training stops (no frame, no further update)"
        )


def check_identity(recorded: dict, current: dict, step: int) -> None:
    for key in ("config", "model", "source", "weights_digest"):
        if recorded.get(key) != current.get(key):
            raise ValidationIdentityError(
                f"pending validation at step {step} was recorded with another {key} "
                f"({json.dumps(recorded.get(key), sort_keys=True)[:120]} != "
                f"{json.dumps(current.get(key), sort_keys=True)[:120]}); refusing to resume it"
            )


ResumeAction = Literal["none", "evaluate", "publish"]


def resume_action(
    journal: Journal | None, *, ckpt_step: int | None, due: bool, init_from: bool = False
) -> ResumeAction:
    """What validation must do at the resume step before the next update (rules in the docstring)."""
    if ckpt_step is None or init_from:
        return "none"  # rules 2, 3: a new run; the schedule (step 0 included) runs normally
    if journal is not None:
        if journal.step != ckpt_step:
            raise ValidationIdentityError(
                f"checkpoint at step {ckpt_step} holds a validation journal for step {journal.step}"
            )
        actions: dict[str, ResumeAction] = {
            "completed": "none",
            "pending_evaluation": "evaluate",
            "publication_pending": "publish",
        }
        return actions[journal.phase]
    # a full checkpoint at a due step without a marker (validation enabled after it was written):
    # the step's validation never ran; run it before the next update (rule 4's spirit).
    return "evaluate" if due else "none"


class ValidationTransaction:
    """One pass at one step. ``ckpt_dir`` set: durable (phases persisted there); else in memory only."""

    def __init__(
        self,
        step: int,
        identity: dict,
        ckpt_dir: Path | None = None,
        frame: dict | None = None,
        journal: Journal | None = None,
    ):
        self.step = step
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.journal = journal or Journal(step=step, phase="pending_evaluation", identity=identity, frame=frame or {})
        self.state = "new"  # new -> begun -> evaluated -> completed | failed

    @property
    def durable(self) -> bool:
        return self.ckpt_dir is not None

    def _persist(self) -> None:
        assert self.ckpt_dir is not None and self.journal is not None  # (only a durable transaction persists)
        write_sidecar(self.ckpt_dir, PHASE_FILE, self.journal.model_dump(mode="json"))

    def marker(self) -> dict:
        """The pending-evaluation marker, saved as a component of the full checkpoint."""
        return {"json": self.journal.model_dump_json()}

    def begin(self) -> None:
        assert self.state == "new", self.state
        self.state = "begun"

    def evaluated(self, metrics: dict) -> None:
        assert self.state == "begun", self.state
        check_finite(metrics, self.step)
        self.journal.metrics_hex = {k: _hex(v) for k, v in metrics.items()}
        self.journal.evaluated_pid = os.getpid()
        self.journal.phase = "publication_pending"
        if self.durable:
            self._persist()
        self.state = "evaluated"

    def resume_publication(self) -> None:
        assert self.journal.phase == "publication_pending"
        self.state = "evaluated"

    def completed(self, archive: str | None = None) -> None:
        assert self.state == "evaluated", self.state
        self.journal.archive = archive
        self.journal.completed_pid = os.getpid()
        self.journal.phase = "completed"
        if self.durable:
            self._persist()
        self.state = "completed"

    def failed(self) -> None:
        """A failed pass leaves any durable journal as it is (pending) and records nothing."""
        self.state = "failed"
