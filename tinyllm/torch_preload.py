"""Load torch's native libraries while the spec is being validated: two CPUs do a trainer's start.

The first ~0.3 s of CPU in ``import torch`` is the dynamic loader's: mapping libtorch_cpu.so (430 MB),
relocating it and running its static initializers (the operator registrations). That is C and needs
no GIL, while what ``tinyllm train`` does before torch (pydantic, the spec models, validating the
spec: ~0.25 s) is Python. So ``tinyllm train`` (only it, from ``tinyllm/cli.py``) does both at once:

- the main thread loads torch's libraries exactly as ``import torch`` then would: libtorch_global_deps.so
  with ``RTLD_GLOBAL`` (torch's ``_load_global_deps``), then ``torch/_C*.so`` (the file the import system
  finds, with its flags ``sys.getdlopenflags()``), through libc's ``dlopen`` (a ctypes foreign call,
  which releases the GIL; ``ctypes.CDLL`` itself holds it). ``import torch`` later opens the same
  files: the same objects, loaded with the same flags in the same order and the same symbol scope
  (an ``LD_DEBUG=bindings`` dump binds every symbol to the same library either way), their
  initializers run in the same (main) thread; only earlier. (Loading libtorch_cpu.so alone would not
  be the same: its vague-linkage symbols would bind to its own copies instead of libtorch_python's.)
- a helper thread meanwhile runs the given function (reading the spec); its result, or its
  exception, comes back to the main thread (``Outcome.result()``). Then, while the load goes on, it
  imports the pure-Python standard modules torch will import (``AHEAD``: asyncio, unittest.mock, ...).

The loader holds its lock through the whole load, and ``dlsym`` and every C extension module's import
take it: a helper that imported one would wait the whole load. So before the load, this imports the C
extension modules the spec's path imports (``EXTENSIONS``; tests/tinyllm/test_torch_preload.py checks
the list against the real path) and lets pydantic_core make its one lazy ``dlsym`` (Rust's
``getrandom``, at its first validator). A module missing from the list costs time, never correctness.

Nothing is computed differently: the final loss and digest of specs/tiny.json are bitwise the same on
and off (tests). The OpenMP wait policy must be in the environment before the load (libgomp reads it
when it loads), so the CLI chooses it first, with the thread count read from the spec's JSON
(``plan()``: the spec's own validation follows; a spec that fails it fails as ever, one line, exit 2).

Used only where it was checked: CPython on Linux, torch ``TORCH_VERSION`` built for CPU (read from
torch/version.py before any import), ``TORCH_USE_RTLD_GLOBAL`` unset (torch then loads differently),
torch not imported yet, not a distributed spec (its ranks share the CPUs: nothing to overlap).
And only where a CPU is free for the second thread (the kernel's runnable tasks, sampled as
tinyllm/omp.py does, leave room for 2): on a machine whose other CPU is busy the two threads only
take turns, and measured at load ~2 that was 0.1-0.2 s slower, not faster (bench/restart.py).
``TINYLLM_TORCH_PRELOAD=0`` turns it off, ``=1`` uses it whatever the load (``auto``, the default:
as above). The 'ready' progress line says what was done and why (``"torch_preload"``: enabled,
reason, the load's and the helper's seconds).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import re
import sys
import threading
import time
from typing import Any, Callable

ENV = "TINYLLM_TORCH_PRELOAD"  # "0": torch's libraries load at `import torch`, as usual; "1": always; "auto"
TORCH_VERSION = "2.13.0"  # what the loading order below was checked against (pinned in constraints.txt)
# C extension modules `tinyllm train` imports before torch (through pydantic, importlib.metadata, the
# spec models, tinyllm.ddp_launch/progress), imported before the load so the helper never waits for it
EXTENSIONS = ("math", "_opcode", "_typing", "_uuid", "_datetime", "_json", "_heapq", "_socket", "_decimal",
              "_contextvars", "_struct", "_zoneinfo", "binascii", "_hashlib", "_blake2", "_bisect", "_random",
              "_sha512", "_csv", "zlib", "_bz2", "_lzma", "select", "array", "fcntl", "_posixsubprocess", "_ctypes",
              "pydantic_core._pydantic_core",
              # ... and those of AHEAD
              "_asyncio", "_multiprocessing", "_pickle", "_posixshmem", "_queue", "_ssl", "cmath", "grp", "mmap")
# pure-Python standard modules `import torch` (TORCH_VERSION) imports: the helper imports them after the
# spec while the load still runs (then torch finds them imported), instead of the main thread later
AHEAD = ("asyncio", "unittest.mock", "urllib.request", "http.client", "ssl", "concurrent.futures", "logging",
         "pickle", "pickletools", "pkgutil", "pprint", "queue", "runpy", "tarfile", "timeit", "traceback", "argparse",
         "glob", "gzip", "email.parser", "multiprocessing.connection", "multiprocessing.reduction",
         "multiprocessing.resource_sharer", "multiprocessing.resource_tracker", "multiprocessing.spawn")

_status: dict[str, Any] = {"enabled": False, "reason": "not used"}
_paths: dict[str, str] = {}


class Outcome:
    """What the helper's function returned or raised."""

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _set(enabled: bool, reason: str) -> None:
    _status.clear()
    _status.update(enabled=enabled, reason=reason)


