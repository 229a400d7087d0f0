"""Asynchronous checkpoints: an exact in-memory snapshot at the step, persisted by a background thread.

The training thread stalls only for the snapshot (``snapshot``: every tensor copied in memory, on the
CPU, storage sharing kept, so ``torch.save`` of the copy is byte for byte ``torch.save`` of the live
state), then goes on training while ``CheckpointWriter`` runs the unchanged write protocol of
tinyllm/checkpoint.py (files, fsync, manifest, rename, then ``LATEST``) on its own thread. CheckFreq
(FAST '21) and torchtitan's ``async_save`` do the same: snapshot, then persist in the background.

Rules the writer keeps:

- **at most one checkpoint in flight**: the next one first waits for the one before (memory stays
  bounded at one snapshot; a persist slower than ``checkpoint_every`` steps stalls the loop, never
  piles up), which is announced before the next persist starts (pruning never runs beside a write);
- **durable means announced**: a finished persist is handed back to the training thread (``poll`` at
  each step boundary, ``wait``), which only then writes the checkpoint's progress line, moves the
  result's checkpoint and prunes; nothing names a checkpoint before it is durable;
- **errors surface where they did**: an exception of the persist (``DiskFull``, any ``OSError``) is
  re-raised on the training thread by the next ``poll``/``submit``/``wait``, as the same object, so the
  CLI's one line and exit code (74 for a full disk) are what they were with synchronous writes;
- a kill during the persist is a kill during a synchronous write: ``LATEST`` still names the previous
  checkpoint (every fault point of the protocol runs on the writer thread; a SIGKILL takes the process).

``asynchronous=False`` runs each persist inline (``submit`` returns when it is durable): the switch
``TINYLLM_ASYNC_CHECKPOINTS=0`` (docs/checkpoints.md), and what distributed ranks use.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ASYNC_ENV = "TINYLLM_ASYNC_CHECKPOINTS"


def async_enabled(environ: Any = None) -> bool:
    """``$TINYLLM_ASYNC_CHECKPOINTS``: unset, ``1``, ``true``, ``on``: asynchronous (the default);
    ``0``, ``false``, ``off``: synchronous. Anything else is a ``ValueError`` (one line)."""
    value = (os.environ if environ is None else environ).get(ASYNC_ENV, "").strip().lower()
    if value in ("", "1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{ASYNC_ENV}={value!r}: expected 1 (asynchronous checkpoints, the default) or 0 (synchronous)")


def snapshot(obj: Any) -> Any:
    """A deep copy of ``obj`` (a checkpoint's components) that training can no longer change, made so
    that ``torch.save`` of it writes the very bytes ``torch.save`` of ``obj`` would: ``copy.deepcopy``,
    which copies each CPU tensor's storage once (tensors sharing a storage, like tied weights, share
    one copy; offsets, strides, dtypes kept), keeps objects referenced twice referenced twice (pickle
    writes them once) and keeps ``state_dict``'s ``_metadata``. Tensors on another device (a CUDA
    model in the helper) are copied to the CPU (their checkpoint then records the CPU as their device;
    loading maps them to the CPU anyway)."""
    memo: dict[int, Any] = {}
    kept: list[Any] = []
    for t in _tensors(obj, set()):
        if t.device.type != "cpu" and id(t) not in memo:
            memo[id(t)] = t.detach().to("cpu", copy=True)
            kept.append(t)
    memo[id(memo)] = kept  # deepcopy's keep-alive list: the ids above stay valid
    return copy.deepcopy(obj, memo)


def _tensors(obj: Any, seen: set[int]) -> list[torch.Tensor]:
    """The tensors inside nested mappings, lists and tuples (to find those not on the CPU)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple)):
        return []
    seen.add(id(obj))
    values = obj.values() if isinstance(obj, dict) else obj
    return [t for v in values for t in _tensors(v, seen)]


@dataclass(frozen=True)
class Done:
    """A persisted checkpoint: the ``tag`` it was submitted with and what the persist returned."""

    tag: Any
    result: Any


class CheckpointWriter:
    """Persists one checkpoint at a time, on a background thread (or inline; see the module docstring).

    Only the training thread calls it: ``wait`` (the one in flight, if any, then announce it), then
    ``submit``; ``poll`` returns a finished one without waiting. Each ``Done`` is handed out exactly once."""

    def __init__(self, asynchronous: bool = True, name: str = "tinyllm-checkpoint-writer"):
        self.asynchronous = asynchronous
        self.name = name
        self._thread: threading.Thread | None = None
        self._tag: Any = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._ready: Done | None = None  # an inline persist's result, not yet handed out

    @property
    def in_flight(self) -> bool:
        """A persist is running (or finished and not yet handed out)."""
        return self._thread is not None or self._ready is not None

    def submit(self, persist: Callable[[], Any], tag: Any) -> None:
        """Persist with ``persist()`` (it must only read its snapshot). The checkpoint before must have
        been collected (``wait``) and announced first: announcing prunes and writes lines, which must
        never run beside a persist, so a second submit while one is in flight is a ``RuntimeError``."""
        if self.in_flight:
            raise RuntimeError("a checkpoint is still in flight: wait() for it and announce it first")
        if not self.asynchronous:
            self._ready = Done(tag, persist())  # an error propagates here, at once
            return
        self._tag, self._result, self._error = tag, None, None

        def body() -> None:
            try:
                self._result = persist()
            except BaseException as e:  # noqa: BLE001 -- any error, handed to the training thread by poll/wait
                self._error = e

        self._thread = threading.Thread(target=body, name=self.name, daemon=True)
        self._thread.start()

    def poll(self) -> Done | None:
        """The finished checkpoint, if one finished since (no waiting); its error re-raised here."""
        if self._ready is not None:
            done, self._ready = self._ready, None
            return done
        if self._thread is None or self._thread.is_alive():
            return None
        return self._collect()

    def wait(self) -> Done | None:
        """Wait for the checkpoint in flight; its ``Done`` (None: none in flight), or its error raised."""
        if self._ready is not None or self._thread is None:
            return self.poll()
        self._thread.join()  # signal handlers still run meanwhile (they only set a flag)
        return self._collect()

    def close(self) -> BaseException | None:
        """Wait for the checkpoint in flight, whatever happens (before the run lock is released);
        returns its error instead of raising it (the caller is already failing, or has announced all)."""
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 -- returned, not raised (see the docstring)
            return e
        return None

    def _collect(self) -> Done:
        thread, self._thread = self._thread, None
        assert thread is not None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return Done(self._tag, self._result)
