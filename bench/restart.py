"""Restart to resumed step: where the time goes between a resumed `tinyllm train`'s process start
and its first step's metrics frame. Prints figures measured in this one run.

1. end to end (the real CLI, ``--reps`` times, median): Popen -> the first resumed frame in
   metrics.jsonl, with the progress file's ``starting`` (interpreter, click, the spec read while
   torch's libraries load: tinyllm/torch_preload.py) and ``imported`` (torch and the trainer's
   modules) and ``ready`` (set up and resumed) marks; alternated with the same run with
   ``TINYLLM_TORCH_DEFER=0`` and with ``TINYLLM_TORCH_PRELOAD=0`` (and ``--against`` an older checkout);
2. the same path in one child process, each phase timed by a stopwatch wrapped around the real
   functions (the spec read || library load, imports, corpus check, model build, checkpoint choice
   with its checksum verification, checkpoint load, metrics sinks, first step), with both
   start-up measures on and both off; plus, for scale, a bare interpreter and a bare ``import torch``.

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
    proc = subprocess.run(_cli("train", "--spec", str(spec_file), "--home", str(home), "--progress", str(progress),
                               "--resume", resume),
                          env=_env(tree, **extra_env), cwd=home, capture_output=True, text=True,
                          timeout=600)  # -m: cwd first
    if proc.returncode != 0:
        sys.exit(f"bench: resumed run failed: {proc.stderr[-2000:]}")
    if json.loads(proc.stdout.strip().splitlines()[-1])["resumed_from"] is None:
        sys.exit("bench: the run did not resume")
    marks = {}
    for line in progress.read_text().splitlines():
        d = json.loads(line)
        if d.get("event") in ("starting", "imported", "ready"):
            marks.setdefault(d["event"], d["time"] - t0)
        if d.get("event") == "ready":
            marks["deferred"] = d.get("torch_defer", {}).get("deferred", [])
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
    from tinyllm import torch_defer, torch_preload

    spent["imports: click, tinyllm.cli"] = time.perf_counter() - t_start
    marks: dict[str, float] = {}

    def wrap(owner, attr, before=None, after=None):
        fn = getattr(owner, attr)

        def timed(*a, **kw):
            if before:
                before()
            try:
                return fn(*a, **kw)
            finally:
                if after:
                    after()

        setattr(owner, attr, timed)

    def phases() -> None:  # once tinyllm.trainer is imported (by the CLI, after the preload)
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

    def mark(name):
        return lambda: marks.__setitem__(name, time.perf_counter())

    wrap(torch_preload, "while_loading", before=mark("read0"), after=mark("read1"))
    wrap(torch_defer, "install", before=mark("torch0"))
    wrap(torch_defer, "after_import", after=lambda: (mark("torch1")(), phases()))
    t = time.perf_counter()
    try:
        cli.main(["train", "--spec", args.child_spec, "--home", args.home, "--resume", args.resume],
                 standalone_mode=False)
    except SystemExit:
        pass
    spent["whole command (imports excluded)"] = time.perf_counter() - t
    pre = torch_preload.status()
    spent["read spec (pydantic, models) || load torch libs"] = marks["read1"] - marks["read0"]
    spent["  the helper's spec read alone (its CPU)"] = pre.get("work_cpu_s", 0.0)
    spent["  the main thread's library load alone"] = pre.get("load_s", 0.0)
    spent["import torch + tinyllm.trainer"] = marks["torch1"] - marks["torch0"]
    print(json.dumps(spent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "specs" / "tiny.json"))
    ap.add_argument("--at", type=int, default=20, help="the step the resumed checkpoint is at")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--against", default=None, help="another checkout of this project (e.g. an older commit): "
                                                    "its end-to-end figure is measured alternately with this one's")
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
    subprocess.run(_cli("train", "--spec", str(first), "--home", str(home)), env=_env(), check=True,
                   capture_output=True, timeout=600)
    ckpt_dir = home / "runs" / "restart" / "ckpt" / f"step-{args.at:06d}"
    size = sum(f.stat().st_size for f in ckpt_dir.iterdir())
    resume = str(ckpt_dir.relative_to(home))  # every measured run resumes from this same checkpoint
    print(f"bench: spec {args.spec}, checkpoint at step {args.at} ({size:,} bytes), home {home}, "
          f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")

    def bare(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=600)
        return time.perf_counter() - t0

    runs, bares, torches, childs, child_offs, others, offs, pre_offs = [], [], [], [], [], [], [], []
    for _ in range(args.reps):  # alternated, so load changes hit all alike
        runs.append(end_to_end(home, resumed, "restart", resume))
        offs.append(end_to_end(home, resumed, "restart", resume, TINYLLM_TORCH_DEFER="0"))
        pre_offs.append(end_to_end(home, resumed, "restart", resume, TINYLLM_TORCH_PRELOAD="0"))
        if args.against:
            others.append(end_to_end(home, resumed, "restart", resume, tree=Path(args.against).absolute()))
        bares.append(bare("pass"))
        torches.append(bare("import torch"))
        for into, extra in ((childs, {}), (child_offs, {"TINYLLM_TORCH_DEFER": "0", "TINYLLM_TORCH_PRELOAD": "0"})):
            out = subprocess.run([sys.executable, __file__, "--child-spec", str(resumed), "--home", str(home),
                                  "--resume", resume],
                                 env=_env(**extra), capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                sys.exit(f"bench: child failed: {out.stderr[-2000:]}")
            into.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "deferred"}
    total = med["first step"]
    print(f"restart to resumed step (median of {args.reps}): {total:.2f} s (aim <= {AIM_S} s)"
          f"{'' if total <= AIM_S else '  ABOVE AIM'}")
    last = 0.0
    for mark, label in [("starting", "interpreter, click, the spec"), ("imported", "torch + trainer modules"),
                        ("ready", "corpus, model, checkpoint verify + load, sinks"), ("first step", "first step")]:
        print(f"  {label:<48} {med[mark] - last:6.3f} s  (mark '{mark}' at {med[mark]:.3f} s)")
        last = med[mark]
    print(f"  CPU time of the whole resumed process (its 2 steps, checkpoint and exit included): {med['cpu']:.2f} s "
          f"(about its wall time on an idle machine; the aim's proxy when the machine is busy)")
    off = {k: statistics.median(r[k] for r in offs) for k in offs[0] if k != "deferred"}
    print(f"  torch modules deferred (tinyllm/torch_defer.py): {', '.join(runs[0]['deferred']) or 'none'}")
    print(f"  with TINYLLM_TORCH_DEFER=0 (alternated): {off['first step']:.2f} s to the resumed step "
          f"(torch + trainer modules {off['imported'] - off['starting']:.3f} s), {off['cpu']:.2f} s CPU; "
          f"deferral on is {off['first step'] / total:.2f}x as fast ({off['cpu'] / med['cpu']:.2f}x in CPU time)")
    po = {k: statistics.median(r[k] for r in pre_offs) for k in pre_offs[0] if k != "deferred"}
    print(f"  with TINYLLM_TORCH_PRELOAD=0 (alternated): {po['first step']:.2f} s to the resumed step "
          f"(to 'imported' {po['imported']:.3f} s against {med['imported']:.3f} s), {po['cpu']:.2f} s CPU; "
          f"the preload is {po['first step'] / total:.2f}x as fast ({po['cpu'] / med['cpu']:.2f}x in CPU time)")
    if others:
        o = {k: statistics.median(r[k] for r in others) for k in others[0] if k != "deferred"}
        print(f"  against {args.against}: {o['first step']:.2f} s to the resumed step, {o['cpu']:.2f} s CPU; "
              f"this checkout is {o['first step'] / total:.2f}x as fast ({o['cpu'] / med['cpu']:.2f}x in CPU time)")
    print(f"breakdown in one process (median of {args.reps}), the real functions timed:  "
          f"deferral + preload on | both off")
    for key in childs[0]:
        print(f"  {key:<48} {statistics.median(c.get(key, 0.0) for c in childs):6.3f} s | "
              f"{statistics.median(c.get(key, 0.0) for c in child_offs):6.3f} s")
    print(f"for scale: bare interpreter {statistics.median(bares):.3f} s, bare `import torch` "
          f"{statistics.median(torches):.3f} s (process start included)")


if __name__ == "__main__":
    main()
