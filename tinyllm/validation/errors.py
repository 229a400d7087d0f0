"""Validation failures. Every one is fatal to the training process: no validation frame, no further
optimizer update, one clear line on stderr and the exit code below.

Exit codes (``tinyllm train``): 2 for deterministic failures a retry cannot fix (bad, missing,
changed or overlapping held-out data; identity or weight-version mismatch; non-finite metric) --
the engine's subprocess runner treats 2 as non-retryable; 1 for a failed strict archive copy (an
environment problem: the run resumes at the pending publication when retried).
"""

from __future__ import annotations

from ..errors import SpecError  # tinyllm.spec's, importable without pydantic


class ValidationFailure(SpecError):
    """Deterministic: the CLI reports it like bad input (one line, exit 2, non-retryable)."""

    exit_code = 2


class ValidationDataError(ValidationFailure):
    """The held-out source is missing, malformed, changed since it was recorded, or overlaps training."""


class ValidationIdentityError(ValidationFailure):
    """A pending validation's recorded config/source/model/weights identity differs from now."""


class NonFiniteMetricError(ValidationFailure):
    """A validation metric is NaN or infinite."""


class ArchiveError(Exception):
    """The strict archive copy of a full validation checkpoint failed (retryable, exit 1)."""

    exit_code = 1


class ValidationAbandoned(Exception):
    """A stop request (SIGTERM, SIGINT, $DURABLE_STOP_SIGNAL) arrived during an evaluation: the pass is
    abandoned between two batches, records no figure, and the trainer checkpoints this step with the
    validation pending (it runs once, on resume). Not a failure: the process exits 130."""
