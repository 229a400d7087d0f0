"""Polite stops at every position (issue 39): ``python -m simulator stops``.

A polite stop is what ctl does on SIGTERM, SIGINT or the preemption signal: ``Engine.request_stop``
(the engine's public call). From then on the worker starts nothing new; the attempt in flight is
asked to stop (the fake trainer, like a real one under the runner's SIGTERM, finishes the step it is
in, checkpoints that step and ends ``Preempted``; an evaluation ends ``Preempted`` with nothing
written); the history records ``activity_preempted`` (or, when no attempt was running, e.g. during a
durable wait, ``preempted``), and ctl exits 143 with the workflow still running. The same command
then starts again (a fresh engine on the same files), as a scheduler brings a preempted job back.

For each stop position ``p`` of the uninterrupted run (every position, or ``positions``):

- the run stopped at ``p``, then run again to its end;
- the same stop, then a kill (``SimulatedCrash``) at every position from ``p`` to the end of the
  stopped life (every commit of the stop's records before ctl exits) and ``after`` positions more
  (the next life's recovery).

Each run is held to every check of a killed run (result, final loss bits, digest, commands, timer
waits, each evaluation once, no step redone beyond the newest checkpoint, the files), and to the
stop's own (``stop_lines``): a stop that ended a life without a kill before ctl's exit recorded
``activity_preempted`` or ``preempted``; a preempted training attempt lost no step (its event's
``steps_lost`` is 0 and the next attempt resumed from the step it stopped at); no preemption counted
as a failure (no ``activity_failed`` in a run that has no trainer failures); and a stop during a
timer wait left the rest of the wait to the next life, the timer firing once, at its recorded time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable

from contracts.activity_ids import is_train

from .report import Mismatch, Report
from .scenario import Outcome

if TYPE_CHECKING:
    from .sweep import Simulator

AFTER = 3  # kills also this many positions after the stopped life's end (the next life's recovery)
# the history's event types read here (the public format ``ctl history --json`` prints)
ACTIVITY_PREEMPTED, PREEMPTED, ACTIVITY_FAILED, TIMER_FIRED = (
    "activity_preempted",
    "preempted",
    "activity_failed",
    "timer_fired",
)


def stop_lines(o: Outcome) -> list[str]:
    """The stop's own checks on a finished run (module docstring); empty when they hold."""
    bad: list[str] = []
    entries = o.ledger.entries
    stops = [e for e in entries if e["kind"] == "stop"]
    if not stops:
        return bad
    stop = stops[0]
    after = entries[stop["seq"] :]
    exit_ = next((e for e in after if e["kind"] == "ctl-exit"), None)
    crashed = next((e for e in after if e["kind"] == "crash"), None)
    clean = exit_ is not None and (crashed is None or crashed["seq"] > exit_["seq"])
    events = o.events
    preempted = [e for e in events if e.type == ACTIVITY_PREEMPTED]
    waits = [e for e in events if e.type == PREEMPTED]
    if clean and not preempted and not waits:
        bad.append(
            f"ctl exited after the stop (position {stop['position']}, {stop['where']}) with nothing recorded: "
            "no activity_preempted, no preempted event"
        )
    for e in preempted:
        a = e.attrs
        if is_train(a.get("activity_id", "")) and a.get("steps_lost") not in (0, None):
            bad.append(
                f"{a['activity_id']} attempt {a.get('attempt')} preempted with {a.get('steps_lost')} step(s) lost "
                f"(stopped at {a.get('stopping_step')}, checkpoint {a.get('step')})"
            )
    # 0 steps lost: the attempt after a trainer's stop resumes from the very step it stopped at
    for i, ent in enumerate(entries):
        if ent["kind"] != "train-preempted":
            continue
        nxt = next((x for x in entries[i + 1 :] if x["kind"] == "train-start" and x["run"] == ent["run"]), None)
        if nxt is not None and ent["step"] > 0 and nxt["from_step"] != ent["step"]:
            bad.append(
                f"{ent['activity']} stopped politely at step {ent['step']}, its next attempt ({nxt['activity']} "
                f"attempt {nxt['attempt']}) resumed from step {nxt['from_step']}: "
                f"{ent['step'] - nxt['from_step']} step(s) lost"
            )
    if not o.scenario.oom_at and not o.scenario.fail_suites:
        bad += [
            f"{e.type} of {e.attrs.get('activity_id')} attempt {e.attrs.get('attempt')}: a stop counted as a failure"
            for e in events
            if e.type == ACTIVITY_FAILED
        ]
    if clean and stop["where"] == "timer-wait" and not preempted:
        fired = [e for e in events if e.type == TIMER_FIRED]
        if not any(w.seq < f.seq for w in waits for f in fired):
            bad.append("a stop during a durable wait: no preempted event before the timer fired")
        late = [e for e in events if e.type == TIMER_FIRED and e.seq > waits[0].seq] if waits else []
        if waits and late and late[0].time <= waits[0].time:
            bad.append(f"the timer fired at {late[0].time} though the stop came at {waits[0].time}, mid-wait")
    return bad


