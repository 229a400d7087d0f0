"""ctl's error classes and exit codes live in the application layer (``app/errors.py``; the codes are the
contract's, contracts/exits.py); this name stays for ``ctl/verify*.py`` (moving to ``simulator/`` in issue
41's item 3), which import them from here."""
from __future__ import annotations

from app.errors import (EXIT_BAD_INPUT, EXIT_CANCELED, EXIT_CONTRACT_BROKEN, EXIT_DISK_FULL, EXIT_FAILED,
                        EXIT_NOT_PROVEN, EXIT_OK, EXIT_PREEMPTED, BadRequest, CtlError, DiskFull)

__all__ = ["EXIT_BAD_INPUT", "EXIT_CANCELED", "EXIT_CONTRACT_BROKEN", "EXIT_DISK_FULL", "EXIT_FAILED",
           "EXIT_NOT_PROVEN", "EXIT_OK", "EXIT_PREEMPTED", "BadRequest", "CtlError", "DiskFull"]
