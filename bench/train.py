"""Benchmark tinyllm's trainer; prints figures and ratios measured in this one run.

1. ms per step of tinyllm's Trainer vs a plain PyTorch loop written the way nanoGPT's ``train.py``
   is (same GPT, AdamW in two groups, the LR set per step, clipping, ``loss.item()`` every step;
   each batch gathered in one indexing op from a memmap), under each OpenMP wait policy (ACTIVE,
   PASSIVE, and the one tinyllm picks by itself now), and tinyllm with 1 thread for reference.
   Each figure is its own process (the policy is fixed when libgomp loads), runs alternate
   ``--reps`` times so machine load hits all alike, and each is the median step of a run.
   ``--nanogpt DIR`` also times nanoGPT's own ``train.py`` from a checkout with
   ``data/shakespeare_char`` prepared (optional; nothing else here needs nanoGPT). Its model has its
   data's character vocabulary (68 in that checkout's meta.pkl); tinyllm runs both ways in the same
   alternation: at bytes (vocab 256, a larger embedding, head and softmax: about 3% more arithmetic
   per step, ``--only phases``) and with its char tokenizer on a char corpus (equal work: built from
   nanoGPT's own ``input.txt`` when ``--nanogpt`` is given, so the same 68 characters and the same
   token ids as its train.bin; else the built-in text, 69 characters). Ratios by wall and CPU time;
2. checkpoint save time as a fraction of training time, for specs/tiny.json at its cadence;
3. checkpoint size in bytes per parameter;
4. start-up: process start (Popen) to the first step's metrics frame, fresh and resumed
   (bench/restart.py breaks the resumed figure down).

1b. (``--only cpu1``) the same at 1 thread by CPU time per step: plain loop, tinyllm, tinyllm with
   glibc's default heap, tinyllm at character level, nanoGPT's train.py (its CPU time read at each of its "iter" lines). Every
   child also reports its CPU time, minor page faults and OpenMP worker sleeps per step.
1c. (``--only phases``) bench/train_phases.py: each phase of one step by CPU time at 1 thread, tinyllm
   beside nanoGPT's model.py + train.py loop body (at its 65-token vocabulary and at tinyllm's 256).

5. the loaded case: N busy-loop processes (``--load``, default one per CPU) while tinyllm picks its
   thread count and policy itself, vs 1 thread and vs the spec's threads pinned (TINYLLM_THREADS).

Usage: python bench/train.py [--steps 40] [--reps 3] [--spec FILE] [--nanogpt DIR]
       [--only throughput|cpu1|phases|loaded|checkpoints]
       [--load N]
The default shape is nanoGPT's CPU recipe for tiny Shakespeare (4 layers, 4 heads, 128 wide,
block 64, batch 12, dropout 0, torch's default thread count).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 5  # steps not counted: allocator and thread pool warm-up
RECIPE = {
    "name": "nanogpt-recipe",
    "steps": 40,
    "corpus": "default",
    "seed": 7,
    "batch_size": 12,
    "lr": 1e-3,
    "min_lr": 1e-4,
    "warmup_steps": 100,
    "lr_decay_steps": 5000,
    "beta2": 0.99,
    "checkpoint_every": 10**6,
    "log_every": 10**6,
    "eval_every": 10**6,
    "model": {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0},
}


# -- child processes: one measurement each, the OpenMP policy fixed by the parent's environment --


class Stamps:
    """Per step: wall time, this process's CPU time (all threads) and minor page faults; and, over the
    timed steps only, the voluntary context switches of the threads other than the main one (an OpenMP
    worker sleeping in the kernel between parallel regions: 0 while it spins through every gap)."""

    def __init__(self, total_steps: int):
        self.total, self.rows, self.sleeps_at = total_steps, [], {}

    def mark(self) -> None:
        import resource

        self.rows.append((time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt))
        if len(self.rows) in (WARMUP_STEPS, self.total):
            self.sleeps_at[len(self.rows)] = _worker_sleeps()

    def summary(self) -> dict:
        rows = self.rows[WARMUP_STEPS - 1 :]
        d = [[b[i] - a[i] for a, b in zip(rows, rows[1:])] for i in range(3)]
        n = len(rows) - 1
        sleeps = (self.sleeps_at.get(self.total, 0) - self.sleeps_at.get(WARMUP_STEPS, 0)) / n if n > 0 else 0.0
        return {
            "median_s": statistics.median(d[0]),
            "cpu_s": statistics.median(d[1]),
            "faults": sum(d[2]) / n,
            "worker_sleeps": sleeps,
            "steps": n,
        }


def _worker_sleeps() -> int:
    """Voluntary context switches of every thread of this process but the main one."""
    total = 0
    for status in Path(f"/proc/{os.getpid()}/task").glob("*/status"):
        if status.parent.name == str(os.getpid()):
            continue
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:
            continue  # a thread that ended
    return total


def _spec(args):
    from tinyllm.spec import parse_train_spec

    data = json.loads(Path(args.spec).read_text()) if args.spec else dict(RECIPE, threads=len(os.sched_getaffinity(0)))
    data.update(steps=args.steps + WARMUP_STEPS, checkpoint_every=10**6, log_every=10**6)
    if getattr(args, "corpus", None):
        data["corpus"] = args.corpus  # "char": the character-level corpus main() builds
    if args.threads:
        data["threads"] = args.threads
    data.pop("validation", None)
    return parse_train_spec(data)


def child_plain(args) -> Stamps:
    """The plain loop (nanoGPT's train.py loop, tinyllm's GPT)."""
    import numpy as np
    import torch

    from tinyllm.corpus import open_corpus
    from tinyllm.model import GPT
    from tinyllm.tokenizer import from_corpus_meta
    from tinyllm.trainer import lr_at, with_vocab

    spec = _spec(args)
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    data, meta = open_corpus(Path(args.home), spec.corpus)  # a uint16 memmap, as nanoGPT's train.bin
    spec = with_vocab(spec, from_corpus_meta(meta), spec.corpus)  # the corpus's vocabulary, as the trainer
    T, B = spec.model.block_size, spec.batch_size
    offsets = np.arange(T + 1)

    def get_batch():  # nanoGPT draws B offsets; here one fancy-indexing op gathers all B rows
        ix = torch.randint(len(data) - T, (B,)).numpy()
        rows = torch.from_numpy(data[ix[:, None] + offsets].astype(np.int64))
        return rows[:, :-1], rows[:, 1:]

    model = GPT(spec.model)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2))
    model.train()
    stamps, (x, y) = Stamps(spec.steps), get_batch()
    for step in range(spec.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spec)
        _, loss = model(x, y)
        x, y = get_batch()  # nanoGPT prefetches the next batch while the forward is in flight
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        stamps.mark()  # the end of each step, as the trainer's frames are
    return stamps


def child_tinyllm(args) -> Stamps:
    """tinyllm's real Trainer (metrics sinks on, liveness, hooks); timed between frames."""
    from tinyllm.sinks.metrics import Reporter, default_reporter
    from tinyllm.trainer import Trainer

    spec = _spec(args).model_copy(update={"name": f"bench-{os.getpid()}"})
    trainer = Trainer(spec, Path(args.home))
    stamps = Stamps(spec.steps)

    class Stamped(Reporter):
        def report(self, step, frame):
            super().report(step, frame)
            stamps.mark()

    inner = default_reporter(trainer.run_dir, -1, spec.steps, spec.log_every)
    trainer.run(reporter=Stamped(inner.sinks))
    return stamps


