"""The simulator on the real engine and the real TrainRun: kills at every position, many kills, cancels.

Fakes stand in for tinyllm here (simulator/fakes.py: a float-recurrence trainer with real
checkpoint files), because the point is the engine's and the workflow's behaviour under kills,
not the model; tests/simulator/test_sim_kill_loop.py kills the real processes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.mutants import make_mutant
from workflows.models import ACTIVITY_TRAIN
from workflows.training import train_run
from simulator.scenario import Scenario
from simulator.sweep import Simulator


@pytest.mark.slow
def test_hand_example_killed_at_every_position():
    """Section 3's run (1200 steps, eval_every 500, 30 s waits, ppl; checkpoints every 100)."""
    sim = Simulator(Scenario())
    report = sim.kill_every_position()
    assert report.mismatches == [], "\n".join(str(m) for m in report.mismatches[:3])
    # every position of the uninterrupted run was a kill: each step, each commit, each timer wait
    kinds = {kind for kind, _ in sim.trace}
    assert {"step", "ckpt", "before-commit", "after-commit", "eval", "eval-done", "timer-wait"} <= kinds
    assert sum(1 for kind, _ in sim.trace if kind == "step") == 1200
    assert sum(1 for kind, _ in sim.trace if kind == "timer-wait") == 2
    assert report.tried == report.matched == len(sim.trace)
    # and literally: every 10th position run again from the start and killed in-process
    literal = sim.kill_every_position(positions=range(0, len(sim.trace), 10), mode="rerun")
    assert literal.ok and literal.tried == len(range(0, len(sim.trace), 10))


@pytest.mark.slow
def test_seeded_runs_with_several_kills():
    sim = Simulator(Scenario(suites=("ppl", "zoo"), corpus=True))
    report = sim.random_kills(seed=11, runs=25, kills_per_run=5)
    assert report.ok, "\n".join(str(m) for m in report.mismatches[:3])
    assert sim.stats["ended completed"] == 25
    assert sum(n for key, n in sim.stats.items() if key in ("3 kills", "4 kills", "5 kills")) > 0


@pytest.mark.slow
def test_kills_during_cancel_end_canceled_and_the_spec_continues():
    sim = Simulator(Scenario(suites=("ppl", "zoo")))
    report = sim.cancels(seed=5, runs=25)
    assert report.ok, "\n".join(str(m) for m in report.mismatches[:3])
    assert sim.stats["ended canceled"] > 0
    assert sim.stats["restarted after cancel, ended completed"] == sim.stats["ended canceled"]


def test_a_retryable_trainer_failure_resumes_from_its_checkpoint():
    """TestRetryResumesFromLatest: an OOM at step 740 redoes only steps 701..740."""
    sim = Simulator(Scenario(oom_at=((740, 2),)))
    assert sim.check_reference() is None
    starts = [e for e in sim.reference().ledger.entries if e["kind"] == "train-start"]
    assert [(e["activity"], e["attempt"], e["from_step"]) for e in starts] == [
        ("train-000500", 1, 0),
        ("train-001000", 1, 500),
        ("train-001000", 2, 700),
        ("train-001000", 3, 700),
        ("train-001200", 1, 1000),
    ]
    report = sim.kill_every_position(positions=range(0, len(sim.trace), 37))
    assert report.ok, "\n".join(str(m) for m in report.mismatches[:3])


def test_a_suite_failing_for_good_stops_the_run_under_kills():
    sim = Simulator(Scenario(suites=("ppl", "zoo"), fail_suites=("ppl",)))
    sim.reference()
    report = sim.kill_every_position(positions=range(0, len(sim.trace), 5))
    assert report.ok, "\n".join(str(m) for m in report.mismatches[:3])
    assert sim.reference().state == "failed"