def status() -> dict:
    """``{"enabled", "reason"}``, and once loaded ``load_s`` (the main thread's load), ``work_s`` and
    ``work_cpu_s`` (the helper's function: wall and CPU seconds), ``helper_s`` (its function and AHEAD),
    ``same_file`` (torch._C is the file loaded)."""
    return dict(_status)


def _torch_files() -> tuple[dict[str, str] | None, str]:
    """(paths of libtorch_global_deps.so and torch._C's file, "") where torch is the checked CPU build,
    else (None, why not); nothing is imported."""
    from .torch_defer import torch_version_file, version_in

    found = torch_version_file()
    if found is None:
        return None, "torch not found, or its version.py unreadable"
    root, text = found
    version = version_in(text)
    if version != TORCH_VERSION:
        return None, f"torch {version or '?'} (checked against {TORCH_VERSION})"
    for accelerator in ("cuda", "hip", "xpu"):  # a GPU build loads its own libraries first (torch/__init__.py)
        if not re.search(rf"^{accelerator}\s*(:[^=]*)?=\s*None\s*$", text, re.M):
            return None, f"torch built for {accelerator}"
    c_spec = importlib.machinery.PathFinder.find_spec("torch._C", [root])  # what `import torch._C` finds
    if c_spec is None or type(c_spec.loader) is not importlib.machinery.ExtensionFileLoader:
        return None, "torch._C is not an extension module here"
    deps = os.path.join(root, "lib", "libtorch_global_deps.so")
    if not os.path.isfile(deps):
        return None, "no libtorch_global_deps.so"
    return {"global_deps": deps, "torch._C": c_spec.origin}, ""


