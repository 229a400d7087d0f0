"""How long ``ctl``'s read commands take, and where their start-up goes: each command's time (best of
``--reps``) on a prepared home, and its import time (``python -X importtime``), for this tree and, with
``--rev REV``, for that git revision beside it (before/after in one run, alternated rep by rep).

    python bench/cli.py [--rev main] [--reps 5] [--top 8] [--home DIR] [--only status,show] [--as-is]

The home is made once by this tree's real ``ctl train`` of a tiny spec (one run ``train/bench`` of 12
steps: 6 checkpoints, 2 segments, each evaluated with ppl) under ``--home`` (kept, reused when it already
holds the run) or a temporary folder. Both trees run against the same home (``--rev`` is extracted with
``git archive`` into a temporary folder and put first on ``PYTHONPATH``; the installed package is not used).

Per command it prints the best wall time and the best CPU time (user + system of the child: steadier than
wall on a shared machine) over ``--reps`` runs, then, from the run of ``python -X importtime`` with the
least total, the import total and the top ``--top`` top-level imports by cumulative time, and which heavy
packages the command loaded (torch, rich, pydantic, temporalio, mlflow, opentelemetry, transformers,
lightning). Each command runs once unmeasured first, so that its modules are compiled and cached (under a
``PYTHONPYCACHEPREFIX`` of its own, also where ``PYTHONDONTWRITEBYTECODE`` is set), as in an installed
package. Nothing is asserted (tests/ctl/test_ctl_imports.py pins what may be imported).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = "train/bench"
SPEC = {
    "name": "bench",
    "steps": 12,
    "eval_every": 6,
    "eval_interval_seconds": 0,
    "checkpoint_every": 2,
    "batch_size": 2,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
COMMANDS = {  # name -> ctl arguments (--home is added)
    "--version": ["--version"],
    "status": ["status"],
    "status ID": ["status", RUN],
    "list": ["list"],
    "show": ["show", RUN],
    "history": ["history", RUN],
    "doctor": ["doctor"],
}
HEAVY = ("torch", "rich", "pydantic", "temporalio", "mlflow", "opentelemetry", "transformers", "lightning")


PYCACHE: Path | None = None  # where compiled modules are kept (set in main): bytecode cached, as in an install


def _env(tree: Path) -> dict:
    drop = ("CTL_HOME", "CTL_BACKEND", "PYTHONPROFILEIMPORTTIME") + (("PYTHONDONTWRITEBYTECODE",) if PYCACHE else ())
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(tree)
    env["OMP_NUM_THREADS"] = "1"
    if PYCACHE is not None:  # each tree's bytecode once, outside the trees (a checkout's own may be unwritable)
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE / tree.name)
    return env


def _argv(args: list[str], home: Path) -> list[str]:
    return [sys.executable, "-m", "ctl.cli", *args] + ([] if args == ["--version"] else ["--home", str(home)])


def prepare_home(home: Path) -> Path:
    """The bench's home: one finished run of 6 checkpoints (made once by this tree's ``ctl train``)."""
    if (home / "runs" / "bench" / "ckpt" / "LATEST").is_file() and (home / ".ctl" / "engine.db").is_file():
        return home
    home.mkdir(parents=True, exist_ok=True)
    (home / "spec.json").write_text(json.dumps(SPEC))
    t0 = time.perf_counter()
    proc = subprocess.run(
        _argv(["train", "--spec", str(home / "spec.json"), "--quiet"], home),
        env=_env(REPO),
        capture_output=True,
        text=True,
        cwd=home,
    )
    if proc.returncode != 0:
        sys.exit(f"bench/cli.py: ctl train of the bench home failed ({proc.returncode}): {proc.stderr[-2000:]}")
    print(f"# home {home}: train/bench made in {time.perf_counter() - t0:.1f} s", flush=True)
    return home


def extract(rev: str, into: Path) -> Path:
    """``rev``'s tree (git archive) under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=False)
    if archive.returncode != 0:
        sys.exit(f"bench/cli.py: git archive {rev}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


@dataclass
class Timing:
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    codes: set[int] = field(default_factory=set)


def time_once(argv: list[str], env: dict, cwd: Path, into: Timing) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    into.wall_s.append(time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    into.cpu_s.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    into.codes.add(proc.returncode)


@dataclass
class Imports:
    total_us: int
    top: list[tuple[str, int]]  # top-level imports (not nested in another), by cumulative time
    heavy: list[str]


def import_profile(argv: list[str], env: dict, cwd: Path, reps: int) -> Imports:
    """``python -X importtime`` of the command, the run with the least total of ``reps``."""
    best: Imports | None = None
    for _ in range(reps):
        proc = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]],
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        top: dict[str, int] = {}
        names: set[str] = set()
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _self, cum, name = line[len("import time:") :].split("|", 2)
            names.add(name.strip())
            if not name[1:].startswith(" "):  # depth 0: imported by no other module's import
                top[name.strip()] = top.get(name.strip(), 0) + int(cum)
        total = sum(top.values())
        if best is None or total < best.total_us:
            heavy = [h for h in HEAVY if h in names]
            best = Imports(total, sorted(top.items(), key=lambda kv: -kv[1]), heavy)
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default=None, help="Also measure this git revision (e.g. main), beside this tree.")
    ap.add_argument("--reps", type=int, default=5, help="Runs per command and tree; the best is printed.")
    ap.add_argument("--top", type=int, default=8, help="Top-level imports listed per command.")
    ap.add_argument("--home", default=None, help="The prepared home (made when it holds no run yet).")
    ap.add_argument(
        "--as-is",
        action="store_true",
        help="Keep the environment's bytecode setting (PYTHONDONTWRITEBYTECODE: every module compiled at "
        "each start, as this machine runs ctl) instead of a bytecode cache.",
    )
    ap.add_argument("--only", default=None, help="Comma-separated commands (of: " + ", ".join(COMMANDS) + ").")
    args = ap.parse_args()
    chosen = [c for c in COMMANDS if args.only is None or c in args.only.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    global PYCACHE
    PYCACHE = None if args.as_is else scratch / "pycache"
    try:
        home = prepare_home(Path(args.home).resolve() if args.home else scratch / "home")
        trees = {"now": REPO}
        if args.rev:
            trees = {args.rev: extract(args.rev, scratch / "rev"), "now": REPO}
        load = os.getloadavg()[0]
        cache = "bytecode as the environment has it" if PYCACHE is None else "bytecode cached"
        print(
            f"# python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load:.2f}; best of {args.reps}; {cache}"
        )
        print("# trees: " + ", ".join(f"{k} = {v}" for k, v in trees.items()))
        results: dict[tuple[str, str], Timing] = {(c, t): Timing() for c in chosen for t in trees}
        for c in chosen:  # once unmeasured: every module compiled and cached first (PYTHONPYCACHEPREFIX)
            for tree in trees.values():
                time_once(_argv(COMMANDS[c], home), _env(tree), home, Timing())
        for _ in range(args.reps):  # alternated: load that comes and goes hits both trees alike
            for c in chosen:
                for t, tree in trees.items():
                    time_once(_argv(COMMANDS[c], home), _env(tree), home, results[(c, t)])
        head = "".join(f"{t + ' wall':>13}{t + ' cpu':>12}" for t in trees)
        print(f"\n{'command':<12}{head}" + ("   ratio (wall, cpu)" if len(trees) > 1 else "") + "   exit")
        for c in chosen:
            row = "".join(
                f"{min(results[(c, t)].wall_s) * 1e3:>10.0f} ms{min(results[(c, t)].cpu_s) * 1e3:>9.0f} ms"
                for t in trees
            )
            if len(trees) > 1:
                a, b = (results[(c, t)] for t in trees)
                row += f"   {min(b.wall_s) / min(a.wall_s):5.2f}x {min(b.cpu_s) / min(a.cpu_s):5.2f}x"
            codes = sorted({code for t in trees for code in results[(c, t)].codes})
            print(f"{c:<12}{row}   {','.join(map(str, codes))}")
        print(f"\nimports (python -X importtime, least total of {args.reps}; top-level by cumulative ms):")
        for c in chosen:
            for t, tree in trees.items():
                imp = import_profile(_argv(COMMANDS[c], home), _env(tree), home, args.reps)
                tops = ", ".join(f"{n} {us / 1e3:.1f}" for n, us in imp.top[: args.top])
                print(f"{c:<10} {t:<6} total {imp.total_us / 1e3:6.1f} ms; heavy: {', '.join(imp.heavy) or 'none'}")
                print(f"{'':<17} {tops}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
