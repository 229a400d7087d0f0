"""The process settings a run starts with, applied by an explicit call, never on ``import tinyllm``.

``tinyllm train`` calls ``prepare(spec.threads)`` before it imports torch (each segment and each DDP
rank is a new process, so each decides again), the trainer ``start_run()`` when it builds its model,
``tinyllm eval`` ``prepare()``, and ``tinyllm.durable.DurableRun`` ``start_run()``. What they set:

- Thread invariance (correctness): MKL in strict CNR mode, ``MKL_CBWR=AUTO,STRICT`` (a user's value
  wins), so its gemm gives the same bits for any thread count (without it, 3 threads differ from 1
  and 2 at 40,960 tokens: tests/tinyllm/test_threads.py). MKL reads the variable at its first call,
  not when torch loads, so ``start_run()`` sets it and then asks MKL which mode it runs in
  (``mkl_serv_cbwr_get`` in libtorch_cpu). If MKL already ran without it (a script did tensor math
  before the run started), the mode is fixed for the process's life: one warning line, once, saying
  so and how to fix it. A warning, not a refusal: a pytest session, a notebook or a user's loop that
  evaluated first is still reproducible at one thread count (``ctl verify-resume`` proves a trainer
  either way); only a change of the thread count between segments is then unsafe.
- Threads and the OpenMP wait policy (speed; the bits never depend on them): the spec's ``threads``
  is the most training uses; with fewer CPUs free (the kernel's runnable tasks, median of 5
  readings 2 ms apart, less this process) it uses fewer, at least 1; ``TINYLLM_THREADS=N`` pins the
  count. The threads spin between parallel regions (``OMP_WAIT_POLICY=ACTIVE`` with libgomp's ~3 ms
  ``GOMP_SPINCOUNT=300000``) when each has a free CPU, else sleep (``PASSIVE``); ``OMP_WAIT_POLICY``
  or ``GOMP_SPINCOUNT`` in the environment wins. libgomp reads them when torch loads: ``prepare()``.
- glibc keeps freed memory in the heap (``mallopt``: mmap threshold 32 MiB, trim threshold 1 GiB),
  so a step's activations reuse pages instead of faulting fresh ones in; nothing where not glibc.
- torch._dynamo is never imported (tinyllm never compiles): ``use_deterministic_algorithms``,
  ``defer_dynamo_in_optimizers`` and ``optimizer_step`` make the same calls as torch's public ones
  without the wrappers that import it; where torch's wrappers are not the ones expected (compared
  by code object, not by version) or dynamo is loaded, torch's own calls are used (the last part
  of this module).

Measured (bench/startup.py, one round, 2026-12-02, this 2-CPU machine shared with other work: 12-13
runnable tasks, so every figure is a loaded machine's; "+busy": a busy loop on top):
- wait policy, 2 threads, ms/step of specs/tiny.json's model: ACTIVE 17,517, PASSIVE 1,851,
  tinyllm's choice (PASSIVE here) 229, 1 thread 442: spinning under load is the one setting that
  costs 10x or more, so the policy is chosen by load, and the count too.
- heap, 1 thread: 442 ms/step and 177 minor faults/step kept, 1,554 ms and 597 with glibc's default
  (+busy: 684 ms and 57 faults against 350 ms and 690: one round's wall times at this load are
  noise; the faults are not, and mallopt costs nothing, so it stays).
- +busy, 2 threads: ACTIVE 20,059 ms/step, PASSIVE 243, libgomp's default 592.
- dynamo: AdamW's first step 23.7 s with torch's public calls (they import torch._dynamo), 0.36 s
  without (31.7 against 0.50 s +busy) (kept: it is most of a resumed trainer's start here).
- removed: deferring torch's tracing-only modules (tinyllm/torch_defer.py) paid 1.3-1.7 s CPU per
  start (restart 3.3 against 4.6 s CPU; 3.9 against 5.6 s +busy), and loading torch's libraries
  while the spec was read (tinyllm/torch_preload.py) cost CPU (3.3 against 3.1 s; 3.9 and 3.9 s
  +busy) for a wall gain lost in the noise (32.9 against 33.6 s +busy); both were import-system and loader tricks checked against one torch
  version (2.13.0) and off on any other, so they went (git history has them and bench/startup.py's
  first version measured them).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time

THREADS_ENV = "TINYLLM_THREADS"  # N pins the training thread count; unset or auto: chosen by load
CBWR_ENV, CBWR = "MKL_CBWR", "AUTO,STRICT"
_MKL_STRICT = 0x10000  # MKL_CBWR_STRICT, in what mkl_cbwr_get(MKL_CBWR_ALL) returns
_STATE: dict = {}
_WARNED = [False]
PRELOADED: dict = {}  # a warm trainer server's choice (tinyllm/warm.py): made when it loaded torch


def busy_tasks(samples: int = 5, gap_s: float = 0.002) -> float | None:
    """Runnable tasks other than this process (``procs_running`` in /proc/stat): the median of a few
    readings, since processes started together are each other's competitors while one blocks."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/stat", "rb") as f:
                n = next(int(x.split()[1]) for x in f if x.startswith(b"procs_running "))
        except (OSError, ValueError, StopIteration):
            return None
        seen.append(max(0, n - 1))
        if i + 1 < samples:
            time.sleep(gap_s)
    return float(sorted(seen)[len(seen) // 2])


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose(busy: float | None, cpus: int, most: int, pinned: int | None) -> dict:
    """The thread count and wait policy for ``busy`` other runnable tasks on ``cpus`` CPUs."""
    if pinned is not None:
        threads, why = pinned, f"{THREADS_ENV}={pinned}"
    elif busy is None:
        threads, why = most, "machine load unknown: the spec's threads"
    else:
        free = int(cpus - busy)
        threads = max(1, min(most, free))
        why = f"{busy:g} other runnable tasks on {cpus} CPUs leave {max(free, 0)} free; at most {most}"
    fits = busy is not None and busy + threads <= cpus
    return {
        "threads": threads,
        "threads_max": most,
        "threads_reason": why,
        "cpus": cpus,
        "wait_policy": "ACTIVE" if fits else "PASSIVE",
        "reason": "machine load unknown"
        if busy is None
        else f"{busy:g} other runnable tasks + {threads} threads {'fit on' if fits else 'exceed'} {cpus} CPUs",
    }


def pinned_threads(env=os.environ) -> int | None:
    raw = env.get(THREADS_ENV, "auto").strip()
    if raw.lower() in ("", "auto"):
        return None
    if not raw.isdigit() or int(raw) < 1:
        print(f"tinyllm: warning: {THREADS_ENV}={raw!r} is not a positive integer or auto; using auto", file=sys.stderr)
        return None
    return int(raw)


def prepare(
    threads: int | None = None,
    adapt: bool = True,
    keep_heap: bool = True,
    env=os.environ,
    busy=busy_tasks,
    modules=sys.modules,
) -> dict:
    """Before torch loads: MKL_CBWR, the thread count (at most ``threads`` by load, unless pinned;
    ``adapt`` False or ``threads`` None: that count, or torch's default) with the OpenMP wait policy
    for it, and the heap. Returns what it chose."""
    env.setdefault(CBWR_ENV, CBWR)
    most = threads or max(1, int(env.get("OMP_NUM_THREADS", "0") or 0)) or cpu_count()
    adapt = adapt and threads is not None
    got = choose(busy(), cpu_count(), most, pinned_threads(env) if adapt else most)
    if not adapt:
        got = {k: v for k, v in got.items() if not k.startswith("threads")}
    user = {k: env[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if env.get(k)}
    if "torch" in modules and PRELOADED.get("wait_policy"):  # forked by a warm server: its choice holds
        got.update(
            wait_policy=PRELOADED["wait_policy"],
            reason=f"chosen when the warm trainer server loaded torch: {PRELOADED.get('reason')}",
        )
        if PRELOADED.get("spin_count"):
            env["GOMP_SPINCOUNT"] = PRELOADED["spin_count"]
        env["OMP_WAIT_POLICY"] = PRELOADED["wait_policy"]  # what its own children inherit, as a cold start's
    elif "torch" in modules:
        got.update(
            wait_policy=env.get("OMP_WAIT_POLICY") or "(libgomp's default)",
            reason="torch was loaded before the run started",
        )
    elif user:
        got.update(
            wait_policy=user.get("OMP_WAIT_POLICY") or "(libgomp's default)",
            reason=" and ".join(f"{k}={v}" for k, v in user.items()) + " set in the environment",
        )
    else:
        env["OMP_WAIT_POLICY"] = got["wait_policy"]
        if got["wait_policy"] == "ACTIVE":  # plain ACTIVE spins ~5 minutes after each region; this ~3 ms
            env["GOMP_SPINCOUNT"] = "300000"
    if env.get("GOMP_SPINCOUNT"):
        got["spin_count"] = env["GOMP_SPINCOUNT"]
    got["mkl_cbwr"] = env.get(CBWR_ENV, "")
    _STATE.clear()
    _STATE.update(omp=got, heap=keep_freed_memory() if keep_heap else {"enabled": False, "reason": "not asked"})
    return status()


def train_threads(most: int) -> int:
    """The count ``prepare(most)`` chose, else ``most`` (an in-process caller that did not prepare)."""
    omp = _STATE.get("omp", {})
    return int(omp["threads"]) if omp.get("threads_max") == most else most


def mkl_mode() -> str:
    """``strict``, ``not strict`` (MKL runs, its mode fixed without STRICT) or ``unknown`` (no MKL
    found). Asking makes MKL read MKL_CBWR if it has not run yet."""
    torch = sys.modules.get("torch")
    lib = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or "."), "lib", "libtorch_cpu.so")
    try:
        get = ctypes.CDLL(lib).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return "unknown"
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    return "strict" if get(-1) & _MKL_STRICT else "not strict"


def start_run(log=None) -> str:
    """When a run starts (torch imported, before its first step): MKL_CBWR applied, then checked;
    one warning line, once per process, where MKL already runs without STRICT. Returns the mode."""
    os.environ.setdefault(CBWR_ENV, CBWR)
    mode = mkl_mode()
    _STATE.setdefault("omp", {})["mkl_mode"] = mode
    if mode == "not strict" and not _WARNED[0]:
        _WARNED[0] = True
        value = os.environ.get(CBWR_ENV, "")
        why = "MKL ran before the run started" if "STRICT" in value.upper() else f"MKL_CBWR={value!r}"
        print(
            f"tinyllm: warning: MKL runs without strict CNR mode ({why}): results may change with the thread "
            f"count; start the run before any tensor math, or set MKL_CBWR={CBWR} in the environment",
            file=log or sys.stderr,
            flush=True,
        )
    return mode


def keep_freed_memory() -> dict:
    """glibc: serve blocks up to 32 MiB from the heap and keep up to 1 GiB freed (no fresh pages per step)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, version = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return {"enabled": False, "reason": "not glibc"}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    version.restype = ctypes.c_char_p
    ok = mallopt(-3, 32 << 20) == 1  # M_MMAP_THRESHOLD
    ok = mallopt(-1, 1 << 30) == 1 and ok  # M_TRIM_THRESHOLD
    return {"enabled": ok, "reason": f"glibc {version().decode()} mallopt" + ("" if ok else " refused")}


def status() -> dict:
    """For the progress file's 'ready' line: ``{"omp": ..., "heap": ...}``."""
    return {k: dict(v) for k, v in _STATE.items()}


# -- torch._dynamo never imported -----------------------------------------------------------------
# Two public paths import ``torch._dynamo`` (with ``torch._inductor``: as long as ``import torch``
# itself, about half of a resumed trainer's start) though tinyllm never compiles:
# ``torch.use_deterministic_algorithms`` imports ``torch._inductor.config`` to set inductor's copy of
# the flag, which only ``torch.compile`` reads; ``Optimizer.__init__`` / ``zero_grad`` / ``state_dict``
# / ``load_state_dict`` are wrapped in ``torch._disable_dynamo``, which imports dynamo on the first call;
# and ``Optimizer.step`` is wrapped in ``_use_grad_for_differentiable``, which imports dynamo on every
# call for a ``graph_break()`` (a no-op outside tracing) around the step run under ``no_grad``. Below,
# the flag is set in ATen directly; each wrapped optimizer method calls its function directly while
# ``torch._dynamo`` is not loaded (nothing can be tracing then) and switches to torch's own wrapper
# once it is (a user's own ``torch.compile`` in the same process); ``optimizer_step`` runs the step
# function itself under ``no_grad`` while dynamo is not loaded and no step hooks are registered. The
# arithmetic is the same code either way (tests/tinyllm/test_no_dynamo.py). These functions run after
# the caller loaded torch; this module never loads it (``prepare()`` must run before torch loads).


def _torch():
    torch = sys.modules.get("torch")
    assert torch is not None, "runtime_env: the caller imports torch first"
    return torch


def use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True)`` for eager code, without importing inductor."""
    torch = _torch()
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)
    assert torch.are_deterministic_algorithms_enabled()


_DISABLE_ATTR = "__dynamo_disable"  # where torch._compile._disable_dynamo caches its wrapper


def _wrapper_code():
    torch = _torch()
    make = getattr(getattr(torch, "_compile", None), "_disable_dynamo", None)
    return None if make is None else make(lambda: None).__code__


def defer_dynamo_in_optimizers() -> int:
    """Let ``torch.optim.Optimizer``'s dynamo-disabled methods run without importing dynamo until
    dynamo is loaded; returns how many methods it set up (0: torch's wrappers left as they are)."""
    torch = _torch()
    code = _wrapper_code()
    done = 0
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        method = getattr(torch.optim.Optimizer, name, None)
        fn = getattr(method, "__wrapped__", None)
        if code is None or fn is None or getattr(method, "__code__", None) is not code:
            continue  # not torch's _disable_dynamo wrapper in this version of torch
        if getattr(fn, _DISABLE_ATTR, None) is None:
            setattr(fn, _DISABLE_ATTR, _until_dynamo_loads(fn))
        done += 1
    return done


def _until_dynamo_loads(fn):
    def call(*args, **kwargs):
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:  # dynamo may be tracing from now on: torch's own wrapper
            real = dynamo.disable(fn, recursive=True, wrapping=False)
            setattr(fn, _DISABLE_ATTR, real)
            return real(*args, **kwargs)
        return fn(*args, **kwargs)

    call.tinyllm_deferred = True  # type: ignore[attr-defined]  # a mark on the function object
    return call


def _step_chain_code():
    o = sys.modules["torch.optim.optimizer"]

    hook = getattr(o.Optimizer, "profile_hook_step", None)
    grad = getattr(o, "_use_grad_for_differentiable", None)
    if hook is None or grad is None:
        return None
    return hook(lambda self: None).__code__, grad(lambda self: None).__code__


def _raw_step(cls):
    """The step function under torch's two wrappers (hooks/profiling, then no_grad + graph break);
    None where the wrappers are not exactly those."""
    codes = _step_chain_code()
    outer = getattr(cls, "step", None)
    inner = getattr(outer, "__wrapped__", None)
    raw = getattr(inner, "__wrapped__", None)
    if codes is None or outer is None or inner is None or raw is None or (outer.__code__, inner.__code__) != codes:
        return None
    return raw


def optimizer_step(optimizer) -> None:
    """``optimizer.step()`` of a ``torch.optim.Optimizer``: the same step, without importing dynamo
    while it is not loaded."""
    o = sys.modules["torch.optim.optimizer"]
    torch = _torch()

    raw = None if "torch._dynamo" in sys.modules else _raw_step(type(optimizer))
    hooks = (
        o._global_optimizer_pre_hooks
        or o._global_optimizer_post_hooks
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
    )
    if raw is None or hooks or optimizer.defaults.get("differentiable", False):
        optimizer.step()
        return
    with torch.no_grad():  # what the wrapper does for differentiable=False
        raw(optimizer)
    optimizer._optimizer_step_code()  # the profiler's marker, as the hooks wrapper calls it
