"""Test-only fault injection for tinyllm and the durable helper: named points, armed by one variable.

Every fault point of tinyllm is declared here (``POINTS``) and armed by ``TINYLLM_FAULT``, the one
variable that arms them (nothing else in tinyllm reads a fault variable). Grammar::

    TINYLLM_FAULT = ENTRY ["," ENTRY]...          e.g.  checkpoint.between_renames@4
    ENTRY         = POINT "@" AT  |  SWITCH       e.g.  durable.fingerprint,durable.checkpoint_write@1

A kill point SIGKILLs the process when it is reached at ``AT``: a real, uncatchable kill at a
deterministic point, so tests need no timing. ``AT`` is the model step, ``<step>#<i>`` for the
retention points (the i-th checkpoint pruned at that step), and for ``durable.checkpoint_write`` the
ordinal ``N`` of the checkpoint write in this process (1: the first) or ``armed:FILE``: the first
write that finds FILE (relative to the home) claims it by renaming it to ``FILE.fired-<pid>`` and dies
(a rename has one winner: one process fires once, at a moment another process chose; the fault
campaign arms it). Points:

- ``checkpoint.between_renames@S``: re-saving an existing step S, the old directory renamed away and
  the new one not yet in place (tinyllm/checkpoint.py; the window recover_interrupted_writes closes);
- ``retention.after_rename@S#I``, ``retention.during_delete@S#I`` (after the hidden directory's first
  file is deleted), ``retention.after_delete@S#I``: pruning (tinyllm/retention.py);
- ``validation.<phase>@S``, phases in order: ``before_marker`` (update done, checkpoint with the
  pending marker not yet written), ``after_marker`` (checkpoint + pending marker durable, held-out data
  not yet read), ``during_evaluation`` (after the first held-out batch), ``after_evaluation``
  (publication-pending recorded with the metrics, archive/frame not yet done), ``before_frame``
  (completion recorded, the frame not yet emitted: the at-most-once window for metric delivery),
  ``after_publication`` (completion recorded and the frame emitted) -- tinyllm/validation;
- ``durable.checkpoint_write@N|armed:FILE``: the helper (tinyllm/durable/run.py) dies in the middle of
  that checkpoint write (some files written, no manifest yet);
- ``trainer.hold@S``, the one point that is not a kill: the training loop holds at model step S
  (after that step's checkpoint, if one was due), still writing its liveness lines, until a stop
  (SIGTERM/SIGINT) is requested or ``HOLD_LIMIT_S`` pass. A test that cancels "in the middle of a
  segment" then needs no race against a fast machine (a 120-step tiny segment can end in a second).

- ``validation.hold@S`` (not a kill): an evaluation at model step S holds after its first batch until a
  stop is requested (or ``HOLD_LIMIT_S``), so a test's signal lands inside the validation;
- ``checkpoint.hold_write@S`` (not a kill): writing checkpoint step S holds after its first file
  until the file ``HOLD_WRITE_FILE`` it created in the checkpoint's parent folder is removed (or
  ``HOLD_LIMIT_S``): a test sends more signals while the write is in flight, then lets it finish;
- ``eval.hold@N`` (not a kill): ``tinyllm eval`` holds once N units of its suite are done, and
  ``corpus.hold@N`` ``tinyllm corpus`` at its N-th point (1: before writing anything, 2: in the middle
  of writing, one file written), each creating ``HOLD_FILE`` (in the eval's output folder's parent,
  in ``corpora/``) and waiting until a stop is requested (or ``HOLD_LIMIT_S``), then going on: a
  test's signal lands there.

- ``release.after_copy@N``, ``release.after_rename@N``: ModelRelease's publish activity
  (workflows/release.py) publishing version N (1: ``v0001``), the copy complete in its temporary
  directory / renamed into place, ``CURRENT`` not yet written; armed when the activity starts.

Switch (no ``@``): ``durable.fingerprint`` adds the state fingerprint to every step frame of the
helper (``ctl verify-resume`` compares them).

The variable is read by ``arm_from_env()``, which ``Trainer`` and ``DurableRun`` call first thing: an
unknown name, a malformed ``AT``, a point named twice, or one of the retired variables
(``RETIRED``) is a ``FaultError`` -- one line, exit 2 from ``tinyllm train`` and the helper, before
anything is written -- so a typo cannot silently disarm a test. Unset, a point is one dict lookup.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Callable

ENV = "TINYLLM_FAULT"
HOLD_LIMIT_S = 300.0
HOLD_WRITE_FILE = "write-held"
HOLD_FILE = "held"  # eval.hold's and corpus.hold's file  # checkpoint.hold_write's file, in the folder of the checkpoint being written

# the forms of AT, and what each matches
_AT = {"S": r"\d+", "S#I": r"\d+#\d+", "N": r"\d+", "N|armed:FILE": r"\d+|armed:.+"}
# every fault point: name -> the form of its AT (None: a switch, no "@")
POINTS: dict[str, str | None] = {
    "checkpoint.between_renames": "S",
    "retention.after_rename": "S#I",
    "retention.during_delete": "S#I",
    "retention.after_delete": "S#I",
    **{
        f"validation.{phase}": "S"
        for phase in (
            "before_marker",
            "after_marker",
            "during_evaluation",
            "after_evaluation",
            "before_frame",
            "after_publication",
        )
    },
    "durable.checkpoint_write": "N|armed:FILE",
    "trainer.hold": "S",
    "validation.hold": "S",
    "checkpoint.hold_write": "S",
    "eval.hold": "N",
    "corpus.hold": "N",
    "durable.fingerprint": None,
    "release.after_copy": "N",
    "release.after_rename": "N",
}
# the variables TINYLLM_FAULT replaced: set, they are refused (a test still using one would run unarmed)
RETIRED = {
    "TINYLLM_CHECKPOINT_KILL": "checkpoint.between_renames@S",
    "TINYLLM_RETENTION_KILL": "retention.<phase>@S#I",
    "TINYLLM_VALIDATION_KILL": "validation.<phase>@S",
    "TINYLLM_HOLD_AT": "trainer.hold@S",
    "DURABLE_FAULT": "durable.checkpoint_write@N",
    "DURABLE_FINGERPRINT": "durable.fingerprint",
}

_armed: dict[str, str] = {}  # point -> its AT ("" for a switch); empty unless armed


class FaultError(ValueError):
    """A bad ``TINYLLM_FAULT`` (or a retired fault variable set): the message is one line."""


def parse(value: str) -> dict[str, str]:
    """``TINYLLM_FAULT``'s value as point -> AT (``FaultError`` on anything not in the grammar)."""
    armed: dict[str, str] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        name, sep, at = entry.partition("@")
        if name not in POINTS:
            raise FaultError(f"{ENV}: unknown fault point {name!r} (known: {', '.join(POINTS)})")
        form = POINTS[name]
        if form is None and sep:
            raise FaultError(f"{ENV}: {name} is a switch and takes no '@...' (got {entry!r})")
        if form is not None and not (sep and re.fullmatch(_AT[form], at)):
            raise FaultError(f"{ENV}: {entry!r} is not of the form {name}@{form}")
        if name in armed:
            raise FaultError(f"{ENV}: fault point {name} named twice")
        armed[name] = at
    return armed