def run_child(args) -> None:
    from tinyllm import runtime_env

    # as `tinyllm train` does before torch: the thread count (at most the spec's) and the policy by load
    most = _spec(args).threads
    runtime_env.prepare(most, adapt=args.child == "tinyllm", keep_heap=os.environ.get("BENCH_HEAP") != "default")

    stamps = {"plain": child_plain, "tinyllm": child_tinyllm}[args.child](args)
    got = runtime_env.status()
    got["omp"]["threads"] = runtime_env.train_threads(most)
    print(json.dumps({**stamps.summary(), **got}))


# -- the parent ----------------------------------------------------------------------------


def measure(
    args,
    home: Path,
    what: str,
    policy: str | None,
    threads: int | None = None,
    extra_env: dict | None = None,
    corpus: str | None = None,
) -> dict:
    """One child process: ``policy`` None leaves OMP_WAIT_POLICY unset, so tinyllm chooses; ``threads``
    None with ``policy`` None lets tinyllm choose its count by load (at most the spec's); else it is pinned
    (TINYLLM_THREADS: ``threads``, or the spec's under a forced policy)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TINYLLM_THREADS")}
    if threads or policy is not None:  # a forced policy is a controlled run: the count the plain loop uses
        env["TINYLLM_THREADS"] = str(threads or _spec(args).threads)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    env.update(extra_env or {})
    cmd = [sys.executable, __file__, "--child", what, "--home", str(home), "--steps", str(args.steps)]
    cmd += ["--spec", args.spec] if args.spec else []
    cmd += ["--threads", str(threads)] if threads else []
    cmd += ["--corpus", corpus] if corpus else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench: child {what} {policy} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# Runs nanoGPT's train.py unmodified; its "iter N: ..." lines get this process's CPU time appended (its
# own figure is wall time), through a `print` in its globals.
NANOGPT_DRIVER = """
import builtins, runpy, sys, time
def stamped(*a, **k):
    if a and isinstance(a[0], str) and a[0].startswith("iter "):
        a = (a[0] + f" cpu_s={time.process_time():.6f}",) + a[1:]
    builtins.print(*a, **k)
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", init_globals={"print": stamped}, run_name="__main__")
"""


def measure_nanogpt(args, threads: int | None = None) -> dict:
    """nanoGPT's own train.py on the same shape, in the user's environment (policy unset; ``threads``:
    OMP_NUM_THREADS); its median iteration by its own wall figure and by CPU time."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "PYTHONPATH")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the checkout
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    m = RECIPE["model"]
    cmd = [
        sys.executable,
        "-c",
        NANOGPT_DRIVER,
        "config/train_shakespeare_char.py",
        "--device=cpu",
        "--compile=False",
        "--eval_iters=1",
        "--log_interval=1",
        f"--block_size={m['block_size']}",
        f"--batch_size={RECIPE['batch_size']}",
        f"--n_layer={m['n_layer']}",
        f"--n_head={m['n_head']}",
        f"--n_embd={m['n_embd']}",
        "--dropout=0.0",
        f"--max_iters={args.steps + WARMUP_STEPS}",
        "--lr_decay_iters=2000",
        "--eval_interval=100000",
        f"--out_dir={tempfile.mkdtemp(prefix='nanogpt-out-')}",
    ]
    out = subprocess.run(cmd, cwd=args.nanogpt, env=env, capture_output=True, text=True, timeout=1800)
    rows = [
        (int(i), float(t), float(c))
        for i, t, c in re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms.* cpu_s=([\d.]+)", out.stdout, re.M)
    ]
    ms = [t for i, t, _ in rows if i >= WARMUP_STEPS]
    cpu = [b[2] - a[2] for a, b in zip(rows, rows[1:]) if b[0] >= WARMUP_STEPS]
    if out.returncode != 0 or not ms or not cpu:
        sys.exit(f"bench: nanoGPT's train.py failed:\n{out.stdout[-1000:]}{out.stderr[-2000:]}")
    return {"median_s": statistics.median(ms) / 1000, "cpu_s": statistics.median(cpu), "steps": len(ms)}


