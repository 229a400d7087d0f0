"""``python -m simulator``: kill the worker at every position, or kill real processes in a loop.

    python -m simulator kill-every-position --steps 1200 --eval-every 500 --eval-interval 30 --suites ppl
    python -m simulator kill-every-position --steps 300 --eval-every 100 --release --gate fail,pass
    python -m simulator random-kills --runs 200 --kills 5 --seed 1
    python -m simulator cancels --runs 100 --seed 1
    python -m simulator stops --steps 40 --eval-every 20 --checkpoint-every 10   # polite stops, kills after
    python -m simulator kill-at --steps 1200 ... --kills 17,230 [--cancel-at 40 | --stop-at-position 20]
    python -m simulator mutants                      # every planted pitfall must be caught
    python -m simulator kill-loop --spec specs/tiny.json --kills 3 --seed 1
    python -m simulator campaign --seed 1 --runs 2   # real processes, seeded random faults, an oracle
    python -m simulator campaign --trainer examples --seed 1   # the same for a user's own trainer

Exit status: 0 when every run matched, 1 on any mismatch, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import signal
import sys

from contracts.exits import EXIT_BAD_INPUT

from .proving.campaign import campaign
from .proving.campaign_targets import PREEMPT_FAULTS, USER_FAULTS, TargetError, choose
from .proving.kill_loop import kill_loop
from .mutants import MUTANTS, catch_mutant, make_mutant
from .scenario import Scenario, remove_home
from .stops import StopSweep
from .sweep import Simulator

SUITES = ("ppl", "zoo")


def _suites(text: str) -> tuple[str, ...]:
    out = tuple(s for s in text.split(",") if s) if text not in ("", "none") else ()
    for s in out:
        if s not in SUITES:
            raise argparse.ArgumentTypeError(f"unknown suite {s!r} (known: {', '.join(SUITES)})")
    return out


def _at_least_one(text: str) -> int:
    """A count of runs, kills or jobs: a sweep of none would report a pass with nothing exercised."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _ints(text: str) -> list[int]:
    if text in ("", "none"):
        return []
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(x < 0 for x in out):
        raise argparse.ArgumentTypeError("positions are >= 0")
    return out


def _gates(text: str) -> tuple[str, ...]:
    out = tuple(x for x in text.split(",") if x)
    if not out or any(x not in ("pass", "fail") for x in out):
        raise argparse.ArgumentTypeError(f"expected pass or fail, comma-separated, got {text!r}")
    return out


