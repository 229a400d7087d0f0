"""Helpers for the engine tests: a crash-injecting store, an engine factory."""

from __future__ import annotations

import os
import sys

from engine import Engine, Store

HERE = os.path.dirname(os.path.abspath(__file__))


class Crash(BaseException):
    """A simulated process death (not an Exception, so nothing may swallow it)."""


class CrashStore(Store):
    """Raises ``Crash`` at the ``crash_at``-th commit hook (before and after each commit count)."""

    def __init__(self, path, crash_at: int | None = None):
        self.crash_at = crash_at
        self.hooks = 0
        self.crashed: tuple[str, str] | None = None
        super().__init__(path)

    def _hit(self, label: str, when: str) -> None:
        self.hooks += 1
        if self.hooks == self.crash_at:
            self.crashed = (label, when)
            raise Crash(f"{when} commit of {label}")

    def before_commit(self, label: str) -> None:
        self._hit(label, "before")

    def after_commit(self, label: str) -> None:
        self._hit(label, "after")


def make_engine(path, clock, *, workflows=(), activities=(), store=None, inline=True, **kw) -> Engine:
    eng = Engine(path, clock=clock, store=store, inline_activities=inline, **kw)
    for name, fn, *rest in workflows:
        eng.register_workflow(name, fn, input_type=rest[0] if rest else None)
    for name, fn in activities:
        eng.register_activity(name, fn)
    return eng


def python_cmd(script: str, *args: str) -> list[str]:
    return [sys.executable, os.path.join(HERE, script), *args]