def arm(value: str | None) -> None:
    """Arm exactly the points ``value`` names (None or "": none); ``FaultError`` leaves none armed."""
    global _armed
    _armed = {}
    _armed = parse(value or "")


def arm_from_env() -> None:
    """Arm from ``TINYLLM_FAULT`` (the start of ``tinyllm train`` and of the helper); ``FaultError``."""
    for old, new in RETIRED.items():
        if old in os.environ:
            arm(None)
            raise FaultError(f"{old} is retired: use {ENV}={new} (tinyllm/faults.py)")
    arm(os.environ.get(ENV))


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str, step: int, index: int | None = None) -> None:
    """SIGKILL this process if ``name`` is armed at ``step`` (``step#index`` for the retention points)."""
    at = _armed.get(name)
    if at is not None and at == (str(step) if index is None else f"{step}#{index}"):
        _kill()


def switch(name: str) -> bool:
    """Is the switch ``name`` (e.g. ``durable.fingerprint``) on?"""
    return name in _armed


def fires(name: str, ordinal: int, home: Path) -> bool:
    """``durable.checkpoint_write``: is write number ``ordinal`` the one to die in? (The caller kills
    itself later, in the middle of the write.) ``armed:FILE`` is claimed here, relative to ``home``."""
    at = _armed.get(name)
    if at is None:
        return False
    if not at.startswith("armed:"):
        return at == str(ordinal)
    armed = home / at[len("armed:") :]
    try:  # a rename has one winner: of all the processes that see the file, one fires
        os.rename(armed, armed.with_name(f"{armed.name}.fired-{os.getpid()}"))
    except OSError:
        return False
    return True


def hold(step: int, stopping: Callable[[], bool], alive: Callable[[], None]) -> bool:
    """``trainer.hold``: hold at ``step`` when armed there (see the module docstring); else return at once.
    True when it held (``stopping`` is then worth asking again; it is never called otherwise: on
    distributed ranks asking is a collective)."""
    if _armed.get("trainer.hold") != str(step):
        return False
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not stopping() and time.monotonic() < deadline:
        alive()  # timed: at most one liveness line every few seconds
        time.sleep(0.05)
    return True


def hold_validation(step: int, batch: int, stopping: Callable[[], bool]) -> None:
    """``validation.hold``: after the first batch of the evaluation at ``step``, hold until ``stopping()``."""
    if batch != 1 or _armed.get("validation.hold") != str(step):
        return
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not stopping() and time.monotonic() < deadline:
        time.sleep(0.05)


def hold_write(step: int, folder: Path) -> None:
    """``checkpoint.hold_write``: in the middle of writing checkpoint ``step``, create
    ``folder/HOLD_WRITE_FILE`` and wait until it is removed. Sleeping in short slices: each signal that
    arrives runs its handler in between, as it would in the middle of a real, long write."""
    if _armed.get("checkpoint.hold_write") != str(step):
        return
    flag = Path(folder) / HOLD_WRITE_FILE
    flag.write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + HOLD_LIMIT_S
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def hold_at(name: str, reached: int, folder: Path, stopping: Callable[[], bool]) -> None:
    """``eval.hold`` / ``corpus.hold``: the first time ``reached`` >= the armed N (``corpus.hold``: == N),
    create ``folder/HOLD_FILE`` and hold until ``stopping()``; the file is removed when it goes on."""
    at = _armed.get(name)
    if at is None or (reached < int(at) if name == "eval.hold" else reached != int(at)):
        return
    del _armed[name]  # once
    flag = Path(folder) / HOLD_FILE
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not stopping() and time.monotonic() < deadline:
        time.sleep(0.02)
    flag.unlink(missing_ok=True)
