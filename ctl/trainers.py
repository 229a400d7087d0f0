"""A spec's own trainer is the application layer's (``app/trainers.py``); this name stays for
``ctl/verify.py`` (moving to ``simulator/`` in issue 41's item 3), which imports ``resolved_spec`` from here."""
from __future__ import annotations

from app.trainers import resolved_spec

__all__ = ["resolved_spec"]
