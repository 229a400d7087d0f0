"""Defer torch submodules that eager CPU training never runs, until something touches them.

``import torch`` executes, among much else, modules that only tracing needs (``torch.compile``,
``torch.export``, fake and meta tensors), about a third of its CPU time:

- ``torch._meta_registrations`` (with ``torch._decomp``, ``torch._refs``, ``torch._prims``): python
  kernels for the ``Meta`` dispatch key, decomposition and reference tables, fake-tensor impls,
  python-dispatcher kernels (``py_impl``), the ``prims`` op library;
- ``torch.distributed._meta_registrations``: ``Meta`` kernels of the functional collectives;
- ``torch.export`` (with ``torch._export``): the export API, its ``export::`` ops and tracepoints;
- and python-only APIs tinyllm never calls, whose import registers nothing outside themselves
  (checked: no dispatcher, pytree, safe-globals or torch-wide registration; ``torch.utils.data``
  registers its DataLoader-workers atexit flag when it runs): ``torch.utils.data``,
  ``torch.distributions``, ``torch.masked``, ``torch.quasirandom``, ``torch.nn.intrinsic``,
  ``torch.nn.qat``. (Not ``torch.nested``: it adds safe globals for ``torch.load``; not
  ``torch.profiler``: it registers a global optimizer hook.)

None of that is on an eager CPU tensor's dispatch path (CPU and autograd kernels are native), so
training, ``torch.load``/``torch.save``, AdamW, ``clip_grad_norm_``, SDPA and gloo DDP compute the
same bits without them (the final loss and digest of specs/tiny.json are unchanged; tests).

How: before ``import torch``, ``install()`` puts a finder first on ``sys.meta_path``. For the modules
above it returns the real spec with a loader that makes the module object, binds it on its parent as
usual (``torch.export`` is there), but does not run its code; once bound, the object is taken out of
``sys.modules``. Its first touch (any attribute but the import system's metadata: ``__name__``,
``__file__``, ``__spec__``, ``__path__``...), or any later ``import`` of it or of a submodule (which
now reaches the finder), runs its code through the import system into that same object. Then, so
that a side effect that nothing touches by name (a meta kernel, a fake impl) is never missing:

- the first touch of any deferred module runs all of them (``complete()``, in torch's order);
- so does the first import of a module that traces or needs those tables (``CONSUMERS``:
  ``torch._dynamo`` (``torch.compile``), ``torch._inductor``, ``torch._export``, ``torch.onnx``,
  ``torch._decomp``, ``torch._refs``, ``torch._prims``, aot_autograd), before it runs: torch's own
  order (its import ran them before anything could import those);
- and so does constructing a ``FakeTensorMode`` (``after_import()``).

One side effect of the deferred set is needed by eager code and is done by ``after_import()``
itself: ``torch._prims.rng_prims`` sets ``torch.Generator``'s metaclass (``torch.Generator()``
raises without it; post-training samples with generators); it is set the same way up front.

What stays out: ops on ``device="meta"`` tensors that only have a python meta kernel raise
``NotImplementedError`` until ``complete()`` ran (no wrong numbers: they fail). tinyllm never makes
meta tensors; this is why the deferral is applied only by ``tinyllm train`` to its own trainer, never
to a user's code (examples/, tinyllm.durable users): ``tinyllm train`` runs no user code.

It is applied only where what it relies on holds: torch ``TORCH_VERSION`` (read from
``torch/version.py`` before the import; the lists above were checked against its code), CPython
(its import system's order of lookups), modules loaded from source files. Else, or with
``TINYLLM_TORCH_DEFER=0`` in the environment, torch is imported as it is.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import types

ENV = "TINYLLM_TORCH_DEFER"  # "0": import torch as it is
TORCH_VERSION = "2.13.0"  # what the lists below were checked against (pinned in constraints.txt)
DEFERRED = ("torch.utils.data", "torch.distributions", "torch.nn.intrinsic", "torch.nn.qat", "torch.quasirandom",
            "torch.masked", "torch.export", "torch.distributed._meta_registrations",
            "torch._meta_registrations")  # in torch's import order
CONSUMERS = ("torch._dynamo", "torch._inductor", "torch._export", "torch.onnx", "torch._decomp", "torch._refs",
             "torch._prims", "torch._functorch.aot_autograd", "torch._functorch.partitioners")
# read without running the module: what the import system set before the module's code runs
# (``__path__`` too: a deferred package is out of sys.modules, so importing a submodule imports it first)
_METADATA = frozenset({"__name__", "__file__", "__cached__", "__loader__", "__package__", "__spec__", "__path__",
                       "__class__", "__dict__"})

_lock = threading.RLock()  # one completion at a time (tinyllm train imports from its main thread only)
_modules: dict[str, types.ModuleType] = {}  # deferred module name -> its module object (bound on its parent)
_state: dict[str, str] = {}  # module name -> "deferred" | "executed"
_status = {"enabled": False, "reason": "not installed"}
_completing = [False]


class _DeferredModule(types.ModuleType):
    """A module whose code has not run yet; touching it runs every deferred module (``complete()``)."""

    def __getattribute__(self, attr):
        if attr not in _METADATA:
            complete()
        return object.__getattribute__(self, attr)

    def __setattr__(self, attr, value):
        complete()
        object.__setattr__(self, attr, value)

    def __delattr__(self, attr):
        complete()
        object.__delattr__(self, attr)

    def __dir__(self):
        complete()
        return object.__dir__(self)


def complete() -> None:
    """Run every module still deferred, in torch's import order, each through the import system (into
    the module object already bound on its parent): the process is then as after a plain ``import torch``."""
    with _lock:
        if _completing[0]:
            return
        _completing[0] = True
        try:
            for name in DEFERRED:
                if _state.get(name) != "deferred":
                    continue
                _unlist()
                module = _modules[name]
                if sys.modules.get(name) is module:  # not bound on its parent yet (torch still importing): here
                    _state[name] = "executed"
                    object.__setattr__(module, "__class__", types.ModuleType)
                    module.__spec__.loader.exec_module(module)
                else:
                    importlib.import_module(name)  # not in sys.modules: the finder adopts the deferred object
        finally:
            _completing[0] = False


def _unlist() -> None:
    """Take deferred modules out of ``sys.modules`` once bound on their parent: every later import of
    them (or of a submodule) then goes through the finder, which runs them like a first import."""
    for name, module in _modules.items():
        parent, _, child = name.rpartition(".")
        if (_state[name] == "deferred" and sys.modules.get(name) is module
                and getattr(sys.modules.get(parent), "__dict__", {}).get(child) is module):
            del sys.modules[name]


class _DeferringLoader(importlib.abc.Loader):
    """First import: a module object whose code does not run yet."""

    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = module.__loader__ = self.real
        _modules[spec.name], _state[spec.name] = module, "deferred"
        module.__class__ = _DeferredModule


class _AdoptingLoader(importlib.abc.Loader):
    """A later import of a deferred module: its code runs in the object already bound on its parent."""

    def __init__(self, real, module):
        self.real, self.module = real, module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = module.__loader__ = self.real
        object.__setattr__(module, "__class__", types.ModuleType)
        self.real.exec_module(module)


class _ImportedLoader(importlib.abc.Loader):
    """A module that ``complete()`` imported while the import system was finding it: the same object
    again (the bootstrap loads the spec of a module that appeared in sys.modules meanwhile)."""

    def __init__(self, real, module):
        self.real, self.module = real, module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__.loader = self.real  # nothing to run: it ran during complete()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if _modules:
            _unlist()
        if name in DEFERRED:
            if _state.get(name) == "deferred":
                _state[name] = "executed"  # from now on (once: a nested touch while it runs sees it as running)
                spec = object.__getattribute__(_modules[name], "__dict__")["__spec__"]
                spec.loader = _AdoptingLoader(spec.loader, _modules[name])
                return spec
            if name in _state or _completing[0]:
                return None
            return self._wrap(name, path, target, _DeferringLoader)
        if any(name == c or name.startswith(c + ".") for c in CONSUMERS) and any(
                s == "deferred" for s in _state.values()):
            complete()  # before it, as with a plain `import torch` (which ran them all at its import)
            module = sys.modules.get(name)
            if module is not None:  # complete() imported it: hand back that one, never a second copy
                spec = module.__spec__
                spec.loader = _ImportedLoader(spec.loader, module)
                return spec
        return None

    @staticmethod
    def _wrap(name, path, target, loader):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return None  # not a plain source module here: imported as it is
        spec.loader = loader(spec.loader)
        return spec


@functools.lru_cache(maxsize=1)
def torch_version_file() -> tuple[str, str] | None:
    """(torch's package folder, the text of its version.py), without importing torch; None if unreadable.
    Read once per process (torch_preload checks the same file)."""
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    try:
        with open(os.path.join(root, "version.py"), encoding="utf-8") as f:
            return root, f.read()
    except OSError:
        return None


def version_in(text: str) -> str | None:
    """``__version__`` in a torch/version.py text, without a local suffix (``+cpu``)."""
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"+]+)", text, re.M)
    return m.group(1) if m else None


def _torch_version() -> str | None:
    """torch's version from its version.py, without importing torch."""
    found = torch_version_file()
    return version_in(found[1]) if found else None


def install() -> dict:
    """Before ``import torch``: defer ``DEFERRED`` where it is known to hold; returns ``status()``."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return status()
    if os.environ.get(ENV, "1") == "0":
        return _set(False, f"{ENV}=0")
    if sys.implementation.name != "cpython":
        return _set(False, f"{sys.implementation.name} (checked on CPython's import system)")
    version = _torch_version()
    if version != TORCH_VERSION:
        return _set(False, f"torch {version} (checked against {TORCH_VERSION})")
    if "torch" in sys.modules:
        return _set(False, "torch was already imported")
    sys.meta_path.insert(0, _Finder())
    return _set(True, f"torch {version}")


def after_import() -> None:
    """After ``import torch``: a ``FakeTensorMode`` (tracing without the names above) completes first."""
    if not _status["enabled"]:
        return
    _unlist()
    torch = sys.modules["torch"]
    set_metaclass = getattr(torch._C, "_set_generator_metaclass", None)
    if set_metaclass is not None and "torch._prims.rng_prims" not in sys.modules:
        # torch._prims.rng_prims (deferred with the meta registrations) gives torch.Generator its
        # metaclass, without which eager code's torch.Generator() raises: set it as it does (it
        # sets the same again when it runs)
        from torch._opaque_base import OpaqueBaseMeta

        set_metaclass(OpaqueBaseMeta)
    try:
        torch.Generator()
    except RuntimeError:
        complete()  # torch differs from what this expects: everything runs now
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    mode = getattr(fake, "FakeTensorMode", None)
    if mode is None or getattr(mode.__init__, "tinyllm_completes", False):
        if mode is None:
            complete()  # torch differs from what this expects: everything runs now
        return
    init = mode.__init__

    def __init__(self, *args, **kwargs):
        complete()
        init(self, *args, **kwargs)

    __init__.tinyllm_completes = True
    __init__.__wrapped__ = init
    mode.__init__ = __init__


def _set(enabled: bool, reason: str) -> dict:
    _status.update(enabled=enabled, reason=reason)
    return status()


def status() -> dict:
    """``{"enabled", "reason", "deferred": [not run yet], "executed": [deferred, then run on touch]}``."""
    return {**_status, "deferred": sorted(n for n, s in _state.items() if s == "deferred"),
            "executed": sorted(n for n, s in _state.items() if s == "executed")}
