"""Restart to resumed step: where the time goes between a resumed `tinyllm train`'s process start
and its first step's metrics frame. Prints figures measured in this one run.

1. end to end (the real CLI, ``--reps`` times, median): Popen -> the first resumed frame in
   metrics.jsonl, with the progress file's ``starting`` (interpreter, click, the spec read while
   then tinyllm/runtime_env.prepare) and ``imported`` (torch and the trainer's
   modules) and ``ready`` (set up and resumed) marks (alternated with ``--against`` an older checkout);
2. the same path in one child process, each phase timed by a stopwatch wrapped around the real
   functions (the spec read || library load, imports, corpus check, model build, checkpoint choice
   with its checksum verification, checkpoint load, metrics sinks, first step); plus, for scale, a
   bare interpreter and a bare ``import torch``. Start-up tricks on and off: bench/startup.py.

Usage: python bench/restart.py [--spec specs/tiny.json] [--at 20] [--reps 3]
The run is trained to step ``--at`` (one checkpoint there) first; each measured run resumes from
that checkpoint (``--resume``) and trains to ``--at`` + 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AIM_S = 2.5


def _env(tree: Path = REPO, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinyllm.cli", *args]


def end_to_end(home: Path, spec_file: Path, name: str, resume: str, tree: Path = REPO, **extra_env: str) -> dict:
    """One resumed CLI run: seconds from Popen to each progress mark and to the first new frame."""
    progress = home / f"progress-{time.monotonic_ns()}.jsonl"
    metrics = home / "runs" / name / "metrics.jsonl"
    t0, cpu0 = time.time(), _children_cpu_s()
    proc = subprocess.run(
        _cli("train", "--spec", str(spec_file), "--home", str(home), "--progress", str(progress), "--resume", resume),
        env=_env(tree, **extra_env),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )  # -m: cwd first
    if proc.returncode != 0:
        sys.exit(f"bench: resumed run failed: {proc.stderr[-2000:]}")
    if json.loads(proc.stdout.strip().splitlines()[-1])["resumed_from"] is None:
        sys.exit("bench: the run did not resume")
    marks = {}
    for line in progress.read_text().splitlines():
        d = json.loads(line)
        if d.get("event") in ("starting", "imported", "ready"):
            marks.setdefault(d["event"], d["time"] - t0)
    frames = [json.loads(line) for line in metrics.read_text().splitlines()]
    marks["first step"] = min(f["time"] for f in frames if f["time"] >= t0) - t0
    marks["cpu"] = _children_cpu_s() - cpu0
    return marks


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children: what a process costs
    whatever else runs on the machine (its wall time on an idle machine, where it is one thread)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


PHASES = [  # (label, module, class or None, attribute): the real functions the child wraps with a stopwatch
    ("corpus: open + sha256", "tinyllm.trainer", None, "open_corpus"),
    ("run lock", "tinyllm.trainer", "Trainer", "_lock"),
    ("recover interrupted writes", "tinyllm.checkpoint", None, "recover_interrupted_writes"),
    ("model + optimizer build", "tinyllm.trainer", "Trainer", "_build"),
    ("choose checkpoint (verify sha256)", "tinyllm.checkpoint", None, "choose_resume"),
    ("load checkpoint (sha256 + torch.load)", "tinyllm.checkpoint", None, "load_checkpoint"),
    ("metrics sinks (jsonl, tensorboard)", "tinyllm.trainer", None, "default_reporter"),
    ("first step", "tinyllm.trainer", "Trainer", "train_step"),
]


def child(args) -> None:
    """The real CLI in this process with stopwatches around its phases; prints one JSON object."""
    t_start = time.perf_counter()
    import importlib

    spent: dict[str, float] = {}
    import click  # noqa: F401
    import tinyllm.cli as cli
    from tinyllm import runtime_env

    spent["imports: click, tinyllm.cli"] = time.perf_counter() - t_start
    t = time.perf_counter()
    spec = cli._read_train_spec(args.child_spec)
    spent["read spec (pydantic, models)"] = time.perf_counter() - t
    runtime_env.prepare(spec.threads)
    t = time.perf_counter()
    import tinyllm.trainer  # noqa: F401  (torch and the trainer's modules, as the CLI imports them)

    spent["import torch + tinyllm.trainer"] = time.perf_counter() - t

    def phases() -> None:  # once tinyllm.trainer is imported
        for label, module, cls, attr in PHASES:
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            fn = getattr(owner, attr)

            def timed(*a, _fn=fn, _label=label, **kw):
                if _label == "first step" and _label in spent:  # later steps are not start-up
                    return _fn(*a, **kw)
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - t0
                    if _label == "first step":  # this process's CPU since it started (interpreter start included)
                        spent["CPU time to the first step's end"] = time.process_time()

            setattr(owner, attr, timed)

    phases()
    t = time.perf_counter()
    try:
        cli.main(
            ["train", "--spec", args.child_spec, "--home", args.home, "--resume", args.resume], standalone_mode=False
        )
    except SystemExit:
        pass
    spent["whole command (imports excluded)"] = time.perf_counter() - t
    print(json.dumps(spent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "specs" / "tiny.json"))
    ap.add_argument("--at", type=int, default=20, help="the step the resumed checkpoint is at")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--against",
        default=None,
        help="another checkout of this project (e.g. an older commit): "
        "its end-to-end figure is measured alternately with this one's",
    )
    ap.add_argument("--child-spec", help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--resume", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_spec:
        return child(args)
    sys.stdout.reconfigure(line_buffering=True)
    home = Path(tempfile.mkdtemp(prefix="tinyllm-restart-"))
    spec = json.loads(Path(args.spec).read_text())
    spec.update(name="restart", steps=args.at, checkpoint_every=args.at, validation=None)
    spec = {k: v for k, v in spec.items() if v is not None}
    first, resumed = home / "first.json", home / "resumed.json"
    first.write_text(json.dumps(spec))
    resumed.write_text(json.dumps(dict(spec, steps=args.at + 2)))
    subprocess.run(_cli("corpus", "--home", str(home)), env=_env(), check=True, capture_output=True, timeout=600)
    subprocess.run(
        _cli("train", "--spec", str(first), "--home", str(home)),
        env=_env(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    ckpt_dir = home / "runs" / "restart" / "ckpt" / f"step-{args.at:06d}"
    size = sum(f.stat().st_size for f in ckpt_dir.iterdir())
    resume = str(ckpt_dir.relative_to(home))  # every measured run resumes from this same checkpoint
    print(
        f"bench: spec {args.spec}, checkpoint at step {args.at} ({size:,} bytes), home {home}, "
        f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )

    def bare(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=600)
        return time.perf_counter() - t0

    runs, bares, torches, childs, others = [], [], [], [], []
    for _ in range(args.reps):  # alternated, so load changes hit all alike
        runs.append(end_to_end(home, resumed, "restart", resume))
        if args.against:
            others.append(end_to_end(home, resumed, "restart", resume, tree=Path(args.against).absolute()))
        bares.append(bare("pass"))
        torches.append(bare("import torch"))
        out = subprocess.run(
            [sys.executable, __file__, "--child-spec", str(resumed), "--home", str(home), "--resume", resume],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            sys.exit(f"bench: child failed: {out.stderr[-2000:]}")
        childs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = med["first step"]
    print(
        f"restart to resumed step (median of {args.reps}): {total:.2f} s (aim <= {AIM_S} s)"
        f"{'' if total <= AIM_S else '  ABOVE AIM'}"
    )
    last = 0.0
    for mark, label in [
        ("starting", "interpreter, click, the spec"),
        ("imported", "torch + trainer modules"),
        ("ready", "corpus, model, checkpoint verify + load, sinks"),
        ("first step", "first step"),
    ]:
        print(f"  {label:<48} {med[mark] - last:6.3f} s  (mark '{mark}' at {med[mark]:.3f} s)")
        last = med[mark]
    print(
        f"  CPU time of the whole resumed process (its 2 steps, checkpoint and exit included): {med['cpu']:.2f} s "
        f"(about its wall time on an idle machine; the aim's proxy when the machine is busy)"
    )
    if others:
        o = {k: statistics.median(r[k] for r in others) for k in others[0]}
        print(
            f"  against {args.against}: {o['first step']:.2f} s to the resumed step, {o['cpu']:.2f} s CPU; "
            f"this checkout is {o['first step'] / total:.2f}x as fast ({o['cpu'] / med['cpu']:.2f}x in CPU time)"
        )
    print(f"breakdown in one process (median of {args.reps}), the real functions timed:")
    for key in childs[0]:
        print(f"  {key:<48} {statistics.median(c.get(key, 0.0) for c in childs):6.3f} s")
    print(
        f"for scale: bare interpreter {statistics.median(bares):.3f} s, bare `import torch` "
        f"{statistics.median(torches):.3f} s (process start included)"
    )


if __name__ == "__main__":
    main()
