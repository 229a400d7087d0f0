"""Shared replays (simulator/prefix.py): the spine fed on at each cut, and recoveries that take the replayer
a recovery stopped at that cut donated (``SnapshotSweep._admit``, ``prefix.adopt_donor``), in-process or forked.

Both ways are compared with literal reruns from the start, run for run, on a sample of positions of a
100-segment run; adopt_donor and _admit refuse the donors that would not equal a fresh replay (other
cut, other visible history, code that read is_replaying), and a mutant without the is_replaying guard
is caught (its outcomes change).
"""

from __future__ import annotations

import pytest

from simulator import prefix
from simulator.scenario import Scenario
from simulator.sweep import Simulator
from workflows.training import train_run


def _merged(entries: list[dict]) -> list[tuple]:
    return [tuple(sorted((k, str(v)) for k, v in e.items() if k != "seq")) for e in entries]


def _sample(sim: Simulator) -> list[int]:
    """Every distinct kind of position of three segments in the middle, and a few near the end."""
    n = len(sim.trace)
    segs = [
        k
        for k, (kind, label) in enumerate(sim.trace)
        if label.startswith(("train-000100:", "train-000102:", "train-000104:"))
    ]
    lo, hi = segs[0] - 4, segs[-1] + 12
    return sorted(set(range(lo, hi)) | set(range(n - 30, n, 3)))


def _runs(sim: Simulator, picks: list[int], mode: str) -> dict:
    seen: dict = {}

    def on_outcome(what, kills, o):
        if what == "kill":
            seen[kills[0]] = (
                o.state,
                o.result,
                [(e.type, e.time, e.attrs) for e in o.events],
                _merged(o.ledger.entries),
            )

    sim.on_outcome = on_outcome
    report = sim.kill_every_position(positions=picks, mode=mode)
    sim.on_outcome = None
    return report, seen


@pytest.mark.slow
@pytest.mark.soak  # ~1 min for both; the shared-replay unit tests stay in CI
@pytest.mark.parametrize("fork_from", [0, 10**9], ids=["forked-when-none-donated", "in-process-only"])
def test_at_100_segments_donated_and_forked_replays_make_the_literal_runs(fork_from):
    sim = Simulator(Scenario(steps=200, eval_every=2, checkpoint_every=10, eval_interval_s=5))
    sim.share_min_events = fork_from
    sim.reference()
    assert len(sim.reference().result["segments"]) == 100
    picks = _sample(sim)
    literal_report, literal = _runs(sim, picks, "rerun")
    report, dedup = _runs(sim, picks, "dedup")
    assert literal_report.ok and report.ok, "\n".join(str(m) for m in report.mismatches[:3])
    assert sorted(literal) == sorted(dedup) == picks
    for k in picks:
        assert dedup[k] == literal[k], f"position {k}: {sim.where(k)}"
    if fork_from:  # each recovery after the first took a replayer a recovery before it stopped with
        assert sim.stats["recoveries from a donated replay"] >= 10 and sim.stats["forked recoveries"] == 0
        # and those with none replayed from scratch on the spine's indexes (prefix.py, 6.)
        assert sim.stats["replays from scratch on the spine's indexes"] >= 10
    else:  # each forked off the spine (forked ones donate nothing back)
        assert sim.stats["forked recoveries"] >= 20
    assert sim.stats["spine cuts"] >= 90
    assert sim.stats["fresh shared replays"] == 1  # the spine was replayed fresh once, then fed on
    assert sim.stats["refused donations"] == 0


def _replayer(events, chunks=None, runtime=None):
    from engine.testing import DrySink, Replayer
    from workflows.models import TrainRunInput
    from workflows.training import train_run

    r = Replayer("train/tiny", train_run, TrainRunInput.model_validate(events[0].attrs["input"]), DrySink())
    r.rt = (runtime or prefix.NotingRuntime)(r)
    at = 0
    for stop in chunks or [len(events)]:
        r.feed(events[at:stop])
        r.advance()
        at = stop
    return r


def test_adopt_donor_takes_only_a_replayer_stopped_at_the_spines_point():
    """Unit: a donor fed the same history in other chunks is adopted, and fed on it ends as a fresh replay
    of the whole history does; a donor at another cut, one whose code read is_replaying, one without the
    noting seam, are refused."""
    from engine import testing as h
    from engine.testing import DrySink, WorkflowRuntime

    ref = Simulator(Scenario(steps=60, eval_every=10, checkpoint_every=10, eval_interval_s=5)).reference()
    ev = ref.events
    cuts = [i + 1 for i, e in enumerate(ev) if e.type == h.TIMER_STARTED]
    c1, c2 = cuts[1], cuts[3]
    spine = prefix.ReplayPrefix("train/tiny", c1, "crcs", "input", _replayer(ev[:c1], [cuts[0], c1]))
    donor = _replayer(ev[:c1], [3, cuts[0] - 2, c1])
    assert prefix.adopt_donor(spine, _replayer(ev[:c2], [c1, c2])) is None
    assert prefix.adopt_donor(spine, _replayer(ev[:c1], runtime=WorkflowRuntime)) is None
    noted = _replayer(ev[:c1])
    noted.rt.read_replaying = True
    assert prefix.adopt_donor(spine, noted) is None
    took = prefix.adopt_donor(spine, donor)
    assert took is not None and took.seq == c1 and donor.done and donor.coro is None
    r = took.replayer
    r.sink = DrySink()
    r.feed(ev[c1:-1])
    r.advance()
    fresh = _replayer(ev[:-1])
    assert r.done and fresh.done and r.outcome == fresh.outcome == ("completed", ref.result)
    assert r.issued == fresh.issued


