"""Warm segment starts (workflows/activities.py, engine/_forkserver.py, tinyllm/warm.py) with real ``ctl train``
runs: a run whose segments are forked by the warm server gives the same bits as one whose segments each start a
fresh interpreter (every checkpoint's loss, the final loss and the model digest; each segment's evaluation, also
forked warm, byte for byte), and nothing of either is left running afterwards (no trainer, no server)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from simulator.proving import procs

pytestmark = pytest.mark.slow  # two real ctl train runs of a tiny model

SPEC = {
    "name": "warm",
    "steps": 12,
    "corpus": "default",
    "seed": 5,
    "eval_every": 4,
    "eval_interval_seconds": 0,
    "checkpoint_every": 2,
    "batch_size": 2,
    "lr": 0.003,
    "min_lr": 0.0003,
    "warmup_steps": 2,
    "lr_decay_steps": 12,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16},
}
WARM_REASON = "chosen when the warm trainer server loaded torch"


def _train(tmp: Path, kind: str, **env: str) -> tuple[dict, Path]:
    home = tmp / kind
    spec = tmp / "warm.json"
    spec.write_text(json.dumps(SPEC))
    p = subprocess.run(
        [*procs.CTL, "train", "--spec", str(spec), "--suite", "ppl", "--json", "--home", str(home)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**procs.env(), **env},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["result"], home


def _segments(home: Path) -> dict[str, list[dict]]:
    """Each segment's progress lines (its first attempt's)."""
    out = {}
    for d in sorted((home / "runs" / "warm" / "activity").glob("train-*")):
        lines = (d / "progress-1.jsonl").read_text().splitlines()
        out[d.name] = [json.loads(x) for x in lines if x.strip()]
    return out


def _logs(home: Path) -> str:
    """The kept stderr of every attempt (why a segment was not warm, when it was not)."""
    return "\n".join(
        f"{p}: {p.read_text(errors='replace')[-300:]}" for p in sorted(home.glob("runs/*/activity/*/logs/*/stderr.log"))
    )


def _left_in(home: Path) -> list[int]:
    """Live processes started for ``home``: its command line names it, or it runs in it (the server)."""
    left = [pid for pid, _ in procs.processes_in(home)]
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "cwd") == str(home):
                left.append(int(d.name))
        except OSError:
            continue
    return left


def test_warm_segments_give_the_bits_of_cold_ones_and_leave_nothing_running(tmp_path: Path) -> None:
    cold, cold_home = _train(tmp_path, "cold", CTL_WARM_START="0")
    warm, warm_home = _train(tmp_path, "warm")
    cold_segs, warm_segs = _segments(cold_home), _segments(warm_home)
    assert list(warm_segs) == ["train-000004", "train-000008", "train-000012"] == list(cold_segs)
    for name, lines in warm_segs.items():  # every segment really went warm, and every cold one cold
        [ready] = [x for x in lines if x.get("event") == "ready"]
        [cold_ready] = [x for x in cold_segs[name] if x.get("event") == "ready"]
        assert ready["omp"]["reason"].startswith(WARM_REASON), (name, ready, _logs(warm_home))
        assert not cold_ready["omp"]["reason"].startswith(WARM_REASON), cold_ready

    def saved(segs: dict[str, list[dict]]) -> list[tuple[int, str]]:
        return [
            (x["step"], x["loss_hex"])
            for lines in segs.values()
            for x in lines
            if "checkpoint" in x and "event" not in x
        ]

    assert saved(warm_segs) == saved(cold_segs) and len(saved(cold_segs)) >= 6
    assert (warm["final_loss_hex"], warm["digest"]) == (cold["final_loss_hex"], cold["digest"])
    summaries = sorted((cold_home / "evals" / "ppl").glob("*/summary.json"))
    assert len(summaries) == 3
    for path in summaries:
        assert (warm_home / path.relative_to(cold_home)).read_bytes() == path.read_bytes()
    assert _left_in(warm_home) == [] and _left_in(cold_home) == []
