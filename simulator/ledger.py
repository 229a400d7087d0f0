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
        if (
            kind == "steps"
            and last is not None
            and last["kind"] == "steps"
            and last["activity"] == fields["activity"]
            and last["last"] + 1 == fields["first"]
        ):
            self.entries[-1] = {**last, "last": fields["last"]}
            return
        fields["kind"] = kind
        fields["seq"] = len(self.entries)
        self.entries.append(fields)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["kind"] == kind]

    def dump(self, path: str | Path) -> None:
        Path(path).write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in self.entries))


class SplicedLedger(Ledger):
    """``head`` as it is, then the pieces ``(entries, start, stop)`` renumbered (``seq``) after it.

    What a sweep's position sees (its past, then a verified run's future): its entries are made
    only when read (a report, a test); the sweep checks it piecewise (simulator/ledger_folds.py).
    """

    def __init__(self, head: list[dict[str, Any]], pieces: list[tuple[list[dict[str, Any]], int, int]]) -> None:
        self.head, self.pieces = head, list(pieces)
        self._entries: list[dict[str, Any]] | None = None

    @property
    def entries(self) -> list[dict[str, Any]]:
        if self._entries is None:
            out = list(self.head)
            for entries, start, stop in self.pieces:
                base = len(out) - start
                out += [{**entries[i], "seq": base + i} for i in range(start, stop)]
            self._entries = out
        return self._entries

    @entries.setter
    def entries(self, value: list[dict[str, Any]]) -> None:
        self._entries = value


class TailLedger(Ledger):
    """``head`` (another ledger's entries, shared, never written) then this ledger's own entries: a
    recovery's ledger (the killed run's entries, then its own) made without copying the head, whose
    entries a forked recovery would otherwise touch (copy) page by page. ``entries`` is made when read."""

    def __init__(self, head: list[dict[str, Any]]) -> None:
        self.head, self.own = head, list[dict[str, Any]]()
        self._n = len(head)
        self._entries: list[dict[str, Any]] | None = None

    @property
    def entries(self) -> list[dict[str, Any]]:
        if self._entries is None or len(self._entries) != self._n + len(self.own):
            self._entries = self.head[: self._n] + self.own
        return self._entries

    @entries.setter
    def entries(self, value: list[dict[str, Any]]) -> None:
        self.head, self.own, self._n, self._entries = value, [], len(value), None

    def record(self, kind: str, **fields: Any) -> None:
        own = self.own
        last = own[-1] if own else (self.head[self._n - 1] if self._n else None)
        if (
            kind == "steps"
            and last is not None
            and last["kind"] == "steps"
            and last["activity"] == fields["activity"]
            and last["last"] + 1 == fields["first"]
        ):
            if not own:  # the head's last entry is extended: it is replaced, in a copy of the head
                self.head, self._n = self.head[: self._n - 1], self._n - 1
            else:
                own.pop()
            own.append({**last, "last": fields["last"]})
            self._entries = None
            return
        fields["kind"] = kind
        fields["seq"] = self._n + len(own)
        own.append(fields)
        self._entries = None
