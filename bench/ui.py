"""``ctl ui``: start-up and page times on a synthetic home (a run of 1,000 segments, 10,000 events).

Builds the history in a temporary home with the engine's own schema (tests/ui/synth.py: no trainer
runs), then prints: the time from ``ctl ui`` starting to its first page served over HTTP, the
server's own ready time, and each page's render time (cold: the first, templates compiled; warm:
the median of 5), in process and over HTTP.

    python bench/ui.py [--segments 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "ui")]  # the project and the synthetic-home builder

import synth  # noqa: E402
from browser import Ui  # noqa: E402
import app  # noqa: E402
from ctl.ui import server  # noqa: E402


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu(fn) -> float:
    """CPU seconds of ``fn`` in this process (what it costs on an idle machine; wall time on a loaded
    one is this divided by the share of a core the process got)."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segments", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        w = synth.Writer(home)
        try:
            t0 = time.perf_counter()
            wid = synth.train_run(w, "big", segments=args.segments, heartbeats=2, retry_every=0)
            synth.train_run(w, "small", segments=3, t0=1.8e9)
            built = time.perf_counter() - t0
        finally:
            w.close()
        engine = app.open_engine(home, create=False, readonly=True)
        events = len(engine.history(wid))
        print(f"history: {wid}, {args.segments} segments, {events} events (built in {built:.1f} s)")
        ui = server.App(engine, home)
        for label, path, query in (
            ("runs page", "/", {}),
            ("run page", f"/run/{wid}", {}),
            ("run page, all events", f"/run/{wid}", {"limit": ["all"]}),
            ("run page, live poll", f"/run/{wid}", {"partial": ["1"]}),
        ):
            cold = _timed(lambda: ui.render(path, query))
            warm = statistics.median(_timed(lambda: ui.render(path, query)) for _ in range(5))
            cpu = statistics.median(_cpu(lambda: ui.render(path, query)) for _ in range(3))
            size = len(ui.render(path, query)[1])
            print(
                f"{label:<24} in process: first {cold * 1000:6.0f} ms, then {warm * 1000:6.0f} ms wall, "
                f"{cpu * 1000:6.0f} ms CPU ({size / 1e6:.2f} MB)"
            )
        engine.close()
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times grow with it)")
        t0 = time.perf_counter()
        with Ui(home) as proc:
            urllib.request.urlopen(proc.url, timeout=60).read()
            first = time.perf_counter() - t0
            ready = proc.banner.split("ready in ")[-1].split(" s")[0]
            print(
                f"ctl ui start-up: first page served {first:.2f} s after the process started "
                f"(the server's own ready time {ready} s)"
            )
            for label, url in (("runs page", proc.url), ("run page", proc.url + f"run/{wid}")):
                took = statistics.median(
                    _timed(lambda: urllib.request.urlopen(url, timeout=60).read()) for _ in range(5)
                )
                print(f"{label:<24} over HTTP:  {took * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
