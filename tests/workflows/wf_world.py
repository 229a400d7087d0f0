"""The test world: the real engine (VirtualClock, inline activities) running the real workflow
functions over the fake activities of ``fakes.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import workflows
from engine import Engine, VirtualClock
from engine import Store

from wf_fakes import Fakes


@dataclass
class World:
    """One home folder, one database file, the fakes; engines come and go (crashes)."""

    home: Path
    clock: VirtualClock
    fakes: Fakes
    engine: Engine | None = None
    overrides: dict = field(default_factory=dict)  # workflow name -> a mutant function

    @property
    def db(self) -> Path:
        return self.home / ".ctl" / "engine.db"

    def open(self, store: Store | None = None) -> Engine:
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                pass
        self.engine = Engine(
            self.db,
            clock=self.clock,
            inline_activities=True,
            poll_interval_s=0.01,
            store=store if store is not None else Store(self.db),
        )
        if not self.overrides:
            workflows.register(self.engine, activities=self.fakes.activities())
        else:  # a planted-bug workflow in place of a real one
            for name, (fn, input_type) in workflows.WORKFLOWS.items():
                self.engine.register_workflow(name, self.overrides.get(name, fn), input_type=input_type)
            for name, fn in self.fakes.activities().items():
                self.engine.register_activity(name, fn)
        self.fakes.engine = self.engine
        return self.engine

    def run(self, workflow: str, wid: str, input: Any) -> Any:
        eng = self.engine or self.open()
        eng.start(workflow, wid, input)
        return eng.run_until_complete(wid)

    def events(self, wid: str) -> list:
        return (self.engine or self.open()).history(wid)

    def types(self, wid: str) -> list[str]:
        return [e.type for e in self.events(wid)]


def hand_spec(**over: Any) -> dict:
    """Section 3's spec (the fields that matter to the workflow; the rest are tinyllm's defaults)."""
    spec = {
        "name": "tiny",
        "steps": 1200,
        "eval_every": 500,
        "eval_interval_seconds": 30,
        "seed": 7,
        "checkpoint_every": 100,
    }
    spec.update(over)
    return spec


def small_spec(**over: Any) -> dict:
    """A smaller run for loops: 3 segments of 20, 20, 10 steps, checkpoints every 5."""
    return hand_spec(steps=50, eval_every=20, checkpoint_every=5, **over)


def commands(world: World, wid: str = "train/tiny") -> list[str]:
    """The workflow's commands in order: activity ids and ``sleep <s>s`` for timers."""
    out = []
    for e in world.events(wid):
        if e.type == "activity_scheduled":
            out.append(e.attrs["activity_id"])
        elif e.type == "timer_started":
            out.append(f"sleep {e.attrs['seconds']:g}s")
    return out
