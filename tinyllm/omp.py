"""The OpenMP wait policy of torch's CPU threads, chosen by what the machine is doing (no torch here).

libgomp reads ``OMP_WAIT_POLICY`` once, when it loads with torch, so the choice is made when
``tinyllm`` is imported, before torch. Between parallel regions torch's worker threads either spin
(``ACTIVE``) or sleep in the kernel (``PASSIVE``):

- on an idle machine spinning threads are ready for the next of the thousands of small regions of
  a step: ``PASSIVE`` costs about 1.7x per step (bench/train.py);
- on a machine whose CPUs are busy, a spinning thread takes the CPU from the thread it waits for:
  2-thread training went several times slower than 1 thread (68 s vs 15 s for 20 steps of
  specs/tiny.json at load 7 on 2 cores).

So: ``ACTIVE`` when the CPUs this process may use have room for its threads besides the tasks
running now, else ``PASSIVE``. ACTIVE comes with ``GOMP_SPINCOUNT=300000`` (libgomp's default
spin for an unset policy, about 3 ms, then sleep), not plain ACTIVE's minutes of spinning. "Running now" is the kernel's count of runnable tasks
(``procs_running`` in /proc/stat), the median of a few readings over a few milliseconds, less this process;
not the load average, which still counts the trainer a restart replaces for a minute after it died.

An explicit setting always wins: ``OMP_WAIT_POLICY`` (or ``GOMP_SPINCOUNT``) in the environment,
or ``TINYLLM_OMP_WAIT_POLICY=ACTIVE|PASSIVE|auto``. The policy changes only how idle threads wait,
never the arithmetic: results are bit-identical under either (tests/tinyllm/test_omp.py).

The thread count of ``tinyllm train`` is chosen here too (``configure(adapt=True)``): the spec's
``threads`` is the most it uses; with fewer CPUs free it uses fewer, down to 1; ``TINYLLM_THREADS=N``
pins it. It changes speed only: the model's reductions are thread-invariant (tinyllm/model.py) and
MKL runs in strict CNR mode (``MKL_CBWR=AUTO,STRICT``), so any count gives the same bits
(tests/tinyllm/test_threads.py). Each segment is a new process, so each resume decides again.

Limit: the choice holds for the process's life. A machine that becomes busy later keeps spinning
threads until the process ends (``ctl train`` starts a new one per segment, which decides again);
no bounded spin is safe under load (measured at load ~12: PASSIVE 149 ms/step, GOMP_SPINCOUNT=1000
501 ms, ACTIVE 3020 ms), so there is no middle setting.
"""
from __future__ import annotations

import os
import sys
import time

POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_ENV = "GOMP_SPINCOUNT"
OVERRIDE_ENV = "TINYLLM_OMP_WAIT_POLICY"  # ACTIVE | PASSIVE | auto (the default)
# What tinyllm set by itself ("OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000"): a child process that
# inherits exactly that decides again for itself (a worker's choice at its start says nothing about
# the machine when it starts a trainer); a value the user set differs from it and wins.
MARK_ENV = "TINYLLM_OMP_AUTO"
# MKL's strict conditional numerical reproducibility: its gemm then gives the same bits for any thread
# count (without it, 3 threads differ from 1 and 2 at 40,960 tokens; with it 1 and 2 keep today's bits).
# Read once when MKL loads with torch, so set here with the wait policy; a user's MKL_CBWR wins.
CBWR_ENV = "MKL_CBWR"
CBWR = "AUTO,STRICT"
POLICIES = ("ACTIVE", "PASSIVE")
# ACTIVE alone spins an idle thread for about 5 minutes (libgomp's figure) after each parallel
# region: through checkpoint writes, evaluations, waits. libgomp's own default for an unset policy
# is 300000 spins (about 3 ms), then sleep: that covers the gaps inside a training step.
ACTIVE_SPINS = "300000"
SAMPLES = 5
SAMPLE_GAP_S = 0.002
SELF_TASKS = 1  # the deciding process is itself one of the runnable tasks it counts

