"""The simulator covers ModelRelease: the real release workflow after the simulated TrainRun, killed at
every position of its requests (simulator/release.py), with its oracle."""

from __future__ import annotations

import pytest

from simulator.__main__ import main
from simulator.mutants import RELEASE_SCENARIO
from simulator.release_checks import check_releases
from simulator.scenario import Scenario, remove_home
from simulator.sweep import Simulator


def _release_positions(sim: Simulator) -> list[int]:
    sim.reference()
    assert sim.release_from is not None
    return list(range(sim.release_from, len(sim.trace)))


def test_the_uninterrupted_release_publishes_once_and_reuses_the_evaluation():
    sim = Simulator(RELEASE_SCENARIO)
    assert sim.check_reference() is None
    ref = sim.reference()
    failed, passed = ref.extra["releases"]
    assert not failed["result"]["published"] and "gate ppl/ppl<=1 failed" in failed["result"]["reason"]
    assert failed["commands"] == [f"eval-r{failed['result']['digest'][:12]}-ppl"]  # no publish scheduled
    assert passed["result"]["published"] and passed["result"]["version"] == "v0001"
    kinds = [e["kind"] for e in ref.ledger.entries if str(e.get("wf", "")).startswith("release/")]
    assert kinds == ["eval-start", "eval-done", "eval-reused", "publish-start", "published", "publish-done"]
    labels = [label for _, label in sim.trace[sim.release_from :] if label.startswith("publish")]
    assert labels == ["publish:start", "publish:after_copy:v0001", "publish:after_rename:v0001"]


def test_a_kill_at_every_position_of_the_release_requests_matches():
    sim = Simulator(RELEASE_SCENARIO)
    sim.verify_snapshots = True  # each snapshot folder (evaluations and releases/ included) equals its source
    positions = _release_positions(sim)
    assert len(positions) >= 15
    report = sim.kill_every_position(positions=positions)
    assert report.ok and report.tried == report.matched == len(positions), report.mismatches[:1]


def test_the_rerun_and_snapshot_modes_agree_on_the_release():
    sim = Simulator(RELEASE_SCENARIO)
    seen: dict[str, dict] = {"rerun": {}, "snapshot": {}}
    mode = ["rerun"]
    sim.on_outcome = lambda what, kills, o: kills and seen[mode[0]].setdefault(tuple(kills), o.extra.get("releases"))
    positions = _release_positions(sim)[::3]
    assert sim.kill_every_position(positions=positions, mode="rerun").ok
    mode[0] = "snapshot"
    assert sim.kill_every_position(positions=positions, mode="snapshot").ok
    assert seen["rerun"] == seen["snapshot"] and len(seen["rerun"]) == len(positions)


def test_a_second_publication_and_a_second_evaluation_are_caught():
    """The oracle itself: a run whose ledger and files show a second publication / evaluation fails it."""
    ref = Simulator(RELEASE_SCENARIO).run([])  # (its home is kept)
    assert check_releases(ref) == []
    pub = next(e for e in ref.ledger.entries if e["kind"] == "published")
    ev = next(e for e in ref.ledger.entries if e["kind"] == "eval-start" and e["wf"].startswith("release/"))
    ref.ledger.entries.append({**pub, "seq": len(ref.ledger.entries)})
    ref.ledger.entries.append({**ev, "seq": len(ref.ledger.entries)})
    lines = check_releases(ref)
    assert any("published again" in x for x in lines) and any("evaluated again" in x for x in lines), lines
    current = ref.home / "releases" / "tiny" / "CURRENT"
    current.write_text("v0002\n")
    assert any("CURRENT names v0002" in x for x in check_releases(ref))
    remove_home(ref.home)


def test_kill_every_position_of_a_run_then_its_release_with_best_selection(capsys):
    rc = main(
        [
            "kill-every-position",
            "--steps",
            "200",
            "--eval-every",
            "100",
            "--checkpoint-every",
            "50",
            "--stop-at",
            "150",
            "--suites",
            "ppl,zoo",
            "--release",
            "--gate",
            "fail,pass",
            "--select",
            "best",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    tried = int(out.split(" tried")[0].rsplit(" ", 1)[1])
    assert tried > 150 and f"{tried} tried, {tried} matched" in out


def test_release_best_runs_on_the_early_stops_best_checkpoint():
    scn = Scenario(steps=400, eval_every=200, checkpoint_every=50, stop_at=300, release=("pass",), select="best")
    sim = Simulator(scn)
    assert sim.check_reference() is None
    (rel,) = sim.reference().extra["releases"]
    assert rel["result"]["checkpoint"] == "runs/tiny/ckpt/step-000200" and rel["result"]["published"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--release", "--select", "best"], "--select best needs a selection metric"),
        (["--release-only"], "--release-only needs --release"),
        (["--release", "--oom-at", "50x1"], "not with --fail-suites or --oom-at"),
    ],
)
def test_bad_release_arguments_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["kill-every-position", "--steps", "100", "--eval-every", "50", "--checkpoint-every", "50", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
