"""``tinyllm eval`` and ``tinyllm corpus`` under a polite stop, with real processes and real signals (issue 39).

eval: its files are written at the end only (results.jsonl, summary.json, then complete.json), so a stop
abandons the suite between two units (held there by ``TINYLLM_FAULT=eval.hold@N``): the ``stopping``
liveness line, one stderr line, exit 130, no traceback, nothing under its output folder; the rerun runs the
suite from the start and writes exactly the files of an uninterrupted run (byte for byte).
corpus: a stop before the write (``corpus.hold@1``): exit 130, nothing written, the rerun builds it; a stop
in the middle of the write (``corpus.hold@2``): the write finishes (a corpus appears whole or not at all),
exit 0, and the rerun keeps it (``built: false``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tl_helpers import REPO, write_spec

pytestmark = pytest.mark.slow  # real tinyllm processes (~30 s in all on 2 loaded cores)


def start(home: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", *args, "--home", str(home)],
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def stop_when(flag: Path, proc: subprocess.Popen) -> tuple[int, str, str]:
    end = time.monotonic() + 180
    while not flag.exists():
        assert proc.poll() is None, f"exit {proc.returncode} before the hold: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < end, "never reached the hold"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def trained(home: Path) -> Path:
    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    Trainer(load_train_spec(write_spec(home / "s.json", steps=10)), home).run(reporter=Reporter([]))
    return home


def test_eval_stopped_mid_suite_exits_130_writes_nothing_and_the_rerun_writes_the_uninterrupted_files(trained: Path):
    spec = {
        "name": "small",
        "suite": "zoo",
        "seed": 3,
        "max_items": 4,
        "subjects": [{"id": "s10", "model": "runs/small/ckpt/step-000010"}],
    }
    for tag in ("ref", "cut"):  # the same suite into evals/zoo/small-ref and small-cut
        (trained / f"{tag}.json").write_text(json.dumps({**spec, "tag": tag}))
    ref = start(trained, "eval", "--spec", str(trained / "ref.json"))
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    progress = trained / "progress.jsonl"
    proc = start(
        trained,
        "eval",
        "--spec",
        str(trained / "cut.json"),
        "--progress",
        str(progress),
        env={"TINYLLM_FAULT": "eval.hold@3"},
    )
    code, out, err = stop_when(trained / "evals/zoo/held", proc)
    assert code == 130, err
    assert "Traceback" not in err and out == ""
    assert err.strip().splitlines()[-1].startswith("tinyllm: evaluation stopped by SIGTERM after 3 of"), err
    assert not (trained / "evals/zoo/small-cut").exists()  # nothing of the stopped suite
    stops = [json.loads(x) for x in progress.read_text().splitlines() if '"stopping"' in x]
    assert len(stops) == 1 and stops[0]["signal"] == "SIGTERM"
    again = start(trained, "eval", "--spec", str(trained / "cut.json"))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    ref_files = files(trained / "evals/zoo/small-ref")
    got = files(trained / "evals/zoo/small-cut")
    assert sorted(got) == sorted(ref_files) == ["complete.json", "results.jsonl", "summary.json"]
    strip = lambda b: b.replace(b"small-cut", b"small-ref").replace(b'"cut"', b'"ref"')  # noqa: E731 (run and tag differ)
    assert {k: strip(v) for k, v in got.items()} == ref_files


def test_corpus_stopped_before_its_write_writes_nothing_and_in_its_write_finishes_it(home: Path):
    spec = home / "c.json"
    spec.write_text(json.dumps({"name": "stopped"}))
    proc = start(home, "corpus", "--spec", str(spec), env={"TINYLLM_FAULT": "corpus.hold@1"})
    code, out, err = stop_when(home / "corpora/held", proc)
    assert code == 130 and "Traceback" not in err and out == "", err
    assert "before anything was written" in err
    assert sorted(p.name for p in (home / "corpora").iterdir()) == ["default"]  # no corpus, no temporary
    proc = start(home, "corpus", "--spec", str(spec), env={"TINYLLM_FAULT": "corpus.hold@2"})
    code, out, err = stop_when(home / "corpora/held", proc)
    assert code == 0 and "Traceback" not in err, err  # the write was under way: it finished
    first = json.loads(out.strip().splitlines()[-1])
    assert first["built"] is True
    assert sorted(p.name for p in (home / "corpora").iterdir()) == ["default", "stopped"]
    again = start(home, "corpus", "--spec", str(spec))
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    second = json.loads(out.strip().splitlines()[-1])
    assert second["built"] is False and second["checksum"] == first["checksum"]
