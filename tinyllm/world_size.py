"""The world size a checkpoint was trained at, and the refusal to resume it at another one.

Both sides check it: the trainer (tinyllm/trainer.py, on resume) and the launcher (tinyllm/distributed/
launch.py, before it starts any rank), so it stands below both: the trainer's folder-level neighbour
``distributed/`` builds on the trainer, and the trainer must not import back up into it.
"""

from __future__ import annotations

from pathlib import Path

from .spec import SpecError, TrainSpec


def world_size_of(trajectory: dict | None) -> int | None:
    """The world size a checkpoint was trained at (None: a one-process run)."""
    d = (trajectory or {}).get("distributed")
    return int(d["world_size"]) if isinstance(d, dict) and "world_size" in d else None


def check_world_size(saved: dict | None, spec: TrainSpec, path: Path | str | None) -> None:
    """Refuse resuming ``path`` (trajectory ``saved``) at a world size other than its own."""
    if saved is None:
        return
    was, now = world_size_of(saved), spec.distributed.world_size if spec.distributed else None
    if was == now:
        return

    def words(n: int | None) -> str:
        return "one process (no distributed)" if n is None else f"world_size {n}"

    raise SpecError(
        f"checkpoint {path} was trained at {words(was)}, this spec asks for {words(now)}: resuming at "
        f"another world size is refused (the batch shards, the gradient all-reduce and the ranks' "
        f"RNG streams would change, so the run would not be bitwise the same); use {words(was)} "
        f"or a new run name"
    )