@pytest.mark.parametrize("stop_at", [150, 200])  # inside segment 2; at its end
def test_an_early_stop_is_the_same_step_and_best_checkpoint_after_a_kill_at_every_position(stop_at):
    """Early stopping (issue 28) under the simulator: the trainer stops at ``stop_at`` (its decision in
    that checkpoint); killed at every position, every run stops there with the same result, the later
    segments never run, and each evaluation sees the stop's checkpoint."""
    scn = Scenario(
        steps=300, eval_every=100, checkpoint_every=25, eval_interval_s=5, stop_at=stop_at, suites=("ppl", "zoo")
    )
    sim = Simulator(scn)
    assert sim.check_reference() is None
    ref = sim.reference()
    assert ref.state == "completed" and ref.result["steps"] == stop_at
    assert (
        ref.result["stopped_early"]["best_checkpoint"] == f"runs/tiny/ckpt/step-{stop_at - 50:06d}"
    )  # the fake: 2 checks back
    assert [s["until"] for s in ref.result["segments"]] == [100, 200]
    for mode in ("dedup", "rerun"):
        positions = None if mode == "dedup" else range(0, len(sim.trace), 7)
        report = sim.kill_every_position(positions=positions, mode=mode)
        assert report.ok and report.tried > 50 // (1 if mode == "dedup" else 7), "\n".join(
            str(m) for m in report.mismatches[:3]
        )