def load_str() -> str:
    return open("/proc/loadavg").read().split()[0]


def throughput(args, home: Path) -> None:
    """(what, policy, threads, corpus): corpus None is the byte-level default, "char" the char corpus."""
    configs = [
        ("plain", "PASSIVE", None, None),
        ("tinyllm", "PASSIVE", None, None),
        ("plain", "ACTIVE", None, None),
        ("tinyllm", "ACTIVE", None, None),
        ("tinyllm", None, None, None),
        ("tinyllm", "PASSIVE", 1, None),
        ("tinyllm", "PASSIVE", None, "char"),
        ("tinyllm", "ACTIVE", None, "char"),
        ("tinyllm", None, None, "char"),
    ]
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    nano: list[dict] = []
    loads = [load_str()]
    for rep in range(args.reps):  # alternate, so machine load hits every configuration alike
        for c in configs:
            results[c].append(measure(args, home, *c[:3], corpus=c[3]))
            got = results[c][-1]
            said = f" -> {got['omp']['wait_policy']} ({got['omp']['reason']})" if c[1] is None else ""
            print(
                f"  run {rep + 1}: {c[0]}{' char' if c[3] else ''} policy={c[1] or 'own choice'} "
                f"threads={c[2] or ('spec' if c[1] else 'own choice')}: "
                f"{1000 * got['median_s']:.1f} ms/step, CPU {1000 * got['cpu_s']:.1f} ms, {got['faults']:.0f} faults/step, "
                f"{got['worker_sleeps']:.1f} worker sleeps/step (load {load_str()}){said}"
            )
        if args.nanogpt:
            nano.append(measure_nanogpt(args))
            print(
                f"  run {rep + 1}: nanoGPT train.py: {1000 * nano[-1]['median_s']:.1f} ms/step, CPU "
                f"{1000 * nano[-1]['cpu_s']:.1f} ms (load {load_str()})"
            )
        loads.append(load_str())
    ms = {c: 1000 * statistics.median(r["median_s"] for r in rs) for c, rs in results.items()}
    cpu = {c: 1000 * statistics.median(r["cpu_s"] for r in rs) for c, rs in results.items()}
    auto = [r["omp"] for r in results[("tinyllm", None, None, None)]]
    threads = results[("tinyllm", "ACTIVE", None, None)][0]["omp"]["threads"]
    print(
        f"throughput: ms per step (wall, and CPU of all threads), median of {args.reps} runs x {args.steps} steps, "
        f"{threads} threads, 1-min load {' -> '.join(loads)}; char vocabulary {args.char_vocab} ({args.char_source})"
    )
    for policy in ("ACTIVE", "PASSIVE"):
        p, o = ms[("plain", policy, None, None)], ms[("tinyllm", policy, None, None)]
        print(
            f"  OMP_WAIT_POLICY={policy:<7}: plain loop {p:6.1f} ms, tinyllm {o:6.1f} ms, plain/tinyllm {p / o:.3f} (aim >= 0.95)"
        )
    a, one = ms[("tinyllm", None, None, None)], ms[("tinyllm", "PASSIVE", 1, None)]
    chosen = ", ".join(f"{p} {sum(x['wait_policy'] == p for x in auto)} of {len(auto)}" for p in ("ACTIVE", "PASSIVE"))
    print(f"  tinyllm's own choice: {a:6.1f} ms  [{chosen}]")
    print(
        f"  tinyllm 1 thread:     {one:6.1f} ms  (own choice vs 1 thread: {one / a:.3f}x the speed; aim >= 1 when loaded)"
    )
    print(
        f"  ACTIVE vs PASSIVE (tinyllm): {ms[('tinyllm', 'PASSIVE', None, None)] / ms[('tinyllm', 'ACTIVE', None, None)]:.3f}x the speed"
    )
    rows = [
        (f"tinyllm {kind:<5}", c)
        for kind, corpus in (("byte", None), ("char", "char"))
        for c in (
            ("tinyllm", "ACTIVE", None, corpus),
            ("tinyllm", "PASSIVE", None, corpus),
            ("tinyllm", None, None, corpus),
        )
    ]
    for label, c in rows:
        print(f"  {label} {c[1] or 'own choice':<10}: {ms[c]:6.1f} ms wall, {cpu[c]:6.1f} ms CPU")
    for policy in ("ACTIVE", "PASSIVE", None):
        b, ch = ("tinyllm", policy, None, None), ("tinyllm", policy, None, "char")
        print(
            f"  byte/char ({policy or 'own choice'}): wall {ms[b] / ms[ch]:.3f}, CPU {cpu[b] / cpu[ch]:.3f} (> 1: char is less work)"
        )
    if nano:
        n = 1000 * statistics.median(r["median_s"] for r in nano)
        nc = 1000 * statistics.median(r["cpu_s"] for r in nano)
        print(f"  nanoGPT train.py (policy unset): {n:6.1f} ms wall, {nc:6.1f} ms CPU")
        for kind, corpus in (("byte", None), ("char", "char")):
            own, act = ("tinyllm", None, None, corpus), ("tinyllm", "ACTIVE", None, corpus)
            print(
                f"  nanoGPT/tinyllm {kind}: own choice wall {n / ms[own]:.3f} CPU {nc / cpu[own]:.3f}; "
                f"ACTIVE wall {n / ms[act]:.3f} CPU {nc / cpu[act]:.3f} (aim >= 1.0 when idle)"
            )
            # each rep's ratio against the nanoGPT run next to it: load that comes and goes hits both alike
            per = [r["median_s"] / t["median_s"] for r, t in zip(nano, results[own])]
            print(
                f"    per run, nanoGPT/tinyllm {kind} own choice (wall): {' '.join(f'{x:.3f}' for x in per)}; "
                f"median {statistics.median(per):.3f}"
            )


