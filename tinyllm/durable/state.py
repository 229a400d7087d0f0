"""State capture for ``tinyllm.durable`` (torch only; numpy when installed): RNGs and fingerprints.

RNG states: Python ``random``, NumPy's global generator, torch CPU, torch CUDA (every device, when
CUDA is initialised) and any registered generator (``torch.Generator``, ``numpy.random.Generator``,
``random.Random``). Torch states stay tensors; Python and NumPy states are stored as JSON text (NumPy
arrays as lists, big integers exact), so a checkpoint loads with ``torch.load(weights_only=True)``.

A *fingerprint* is a short digest of every piece of state the helper can see at a step boundary;
``ctl verify-resume`` compares the fingerprint right after a resume with the uninterrupted run's at
the same step, which names the piece that was not restored.
"""

from __future__ import annotations

import hashlib
import json
import random
from types import ModuleType
from typing import Any, Mapping

import torch

np: ModuleType | None
try:  # numpy is optional for the helper
    import numpy as _numpy

    np = _numpy
except ImportError:  # pragma: no cover - numpy ships with this project
    np = None


# --- JSON encoding of Python/NumPy RNG states ------------------------------------------------


def _to_json(obj: Any) -> Any:
    if np is not None and isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_json(x) for x in obj]}
    if isinstance(obj, list):
        return [_to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _to_json(v) for k, v in obj.items()}
    return obj


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            assert np is not None  # (an array's record: numpy, a dependency of this project, is there)
            return np.array(obj["__ndarray__"], dtype=obj["dtype"])
        if "__tuple__" in obj:
            return tuple(_from_json(x) for x in obj["__tuple__"])
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(x) for x in obj]
    return obj


def _dump(obj: Any) -> str:
    return json.dumps(_to_json(obj), sort_keys=True)


def _load(text: str) -> Any:
    return _from_json(json.loads(text))


# --- RNGs ------------------------------------------------------------------------------------


def _generator_kind(gen: Any) -> str:
    if isinstance(gen, torch.Generator):
        return "torch"
    if np is not None and isinstance(gen, np.random.Generator):
        return "numpy"
    if np is not None and isinstance(gen, np.random.RandomState):
        return "numpy-legacy"
    if isinstance(gen, random.Random):
        return "python"
    raise TypeError(
        f"cannot save generator of type {type(gen).__name__}: register torch.Generator, "
        "numpy.random.Generator, numpy.random.RandomState or random.Random"
    )


def check_generators(generators: Mapping[str, Any]) -> None:
    for name, gen in generators.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"generator names must be non-empty strings, got {name!r}")
        _generator_kind(gen)


def _generator_state(gen: Any, raw: bool = False) -> Any:
    kind = _generator_kind(gen)
    dump = (lambda x: x) if raw else _dump
    if kind == "torch":
        return gen.get_state()
    if kind == "numpy":
        return dump(gen.bit_generator.state)
    if kind == "numpy-legacy":
        return dump(gen.get_state())
    return dump(gen.getstate())


def _set_generator_state(gen: Any, state: Any, raw: bool = False) -> None:
    kind = _generator_kind(gen)
    load = (lambda x: x) if raw else _load
    if kind == "torch":
        gen.set_state(state)
    elif kind == "numpy":
        gen.bit_generator.state = load(state)
    elif kind == "numpy-legacy":
        gen.set_state(load(state))
    else:
        gen.setstate(load(state))


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def capture_rng(generators: Mapping[str, Any]) -> dict[str, Any]:
    """Every RNG state: {"python", "numpy", "torch", "cuda" (list, or None), "generators": {name: state}}."""
    return {
        "python": _dump(random.getstate()),
        "numpy": _dump(np.random.get_state()) if np is not None else None,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if _cuda_ready() else None,
        "generators": capture_generators(generators),
    }


def capture_rng_raw(generators: Mapping[str, Any]) -> dict[str, Any]:
    """``capture_rng``'s states as the RNGs hand them out, not as JSON text: a tenth of the time, for a
    state this process puts back itself (``restore_rng_raw``), never for a checkpoint."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state() if np is not None else None,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if _cuda_ready() else None,
        "generators": {name: _generator_state(g, raw=True) for name, g in sorted(generators.items())},
    }


def restore_rng_raw(state: Mapping[str, Any], generators: Mapping[str, Any]) -> None:
    """Put back what ``capture_rng_raw`` saw."""
    random.setstate(state["python"])
    if np is not None and state.get("numpy") is not None:
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, gen in generators.items():
        _set_generator_state(gen, state["generators"][name], raw=True)


def capture_generators(generators: Mapping[str, Any]) -> dict[str, Any]:
    """The states of registered generators alone (a framework that saves the global RNGs itself: HF)."""
    return {name: _generator_state(g) for name, g in sorted(generators.items())}


def restore_generators(saved: Mapping[str, Any], generators: Mapping[str, Any]) -> None:
    """Put back ``capture_generators``' states; a registered generator missing from ``saved`` is a KeyError."""
    missing = sorted(set(generators) - set(saved))
    if missing:
        raise KeyError(f"the checkpoint has no state for generator(s) {', '.join(missing)}")
    for name, gen in generators.items():
        _set_generator_state(gen, saved[name])