def _oom(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(a), int(b)) for a, b in (part.split("x") for part in text.split(",") if part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEPxTIMES[,...], got {text!r}") from None


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps (default 1200: the seed's hand example)")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-interval", type=float, default=30.0, help="durable wait after an evaluation, seconds")
    p.add_argument("--suites", type=_suites, default=("ppl",), help="comma-separated: ppl,zoo (or none)")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=7, help="the spec's seed, and the seed of random kills")
    p.add_argument("--corpus", action="store_true", help="CorpusBuild first")
    p.add_argument("--fail-suites", type=_suites, default=(), help="suites that fail for good")
    p.add_argument("--oom-at", type=_oom, default=(), help="STEPxTIMES: retryable trainer failures")
    p.add_argument(
        "--stop-at",
        type=int,
        default=0,
        help="the trainer stops early at this checkpoint step (a multiple of --checkpoint-every; 0: never)",
    )
    p.add_argument(
        "--release",
        action="store_true",
        help="ModelRelease requests after the run (simulator/release.py): evaluate, gate, publish once",
    )
    p.add_argument(
        "--gate",
        type=_gates,
        default=("pass",),
        help="with --release: one request per entry, its gate passing or failing (default pass; e.g. fail,pass)",
    )
    p.add_argument(
        "--select",
        choices=("best", "latest"),
        default="latest",
        help="with --release: the candidate checkpoint (best: the early stop's best; needs --stop-at)",
    )
    p.add_argument("--mutant", default=None, help="replace TrainRun (or the release) by a mutant (see `mutants`)")
    p.add_argument("--keep", action="store_true", help="keep the home folder of a mismatching run")


def _bad(message: str) -> None:
    """Bad input: one line on stderr, exit 2, nothing run."""
    print(f"simulator: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def _scenario(a: argparse.Namespace) -> Scenario:
    if a.steps < 1 or a.eval_every < 0 or a.eval_interval < 0 or a.checkpoint_every < 1:
        _bad("--steps and --checkpoint-every must be >= 1, --eval-every and --eval-interval >= 0")
    if a.stop_at and not (0 < a.stop_at < a.steps and a.stop_at % a.checkpoint_every == 0):
        _bad("--stop-at must be a multiple of --checkpoint-every below --steps")
    if a.select == "best" and a.release and not a.stop_at:
        _bad("--select best needs a selection metric: give --stop-at (the early stop's best), or --select latest")
    if a.release and (a.fail_suites or a.oom_at):
        _bad("--release runs after a completed run: not with --fail-suites or --oom-at")
    if set(a.fail_suites) - set(a.suites):
        _bad(f"--fail-suites {','.join(a.fail_suites)} must be among --suites {','.join(a.suites)}")
    return Scenario(
        steps=a.steps,
        eval_every=a.eval_every,
        eval_interval_s=a.eval_interval,
        suites=a.suites,
        checkpoint_every=a.checkpoint_every,
        seed=a.seed,
        corpus=a.corpus,
        fail_suites=a.fail_suites,
        oom_at=a.oom_at,
        stop_at=a.stop_at,
        release=a.gate if a.release else (),
        select=a.select,
    )


def _simulator(a: argparse.Namespace):
    fn = None
    if a.mutant:
        if a.mutant not in MUTANTS:
            _bad(f"unknown mutant {a.mutant!r} (known: {', '.join(MUTANTS)})")
        fn = make_mutant(a.mutant)
    return Simulator(_scenario(a), workflow_fn=fn, mutant=a.mutant, keep_failed=a.keep)


def _print_report(report) -> int:
    for m in report.mismatches[:20]:
        print(m)
    if len(report.mismatches) > 20:
        print(f"... {len(report.mismatches) - 20} more mismatches")
    print(report.summary())
    return 0 if report.ok else 1


def cmd_kill_every_position(a: argparse.Namespace) -> int:
    sim = _simulator(a)
    positions = None
    if a.release_only:
        if not a.release:
            _bad("--release-only needs --release")
        sim.reference()
        positions = list(range(sim.release_from or len(sim.trace), len(sim.trace)))
    if a.sample:
        n = len(sim.reference().plan.trace)
        pool = positions if positions is not None else range(n)
        positions = sorted(random.Random(a.seed).sample(pool, min(a.sample, len(pool))))
    report = sim.kill_every_position(positions=positions, stop_at_first=a.stop_at_first, jobs=a.jobs, mode=a.mode)
    st = sim.stats
    if a.mode == "dedup" and a.jobs <= 1 and not a.release:  # (forked workers keep their own counts)
        print(
            f"recoveries: {st['recoveries']} for {report.tried} positions (the others shared one); "
            f"{st['converged']} stopped at convergence ({st['checked splices']} after a checked replay), "
            f"{st['ran on']} ran to the end; {st['shared replays']} fresh replays shared by fork"
        )
    return _print_report(report)


def cmd_random_kills(a: argparse.Namespace) -> int:
    sim = _simulator(a)
    return _print_report(sim.random_kills(seed=a.seed, runs=a.runs, kills_per_run=a.kills))


def cmd_cancels(a: argparse.Namespace) -> int:
    sim = _simulator(a)
    return _print_report(sim.cancels(seed=a.seed, runs=a.runs))


def cmd_stops(a: argparse.Namespace) -> int:
    sim = _simulator(a)
    if sim.scn.release:
        _bad("stops: not with --release (the stop sweep covers the TrainRun)")
    positions = None
    if a.sample:
        n = len(sim.reference().plan.trace)
        positions = sorted(random.Random(a.seed).sample(range(n), min(a.sample, n)))
    report = StopSweep(sim).stops(
        positions=positions, after=a.after, kills=not a.no_kills, stop_at_first=a.stop_at_first
    )
    st = sim.stats
    kinds = ", ".join(f"{k.split(': ', 1)[1]} {v}" for k, v in sorted(st.items()) if k.startswith("preempted: "))
    print(
        f"stops: {st['stops']} stop positions ({st['stops that ended a life']} ended a life with ctl's exit 143), "
        f"{st['kills after a stop']} kills after them; recorded: {kinds or 'nothing'}"
    )
    return _print_report(report)


def cmd_kill_at(a: argparse.Namespace) -> int:
    sim = _simulator(a)
    sim.reference()
    if a.stop_at_position is not None:
        o, m = StopSweep(sim).run_one(a.stop_at_position, a.kills)
        for c in o.plan.crashes:
            print(f"killed at position {c.position}: {c.kind} {c.label}")
        print(f"polite stop at position {a.stop_at_position}; ended {o.state} after {o.lives} worker lives")
        print("matched" if m is None else m)
        return 0 if m is None else 1
    o = sim.run(a.kills, cancel_at=a.cancel_at)
    for c in o.plan.crashes:
        print(f"killed at position {c.position}: {c.kind} {c.label}")
    print(f"ended {o.state} after {o.lives} worker lives; cancel recorded: {o.cancel_done}")
    m = sim.check(o, what="cancel" if a.cancel_at is not None else "kill", kills=a.kills, cancel_at=a.cancel_at)
    missed = sorted(set(a.kills) - {c.position for c in o.plan.crashes})
    if m is None and missed:  # the run ended before these positions: those kills were not exercised
        for p in missed:
            print(f"kill at position {p} did not happen (the run ended first): not tested")
        return 3
    if m is None:
        print("matched")
        return 0
    print(m)
    if a.keep and o.home.exists():
        ledger = o.home / "sim-ledger.jsonl"
        o.ledger.dump(ledger)
        print(f"files and ledger kept: {o.home} ({ledger.name})")
    else:
        remove_home(o.home)
    return 1


def cmd_mutants(a: argparse.Namespace) -> int:
    missed = 0
    for name, (pitfall, _what) in MUTANTS.items():
        found = catch_mutant(name)
        status = f"caught: {found[0]}" if found else "NOT CAUGHT"
        missed += not found
        print(f"pitfall {pitfall:2d} {name:34s} {status[:150]}")
    print(f"{len(MUTANTS) - missed}/{len(MUTANTS)} mutants caught")
    return 1 if missed else 0


def cmd_kill_loop(a: argparse.Namespace) -> int:
    return kill_loop(a.spec, kills=a.kills, seed=a.seed, home=a.home, timeout_s=a.timeout)


def cmd_campaign(a: argparse.Namespace) -> int:
    try:
        target = choose(a.trainer, a.spec, a.suite)
    except TargetError as e:
        _bad(str(e))

    def stop(signum, frame):  # a terminated campaign still kills the processes of its run
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # even when inherited as ignored (a background job)
    if a.runs < 1 or a.faults < 0:
        _bad("--runs must be >= 1 and --faults >= 0")
    if a.jobs < 1 or (a.only is not None and a.only < 0):
        _bad("--jobs must be >= 1 and --only >= 0")
    if a.kinds is not None:
        kinds = tuple(k for k in a.kinds.split(",") if k)
        known = (*USER_FAULTS, *PREEMPT_FAULTS)
        unknown = [k for k in kinds if k not in known]
        if not kinds or unknown:
            _bad(f"--kinds: unknown fault kind(s) {', '.join(unknown) or '(none given)'} (known: {', '.join(known)})")
        target = dataclasses.replace(target, faults=kinds, cli=f"{target.cli} --kinds {','.join(kinds)}")
    return campaign(
        a.seed,
        a.runs,
        faults_per_run=a.faults,
        keep=a.keep,
        jobs=a.jobs,
        only=a.only,
        target=target,
        allow_untested=a.allow_untested,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("kill-every-position", help="kill once at every position of the run")
    _scenario_args(p)
    p.add_argument("--sample", type=int, default=0, help="only this many positions, drawn by --seed")
    p.add_argument("--stop-at-first", action="store_true")
    p.add_argument(
        "--release-only",
        action="store_true",
        help="with --release: kill only at the positions of the release requests (after the TrainRun)",
    )
    p.add_argument("--jobs", type=_at_least_one, default=1, help="worker processes (each run is independent)")
    p.add_argument(
        "--mode",
        choices=("dedup", "snapshot", "rerun"),
        default="dedup",
        help="rerun: run again from the start and kill in-process; snapshot: recover from the files "
        "copied at the kill; dedup (fastest): snapshots, one recovery per distinct durable state",
    )
    p.set_defaults(fn=cmd_kill_every_position)

    p = sub.add_parser("random-kills", help="runs killed several times at seeded random positions")
    _scenario_args(p)
    p.add_argument("--runs", type=_at_least_one, default=100)
    p.add_argument("--kills", type=_at_least_one, default=5, help="at most this many kills per run")
    p.set_defaults(fn=cmd_random_kills)

    p = sub.add_parser("cancels", help="a cancel at a random position, kills around it, then the spec again")
    _scenario_args(p)
    p.add_argument("--runs", type=_at_least_one, default=100)
    p.set_defaults(fn=cmd_cancels)

    p = sub.add_parser("kill-at", help="one run killed at the given positions (reproduces a mismatch)")
    _scenario_args(p)
    p.add_argument("--kills", type=_ints, required=True, help="comma-separated positions, or none")
    p.add_argument("--cancel-at", type=int, default=None)
    p.add_argument(
        "--stop-at-position",
        type=int,
        default=None,
        help="a polite stop (Engine.request_stop) at this position (simulator/stops.py)",
    )
    p.set_defaults(fn=cmd_kill_at)

    p = sub.add_parser("stops", help="a polite stop at every position, then kills after each (issue 39)")
    _scenario_args(p)
    p.add_argument("--sample", type=int, default=0, help="only this many stop positions, drawn by --seed")
    p.add_argument("--after", type=int, default=3, help="kill positions past the stopped life's end")
    p.add_argument("--no-kills", action="store_true", help="the stops alone, no kill after them")
    p.add_argument("--stop-at-first", action="store_true")
    p.set_defaults(fn=cmd_stops)

    p = sub.add_parser("mutants", help="plant each pitfall of the seed and show the simulator catches it")
    p.set_defaults(fn=cmd_mutants)

    p = sub.add_parser("kill-loop", help="SIGKILL the real `ctl train` at seeded random moments")
    p.add_argument("--spec", required=True, help="a train spec file")
    p.add_argument("--kills", type=_at_least_one, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--home", default=None, help="home folder of the killed run (default: a new temporary one)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.set_defaults(fn=cmd_kill_loop)

    p = sub.add_parser("campaign", help="real ctl/worker/trainer processes under seeded random faults, with an oracle")
    p.add_argument("--seed", type=int, default=0, help="draws each run's mode, faults and their moments")
    p.add_argument("--runs", type=_at_least_one, default=1)
    p.add_argument("--faults", type=int, default=4, help="faults per run")
    p.add_argument("--keep", action="store_true", help="keep the files of failed runs")
    p.add_argument("--jobs", type=_at_least_one, default=1, help="campaign runs at once (each in its own home)")
    p.add_argument("--only", type=int, default=None, help="run only this run index (reproduce a failure)")
    p.add_argument(
        "--trainer",
        choices=("tinyllm", "examples"),
        default="tinyllm",
        help="what the runs train: tinyllm's tiny spec, or examples/durable_train.py (a user's own "
        "PyTorch loop on tinyllm.durable; adds kill-in-checkpoint-write faults)",
    )
    p.add_argument("--spec", default=None, help="instead of --trainer: a spec naming its own trainer")
    p.add_argument("--suite", default="acc", help="with --spec: the suite its eval_command runs (default acc)")
    p.add_argument(
        "--kinds",
        default=None,
        help="comma-separated fault kinds to draw from instead of the trainer's (e.g. preempt,preempt-group)",
    )
    p.add_argument(
        "--allow-untested",
        action="store_true",
        help="exit 0 even when a run passed without any fault making a trainer resume inside a segment "
        "(default: such a run is untested, exit 3)",
    )
    p.set_defaults(fn=cmd_campaign)

    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
