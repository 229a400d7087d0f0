"""What ``ctl verify-resume`` proved, remembered in the home: ``<home>/.ctl/verified/<key>.json``.

The key is a digest of the spec's trajectory (every field but those a run may change between
segments or resumes: steps, eval_every, eval_interval_seconds, checkpoint_every, log_every,
validation) and of the trainer's code: its command words, its env, and the bytes of each command
word that names a file (relative to the trainer's cwd; a file over ``CODE_FILE_MAX_BYTES`` is no code,
a dataset or a checkpoint named on the command line: it counts by its size, not read, as the key is
computed on every ``ctl train``, ``status`` and ``show``). ``ctl train`` of a spec's own trainer looks
its key up and says once, at start, when no EXACT verdict is recorded for it: the bitwise-equal
final loss its help promises is then unverified.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping

from contracts.layout import RunHome
from tinyllm.fsio import atomic_write

NOT_TRAJECTORY = frozenset(
    {"steps", "eval_every", "eval_interval_seconds", "checkpoint_every", "log_every", "validation", "trainer"}
)


CODE_FILE_MAX_BYTES = 8 << 20  # a command word naming a larger file counts by its size (not read)


def _file_digest(path: Path) -> str | None:
    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        if size > CODE_FILE_MAX_BYTES:
            return f"size:{size}"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def spec_key(spec: Mapping[str, Any]) -> str:
    """The digest of ``spec``'s trajectory and its trainer's code (the module docstring)."""
    trainer = t if isinstance(t := spec.get("trainer"), Mapping) else {}
    words = [str(w) for w in trainer.get("command") or []]
    cwd = Path(str(trainer.get("cwd") or "."))
    files = {w: d for w in words if (d := _file_digest(Path(w) if Path(w).is_absolute() else cwd / w))}
    body = {
        "trajectory": {k: v for k, v in spec.items() if k not in NOT_TRAJECTORY},
        "command": words,
        "env": dict(trainer.get("env") or {}),
        "files": files,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _path(home: Path, key: str) -> Path:
    return RunHome(home).ctl_dir / "verified" / f"{key[:32]}.json"


def record(home: Path, spec: Mapping[str, Any], verdict: str, **facts: Any) -> Path:
    key = spec_key(spec)
    path = _path(home, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"key": key, "name": spec.get("name"), "verdict": verdict, "time": time.time(), **facts}
    atomic_write(path, (json.dumps(body, sort_keys=True) + "\n").encode())
    return path


def lookup(home: Path, spec: Mapping[str, Any]) -> dict | None:
    """The recorded verdict for ``spec``'s key, or None."""
    key = spec_key(spec)
    try:
        body = json.loads(_path(home, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("key") == key else None


def unverified_notice(home: Path, spec: Mapping[str, Any], spec_file: str) -> str | None:
    """The one line ``ctl train`` says at start of a spec's own trainer with no EXACT verdict, else None."""
    if not isinstance(spec.get("trainer"), Mapping):
        return None
    found = lookup(home, spec)
    if found is not None and found.get("verdict") == "exact":
        segs, steps, every = found.get("segments"), spec.get("steps"), spec.get("eval_every") or 0
        cut = isinstance(steps, int) and isinstance(every, int) and 0 < every < steps  # ctl train runs segments
        if cut and isinstance(segs, list) and len(segs) <= 1:
            return (
                f"ctl: the bitwise-equal final loss of this run in segments is unverified for this trainer "
                f"(ctl verify-resume said EXACT under interruptions, but not in segments: --segments 1); "
                f"verify it: ctl verify-resume --spec {spec_file}"
            )
        return None
    why = (
        "no ctl verify-resume of this trainer's code and trajectory"
        if found is None
        else f"ctl verify-resume said {str(found.get('verdict')).upper().replace('_', ' ')} for this trainer's code and trajectory"
    )
    return (
        f"ctl: the bitwise-equal final loss after a resume is unverified for this trainer ({why}); "
        f"verify it: ctl verify-resume --spec {spec_file}"
    )


def verdict_of(home: Path, spec: Mapping[str, Any]) -> dict | None:
    """For ``ctl status`` / ``show`` of a run of ``spec``: what verify-resume recorded for its trainer's
    code and trajectory as they are now (``verdict`` ``unverified`` when nothing), or None for
    tinyllm's own trainer (not a spec's own: the project's tests and simulator prove it)."""
    if not isinstance(spec.get("trainer"), Mapping):
        return None
    found = lookup(home, spec)
    if found is None:
        return {"verdict": "unverified"}
    return {k: found.get(k) for k in ("verdict", "time", "kills", "seed", "segments") if found.get(k) is not None}


def verdict_line(v: Mapping[str, Any]) -> str:
    """One line for ``verdict_of``'s answer."""
    if v.get("verdict") == "unverified":
        return (
            "resume proof: unverified (no ctl verify-resume of this trainer's code and trajectory); "
            "run ctl verify-resume --spec FILE"
        )
    when = (
        time.strftime("%Y-%m-%d %H:%M", time.localtime(v["time"])) if isinstance(v.get("time"), (int, float)) else "?"
    )
    how = ", ".join(
        x
        for x in (
            f"{v['kills']} interruption(s)" if v.get("kills") is not None else "",
            f"seed {v['seed']}" if v.get("seed") is not None else "",
        )
        if x
    )
    segs = v.get("segments")
    untested = (
        "; the run in segments, as ctl train runs it, not tested"
        if v.get("verdict") == "exact" and isinstance(segs, list) and len(segs) <= 1
        else ""
    )
    return (
        f"resume proof: ctl verify-resume said {str(v.get('verdict')).upper().replace('_', ' ')} on {when}"
        + (f" ({how})" if how else "")
        + untested
    )
