"""ctl's error classes (their exit codes are the contract's, contracts/exits.py); only ``ctl/cli.py`` turns errors into exits.

A leaf module: ``app.runs``, ``app.backends``, ``app.homecheck`` and ``app.trainers`` all raise
these, so they live below all of them (``app`` re-exports the classes).
"""

from __future__ import annotations

# The codes are the contract's (contracts/exits.py). 74: a write failed for lack of space; free some, run the same
# command. 143: a polite stop (SIGTERM, SIGINT, the preemption signal) saved the step it was at: the same command
# resumes; 128 + SIGTERM, non-zero, so Kubernetes (OnFailure), systemd (on-failure) and Slurm restart it.
from contracts.exits import (  # noqa: F401  # noqa: F401
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    EXIT_CONTRACT_BROKEN,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_NOT_PROVEN,
    EXIT_OK,
    EXIT_PREEMPTED,
)


class CtlError(Exception):
    """A problem to report in one line; ``exit_code`` says how ctl exits."""

    exit_code = EXIT_FAILED


class BadRequest(CtlError):
    """Bad input: nothing was started and nothing written."""

    exit_code = EXIT_BAD_INPUT


class DiskFull(CtlError):
    """A write failed for lack of space (ENOSPC, SQLite's "database or disk is full")."""

    exit_code = EXIT_DISK_FULL
