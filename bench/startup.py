"""tinyllm's start-up tricks, each against its absence, on the machine as it is and with one CPU
taken by a busy loop (a second process spinning), side by side in one run. Prints figures and ratios.

Rows (each a fresh child process, alternated, median of ``--reps``):

- ``restart``: a resumed ``tinyllm train`` (the real CLI) from Popen to its first resumed step;
- ``dynamo``: ``torch.use_deterministic_algorithms`` + AdamW's first zero_grad/step through torch's
  public calls (they import torch._dynamo) against tinyllm/runtime_env.py's direct calls;
- ``steps``: the median step of specs/tiny.json's model (``--steps`` steps after 3 warm-up ones) at
  2 threads ACTIVE, 2 threads PASSIVE, 1 thread, and with glibc's default heap (minor page faults
  per step beside it).

Usage: python bench/startup.py [--reps 3] [--steps 20] [--only restart,dynamo,steps]
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
CLEAN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TINYLLM_THREADS", "MKL_CBWR")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinyllm.cli", *args]


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _procs_running() -> int:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"procs_running "):
                return int(line.split()[1])
    return -1


# -- children -----------------------------------------------------------------------------------

DYNAMO_CHILD = r"""
import json, sys, time
public = sys.argv[1] == "public"
import torch
t0 = time.perf_counter()
model = torch.nn.Linear(64, 64)
if public:
    torch.use_deterministic_algorithms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    opt.zero_grad(set_to_none=True)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
else:
    from tinyllm import runtime_env
    runtime_env.use_deterministic_algorithms()
    runtime_env.defer_dynamo_in_optimizers()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    opt.zero_grad(set_to_none=True)
    model(torch.randn(8, 64)).sum().backward()
    runtime_env.optimizer_step(opt)
print(json.dumps({"s": time.perf_counter() - t0, "dynamo": "torch._dynamo" in sys.modules}))
"""

STEPS_CHILD = r"""
import json, resource, sys, time
threads, heap, steps = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
try:
    from tinyllm import runtime_env
except ImportError:  # before runtime_env (the first measurement)
    from tinyllm import heap as runtime_env
if heap:
    runtime_env.keep_freed_memory()
import torch
from tinyllm.spec import load_train_spec
from tinyllm.model import GPT
from tinyllm.trainer import make_optimizer
spec = load_train_spec(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = GPT(spec.model)
opt = make_optimizer(model, spec)
g = torch.Generator().manual_seed(1)
T = spec.model.block_size
times, faults = [], []
for i in range(3 + steps):
    x = torch.randint(0, 256, (spec.batch_size, T), generator=g)
    y = torch.randint(0, 256, (spec.batch_size, T), generator=g)
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if i >= 3:
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
times.sort()
print(json.dumps({"ms": 1000 * times[len(times) // 2], "faults": sum(faults) / len(faults)}))
"""


def _child(code: str, *args: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=_env(**env), capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        sys.exit(f"bench: child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- rows ---------------------------------------------------------------------------------------


def restart_setup(home: Path, at: int = 6) -> tuple[Path, str]:
    spec = json.loads((REPO / "specs" / "tiny.json").read_text())
    spec.update(name="restart", steps=at, checkpoint_every=at)
    first, resumed = home / "first.json", home / "resumed.json"
    first.write_text(json.dumps(spec))
    resumed.write_text(json.dumps(dict(spec, steps=at + 1)))
    subprocess.run(_cli("corpus", "--home", str(home)), env=_env(), check=True, capture_output=True, timeout=600)
    subprocess.run(
        _cli("train", "--spec", str(first), "--home", str(home)),
        env=_env(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    return resumed, f"runs/restart/ckpt/step-{at:06d}"


def restart_once(home: Path, spec: Path, resume: str, **env: str) -> dict:
    """Seconds from Popen to the first resumed step's metrics frame; CPU seconds of the whole process."""
    metrics = home / "runs" / "restart" / "metrics.jsonl"
    t0, cpu0 = time.time(), _children_cpu_s()
    proc = subprocess.run(
        _cli("train", "--spec", str(spec), "--home", str(home), "--resume", resume),
        env=_env(**env),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        sys.exit(f"bench: resumed run failed: {proc.stderr[-2000:]}")
    frames = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"s": min(f["time"] for f in frames if f["time"] >= t0) - t0, "cpu": _children_cpu_s() - cpu0}


class BusyLoop:
    """A second process spinning on one CPU for the loaded half of the run."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def measure(args, home: Path, restart: tuple[Path, str] | None) -> dict:
    out: dict = {}

    def add(key, value):
        out.setdefault(key, []).append(value)
        print(f"  measured {key}: {json.dumps(value)}", flush=True)  # as it goes: a slow machine still shows some

    spec_file = str(REPO / "specs" / "tiny.json")
    for _ in range(args.reps):  # alternated, so a change of the machine's load hits every row alike
        add("procs_running", _procs_running())
        if "restart" in args.only:
            for label, env in RESTART_ROWS:
                add(("restart", label), restart_once(home, *restart, **env))
        if "dynamo" in args.only:
            for label in ("public", "direct"):
                add(("dynamo", label), _child(DYNAMO_CHILD, label))
        if "steps" in args.only:
            for label, threads, heap, env in STEP_ROWS:
                add(("steps", label), _child(STEPS_CHILD, str(threads), heap, str(args.steps), spec_file, **env))
    return out


RESTART_ROWS = [("as tinyllm train starts", {})]
STEP_ROWS = [
    ("2 threads ACTIVE", 2, "1", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}),
    ("2 threads PASSIVE", 2, "1", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("2 threads, libgomp's default", 2, "1", {}),
    ("1 thread", 1, "1", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("1 thread, default heap", 1, "0", {"OMP_WAIT_POLICY": "PASSIVE"}),
]


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(name: str, got: dict) -> None:
    print(f"\n{name} (runnable tasks when each round began: {got['procs_running']})")
    for kind, base_key, unit, _label in (
        ("restart", "s", "s to the first resumed step", "cpu"),
        ("dynamo", "s", "s for the first optimizer step", None),
        ("steps", "ms", "ms per step", "faults"),
    ):
        rows = [(k[1], v) for k, v in got.items() if isinstance(k, tuple) and k[0] == kind]
        if not rows:
            continue
        base = med(rows[0][1], base_key)
        for row, vals in rows:
            extra = ""
            if kind == "restart":
                extra = f", {med(vals, 'cpu'):.2f} s CPU"
            elif kind == "dynamo":
                extra = f", torch._dynamo imported: {vals[0]['dynamo']}"
            elif kind == "steps":
                extra = f", {med(vals, 'faults'):.0f} minor faults/step"
            print(
                f"  {kind:<8}{row:<34}{med(vals, base_key):8.3f} {unit}  ({med(vals, base_key) / base:.2f}x of "
                f"'{rows[0][0]}'){extra}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default="restart,dynamo,steps")
    args = ap.parse_args()
    args.only = set(args.only.split(","))
    sys.stdout.reconfigure(line_buffering=True)
    home = Path(tempfile.mkdtemp(prefix="tinyllm-startup-"))
    restart = restart_setup(home) if "restart" in args.only else None
    print(
        f"bench: {os.cpu_count()} CPUs, uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )
    idle = measure(args, home, restart)
    with BusyLoop():
        loaded = measure(args, home, restart)
    report("as the machine is", idle)
    report("with a busy loop on one CPU", loaded)


if __name__ == "__main__":
    main()
