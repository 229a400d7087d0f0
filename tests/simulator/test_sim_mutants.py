"""Each pitfall of the seed (section 5) planted into a copy of TrainRun: the simulator must fail on it.

The mutants are the current ``workflows.train_run`` with one dependency swapped or one call
site changed (simulator/mutants.py), so they follow the real workflow as it evolves.
"""

from __future__ import annotations

import pytest

from simulator.mutants import MUTANTS, catch_mutant, catch_scenarios, make_mutant
from simulator.scenario import Scenario
from simulator.sweep import Simulator

REQUIRED_PITFALLS = {1, 2, 3, 4, 5, 8, 9, 11}

SYMPTOM = {  # what the simulator must say about each mutant (the pitfall's own symptom)
    "s01-last-dropped": "result steps 1000 != spec steps 1200",
    "s04-boundary-repeated": "train-001200",
    "s02-train-id": "activity id 'train' used twice",
    "s03-eval-id": "activity id 'eval-000500' used twice",
    "s05-train-to-end": "1200",  # the trainer ended at 1200 where the segment ends at 500
    "s06-no-retries": "simulated out of memory at step 740",
    "s07-cancel-moves-on": "expected canceled",
    "s10-one-eval-activity": "eval-000500-all",
    "s11-continue-after-failed-suite": "ended completed though suite ppl failed for good",
    "s13-wall-clock-sleep": "'train-000500', 'eval-000500-ppl', 'eval-000500-zoo', 'train-001000'",
    "s14-early-stop-ignored": "ended at step 700, not 1000",
    "r01-publish-twice": "digest 2a841e287012 published again (v0002",  # a kill after the rename, then again
    "r02-gate-ignored": "a failing gate published v0001",
    "r03-eval-per-request": "suite ppl evaluated again for digest 2a841e287012",
}


def test_the_required_pitfalls_are_planted():
    assert {pitfall for pitfall, _ in MUTANTS.values()} >= REQUIRED_PITFALLS
    assert set(SYMPTOM) == set(MUTANTS)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n == "s07-cancel-moves-on" else n  # ~2.6 s
        for n in sorted(MUTANTS)
    ],
)
def test_the_simulator_fails_on_the_mutant(name):
    found = catch_mutant(name)
    assert found, f"mutant {name} ({MUTANTS[name][1]}) was not caught"
    assert any(SYMPTOM[name] in line for line in found), found


@pytest.mark.slow
def test_the_real_workflow_passes_where_the_mutants_fail():
    for what, scn in catch_scenarios():
        assert Simulator(scn).check_reference() is None, what
    sim = Simulator(Scenario())
    assert sim.cancels(seed=1, runs=10).ok
    assert sim.random_kills(seed=1, runs=20, kills_per_run=3).ok


def test_one_activity_for_all_suites_reruns_the_finished_suite_after_a_kill():
    """Pitfall 8's symptom itself: a kill in the zoo suite runs ppl again (the ledger shows it)."""
    sim = Simulator(
        Scenario(suites=("ppl", "zoo")),
        workflow_fn=make_mutant("s10-one-eval-activity"),
        mutant="s10-one-eval-activity",
    )
    sim.reference()
    in_zoo = [k for k, (kind, label) in enumerate(sim.trace) if kind == "eval" and label.endswith(":zoo")]
    report = sim.kill_every_position(positions=in_zoo[:1])
    lines = [line for m in report.mismatches for line in m.lines]
    assert any("evaluation tiny-000500 ppl executed again" in line for line in lines), lines
