"""Preemption: what a hard kill and a polite stop cost, measured in one run (issue 39; docs/preemption.md).

For each spec, ``ctl train --no-eval`` is started in a fresh home and signalled once training has passed
1.4 x ``checkpoint_every`` steps of its segment ("checkpoint every 100 steps, died at step 140"):

- ``kill``: SIGKILL to every process of the job (ctl's group and the trainer's), as the OOM killer or a
  platform's last resort does. Steps lost: the trainer's last recorded step (metrics.jsonl, one frame a
  step) minus the step of ``LATEST``.
- ``term``: SIGTERM to ctl (Kubernetes, docker, systemd; Slurm signals every process, the same path).
  Steps lost likewise, against the checkpoint the stop wrote.

Printed per spec and mode: steps trained when signalled, steps lost, signal -> ctl's exit (s), and for
``term`` the checkpoint on signal (the trainer's ``stopping`` progress line, or the signal when it writes
none, to its checkpoint line). Then the rerun's final loss bits against an uninterrupted run's (EXACT or
DIFFERENT). Nothing here is asserted; the figures go in docs/preemption.md with the machine's load.

Usage: python bench/preempt.py [--spec specs/tiny.json --spec specs/nanogpt-char.json] [--no-rerun]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CTL = [sys.executable, "-m", "ctl.cli"]
CORPUS_SPECS = {"char": REPO / "specs" / "corpus-char.json"}
BOUND_S = 900.0


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}


def _argv(spec: Path, home: Path, spec_json: dict) -> list[str]:
    argv = [*CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home), "--quiet"]
    corpus = CORPUS_SPECS.get(str(spec_json.get("corpus", "default")))
    return argv + (["--corpus-spec", str(corpus)] if corpus else [])


def _frames_step(home: Path, name: str) -> int:
    last = 0
    path = home / "runs" / name / "metrics.jsonl"
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                last = max(last, int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                pass
    return last


def _latest_step(home: Path, name: str) -> int:
    try:
        return int((home / "runs" / name / "ckpt" / "LATEST").read_text().strip().split("-")[-1])
    except (OSError, ValueError):
        return 0


def _progress(home: Path, name: str) -> list[dict]:
    out = []
    for f in sorted(home.glob(f"runs/{name}/activity/train-*/progress-1.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _trainer_groups(name: str, home: Path) -> set[int]:
    groups = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"tinyllm" in cmd and str(home).encode() in cmd:
            try:
                groups.add(os.getpgid(int(d.name)))
            except ProcessLookupError:
                pass
    return groups


def _final_hex(spec: Path, home: Path, spec_json: dict) -> str | None:
    p = subprocess.run(
        [*_argv(spec, home, spec_json), "--json"], capture_output=True, text=True, env=_env(), timeout=BOUND_S
    )
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["result"]["final_loss_hex"]


def one(spec: Path, mode: str, tmp: Path, rerun: bool, reference: str | None) -> dict:
    spec_json = json.loads(spec.read_text())
    name, every = spec_json["name"], int(spec_json["checkpoint_every"])
    target = int(every * 1.4)
    home = tmp / f"{name}-{mode}"
    p = subprocess.Popen(
        _argv(spec, home, spec_json),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_env(),
    )
    deadline = time.monotonic() + BOUND_S
    while _frames_step(home, name) < target:
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{spec}: ctl ended or timed out before step {target}: {p.stderr.read()[-1000:]}")
        time.sleep(0.02)
    signalled = time.time()
    t0 = time.monotonic()
    if mode == "kill":
        for g in _trainer_groups(name, home) | {p.pid}:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        p.send_signal(signal.SIGTERM)
    p.wait(timeout=BOUND_S)
    exit_s = time.monotonic() - t0
    time.sleep(0.2)  # (a SIGKILLed trainer's last frame is on disk already; nothing more is written)
    reached, saved = _frames_step(home, name), _latest_step(home, name)
    row = {
        "spec": spec.name,
        "mode": mode,
        "rc": p.returncode,
        "reached": reached,
        "saved": saved,
        "lost": max(0, reached - saved),
        "exit_s": exit_s,
        "checkpoint_s": None,
        "rerun": "not tested",
    }
    if mode == "term":
        lines = _progress(home, name)
        stop = next((x for x in lines if x.get("event") == "stopping"), None)
        ckpt = next((x for x in reversed(lines) if "checkpoint" in x and "event" not in x), None)
        if ckpt is not None and isinstance(ckpt.get("time"), (int, float)):
            begin = stop["time"] if stop and isinstance(stop.get("time"), (int, float)) else signalled
            row["checkpoint_s"] = max(0.0, ckpt["time"] - begin)
    if rerun and reference is not None:
        got = _final_hex(spec, home, spec_json)
        row["rerun"] = "EXACT" if got == reference else f"DIFFERENT ({got} vs {reference})"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", action="append", default=None)
    ap.add_argument("--no-rerun", action="store_true", help="skip the reruns and their exactness check")
    args = ap.parse_args()
    specs = [Path(s) for s in (args.spec or ["specs/tiny.json", "specs/nanogpt-char.json"])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-preempt-") as tmp_s:
        tmp = Path(tmp_s)
        for spec in specs:
            spec_json = json.loads(spec.read_text())
            reference = None if args.no_rerun else _final_hex(spec, tmp / f"{spec_json['name']}-ref", spec_json)
            for mode in ("kill", "term"):
                row = one(spec, mode, tmp, not args.no_rerun, reference)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        f"{'spec':<20} {'mode':<5} {'rc':>4} {'signalled at':>12} {'saved':>6} {'lost':>5} {'exit s':>7} "
        f"{'ckpt s':>7}  rerun"
    )
    for r in rows:
        ck = f"{r['checkpoint_s']:.2f}" if r["checkpoint_s"] is not None else "-"
        print(
            f"{r['spec']:<20} {r['mode']:<5} {r['rc']:>4} {r['reached']:>12} {r['saved']:>6} {r['lost']:>5} "
            f"{r['exit_s']:>7.2f} {ck:>7}  {r['rerun']}"
        )
    load = os.getloadavg()
    print(f"load average while measured: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
