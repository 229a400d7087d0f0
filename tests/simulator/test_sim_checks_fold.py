"""The ledger checks as folds (simulator/ledger_folds.py) give the very lines of the whole-ledger checks.

``_old_check_evaluations`` and ``_old_check_steps`` are the checks as they were before they
became folds (simulator/checks.py at 9169ad8), kept here as the slow reference. They are
compared with the folds on real ledgers (the uninterrupted run's and its positions') and on
ledgers broken at random, whole and piecewise: a prefix fold, own entries, and a target's tail
whose head differs from the position's (``TailIndex.fast_clean`` must then prove nothing false).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest

from simulator.checks import check_completed_ledger, check_evaluations, check_steps
from simulator.ledger import Ledger, SplicedLedger
from simulator.ledger_folds import WORK_KINDS, LedgerFold, PrefixFold, TailCache, position_lines
from simulator.convergence import Target
from simulator.fakes import FakeActivities
from simulator.mutants import make_mutant
from simulator.scenario import Scenario
from simulator.sweep import Simulator

# --- the reference: the whole-ledger checks as they were ------------------------------------------


def _old_check_evaluations(entries: list[dict], scn: Scenario, *, wf: str | None = None) -> list[str]:
    wanted = {(f"{scn.name}-{b:06d}", s) for b in scn.ends() for s in scn.suites}
    starts: dict[tuple, list[int]] = defaultdict(list)
    done: dict[tuple, int] = defaultdict(int)
    bad = []
    for i, e in enumerate(entries):
        if wf is not None and e.get("wf") not in (wf, None):
            continue
        if e["kind"] == "eval-start":
            key = (e["run"], e["suite"])
            starts[key].append(i)
            step = int(e["run"].rsplit("-", 1)[1]) if e["run"].rsplit("-", 1)[-1].isdigit() else None
            if step is not None and e["steps"] != [step]:
                bad.append(f"evaluation {e['run']} {e['suite']} saw the model at step {e['steps']}, not {step}")
        elif e["kind"] == "eval-done":
            done[(e["run"], e["suite"])] += 1
    for key in sorted(set(starts) | wanted):
        if key not in wanted:
            bad.append(f"unexpected evaluation {key[0]} {key[1]}")
            continue
        if done[key] < 1 and not scn.fail_suites:
            bad.append(f"evaluation {key[0]} {key[1]} never finished")
        runs = starts[key]
        for prev, nxt in zip(runs, runs[1:]):
            if not _old_interrupted_alone(entries, prev, nxt, key):
                bad.append(
                    f"evaluation {key[0]} {key[1]} executed again (ledger #{entries[nxt]['seq']}) "
                    f"though it was not interrupted"
                )
    return bad


def _old_interrupted_alone(entries: list[dict], prev: int, nxt: int, key: tuple) -> bool:
    for e in entries[prev + 1 : nxt]:
        if e["kind"] == "crash":
            return True
        if e["kind"] in WORK_KINDS and (e.get("run"), e.get("suite")) != key:
            return False
    return False


def _old_check_steps(entries: list[dict]) -> list[str]:
    bad = []
    last_ckpt: dict[str, int] = {}
    executed: dict[str, int] = {}
    pending_start: dict[str, dict] = {}
    for e in entries:
        kind, run = e["kind"], e.get("run")
        if kind == "train-start":
            pending_start[run] = e
        elif kind == "steps":
            start = pending_start.pop(run, None)
            if start is not None and start["from_step"] < executed.get(run, 0):
                newest = last_ckpt.get(run, 0)
                if start["from_step"] != newest:
                    bad.append(
                        f"{start['activity']} attempt {start['attempt']} resumed from step {start['from_step']} "
                        f"after step {executed[run]} was taken and step {newest} checkpointed: "
                        f"steps {start['from_step'] + 1}..{newest} redone"
                    )
            executed[run] = max(executed.get(run, 0), e["last"])
        elif kind == "ckpt":
            last_ckpt[run] = e["step"]
    return bad


def _old(entries: list[dict], scn: Scenario, wf: str) -> list[str]:
    return _old_check_evaluations(entries, scn, wf=wf) + _old_check_steps(entries)


def _ledger(entries: list[dict]) -> Ledger:
    led = Ledger()
    led.entries = entries
    return led


# --- ledgers broken at random ---------------------------------------------------------------------


def _break(entries: list[dict], rng: random.Random) -> list[dict]:
    """One to three random breaks of the kinds the checks look for (or that they must not mind)."""
    out = [dict(e) for e in entries]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(out))
        op = rng.randrange(9)
        evals = [j for j, e in enumerate(out) if e["kind"] in ("eval-start", "eval-done")]
        trains = [j for j, e in enumerate(out) if e["kind"] == "train-start"]
        if op == 0:  # an entry lost
            del out[i]
        elif op == 1:  # an entry repeated later (an evaluation run again, a checkpoint written again...)
            out.insert(rng.randrange(i, len(out) + 1), dict(out[i]))
        elif op == 2:  # a crash somewhere
            out.insert(i, {"kind": "crash", "position": i, "where": "test"})
        elif op == 3 and evals:  # an evaluation of the wrong step, or of a suite nobody asked for
            e = out[rng.choice(evals)]
            if rng.random() < 0.5:
                e["steps"] = [e.get("steps", [0])[0] + 1] if e["kind"] == "eval-start" else e.get("steps")
            else:
                e["suite"] = "other"
        elif op == 4 and trains:  # a trainer resumed from an older step
            e = out[rng.choice(trains)]
            e["from_step"] = max(0, e["from_step"] - rng.choice((1, 10, 50)))
        elif op == 5 and evals:  # an evaluation of another workflow (filtered out, but it is work)
            j = rng.choice(evals)
            out.insert(j + 1, {**out[j], "wf": "train/other"})
        elif op == 6 and evals:  # a restart of an evaluation right after its start, a crash between or not
            j = rng.choice(evals)
            extra = [{"kind": "crash", "position": j, "where": "test"}] if rng.random() < 0.5 else []
            out[j + 1 : j + 1] = extra + [dict(out[j], kind="eval-start", steps=out[j].get("steps", [0]))]
        elif op == 7:  # two neighbours swapped
            if i + 1 < len(out):
                out[i], out[i + 1] = out[i + 1], out[i]
        else:  # a heartbeat in between (not work)
            out.insert(i, {"kind": "hb", "run": out[i].get("run"), "step": 0})
    for seq, e in enumerate(out):
        e["seq"] = seq
    return out


def _piecewise(
    prefix: list[dict], own: list[dict], tail: list[dict], t: int, scn: Scenario, wf: str, tails: TailCache
) -> tuple[list[str], list[dict]]:
    """The lines ``position_lines`` gives for prefix + own + tail[t:], and that ledger, made whole."""
    led = _ledger(list(prefix[:-1]))
    folds = PrefixFold(led, scn, wf)
    for e in prefix[len(led.entries) :]:  # the prefix grows as the uninterrupted run's does
        folds.at()
        led.entries.append(e)
    fold, generation = folds.at()
    lines = position_lines(fold, [(own, 0, len(own))], len(prefix), (tail, t), tails)
    folds.check(generation)
    whole = SplicedLedger(list(prefix), [(own, 0, len(own)), (tail, t, len(tail))]).entries
    return lines, whole


def test_the_folds_give_the_whole_ledger_checks_lines_on_real_and_broken_ledgers():
    scn = Scenario(steps=300, eval_every=60, checkpoint_every=30, suites=("ppl", "zoo"))
    sim = Simulator(scn)
    ref = sim.reference()
    wf = scn.workflow_id
    entries = ref.ledger.entries
    assert check_completed_ledger(ref) == _old(entries, scn, wf) == []
    rng = random.Random(15)
    tails = TailCache(scn, wf, ref=entries)
    dirty = fast = 0
    for case in range(400):
        broken = _break(entries, rng) if case else [dict(e) for e in entries]
        want = _old(broken, scn, wf)
        assert check_evaluations(_ledger(broken), scn, wf=wf) + check_steps(_ledger(broken)) == want
        assert _old_check_steps(broken) == check_steps(_ledger(broken))
        dirty += bool(want)
        # piecewise: cut in three; the tail taken from a target whose head is the reference's or broken apart
        n = len(broken)
        a = rng.randrange(1, n)
        b = rng.randrange(a, n + 1)
        head = entries[:b] if rng.random() < 0.5 else _break(entries, rng)[:b]
        target = [dict(e) for e in head] + [dict(e) for e in broken[b:]]
        for seq, e in enumerate(target):
            e["seq"] = seq
        tail_index = tails.get(target)
        t = len(head)
        probe, _ = LedgerFold(scn, wf).feed(broken, 0, b), None
        fast += tail_index.fast_clean(probe, t)
        lines, whole = _piecewise(broken[:a], broken[a:b], target, t, scn, wf, tails)
        assert whole[:a] == broken[:a] and len(whole) == n
        assert lines == _old(whole, scn, wf), f"case {case}: cut at {a}, {b}"
    print("dirty", dirty, "fast", fast)
    assert dirty > 100  # many cases are broken somewhere the checks see...
    assert fast > 20  # ...and the tail was proved clean without reading it in some of the others


def _renumbered(entries: list[dict]) -> list[dict]:
    return [{**e, "seq": i} for i, e in enumerate(entries)]


def test_a_tail_is_read_where_the_position_differs_from_its_target_in_what_the_tail_reads():
    """One case per comparison ``TailIndex.fast_clean`` makes: the target is clean, the position (its
    past differs just there) is not; the piecewise lines must be the whole ledger's."""
    scn = Scenario(steps=300, eval_every=60, checkpoint_every=30, suites=("ppl", "zoo"))
    wf = scn.workflow_id
    ref = Simulator(scn).reference().ledger.entries
    crash = {"kind": "crash", "position": 0, "where": "test"}
    cases = {}
    j = next(i for i, e in enumerate(ref) if e["kind"] == "eval-start")
    # a key the tail starts: the position started it already (not interrupted), the target had not
    cases["fresh key"] = (ref[: j + 1], ref[:j], ref[j:])
    # a key the tail starts again: the target's start was interrupted, the position's was not
    cases["key's state"] = (ref[: j + 1], ref[: j + 1] + [crash], ref[j:])
    c = [i for i, e in enumerate(ref) if e["kind"] == "ckpt"][2]
    start = next(e for e in ref if e["kind"] == "train-start")
    older = [e["step"] for e in ref[:c] if e["kind"] == "ckpt"][-1]
    resume = [
        {**start, "attempt": 2, "from_step": older},
        {**ref[c - 1], "kind": "steps", "first": older + 1, "last": ref[c]["step"]},
    ]
    # a trainer the tail resumes from the older checkpoint: the position has the newer one, the target not
    cases["checkpoint"] = (ref[: c + 1], ref[:c], resume + ref[c + 1 :])
    t0 = next(i for i, e in enumerate(ref) if e["kind"] == "train-start" and i > c)
    # a pending start the tail's steps read: the position's resumes from step 0
    cases["pending start"] = (ref[:t0] + [{**ref[t0], "from_step": 0, "attempt": 2}], ref[: t0 + 1], ref[t0 + 1 :])
    tails = TailCache(scn, wf, ref=ref)
    for name, (mine, theirs, tail) in cases.items():
        target = _renumbered(theirs + tail)
        assert _old(target, scn, wf) == [], name  # the target is clean
        whole = _renumbered(mine + tail)
        want = _old(whole, scn, wf)
        assert want, name  # the position is not
        for a in (1, len(mine) // 2, len(mine)):
            lines, made = _piecewise(_renumbered(mine[:a]), _renumbered(mine)[a:], target, len(theirs), scn, wf, tails)
            assert made == whole and lines == want, (name, a)


@pytest.mark.slow
def test_in_a_sweep_each_positions_piecewise_ledger_lines_are_the_whole_ledgers(monkeypatch):
    """Every position of a sweep (dedup: converged, spliced, reused recoveries; forked off a shared replay
    or not), with the good fakes and with fakes whose recoveries break the ledger (a retried trainer
    that notes an evaluation of the wrong step): the lines the sweep made piecewise are those of the
    position's whole ledger."""
    seen: list[tuple] = []

    def on_outcome(what, kills, o):
        if what == "kill" and "ledger_lines" in o.extra:
            seen.append((kills[0], o.extra["ledger_lines"], _old(o.ledger.entries, o.scenario, o.workflow_id)))

    scn = Scenario(steps=300, eval_every=60, checkpoint_every=30, suites=("ppl", "zoo"))
    for broken in (False, True):
        if broken:
            train = FakeActivities.train

            def noted(self, ctx, input):
                if ctx.attempt > 1:
                    self.ledger.record(
                        "eval-start",
                        wf=ctx.workflow_id,
                        run="tiny-000060",
                        suite="ppl",
                        activity="eval-000060-ppl",
                        steps=[1],
                    )
                return train(self, ctx, input)

            monkeypatch.setattr(FakeActivities, "train", noted)
        sim = Simulator(scn)
        if broken:
            sim.share_min_events, sim.share_every = 0, 1  # forked recoveries
        sim.on_outcome = on_outcome
        report = sim.kill_every_position(positions=range(0, 4000, 2))
        assert sim.stats["converged"] > 0 and bool(report.mismatches) == broken
    assert len(seen) > 300
    assert sum(1 for _, lines, _ in seen if lines) > 20
    for k, lines, want in seen:
        assert lines == want, f"position {k}"


# --- the spliced outcome's event checks, piecewise ----------------------------------------------------


def _break_events(events: list, rng: random.Random) -> list:
    """A recovery's own events broken: one dropped or repeated, a time moved, a timer's fire time moved."""
    from engine import testing as h

    out = list(events)
    if not out:
        return out
    i = rng.randrange(len(out))
    op = rng.randrange(4)
    e = out[i]
    if op == 0:
        del out[i]
    elif op == 1:
        out.insert(i, e)
    elif op == 2:
        out[i] = e._replace(time=e.time + rng.choice((-1.0, 1.0, 5.0)))
    else:
        timers = [j for j, x in enumerate(out) if x.type in (h.TIMER_STARTED, h.TIMER_FIRED)]
        if timers:
            j = rng.choice(timers)
            x = out[j]
            attrs = dict(x.attrs)
            if "fire_at" in attrs:
                attrs["fire_at"] += 1.0
            out[j] = x._replace(attrs=attrs, time=x.time + (0.0 if "fire_at" in attrs else 1.0))
    return out


@pytest.mark.slow
def test_a_spliced_outcomes_event_checks_piecewise_give_the_whole_historys_lines(monkeypatch):
    """``SweepContext.spliced_state_lines`` (the target's lines where the events the checks read are the
    target's, compared only where they can differ) against ``state_lines`` on the whole spliced history:
    at every converged position of a sweep of the good workflow and of a mutant, and with each position's
    own events broken at random."""
    calls: list[tuple] = []
    real = Simulator.spliced_state_lines

    def spy(self, o, copied, own, target):
        lines = real(self, o, copied, own, target)
        calls.append((self, o, copied, own, target, lines))
        return lines

    monkeypatch.setattr(Simulator, "spliced_state_lines", spy)
    scn = Scenario(steps=300, eval_every=60, checkpoint_every=30, suites=("ppl", "zoo"))
    for mutant in (None, "s04-boundary-repeated"):
        sim = Simulator(scn, mutant=mutant, workflow_fn=make_mutant(mutant) if mutant else None)
        sim.kill_every_position(positions=range(0, 4000, 3))
    assert len(calls) > 25
    rng = random.Random(3)
    dirty = 0
    for sim, o, copied, own, target, lines in calls:
        t = target.run
        whole = replace(o, events=sim.reference().events[:copied] + own + t.events[target.events_at :])
        assert lines == sim.state_lines(whole, file_lines=t.file_lines)
        for _ in range(3):
            broken = _break_events(own, rng)
            whole = replace(o, events=sim.reference().events[:copied] + broken + t.events[target.events_at :])
            want = sim.state_lines(whole, file_lines=t.file_lines)
            assert real(sim, whole, copied, broken, target) == want
            dirty += bool(want) and not sim.check_reference()
        if copied > 1:  # a target whose past differs from the reference's before the position's kill
            head = _break_events(t.events[1:copied], rng)
            other = Target(
                replace(t, events=t.events[:1] + head + t.events[copied:]),
                target.events_at + len(head) - (copied - 1),
                target.ledger_at,
            )
            want = sim.state_lines(
                replace(o, events=sim.reference().events[:copied] + own + t.events[target.events_at :]),
                file_lines=t.file_lines,
            )
            assert real(sim, o, copied, own, other) == want
    assert dirty > 10
    assert sum(sim.stats["outcome checks as the target's"] for sim in {c[0] for c in calls}) > 20
