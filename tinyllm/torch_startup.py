"""Torch settings for a fast start: the same effect as the public calls, without their imports.

Two public paths import ``torch._dynamo`` (with ``torch._inductor``: as long as ``import torch``
itself, about half of a resumed trainer's start, bench/restart.py) though tinyllm never compiles:

- ``torch.use_deterministic_algorithms`` imports ``torch._inductor.config`` to set inductor's copy
  of the flag, which only ``torch.compile`` reads;
- ``Optimizer.__init__`` / ``zero_grad`` / ``state_dict`` / ``load_state_dict`` are wrapped in
  ``torch._disable_dynamo``, which imports dynamo on the first call to exclude them from tracing;
- ``Optimizer.step`` is wrapped in ``_use_grad_for_differentiable``, which imports dynamo on every
  call for a ``graph_break()`` (a no-op outside tracing) around the step run under ``no_grad``.

Here the flag is set in ATen directly; each wrapped optimizer method calls its function directly
while ``torch._dynamo`` is not loaded (nothing can be tracing then), and once it is loaded (a
user's own ``torch.compile`` in the same process) switches to torch's own wrapper; and
``optimizer_step`` runs the step function itself under ``no_grad`` while dynamo is not loaded and
no step hooks are registered. The arithmetic is the same code either way (the final loss of
specs/tiny.json is bitwise unchanged). Where torch's internals differ from what this expects, the
public paths are used as they are.
"""
from __future__ import annotations

import sys

import torch


def use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True)`` for eager code, without importing inductor."""
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)
    assert torch.are_deterministic_algorithms_enabled()


_DISABLE_ATTR = "__dynamo_disable"  # where torch._compile._disable_dynamo caches its wrapper


def _wrapper_code():
    make = getattr(getattr(torch, "_compile", None), "_disable_dynamo", None)
    return None if make is None else make(lambda: None).__code__


def defer_dynamo_in_optimizers() -> int:
    """Let ``torch.optim.Optimizer``'s dynamo-disabled methods run without importing dynamo until
    dynamo is loaded; returns how many methods it set up (0: torch's wrappers left as they are)."""
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
        if "torch._dynamo" in sys.modules:  # dynamo may be tracing from now on: torch's own wrapper
            import torch._dynamo

            real = torch._dynamo.disable(fn, recursive=True, wrapping=False)
            setattr(fn, _DISABLE_ATTR, real)
            return real(*args, **kwargs)
        return fn(*args, **kwargs)

    call.tinyllm_deferred = True
    return call


def _step_chain_code():
    from torch.optim import optimizer as o

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
    if codes is None or raw is None or (outer.__code__, inner.__code__) != codes:
        return None
    return raw


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``: the same step, without importing dynamo while it is not loaded."""
    from torch.optim import optimizer as o

    raw = None if "torch._dynamo" in sys.modules else _raw_step(type(optimizer))
    hooks = (o._global_optimizer_pre_hooks or o._global_optimizer_post_hooks
             or optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks)
    if raw is None or hooks or optimizer.defaults.get("differentiable", False):
        optimizer.step()
        return
    with torch.no_grad():  # what the wrapper does for differentiable=False
        raw(optimizer)
    optimizer._optimizer_step_code()  # the profiler's marker, as the hooks wrapper calls it
