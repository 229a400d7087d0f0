"""Test-only fault injection: SIGKILL this process at a named phase of a durable validation.

``TINYLLM_VALIDATION_KILL=<phase>@<step>`` (e.g. ``during_evaluation@4``) makes ``tinyllm train``
send itself SIGKILL when validation at model step ``<step>`` reaches ``<phase>`` -- a real,
uncatchable kill at a deterministic point, so tests need no timing. Unset in normal use; then
``maybe_kill`` is a dictionary lookup and nothing else.

Phases, in order: ``before_marker`` (update done, checkpoint with the pending marker not yet
written), ``after_marker`` (checkpoint + pending marker durable, held-out data not yet read),
``during_evaluation`` (after the first held-out batch), ``after_evaluation`` (publication-pending
recorded with the metrics, archive/frame not yet done), ``before_frame`` (completion recorded, the
frame not yet emitted: the seed's at-most-once window for metric delivery), ``after_publication`` (completion recorded
and the frame emitted).
"""
from __future__ import annotations

from ..faults import kill_point

ENV = "TINYLLM_VALIDATION_KILL"
PHASES = ("before_marker", "after_marker", "during_evaluation", "after_evaluation", "before_frame",
          "after_publication")


def maybe_kill(phase: str, step: int) -> None:
    kill_point(ENV, phase, step)
