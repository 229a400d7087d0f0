"""The simulator's ledger: what the fake activities really did, in order.

It belongs to the simulator (the observer), not to the worker: a simulated crash drops the
engine and every in-memory state of the worker, but the ledger survives, like a log written
by an outside witness. Each entry is a small tuple-like dict with a global sequence number;
``dump`` writes it as JSON lines for a failure report.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Ledger:
    """An append-only list of events: ``train-start``, ``step``, ``ckpt``, ``hb``, ``eval-start``,
    ``eval-done``, ``corpus``, ``crash``, ``restart``, ``cancel``."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> None:
        """Append an entry; a ``steps`` range right after the same activity's previous range extends it.

        Entries are never changed once appended (a copy of ``entries`` stays valid): an
        extended range replaces the last entry by a new one.
        """
        last = self.entries[-1] if self.entries else None
        if (kind == "steps" and last is not None and last["kind"] == "steps"
                and last["activity"] == fields["activity"] and last["last"] + 1 == fields["first"]):
            self.entries[-1] = {**last, "last": fields["last"]}
            return
        fields["kind"] = kind
        fields["seq"] = len(self.entries)
        self.entries.append(fields)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["kind"] == kind]

    def dump(self, path: str | Path) -> None:
        Path(path).write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in self.entries))