def plan(spec_path: str, env=os.environ, modules=sys.modules, busy: Callable[[], float | None] | None = None,
         cpus: int | None = None) -> int | None:
    """The train spec's ``threads`` (read from its JSON, for the OpenMP policy) where the preload applies,
    else None (``status()`` says why). Never raises: the spec's own validation reports a bad spec."""
    mode = env.get(ENV, "auto").strip()
    if mode == "0":
        return _set(False, f"{ENV}=0")
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        return _set(False, f"{sys.implementation.name} on {sys.platform} (checked on CPython, Linux)")
    if env.get("TORCH_USE_RTLD_GLOBAL"):
        return _set(False, "TORCH_USE_RTLD_GLOBAL is set (torch loads its libraries globally then)")
    if "torch" in modules or "torch._C" in modules:
        return _set(False, "torch was already imported")
    try:
        with open(spec_path, "rb") as f:
            raw = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return _set(False, "spec unreadable (reported by its validation)")
    if not isinstance(raw, dict):
        return _set(False, "spec is not a JSON object (reported by its validation)")
    if raw.get("distributed") is not None:
        return _set(False, "distributed spec (its ranks share the CPUs)")
    from .spec_plain import TRAIN_THREADS_DEFAULT

    threads = raw.get("threads", TRAIN_THREADS_DEFAULT)
    if type(threads) is not int or not 1 <= threads <= 1024:
        return _set(False, "spec's threads invalid (reported by its validation)")
    files, why = _torch_files()
    if files is None:
        return _set(False, why)
    if mode != "1":  # auto: two threads at once pay only where a CPU is free for the second one
        from . import omp

        others, cpus = (busy or omp.busy_tasks)(), cpus or omp.cpu_count()
        if others is None or others + 2 > cpus:
            return _set(False, f"{'unknown' if others is None else f'{others:g}'} other runnable tasks + 2 threads "
                               f"exceed {cpus} CPUs (nothing to overlap; {ENV}=1 forces it)")
    _paths.clear()
    _paths.update(files)
    _set(True, f"torch {TORCH_VERSION} (cpu)")
    return threads


def _prepare() -> None:
    """What would take the loader's lock in the helper: C extension modules, pydantic_core's dlsym."""
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:  # its first validator's hash map seeds itself through a symbol it looks up (dlsym) once
        from pydantic_core import SchemaValidator, core_schema

        SchemaValidator(core_schema.any_schema())
    except Exception:  # noqa: BLE001 - only a warm-up: the helper then waits, nothing else changes
        pass


def while_loading(work: Callable[[], Any]) -> Outcome:
    """Run ``work`` in a helper thread while this thread loads torch's native libraries (after ``plan()``
    returned a thread count and the OpenMP policy is set); else just run it. Its outcome either way."""
    if not _status.get("enabled"):
        try:
            return Outcome(work())
        except Exception as e:  # noqa: BLE001 - handed to the caller as the helper's would be
            return Outcome(error=e)
    import ctypes

    _prepare()
    libc = ctypes.CDLL(None)
    dlopen, dlerror = libc.dlopen, libc.dlerror  # looked up now: dlsym waits for the loader's lock
    dlopen.argtypes, dlopen.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p
    dlerror.argtypes, dlerror.restype = [], ctypes.c_char_p
    loads = [(_paths["global_deps"], os.RTLD_NOW | os.RTLD_GLOBAL),  # ctypes.CDLL(.., RTLD_GLOBAL) in torch
             (_paths["torch._C"], sys.getdlopenflags())]  # the import system's flags for extension modules
    box: dict[str, Any] = {}

    def helper() -> None:
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            box["outcome"] = Outcome(work())
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            box["outcome"] = Outcome(error=e)
        box["work_s"], box["work_cpu_s"] = time.perf_counter() - t, time.thread_time() - cpu
        if box["outcome"].error is None:  # a bad spec ends the process: torch is not imported then
            for name in AHEAD:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
        box["helper_s"] = time.perf_counter() - t

    thread = threading.Thread(target=helper, name="tinyllm-spec", daemon=True)
    t = time.perf_counter()
    thread.start()
    try:
        for path, mode in loads:
            if not dlopen(os.fsencode(path), mode):  # `import torch` then fails (or not) on its own
                error = dlerror()
                _set(False, f"dlopen failed: {error.decode(errors='replace') if error else path}")
                break
        _status["load_s"] = round(time.perf_counter() - t, 4)
    finally:
        thread.join()
    _status.update(work_s=round(box["work_s"], 4), work_cpu_s=round(box["work_cpu_s"], 4),
                   helper_s=round(box["helper_s"], 4))
    return box["outcome"]


def after_import() -> None:
    """After ``import torch``: say whether torch._C is the file loaded (it is the one the import finds)."""
    if _status.get("enabled") and "torch._C" in sys.modules:
        try:
            _status["same_file"] = os.path.samefile(sys.modules["torch._C"].__file__, _paths["torch._C"])
        except (OSError, TypeError):
            _status["same_file"] = False
