"""The exit codes of the trainer contract and of ctl (contracts/subprocess-activity.md, README "Exit codes").

A trainer exits 0 (done), 130 (stopped politely after a checkpoint), 2 (bad input: not retried), 74 (no
space: not retried until space is freed), 75 (the run is locked by another live trainer: retried); any other
code is a retryable failure. ctl adds its own: 1 (failed), 3 and 4 (``ctl verify-resume``'s NOT PROVEN and a
broken contract), 143 (a polite stop saved the step it was at: schedulers read it as "come back").
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_PROVEN = 3  # ctl verify-resume: no interruption resumed from a mid-run checkpoint
EXIT_CONTRACT_BROKEN = 4  # ctl verify-resume: the trainer broke a rule of the trainer contract (no verdict)
EXIT_DISK_FULL = 74  # sysexits' EX_IOERR: a write found no space; own temporaries removed, resumable
EXIT_LOCKED = 75  # sysexits' EX_TEMPFAIL: runs/<name>/.lock is held by another live trainer (retried)
EXIT_CANCELED = 130  # 128 + SIGINT: a polite stop, after a checkpoint at the step in flight
EXIT_PREEMPTED = 143  # 128 + SIGTERM: ctl's exit after a polite stop it saved