def restore_rng(state: Mapping[str, Any], generators: Mapping[str, Any]) -> None:
    """Put back what ``capture_rng`` saw; a registered generator the checkpoint lacks is an error."""
    random.setstate(_load(state["python"]))
    if np is not None and state.get("numpy") is not None:
        np.random.set_state(_load(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    restore_generators(state.get("generators", {}), generators)


# --- digests and fingerprints -------------------------------------------------------------------


def _feed(h: "hashlib._Hash", obj: Any) -> None:
    """Canonical hashing of nested state: tensors by dtype/shape/bytes, floats by their bits."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, Mapping):  # a dict, or a batch's BatchEncoding (a UserDict): by its items, not its repr
        h.update(b"{")
        for k in sorted(obj, key=lambda k: (type(k).__name__, str(k))):
            h.update(repr(k).encode() + b":")
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for x in obj:
            _feed(h, x)
        h.update(b"]")
    elif isinstance(obj, float):
        h.update(b"f" + obj.hex().encode())
    elif np is not None and isinstance(obj, np.ndarray):
        h.update(f"A{obj.dtype}{obj.shape}".encode() + obj.tobytes())
    elif isinstance(obj, _Repr):
        h.update(obj.text)
    elif isinstance(obj, _TensorBytes):  # a CPU tensor's snapshot: hashed as the tensor was
        h.update(f"T{obj.dtype}{obj.shape}".encode())
        h.update(obj.data)
    else:
        h.update(repr(obj).encode())


class _Repr:
    """What ``_feed`` hashes for an object ``snapshot`` cannot copy: its repr, taken at the snapshot."""

    __slots__ = ("text",)

    def __init__(self, obj: Any):
        self.text = repr(obj).encode()


class _TensorBytes:
    """A CPU tensor's dtype, shape and bytes (C order), taken at the snapshot: a tenth of a clone's time."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: torch.dtype, shape: tuple, data: bytes):
        self.dtype, self.shape, self.data = dtype, shape, data


_IMMUTABLE = (int, str, bytes, bool, type(None))


def _tensor_snapshot(t: torch.Tensor) -> Any:
    if t.device.type == "cpu":
        try:  # numpy's bytes in C order are the bytes _feed hashes (contiguous, viewed as uint8)
            return _TensorBytes(t.dtype, tuple(t.shape), (t.detach() if t.requires_grad else t).numpy().tobytes())
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16), a conjugate view, ...
            pass
    return t.detach().clone()  # on its device: no sync here, the writer copies it to the CPU


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose ``digest`` is ``digest(obj)`` now, whatever happens to ``obj`` later: tensors
    detached and cloned on their device (no device sync: the copy is hashed later, off the training
    thread), containers copied, floats and immutable values kept, anything else by its repr now."""
    if isinstance(obj, torch.Tensor):
        return _tensor_snapshot(obj)
    if isinstance(obj, Mapping):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [snapshot(x) for x in obj]  # _feed hashes both alike
    if isinstance(obj, (float, *_IMMUTABLE)):
        return obj
    if np is not None and isinstance(obj, np.ndarray):
        return obj.copy()
    return _Repr(obj)


def digest_of_snapshots(snapshots: list) -> str:
    """``digest`` of the list of the snapshots' digests (a step of several micro-batches)."""
    return digest([digest(s) for s in snapshots])


def digest(obj: Any, length: int = 16) -> str:
    """A short digest of any nested state (dicts, lists, tensors, numbers, strings)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:length]


def optimizer_entries(optimizer: Any) -> int:
    """How many parameters have optimizer state (0: a fresh optimizer, no moments)."""
    return sum(1 for v in optimizer.state.values() if v)


def learning_rates(optimizer: Any | None) -> list[str] | None:
    """The param groups' learning rates as ``float.hex`` (None without an optimizer)."""
    if optimizer is None:
        return None
    return [float(g["lr"]).hex() for g in optimizer.param_groups]


def fingerprint_of(
    model: Mapping[str, Any],
    cursor: int,
    optimizer: Mapping[str, Any] | None,
    *,
    scheduler: Any = None,
    scaler: Any = None,
    data: Any = None,
    rng: Mapping[str, Any],
) -> dict[str, Any]:
    """The fingerprint of state given as state dicts (``optimizer``: an optimizer's ``state_dict()``;
    None: no optimizer seen; ``scheduler``/``scaler``/``data``: None when not tracked; ``rng``:
    ``capture_rng``'s). The live state's (``DurableRun.fingerprint``) and a checkpoint snapshot's
    (computed on the writer thread, off the training thread) are the same function of the same state."""
    fp: dict[str, Any] = {"model": digest(model), "cursor": int(cursor)}
    if optimizer is not None:
        fp["optimizer"] = digest(optimizer["state"])
        fp["optimizer/entries"] = sum(1 for v in optimizer["state"].values() if v)
        fp["lr"] = [float(g["lr"]).hex() for g in optimizer["param_groups"]]
    if scheduler is not None:
        fp["scheduler"] = digest(scheduler)
    if scaler is not None:
        fp["scaler"] = digest(scaler)
    if data is not None:
        fp["data"] = digest(data)
    for key in ("python", "numpy", "torch", "cuda"):
        if rng[key] is not None:
            fp[f"rng/{key}"] = digest(rng[key])
    for name, state in rng["generators"].items():
        fp[f"rng/{name}"] = digest(state)
    return fp