@pytest.mark.slow
def test_a_mismatch_names_its_positions_and_a_command_that_reproduces_it():
    sim = Simulator(
        Scenario(steps=300, eval_every=100, checkpoint_every=50),
        mutant="s05-train-to-end",
        workflow_fn=make_mutant("s05-train-to-end"),
    )
    report = sim.kill_every_position(positions=[40], stop_at_first=False)
    assert not report.ok
    text = str(report.mismatches[-1])
    assert "kills at [40]" in text and "killed at position 40" in text
    command = text.split("rerun: ")[1].strip()
    assert command.startswith("python -m simulator kill-at ") and "--mutant s05-train-to-end" in command
    rerun = subprocess.run([sys.executable, "-m", *command.split()[2:]], capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "killed at position 40: step train-000100:37" in rerun.stdout
    assert text.split("\n")[2] in rerun.stdout  # the same first finding


def _merged(entries):
    """Ledger entries without sequence numbers, runs of steps merged (bulk stepping is an optimisation)."""
    out = []
    for e in entries:
        e = {k: v for k, v in e.items() if k not in ("seq", "where")}
        prev = out[-1] if out else None
        if (
            e["kind"] == "steps"
            and prev
            and prev["kind"] == "steps"
            and prev["activity"] == e["activity"]
            and prev["last"] + 1 == e["first"]
        ):
            prev["last"] = e["last"]
        else:
            out.append(e)
    return out


@pytest.mark.slow
def test_the_fast_modes_make_the_same_runs_as_the_literal_one():
    """Literal (run again, killed in-process), snapshot (files copied at the kill) and dedup (one
    recovery per distinct durable state, each position's own ledger) agree, run for run."""
    seen: dict[str, dict] = {"rerun": {}, "snapshot": {}, "dedup": {}}

    def record(mode):
        def on_outcome(what, kills, o):
            if what == "kill":
                seen[mode][kills[0]] = (
                    o.state,
                    o.result,
                    [(e.type, e.time, e.attrs) for e in o.events],
                    _merged(o.ledger.entries),
                )

        return on_outcome

    sim = Simulator(Scenario(steps=400, eval_every=150, checkpoint_every=50, suites=("ppl", "zoo")))
    sim.share_min_events, sim.share_every = 0, 1  # every recovery after the first cut forks off a shared replay
    sim.verify_snapshots = True  # each reused snapshot folder is compared with its source, file for file
    sim.reference()
    positions = list(range(0, len(sim.trace), 3))
    for mode in ("rerun", "snapshot", "dedup"):
        sim.on_outcome = record(mode)
        assert sim.kill_every_position(positions=positions, mode=mode).ok
    assert sorted(seen["rerun"]) == sorted(seen["snapshot"]) == sorted(seen["dedup"]) == positions
    for k in positions:
        assert seen["rerun"][k] == seen["snapshot"][k] == seen["dedup"][k], f"position {k}: {sim.where(k)}"
    assert sim.stats["converged"] > 0  # some recoveries were stopped at convergence and spliced
    assert sim.stats["shared replays"] >= 2


@pytest.mark.slow
def test_at_100_segments_converged_recoveries_are_the_runs_that_ran_to_the_end():
    """100 segments (2 steps each, a checkpoint every 10): kills of several kinds around one
    segment and near the end, each recovered by dedup (stopped at convergence, spliced) and run
    again literally from the start; the two agree run for run, and the splices happened."""
    seen: dict[str, dict] = {"rerun": {}, "dedup": {}}
    homes: dict[str, set] = {"rerun": set(), "dedup": set()}

    def record(mode):
        def on_outcome(what, kills, o):
            homes[mode].add(o.home)
            if what == "kill":
                seen[mode][kills[0]] = (
                    o.state,
                    o.result,
                    [(e.type, e.time, e.attrs) for e in o.events],
                    _merged(o.ledger.entries),
                )

        return on_outcome

    sim = Simulator(Scenario(steps=200, eval_every=2, checkpoint_every=10, eval_interval_s=5))
    sim.share_min_events, sim.share_every = 0, 1  # recoveries fork off a fresh replay shared per segment
    sim.verify_snapshots = True
    sim.reference()
    assert len(sim.reference().result["segments"]) == 100
    n = len(sim.trace)
    # in the segment ending at step 100: a step, the checkpoint written but not yet heartbeated, the
    # heartbeat committed (both resume from step 100: their own segment's end), the evaluation, the timer
    # wait (a fresh engine idle before its first replay); and a step near the end
    seg = [k for k, (kind, label) in enumerate(sim.trace) if label.startswith("train-000100:")]
    first, ckpt = seg[0], next(k for k in seg if sim.trace[k][0] == "ckpt")
    picks = [first, ckpt, ckpt + 3]
    picks += [next(k for k in range(ckpt, n) if sim.trace[k][0] == kind) for kind in ("eval", "timer-wait")]
    picks += [n - 12]
    picks = sorted(set(picks))
    for mode in ("rerun", "dedup"):
        sim.on_outcome = record(mode)
        report = sim.kill_every_position(positions=picks, mode=mode)
        assert report.ok, "\n".join(str(m) for m in report.mismatches[:3])
    assert sorted(seen["rerun"]) == sorted(seen["dedup"]) == picks
    for k in picks:
        assert seen["rerun"][k] == seen["dedup"][k], f"position {k}: {sim.where(k)}"
    assert sim.stats["converged"] >= 3 and sim.stats["checked splices"] >= 1 and sim.stats["shared replays"] >= 40
    # the first recovery made the reused snapshot folder in a forked child; the others took it over from
    # there, and it is gone after the sweep
    assert len(homes["dedup"]) == 1 and not [h for h in homes["dedup"] | homes["rerun"] if h.exists()]


class _Leaky:
    """The seam, passing each train segment's ``resumed_from`` into the next segment's spec."""

    def __init__(self, rt):
        self._rt, self.last = rt, None

    def __getattr__(self, name):
        return getattr(self._rt, name)

    async def execute_activity(self, name, input, options, *, result_type=None):
        if name == ACTIVITY_TRAIN and self.last is not None:
            input = input.model_copy(update={"spec": {**input.spec, "note": self.last}})
        out = await self._rt.execute_activity(name, input, options, result_type=result_type)
        if name == ACTIVITY_TRAIN:
            self.last = str(out.resumed_from)
        return out

    async def sleep(self, seconds):
        return await self._rt.sleep(seconds)


async def _leaky_train_run(rt, input):
    return await train_run(_Leaky(rt), input)


def test_a_checked_splice_is_refused_when_the_code_passes_what_differs_into_later_inputs():
    """A recovery that resumed from its segment's own last checkpoint differs from the uninterrupted
    run only in its train result's ``resumed_from``; a workflow that passes it into the next
    segment's input must not be spliced to the uninterrupted run's future there (it runs on, and
    is spliced one segment later, where the value no longer reaches any input)."""
    seen: dict[str, dict] = {"rerun": {}, "dedup": {}}

    def record(mode):
        def on_outcome(what, kills, o):
            if what == "kill":
                seen[mode][kills[0]] = (o.state, o.result, [(e.type, e.time, e.attrs) for e in o.events])

        return on_outcome

    sim = Simulator(
        Scenario(steps=60, eval_every=10, checkpoint_every=10, eval_interval_s=5), workflow_fn=_leaky_train_run
    )
    sim.share_min_events, sim.share_every = 0, 1  # the recoveries fork off a shared fresh replay
    sim.reference()
    picks = [k for k, (kind, label) in enumerate(sim.trace) if kind == "ckpt" and label.endswith(":20")]
    for mode in ("rerun", "dedup"):
        sim.on_outcome = record(mode)
        sim.kill_every_position(positions=picks, mode=mode)
    assert sorted(seen["rerun"]) == sorted(seen["dedup"]) == picks
    for k in picks:
        assert seen["rerun"][k] == seen["dedup"][k], f"position {k}: {sim.where(k)}"
    assert sim.stats["refused splices"] >= 1 and sim.stats["checked splices"] >= 1
    # the checked replays went on from the recovery's own replayer; a refused one was made again without it
    assert sim.stats["splices on the recovery's own replayer"] >= 1 and sim.stats["recoveries made again"] >= 1


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_command_prints_positions_tried_and_matched_and_exits_by_the_outcome():
    small = [
        "--steps",
        "120",
        "--eval-every",
        "50",
        "--eval-interval",
        "30",
        "--suites",
        "ppl,zoo",
        "--checkpoint-every",
        "20",
    ]
    ok = _cli("kill-every-position", *small)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    tried = int(ok.stdout.split(" tried")[0].split()[-1])
    assert f"{tried} tried, {tried} matched, 0 mismatched" in ok.stdout and tried > 120
    bad = _cli("kill-every-position", *small, "--mutant", "s01-last-dropped", "--stop-at-first")
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout and "rerun: python -m simulator kill-at" in bad.stdout


@pytest.mark.slow
def test_bad_arguments_exit_2_before_any_run():
    for args in (
        ["kill-at", "--kills", "3", "--steps", "0"],
        ["kill-at", "--kills", "x"],
        ["kill-every-position", "--suites", "nope"],
        ["kill-at", "--kills", "1", "--mutant", "nope"],
        ["kill-every-position", "--stop-at", "130", "--checkpoint-every", "25", "--steps", "300"],
    ):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.strip()


def test_the_outcome_checks_give_the_same_lines_on_the_kept_events_as_on_the_whole_history():
    """A spliced recovery's outcome is checked on ``kept_events`` of its history (a third of it): for the
    reference and for histories broken in each way the checks look for, the lines are the same."""
    from dataclasses import replace

    from engine import testing as h
    from simulator.checks import kept_events

    sim = Simulator(Scenario(steps=60, eval_every=10, checkpoint_every=10, eval_interval_s=5))
    ref = sim.reference()
    ev = ref.events
    late = [e._replace(time=e.time + 1.0) if e.type == h.TIMER_FIRED else e for e in ev]
    early = [e._replace(time=e.time - 3.0) if e.type == h.ACTIVITY_SCHEDULED and e.seq > 10 else e for e in ev]
    fired_twice = ev[:10] + [ev[9]._replace(seq=0)] + ev[10:]
    broken = [ev, ev[:5] + ev[7:], late, early, fired_twice, ev[:-3]]
    for i, events in enumerate(broken):
        o = replace(ref, events=events)
        want = sim.state_lines(o, what="kill")
        assert want or i == 0
        assert sim.state_lines(replace(o, events=kept_events(events)), what="kill") == want, i


def test_a_sweep_of_nothing_is_refused_exit_2(capsys):
    """--runs 0 printed '0 tried, 0 matched, 0 mismatched' and exit 0 (a pass with nothing exercised);
    random-kills --kills 0 failed with randint's ValueError traceback. Both: exit 2 before any run."""
    from simulator.__main__ import main

    for args in (
        ["random-kills", "--runs", "0"],
        ["random-kills", "--kills", "0"],
        ["cancels", "--runs", "0"],
        ["kill-loop", "--spec", "x.json", "--kills", "0"],
        ["campaign", "--runs", "0"],
        ["kill-every-position", "--jobs", "0"],
    ):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2, args
        assert "at least 1" in capsys.readouterr().err, args


def test_kill_at_a_position_the_run_never_reaches_is_not_tested(capsys):
    """kill-at 5,99999: the kill at 99999 never happened (the run ended first), yet the run printed 'matched',
    exit 0, as if that kill had been survived."""
    from simulator.__main__ import main

    small = ["--steps", "100", "--eval-every", "50", "--checkpoint-every", "10"]
    assert main(["kill-at", *small, "--kills", "5,99999"]) == 3
    out = capsys.readouterr().out
    assert "killed at position 5:" in out and "matched" not in out.splitlines()[-1], out
    assert "kill at position 99999 did not happen (the run ended first): not tested" in out, out
    assert main(["kill-at", *small, "--kills", "5"]) == 0 and capsys.readouterr().out.splitlines()[-1] == "matched"