def test_a_donor_is_admitted_only_where_its_visible_history_is_the_uninterrupted_runs():
    """``Simulator._admit``: at the spine's cut, a donor whose history digest differs from the uninterrupted
    run's there is refused (its code saw other values: e.g. another ``resumed_from``), one of an earlier
    cut is dropped, one whose digest is the run's is adopted."""
    from engine import testing as h

    scn = Scenario(steps=60, eval_every=10, checkpoint_every=10, eval_interval_s=5)
    sim = Simulator(scn)
    ev = sim.reference().events
    cuts = [i + 1 for i, e in enumerate(ev) if e.type == h.TIMER_STARTED]
    c1 = cuts[1]
    spine = prefix.ReplayPrefix("train/tiny", c1, "crcs", "input", _replayer(ev[:c1]))
    donors = {cuts[0]: [(_replayer(ev[: cuts[0]]), b"d0")], c1: [(_replayer(ev[:c1]), b"other")]}
    ready: list = []
    sim._snapshots._admit(spine, b"d1", donors, ready)
    assert not ready and not donors and sim.stats["refused donations"] == 1
    donors = {c1: [(_replayer(ev[:c1]), b"d1")]}
    sim._snapshots._admit(spine, b"d1", donors, ready)
    assert len(ready) == 1 and sim.stats["donated replays"] == 1


async def _replay_aware(rt, input):
    """A TrainRun whose result tells which of its commands it saw replayed: code that reads is_replaying
    (a fresh replay answers True where the live run that made the history answered False)."""
    from engine import Runtime  # noqa: F401 - (the seam, as in workflows/)

    seen: list[bool] = []

    class Noting:
        def __getattr__(self, name):
            return getattr(rt, name)

        async def execute_activity(self, *a, **k):
            seen.append(rt.is_replaying)
            return await rt.execute_activity(*a, **k)

        async def sleep(self, seconds):
            seen.append(rt.is_replaying)
            return await rt.sleep(seconds)

    result = await train_run(Noting(), input)
    return result.model_copy(update={"name": result.name + "-" + "".join("r" if x else "l" for x in seen)})


@pytest.mark.slow
def test_a_workflow_that_reads_is_replaying_is_not_shared_and_the_guard_is_what_says_so(monkeypatch):
    """Such code is outside replay's contract (its dedup runs differ from its literal ones already), but a
    donated replay must change nothing even there: its donors are refused (the noting seam), so its sweep
    equals the one without donated replays; with the noting seam's flag taken out (a mutant), donated
    replays are taken, and outcomes change (a checked splice's result comes from the donor's code)."""
    scn = Scenario(steps=60, eval_every=10, checkpoint_every=10, eval_interval_s=5)

    def sweep_of(donors: bool):
        sim = Simulator(scn, workflow_fn=_replay_aware)
        sim.share_min_events, sim.share_donors = 10**9, donors
        sim.reference()
        _, runs = _runs(sim, list(range(len(sim.trace))), "dedup")  # (they fail their checks: the name changed)
        return runs, sim

    base, _ = sweep_of(False)
    runs, sim = sweep_of(True)
    assert runs == base and sim.stats["refused donations"] >= 3 and sim.stats["donated replays"] == 0

    monkeypatch.setattr(
        prefix.NotingRuntime, "is_replaying", property(lambda self: self._r.next_cmd < len(self._r.commands))
    )
    runs, sim = sweep_of(True)
    assert sim.stats["donated replays"] >= 3
    assert runs != base  # the mutant is caught


def test_the_spine_refuses_a_history_that_resolves_a_command_twice():
    from engine import testing as h

    ev = [
        h.Event(1, h.ACTIVITY_COMPLETED, 0.0, {"cmd": 0}),
        h.Event(2, h.TIMER_FIRED, 1.0, {"cmd": 1}),
        h.Event(3, h.ACTIVITY_FAILED, 2.0, {"cmd": 0, "final": False}),
    ]
    assert not prefix._resolved_twice(ev, set())  # a retried failure resolves nothing
    assert prefix._resolved_twice(ev + [h.Event(4, h.ACTIVITY_TIMED_OUT, 3.0, {"cmd": 1, "final": True})], set())
    assert prefix._resolved_twice(ev[1:], {1})
