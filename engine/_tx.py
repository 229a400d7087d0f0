"""The worker's transactions: a ``Store.transaction`` entered as ``(db, after)``, and group commit.

``after`` holds what acknowledges a transaction (a lease handed to a runner, a replayer cached), run
only once its COMMIT returned: for a member of a group commit (engine/_runners.py), once the
group's COMMIT returned. ``Transactions`` is the one object the worker, its attempts and its runners
share for this (engine/_worker.py builds it).
"""

from __future__ import annotations

import threading
from typing import Callable, Literal

from ._store import Store, _Transaction


class Transactions:
    """``tx(label)`` / ``tx(label, group=True)``: the context manager below, over ``store``."""

    __slots__ = ("store", "group_after")

    def __init__(self, store: Store):
        self.store = store
        self.group_after: tuple[int, list] | None = None  # (thread, acknowledgements) of an open group

    def __call__(self, label: str, *, group: bool = False) -> "_Tx":
        return _Tx(self, label, group)


class _Tx:
    """``Transactions``' context manager (a class: cheaper than a generator-based one)."""

    __slots__ = ("t", "label", "group", "after", "tx", "member")
    after: list[Callable[[], object]]
    tx: _Transaction | None

    def __init__(self, t: Transactions, label: str, group: bool):
        self.t, self.label, self.after = t, label, []
        ga = t.group_after
        self.member = ga is not None and ga[0] == threading.get_ident()  # a member of this thread's group
        self.group = group and not self.member
        self.tx = None

    def __enter__(self) -> tuple:
        t = self.t
        if self.group:
            t.group_after = (threading.get_ident(), self.after)
        try:
            self.tx = t.store.transaction(self.label, group=self.group)
            return self.tx.__enter__(), self.after
        except BaseException:
            if self.group:
                t.group_after = None
            raise

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        t = self.t
        assert self.tx is not None  # (__enter__ made it)
        try:
            self.tx.__exit__(exc_type, exc, tb)
        finally:
            if self.group:
                t.group_after = None
        if exc_type is None:
            if self.member:
                assert t.group_after is not None  # (a member: this thread's group is open)
                t.group_after[1].extend(self.after)  # held until the group is durable
            else:
                for f in self.after:
                    f()
        return False
