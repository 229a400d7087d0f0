"""ctl's error classes and exit codes, in one table; only ``ctl/cli.py`` turns errors into exits.

A leaf module: ``app.runs``, ``app.backends``, ``app.homecheck`` and ``app.trainers`` all raise
these, so they live below all of them (``app`` re-exports the classes; ``ctl/errors.py`` all of it).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_PROVEN = 3  # ctl verify-resume: no interruption resumed from a mid-run checkpoint
EXIT_DISK_FULL = 74  # sysexits' EX_IOERR: a write failed for lack of space; free some, run the same command
EXIT_CANCELED = 130
EXIT_PREEMPTED = 143  # a polite stop (SIGTERM, SIGINT, the preemption signal) saved the step it was at: the same
# command resumes; 128 + SIGTERM, non-zero, so Kubernetes (OnFailure), systemd (on-failure) and Slurm restart it
EXIT_CONTRACT_BROKEN = 4  # ctl verify-resume: the trainer broke a rule of the trainer contract (no verdict)


class CtlError(Exception):
    """A problem to report in one line; ``exit_code`` says how ctl exits."""

    exit_code = EXIT_FAILED


class BadRequest(CtlError):
    """Bad input: nothing was started and nothing written."""

    exit_code = EXIT_BAD_INPUT


class DiskFull(CtlError):
    """A write failed for lack of space (ENOSPC, SQLite's "database or disk is full")."""

    exit_code = EXIT_DISK_FULL