def cpu_one_thread(args, home: Path) -> None:
    """At 1 thread, by CPU time per step (process time, median step): the plain loop, tinyllm, tinyllm
    with glibc's default heap (BENCH_HEAP=default: no mallopt, tinyllm/runtime_env.py), and nanoGPT's train.py
    (OMP_NUM_THREADS=1), alternating ``--reps`` times. One thread has no OpenMP worker to wait for, so
    the figure is the work of a step; CPU time still grows when other processes share the cores' caches."""
    configs = [
        ("plain", (), None),
        ("tinyllm", (), None),
        ("tinyllm", (("BENCH_HEAP", "default"),), None),
        ("plain", (), "char"),
        ("tinyllm", (), "char"),
    ]
    label = {
        configs[0]: "plain loop",
        configs[1]: "tinyllm",
        configs[2]: "tinyllm, heap not kept",
        configs[3]: f"plain loop char ({args.char_vocab})",
        configs[4]: f"tinyllm char ({args.char_vocab})",
    }
    results: dict = {c: [] for c in configs}
    nano: list[dict] = []
    loads = [load_str()]
    for rep in range(args.reps):
        for c in configs:
            got = measure(args, home, c[0], "PASSIVE", threads=1, extra_env=dict(c[1]), corpus=c[2])
            results[c].append(got)
            print(
                f"  1-thread run {rep + 1}: {label[c]}: CPU {1000 * got['cpu_s']:.1f} ms/step, wall {1000 * got['median_s']:.1f} ms, "
                f"{got['faults']:.0f} faults/step (load {load_str()})"
            )
        if args.nanogpt:
            nano.append(measure_nanogpt(args, threads=1))
            print(
                f"  1-thread run {rep + 1}: nanoGPT train.py: CPU {1000 * nano[-1]['cpu_s']:.1f} ms/step, wall "
                f"{1000 * nano[-1]['median_s']:.1f} ms (load {load_str()})"
            )
        loads.append(load_str())
    cpu = {c: 1000 * statistics.median(r["cpu_s"] for r in rs) for c, rs in results.items()}
    faults = {c: statistics.median(r["faults"] for r in rs) for c, rs in results.items()}
    t = cpu[configs[1]]
    print(
        f"1 thread, CPU ms per step, median of {args.reps} runs x {args.steps} steps, 1-min load {' -> '.join(loads)}"
    )
    for c in configs:
        print(f"  {label[c]:<24}: {cpu[c]:6.1f} ms CPU, {faults[c]:6.0f} faults/step, /tinyllm {cpu[c] / t:.3f}")
    if nano:
        n = 1000 * statistics.median(r["cpu_s"] for r in nano)
        print(
            f"  {'nanoGPT train.py':<24}: {n:6.1f} ms CPU, /tinyllm {n / t:.3f}, /tinyllm char {n / cpu[configs[4]]:.3f} "
            f"(>= 1: tinyllm's step is less work)"
        )