def outcome_kinds(o: Outcome) -> list[str]:
    """What the stop of a run recorded, in words (the sweep's counts: every kind is exercised)."""
    out = []
    for e in o.events:
        if e.type == ACTIVITY_PREEMPTED:
            aid = str(e.attrs.get("activity_id", ""))
            what = "not started" if str(e.attrs.get("message", "")).startswith("not started") else aid.split("-")[0]
            out.append(f"preempted: {what}")
        elif e.type == PREEMPTED:
            out.append(f"preempted: waiting on {str(e.attrs.get('waiting_on')).split(' ')[0]}")
    return out


class StopSweep:
    """Polite stops at each position of a ``Simulator``'s uninterrupted run, then kills after each."""

    def __init__(self, sim: "Simulator"):
        self.sim = sim

    def run_one(self, stop_at: int, kills: list[int]) -> tuple[Outcome, Mismatch | None]:
        """One run stopped at ``stop_at`` and killed at ``kills``, checked (a Mismatch or None)."""
        sim = self.sim
        o = sim.run(kills, stop_at=stop_at)
        for kind in outcome_kinds(o):
            sim.stats[kind] += 1
        own = stop_lines(o)
        m = sim.check(o, what="stop", kills=kills)
        if own or m is not None:
            lines = [f"polite stop at position {stop_at}: {sim.where(stop_at)}"] + own + (m.lines if m else [])
            cmd = (
                m.command
                if m
                else f"python -m simulator kill-at {sim.scn.flags()} --kills {','.join(map(str, kills)) or 'none'}"
            ) + f" --stop-at-position {stop_at}"
            return o, Mismatch("stop", kills, lines, cmd)
        return o, None

    def stops(
        self,
        *,
        positions: Iterable[int] | None = None,
        after: int = AFTER,
        kills: bool = True,
        stop_at_first: bool = False,
    ) -> Report:
        """The sweep (module docstring); ``kills=False``: the stops alone, no kill after them."""
        t0 = time.perf_counter()
        report = Report("stops")
        sim = self.sim
        m = sim.check_reference()
        report.positions = len(sim.trace)
        if m is not None:
            report.mismatches.append(m)
            report.elapsed_s = time.perf_counter() - t0
            return report
        todo = list(range(len(sim.trace)) if positions is None else positions)
        for p in todo:
            o, m = self.run_one(p, [])
            sim.stats["stops"] += 1
            exit_ = next((e for e in o.ledger.entries if e["kind"] == "ctl-exit"), None)
            sim.stats["stops that ended a life"] += exit_ is not None
            if report.record(m) and stop_at_first:
                break
            if not kills:
                continue
            end = exit_["position"] if exit_ is not None else p
            for k in range(p, end + after + 1):
                _, m = self.run_one(p, [k])
                sim.stats["kills after a stop"] += 1
                if report.record(m) and stop_at_first:
                    break
            if stop_at_first and report.mismatches:
                break
        report.elapsed_s = time.perf_counter() - t0
        return report
