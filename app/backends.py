"""Which engine ``ctl`` drives: the embedded SQLite engine (default) or a Temporal cluster.

``ctl --backend temporal --address HOST:PORT [--namespace NS] [--task-queue Q] COMMAND`` (or
``$CTL_BACKEND``, ``$CTL_TEMPORAL_ADDRESS``...) selects Temporal for that command. Nothing of
Temporal is imported unless it is chosen. Both backends offer the same surface to ``app`` (``app.backend.Backend``)
(start, status, history, cancel, list, run a worker), the same workflow ids, exit codes and
``--json`` shapes; the home folder keeps the runs' files on both (on Temporal it must be shared
by every worker host).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import workflows

from .backend import Backend
from .errors import BadRequest, CtlError

EMBEDDED = "embedded"
TEMPORAL = "temporal"
BACKENDS = (EMBEDDED, TEMPORAL)
APP_PACKAGES = ("workflows", "tinyllm")  # what Temporal's workflow sandbox takes from outside, beside the engine


@dataclass(frozen=True)
class Choice:
    """The backend this ctl invocation drives (``--backend``) and its connection options."""

    name: str = EMBEDDED
    options: tuple[tuple[str, Any], ...] = ()  # the Temporal connection options as given (None: default)

    def temporal_config(self) -> Any:
        from engine.temporal import ConfigError, TemporalConfig  # lazy: the optional temporal extra

        try:
            cfg = TemporalConfig.from_env(**dict(self.options))
        except ConfigError as e:
            raise BadRequest(str(e)) from None
        global _warned
        if cfg.api_key and not cfg.uses_tls and not _warned:
            _warned = True
            print(f"ctl: warning: --no-tls sends $CTL_TEMPORAL_API_KEY to {cfg.address} in clear text", file=sys.stderr)
        return cfg


_warned = False  # the clear-text API key warning given (once per chosen backend)


_chosen = Choice()


def choose(backend: Choice) -> None:
    """Set the backend of this ctl invocation (the CLI's group does it once per command)."""
    global _chosen, _warned
    if backend.name not in BACKENDS:
        raise BadRequest(f"unknown backend {backend.name!r} (known: {', '.join(BACKENDS)})")
    _chosen, _warned = backend, False


def chosen() -> Choice:
    return _chosen


def _print_progress(activity_id: str, details: Any) -> None:
    if isinstance(details, dict) and "step" in details:
        loss = details.get("loss")
        loss_text = f" loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
        print(
            f"ctl: {activity_id}: step {details['step']}{loss_text} checkpoint {details.get('checkpoint', '')}",
            file=sys.stderr,
            flush=True,
        )


def open_temporal(home: Path, *, progress: bool = True) -> Backend:
    """A ``TemporalEngine`` with the workflows and the real activities of ``home`` registered."""
    from engine import temporal  # lazy: the optional temporal extra (temporalio), see the module docstring

    cfg = chosen().temporal_config()
    try:
        temporal.require()
    except temporal.MissingExtra as e:
        raise BadRequest(str(e)) from None
    try:
        engine = temporal.TemporalEngine(
            cfg, on_heartbeat=_print_progress if progress else None, passthrough_modules=APP_PACKAGES
        )
    except temporal.Unreachable as e:
        raise CtlError(str(e)) from None
    workflows.register(engine, activities=workflows.tinyllm_activities(home))
    return engine
