"""The campaign's uninterrupted run: the same spec with no fault, started in the background at once.

Every campaign run is compared with its result (simulator/proving/campaign.py); a reference that fails ends the
campaign at once, as nothing could pass against it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

from . import procs
from .campaign_targets import NAME, TINYLLM, Target

REFERENCE_TIMEOUT_S = 900.0  # the uninterrupted run's own limit (a campaign run's is campaign.RUN_TIMEOUT_S)


class ReferenceFailed(RuntimeError):
    """The uninterrupted run did not complete: nothing to compare a campaign run with."""


class Reference:
    """The uninterrupted run, in the background from the start; its result, once, to every caller."""

    def __init__(
        self, base: Path, spec: Path, want: dict | None = None, train_args: tuple[str, ...] = TINYLLM.train_args
    ):
        self.want = want
        self.proc = (
            None if want is not None else procs.spawn(base / "uninterrupted", "train", "--spec", str(spec), *train_args)
        )
        self._lock = threading.Lock()

    def result(self) -> dict:
        with self._lock:
            if self.want is None:
                assert self.proc is not None  # (started when there was no result to want)
                out, err = self.proc.communicate(timeout=REFERENCE_TIMEOUT_S)
                res = json.loads(out or "{}")
                if res.get("state") != "completed":
                    raise ReferenceFailed(
                        f"the uninterrupted run ended {res.get('state')} (exit "
                        f"{self.proc.returncode}): {err.strip()[-500:]}"
                    )
                self.want = res["result"]
            return self.want

    def failed(self) -> str | None:
        """Why the uninterrupted run failed, once it has (a run compared with it cannot pass); else None."""
        if self.want is not None or self.proc is None or self.proc.poll() in (None, 0):
            return None
        try:
            self.result()
        except ReferenceFailed as e:
            return str(e)
        return None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            procs.killpg(self.proc)


def uninterrupted(target: Target = TINYLLM) -> dict:
    """The result of the campaign's spec run without faults (tests share it between seeds)."""
    base = Path(tempfile.mkdtemp(prefix="campaign-ref-"))
    spec = base / f"{NAME}.json"
    spec.write_text(json.dumps(target.spec))
    ref = Reference(base, spec, train_args=target.train_args)
    try:
        return ref.result()
    finally:
        ref.close()
        shutil.rmtree(base, ignore_errors=True)