_CHOSEN: dict = {}


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_procs_running(path: str = "/proc/stat") -> int | None:
    """The kernel's number of runnable tasks now (this process included); None where unknown."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def busy_tasks(read=read_procs_running, samples: int = SAMPLES, gap_s: float = SAMPLE_GAP_S) -> float | None:
    """Runnable tasks other than this process: the median of ``samples`` readings ``gap_s`` apart.

    The median, not the fewest: processes started together (a launcher's ranks, a test's trainers) are
    each other's competitors while one of them blocks for a moment; the fewest reading then saw a free
    CPU that was not free, spun, and starved the rest (suspected in a CI run where four trainers
    started together and a test's poller missed its kill).
    """
    seen = []
    for i in range(samples):
        n = read()
        if n is None:
            return None
        seen.append(max(0, n - SELF_TASKS))
        if i + 1 < samples:
            time.sleep(gap_s)
    seen.sort()
    return float(seen[len(seen) // 2])


def choose(busy: float | None, cpus: int, threads: int) -> tuple[str, str]:
    """(policy, reason) for ``threads`` OpenMP threads on ``cpus`` CPUs with ``busy`` other
    runnable tasks: spin only where every thread has a CPU of its own."""
    assert cpus >= 1 and threads >= 1, (cpus, threads)
    if busy is None:
        return "PASSIVE", "machine load unknown"
    if busy + threads <= cpus:
        return "ACTIVE", f"{busy:g} other runnable tasks + {threads} threads fit on {cpus} CPUs"
    return "PASSIVE", f"{busy:g} other runnable tasks + {threads} threads exceed {cpus} CPUs"


THREADS_ENV = "TINYLLM_THREADS"  # N pins the training thread count; auto (the default): chosen by load


def choose_threads(busy: float | None, cpus: int, most: int) -> tuple[int, str]:
    """(threads, reason): at most ``most``, only as many as the CPUs have room for beside ``busy``
    other runnable tasks, at least 1. On a loaded machine more threads than free CPUs are slower than
    one (2 threads were 0.79x of 1 on a loaded 2-core machine). The count never changes the bits."""
    assert cpus >= 1 and most >= 1, (cpus, most)
    if busy is None:
        return most, "machine load unknown: the spec's threads"
    free = int(cpus - busy)
    n = max(1, min(most, free))
    return n, f"{busy:g} other runnable tasks on {cpus} CPUs leave {max(free, 0)} free; at most {most}"


def pinned_threads(env=os.environ) -> int | None:
    """TINYLLM_THREADS=N (N >= 1): the thread count the user pinned; None for auto (or unset)."""
    raw = env.get(THREADS_ENV, "auto").strip()
    if raw.lower() in ("", "auto"):
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        print(f"tinyllm: warning: {THREADS_ENV}={raw!r} is not a positive integer or auto; using auto", file=sys.stderr)
        return None
    return n


def default_threads(env=os.environ) -> int:
    """The thread count torch will start with: OMP_NUM_THREADS, else one per CPU."""
    try:
        return max(1, int(env.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return cpu_count()


def _settings(policy: str) -> dict[str, str]:
    return {POLICY_ENV: policy, SPIN_ENV: ACTIVE_SPINS} if policy == "ACTIVE" else {POLICY_ENV: policy}


def _marked(env) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in env.get(MARK_ENV, "").split() if "=" in kv)


def configure(env=os.environ, modules=sys.modules, busy=busy_tasks, cpus: int | None = None,
              threads: int | None = None, adapt: bool = False) -> dict:
    """Set the wait policy in ``env`` unless the user set one; return (and remember) what and why.

    ``adapt`` (``tinyllm train``): ``threads`` is the most to use; the count is chosen by load
    (``choose_threads``) unless TINYLLM_THREADS pins it, and the wait policy is chosen for that count;
    ``chosen()`` then reports it and ``train_threads`` returns it.

    Called again (the CLI does, with the spec's ``threads``) before torch is imported, it decides
    again; once torch is imported it only says what libgomp was given.
    """
    global _CHOSEN
    cpus = cpus or cpu_count()
    if "torch" not in modules:
        env.setdefault(CBWR_ENV, CBWR)
    threads = threads or default_threads(env)
    plan: dict = {}
    if adapt:
        most, pin = threads, pinned_threads(env)
        if pin is not None:
            threads, why = pin, f"{THREADS_ENV}={pin}"
        else:
            seen = busy()
            busy = lambda: seen  # noqa: E731  (one sample decides both the count and the policy)
            threads, why = choose_threads(seen, cpus, most)
        plan = {"threads": threads, "threads_max": most, "threads_reason": why}
    if "torch" in modules:
        if not _CHOSEN.get("before_torch"):
            _CHOSEN = {"wait_policy": env.get(POLICY_ENV) or "(libgomp's default)",
                       "reason": "torch was imported before tinyllm", "cpus": cpus}
        _CHOSEN.update(plan)
        return chosen(threads)
    ours = _marked(env)
    user = {k: env[k] for k in (POLICY_ENV, SPIN_ENV) if env.get(k) and env[k] != ours.get(k)}
    override = env.get(OVERRIDE_ENV, "auto").strip()
    if user:
        policy = user.get(POLICY_ENV) or "(libgomp's default)"
        reason = " and ".join(f"{k}={v}" for k, v in user.items()) + " set in the environment"
    else:
        for k in ours:  # what an ancestor chose is decided again here
            env.pop(k, None)
        if override.upper() in POLICIES:
            policy, reason = override.upper(), f"{OVERRIDE_ENV}={override}"
        else:
            if override.lower() != "auto":
                print(f"tinyllm: warning: {OVERRIDE_ENV}={override!r} is not ACTIVE, PASSIVE or auto; using auto",
                      file=sys.stderr)
            policy, reason = choose(busy(), cpus, threads)
        settings = _settings(policy)
        env.update(settings)
        env[MARK_ENV] = " ".join(f"{k}={v}" for k, v in settings.items())
    _CHOSEN = {"wait_policy": policy, "reason": reason, "cpus": cpus, "before_torch": True}
    if env.get(SPIN_ENV):
        _CHOSEN["spin_count"] = env[SPIN_ENV]
    _CHOSEN["mkl_cbwr"] = env.get(CBWR_ENV, "")
    _CHOSEN.update(plan)
    return chosen(threads)


def train_threads(most: int) -> int:
    """The thread count ``configure(adapt=True)`` chose for training, else ``most`` (the spec's)."""
    if _CHOSEN.get("threads_max") != most:  # chosen for another spec (in-process callers), or not at all
        return most
    return int(_CHOSEN["threads"])


def chosen(threads: int | None = None) -> dict:
    """What ``configure`` chose (for the progress 'ready' line), with the threads actually in use."""
    out = {k: v for k, v in _CHOSEN.items() if k != "before_torch"}
    if threads is not None and "threads" not in out:
        out["threads"] = threads
    return out