def phases(args, home: Path) -> None:
    """bench/train_phases.py at 1 thread: each phase of tinyllm's step by CPU time, beside nanoGPT's model
    and loop at its 65-character vocabulary and at tinyllm's 256 (the same work), alternating in one process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(TINYLLM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(REPO / "bench" / "train_phases.py"), str(home), "--steps", str(args.steps)]
    cmd += ["--nanogpt", args.nanogpt] if args.nanogpt else []
    load = load_str()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench: train_phases failed:\n{out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cols = [("tinyllm", got["tinyllm"])] + [(f"nanoGPT V={v}", ph) for v, ph in got["nanogpt"].items()]
    names = list(dict.fromkeys(k for _, ph in cols for k in ph))
    print(
        f"phases: CPU ms per step at 1 thread, median of {args.steps} steps, one process (load {load} -> {load_str()})"
    )
    print("  " + f"{'phase':<22}" + "".join(f"{c:>15}" for c, _ in cols))
    for k in names:
        print("  " + f"{k:<22}" + "".join(f"{ph.get(k, 0.0):15.3f}" for _, ph in cols))
    sums = [sum(ph.values()) for _, ph in cols]
    print("  " + f"{'sum':<22}" + "".join(f"{x:15.3f}" for x in sums))
    print(
        f"  tinyllm's real train_step + report: {got['tinyllm_real_step_ms']:.3f} ms (the phases' sum: {sums[0]:.3f})"
    )
    for (c, _), x in zip(cols[1:], sums[1:]):
        print(f"  {c}/tinyllm: {x / sums[0]:.3f}")


def checkpointing_and_startup(args, home: Path) -> None:
    import tinyllm  # noqa: F401
    from tinyllm.sinks.metrics import default_reporter
    from tinyllm.model import GPT
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    class TimedTrainer(Trainer):
        """The real trainer; only adds a stopwatch around checkpoint saves."""

        save_s = 0.0

        def save(self, extra=None):
            t0 = time.perf_counter()
            path = super().save(extra)
            self.save_s += time.perf_counter() - t0
            return path

    spec = load_train_spec(args.spec or REPO / "specs" / "tiny.json")
    trainer = TimedTrainer(spec, home)
    t0 = time.perf_counter()
    result = trainer.run(reporter=default_reporter(trainer.run_dir, 0, spec.steps, 10**6))
    total = time.perf_counter() - t0
    n_ckpt = len(list((home / "runs" / spec.name / "ckpt").glob("step-*")))
    print(
        f"checkpointing: {n_ckpt} checkpoints in {total:.1f} s of training ({spec.steps} steps, every "
        f"{spec.checkpoint_every}): {trainer.save_s:.2f} s = {100 * trainer.save_s / total:.2f}% (aim <= 3%)"
    )

    ckpt_dir = home / result["checkpoint"]
    size = sum(f.stat().st_size for f in ckpt_dir.iterdir())
    n_params = GPT(spec.model).num_params()
    print(
        f"checkpoint size: {size:,} bytes for {n_params:,} parameters = {size / n_params:.2f} bytes/parameter "
        f"(fp32 weights + 2 AdamW moments = 12)"
    )

    fresh_spec = home / "fresh.json"
    fresh_spec.write_text(spec.model_copy(update={"name": "bench-fresh", "steps": 5}).model_dump_json())
    fresh_s, _ = first_step_latency(home, fresh_spec)
    resume_spec = home / "resume.json"
    resume_spec.write_text(spec.model_copy(update={"steps": spec.steps + 5}).model_dump_json())
    resume_s, step = first_step_latency(home, resume_spec)
    print(
        f"start-up: process start to first step {fresh_s:.2f} s fresh, {resume_s:.2f} s resumed "
        f"(from step {step - 1}, verifying and loading the checkpoint; bench/restart.py breaks it down)"
    )


def first_step_latency(home: Path, spec_file: Path) -> tuple[float, int]:
    """Seconds from Popen to the first new metrics frame of a `tinyllm train` process; its step."""
    from tinyllm.spec import load_train_spec

    spec = load_train_spec(spec_file)
    metrics = home / "runs" / spec.name / "metrics.jsonl"
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec_file), "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.communicate(timeout=600)
    frames = [json.loads(line) for line in metrics.read_text().splitlines()]
    new = [f for f in frames if f["time"] >= t0]
    return new[0]["time"] - t0, new[0]["step"]


def _busy_loop() -> None:
    while True:
        pass


def loaded(args, home: Path) -> None:
    """The loaded case in one run: ``--load N`` busy-loop processes (default: one per CPU) run while
    tinyllm picks its threads and policy itself, against 1 thread and against the spec's threads
    pinned, alternating ``--reps`` times."""
    import multiprocessing as mp

    n = args.load or len(os.sched_getaffinity(0))
    most = _spec(args).threads
    busy = [mp.Process(target=_busy_loop, daemon=True) for _ in range(n)]
    for b in busy:
        b.start()
    try:
        time.sleep(1.0)  # the busy loops are runnable before the first child samples the load
        configs = [("tinyllm", None, None), ("tinyllm", None, 1), ("tinyllm", None, most)]
        results: dict[tuple, list[dict]] = {c: [] for c in configs}
        for rep in range(args.reps):
            for c in configs:
                got = measure(args, home, *c)
                results[c].append(got)
                print(
                    f"  loaded run {rep + 1}: threads={c[2] or 'own choice'}: {1000 * got['median_s']:.1f} ms/step "
                    f"-> {got['omp'].get('threads')} threads, {got['omp']['wait_policy']} (load {load_str()})"
                )
    finally:
        for b in busy:
            b.terminate()
        for b in busy:
            b.join()
    ms = {c: 1000 * statistics.median(r["median_s"] for r in rs) for c, rs in results.items()}
    own, one, pinned = ms[configs[0]], ms[configs[1]], ms[configs[2]]
    picked = sorted({r["omp"].get("threads") for r in results[configs[0]]})
    print(
        f"loaded: {n} busy-loop processes on {len(os.sched_getaffinity(0))} CPUs, median of {args.reps} runs x "
        f"{args.steps} steps"
    )
    print(
        f"  own choice ({picked} threads of at most {most}): {own:6.1f} ms; 1 thread {one:6.1f} ms; "
        f"{most} threads pinned {pinned:6.1f} ms"
    )
    print(f"  own choice vs 1 thread: {one / own:.3f}x the speed (aim >= 1); vs {most} pinned: {pinned / own:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--spec",
        default=None,
        help="train spec (default: nanoGPT's CPU recipe; specs/tiny.json for the checkpoint figures)",
    )
    ap.add_argument("--steps", type=int, default=40, help="timed steps per throughput run (after 5 warm-up)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nanogpt", default=None, help="a nanoGPT checkout with data/shakespeare_char prepared")
    ap.add_argument("--only", choices=["throughput", "cpu1", "phases", "loaded", "checkpoints"], default=None)
    ap.add_argument("--load", type=int, default=None, help="busy-loop processes for the loaded case (default: CPUs)")
    ap.add_argument("--child", choices=["plain", "tinyllm"], help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return run_child(args)
    sys.stdout.reconfigure(line_buffering=True)  # figures appear as they are measured
    sys.path.insert(0, str(REPO))
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    home = Path(tempfile.mkdtemp(prefix="tinyllm-bench-"))
    build_corpus(CorpusSpec(name="default"), home)
    shakespeare = Path(args.nanogpt) / "data" / "shakespeare_char" / "input.txt" if args.nanogpt else None
    if shakespeare is not None and shakespeare.is_file():  # nanoGPT's own text: its vocabulary and token ids
        char = build_corpus(CorpusSpec(name="char", sources=[str(shakespeare.resolve())], tokenizer="char"), home)
        args.char_source = f"nanoGPT's {shakespeare.relative_to(args.nanogpt)}"
    else:
        char = build_corpus(CorpusSpec(name="char", tokenizer="char"), home)
        args.char_source = "the built-in text"
    args.char_vocab = json.loads((home / char["path"] / "meta.json").read_text())["vocab_size"]
    print(
        f"bench: spec {args.spec or 'nanoGPT CPU recipe'}, {len(os.sched_getaffinity(0))} CPUs, home {home}, "
        f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )
    if args.only in (None, "throughput"):
        throughput(args, home)
    if args.only in (None, "cpu1"):
        cpu_one_thread(args, home)
    if args.only in (None, "phases"):
        phases(args, home)
    if args.only in (None, "loaded"):
        loaded(args, home)
    if args.only in (None, "checkpoints"):
        checkpointing_and_startup(args, home)


if __name__ == "__main__":
    main()
