"""Polite stops in the deterministic simulator (issue 39 item 7; simulator/stops.py).

A stop is the engine's public ``Engine.request_stop`` (what ctl's SIGTERM handler calls), asked at a
position of the run; the fake activities answer it as the real runner and trainer do (the trainer
checkpoints the step it is at and the attempt ends ``Preempted``; an evaluation ends ``Preempted``,
nothing written). The engine records ``activity_preempted`` (an attempt in flight or leased), or
``preempted`` (a durable wait, a retry's backoff, a workflow task), ctl "exits 143" and the same
command starts again. Every run must end with the uninterrupted run's result and final loss bits,
each evaluation once, no step lost to the stop, no preemption counted as a failure, and a wait's
remainder waited later. Fakes: the activities (the real engine and workflow code run).
"""

from __future__ import annotations

import copy

import pytest

from engine import testing as h
from simulator.__main__ import main
from simulator.scenario import Scenario
from simulator.stops import StopSweep, stop_lines
from simulator.sweep import Simulator

pytestmark = pytest.mark.slow  # hundreds of simulated runs, a few seconds

SCN = Scenario(steps=40, eval_every=20, checkpoint_every=10, eval_interval_s=30)
KINDS = {
    "preempted: train",
    "preempted: eval",
    "preempted: not started",
    "preempted: waiting on timer",
    "preempted: waiting on workflow",
}


def _position(sim: Simulator, kind: str, label: str) -> int:
    return next(i for i, t in enumerate(sim.trace) if t == (kind, label))


def test_a_stop_at_every_position_ends_exactly_and_records_what_it_stopped() -> None:
    sim = Simulator(SCN)
    report = StopSweep(sim).stops(kills=False)
    assert report.ok and report.tried == len(sim.trace), "\n".join(map(str, report.mismatches[:3]))
    assert KINDS <= set(sim.stats), sim.stats  # every kind of stop was exercised
    assert sim.stats["stops that ended a life"] >= len(sim.trace) - 3, sim.stats  # (the last: the run had ended)


def test_kills_at_every_position_after_a_stop_until_ctl_exits_and_after() -> None:
    """A stop in the middle of training, during an evaluation, during the durable wait and in a workflow
    task's commit; then a kill at every position from the stop to three past the stopped life's end."""
    sim = Simulator(SCN)
    sim.reference()
    where = [
        _position(sim, "step", "train-000020:14"),
        _position(sim, "eval", "eval-000020-ppl:ppl"),
        _position(sim, "timer-wait", "30s"),
        _position(sim, "before-commit", "task"),
    ]
    report = StopSweep(sim).stops(positions=where)
    assert report.ok, "\n".join(map(str, report.mismatches[:3]))
    assert sim.stats["kills after a stop"] >= 4 * 4, sim.stats


def test_a_preempted_attempt_uses_no_retry() -> None:
    """The first segment's trainer fails 4 times at step 15 (train_max_attempts 5): a stop before that must
    not use up the fifth attempt (``activity_preempted`` is not counted), or the run fails."""
    sim = Simulator(Scenario(steps=40, eval_every=20, checkpoint_every=10, eval_interval_s=30, oom_at=((15, 4),)))
    sim.reference()
    report = StopSweep(sim).stops(positions=range(0, 30), kills=False)
    assert report.ok, "\n".join(map(str, report.mismatches[:3]))
    assert sim.stats["preempted: waiting on activity"], sim.stats  # a stop during a retry's backoff too


def test_the_stop_checks_see_a_lost_step_and_a_stop_that_recorded_nothing() -> None:
    sim = Simulator(SCN)
    sim.reference()
    o = sim.run([], stop_at=_position(sim, "step", "train-000020:14"))
    assert stop_lines(o) == []
    lost = copy.copy(o)
    lost.ledger = copy.deepcopy(o.ledger)
    starts = [e for e in lost.ledger.entries if e["kind"] == "train-start"]
    starts[1]["from_step"] = 10  # the attempt after the stop resumed from the cadence's checkpoint
    assert any("stopped politely at step 14" in x and "4 step(s) lost" in x for x in stop_lines(lost)), stop_lines(lost)
    silent = copy.copy(o)
    silent.events = [e for e in o.events if e.type != h.ACTIVITY_PREEMPTED]
    assert any("with nothing recorded" in x for x in stop_lines(silent)), stop_lines(silent)


def test_the_stops_command_refuses_release_and_reruns_one_stop(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["stops", "--steps", "40", "--eval-every", "20", "--checkpoint-every", "10", "--release"])
    assert e.value.code == 2 and "not with --release" in capsys.readouterr().err
    assert (
        main(
            [
                "kill-at",
                "--steps",
                "40",
                "--eval-every",
                "20",
                "--checkpoint-every",
                "10",
                "--kills",
                "22",
                "--stop-at-position",
                "20",
            ]
        )
        == 0
    )
    assert "matched" in capsys.readouterr().out


@pytest.mark.soak
def test_the_full_stop_sweep_with_kills_after_every_stop() -> None:
    """Every stop position of SCN, each followed by kills to 3 positions past its life (~650 runs, ~45 s)."""
    sim = Simulator(SCN)
    report = StopSweep(sim).stops()
    assert report.ok, "\n".join(map(str, report.mismatches[:3]))
    assert KINDS <= set(sim.stats), sim.stats
