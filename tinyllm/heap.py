"""Keep freed memory in the process's heap while training (glibc), so a step faults in no fresh pages.

A training step frees and allocates the same activations and gradients every step (hundreds of
tensors of 0.1-1 MB for the nanoGPT recipe). glibc serves a block above its mmap threshold (128 KiB
at first, raised as such blocks are freed) with a fresh ``mmap`` and gives it back on ``free``, and
returns the heap's free top to the kernel above its trim threshold; either way a later step touches
new pages, and each first touch is a page fault. Measured on the nanoGPT recipe at 1 thread (4 layers,
batch 12): bursts of 2,000-3,900 minor faults on about half of the steps (17,800-18,800 over 16 steps),
185-297 over the same 16 steps with the settings below (tests/tinyllm/test_heap.py); in one loop of
30 steps, ~1,000-1,300 faults and 2.4-3.2 ms of system time per step, 0-2 faults and ~0 with them. bench/train.py prints faults/step beside CPU time
per step (``--only cpu1`` runs tinyllm both ways). nanoGPT's ``train.py`` pays the same faults.

``keep_freed_memory()`` sets ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's largest on 64-bit: blocks up
to that come from the heap) and ``M_TRIM_THRESHOLD`` to 1 GiB (freed memory stays for the next
step). It changes where memory comes from, never what is computed: the bits are the same (the
final loss of specs/tiny.json is unchanged). The cost: the process keeps its peak heap until it
exits (a training process holds that peak every step anyway). Not glibc (musl, macOS): nothing is
done. ``TINYLLM_KEEP_HEAP=0`` turns it off (bench/train.py measures both ways).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "TINYLLM_KEEP_HEAP"
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30

_STATUS: dict = {"enabled": False, "reason": "not configured"}


def keep_freed_memory(env=os.environ) -> dict:
    """Apply the settings (once per process is enough; again is harmless); return what was done."""
    global _STATUS
    if env.get(ENV, "1").strip() == "0":
        _STATUS = {"enabled": False, "reason": f"{ENV}=0"}
        return dict(_STATUS)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, version = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):
        _STATUS = {"enabled": False, "reason": "not glibc"}
        return dict(_STATUS)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    version.restype = ctypes.c_char_p
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    _STATUS = {"enabled": ok, "reason": f"glibc {version().decode()} mallopt" + ("" if ok else " refused"),
               "mmap_threshold": MMAP_THRESHOLD_BYTES, "trim_threshold": TRIM_THRESHOLD_BYTES}
    return dict(_STATUS)


def status() -> dict:
    """What ``keep_freed_memory`` did in this process (for the progress 'ready' line)."""
    return dict(_STATUS)
