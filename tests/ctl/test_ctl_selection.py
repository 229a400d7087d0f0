"""Early stopping and best-k through ``ctl train`` (the TrainRun workflow on the engine): the stop
ends the run as a normal completion (exit 0), the later segments never run, and ``ctl status`` /
``ctl show`` say where it stopped and mark the best checkpoint; a bad selection field is one line,
exit 2, before any work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bi_helpers import ctl, one_line_error

pytestmark = pytest.mark.slow

SPEC = {
    "name": "small",
    "steps": 12,
    "seed": 3,
    "eval_every": 4,
    "checkpoint_every": 4,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 5,
    "lr_decay_steps": 40,
    "threads": 1,
    "log_every": 10,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.1},
    "validation": {
        "enabled": True,
        "every_steps": 2,
        "batch_size": 4,
        "max_samples": 4,
        "data": {"path": "builtin:heldout.txt"},
    },
    "early_stopping": {"metric": "val/loss", "mode": "max", "patience": 2},
    "keep_checkpoints": {"last": 1, "best": {"metric": "val/loss", "mode": "max", "k": 1}},
}


@pytest.fixture
def home(tmp_path: Path, built_corpus: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    shutil.copytree(built_corpus, h / "corpora")
    return h


@pytest.fixture(scope="session")
def built_corpus(tmp_path_factory) -> Path:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    h = tmp_path_factory.mktemp("corpus-home")
    build_corpus(CorpusSpec(), h)
    return h / "corpora"


def test_ctl_train_stops_early_as_a_completion_and_shows_it(home: Path) -> None:
    (home / "s.json").write_text(json.dumps(SPEC))
    p = ctl(home, "train", "--spec", str(home / "s.json"), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(p.stdout)["result"]
    assert result["steps"] == 6 and [s["until"] for s in result["segments"]] == [4, 8]  # segment 3 never ran
    assert result["stopped_early"]["best_checkpoint"] == "runs/small/ckpt/step-000002"
    assert result["best_checkpoints"][0]["step"] == 2
    st = ctl(home, "status", "train/small")
    assert "stopped early at step 6: val/loss (max)" in st.stdout and "best step 2" in st.stdout
    sh = ctl(home, "show", "train/small")
    assert "runs/small/ckpt/step-000002 (val/loss" in sh.stdout and "<- best" in sh.stdout
    assert "skipped" in sh.stdout
    # the final loss (float.hex, bit for bit) and digest that users compare: those ctl train returned
    assert f"final: step 6 loss {result['final_loss_hex']} (" in sh.stdout, sh.stdout
    assert f"digest {result['digest']}" in sh.stdout and len(result["digest"]) == 64
    final = json.loads(ctl(home, "show", "train/small", "--json").stdout)["final"]
    assert (final["final_loss_hex"], final["digest"], final["step"]) == (result["final_loss_hex"], result["digest"], 6)
    pl = ctl(home, "plot", "train/small", "--json")  # ctl plot: the stop and the best step
    stop = json.loads(pl.stdout)["stopped_early"]
    assert stop["step"] == 6 and stop["best_step"] == 2, stop
    text = ctl(home, "plot", "train/small").stdout
    assert "stopped early at step 6" in text and "best 2" in text, text
    png = ctl(home, "plot", "train/small", "-o", str(home / "p.png"))
    assert png.returncode == 0 and (home / "p.png").stat().st_size > 1000, png.stderr
    again = ctl(home, "train", "--spec", str(home / "s.json"), "--json")  # complete: nothing more runs
    assert again.returncode == 0 and json.loads(again.stdout)["result"]["steps"] == 6


def test_ctl_train_refuses_an_unknown_selection_metric(home: Path) -> None:
    (home / "s.json").write_text(json.dumps({**SPEC, "early_stopping": {"metric": "val/acc", "mode": "min"}}))
    one_line_error(ctl(home, "train", "--spec", str(home / "s.json")), 2, "early_stopping.metric 'val/acc'")
    assert not (home / "runs").exists() and not (home / ".ctl").exists()


def _release(home: Path, *args: str, kill: str | None = None):
    import subprocess
    import sys

    from bi_helpers import env

    e = env()
    if kill:
        e["TINYLLM_FAULT"] = f"release.{kill}@1"  # publishing v0001
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "release",
            "train/small",
            "--suite",
            "ppl",
            "--eval-max-items",
            "4",
            *args,
            "--home",
            str(home),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=e,
    )


def _eval_starts(home: Path) -> int:
    """Every eval activity attempt any release workflow of the home started (from the histories)."""
    listed = json.loads(ctl(home, "list", "--json").stdout)
    rows = listed if isinstance(listed, list) else listed.get("workflows", [])
    n = 0
    for w in rows:
        if str(w["workflow_id"]).startswith("release/"):
            events = json.loads(ctl(home, "history", w["workflow_id"], "--json").stdout)
            events = events if isinstance(events, list) else events.get("events", [])
            n += sum(
                1
                for e in events
                if e["type"] == "activity_started" and str(e["attrs"]["activity_id"]).startswith("eval-")
            )
    return n


def test_release_gates_kills_and_publishes_once(home: Path) -> None:
    (home / "s.json").write_text(json.dumps({**SPEC, "eval_every": 0}))
    assert ctl(home, "train", "--spec", str(home / "s.json")).returncode == 0
    one_line_error(_release(home, "--gate", "ppl/ppl<<6"), 2, "gate 'ppl/ppl<<6' is not SUITE/FIGURE OP NUMBER")
    one_line_error(_release(home, "--gate", "zoo/acc>=0.5"), 2, "not evaluated")
    failed = _release(home, "--gate", "ppl/ppl<=6.5")  # a tiny model's perplexity is far above 6.5
    assert failed.returncode == 1 and "not published: gate ppl/ppl<=6.5 failed" in failed.stderr, failed.stderr
    assert not (home / "releases").exists()
    # killed between the evaluation and the publication (the model copied, not yet renamed): nothing published
    killed = _release(home, "--gate", "ppl/ppl<=1e6", kill="after_copy")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not list((home / "releases/small").glob("v*")) and not (home / "releases/small/CURRENT").exists()
    # the same command, killed after the rename (published; CURRENT not moved, the completion not recorded)
    killed = _release(home, "--gate", "ppl/ppl<=1e6", kill="after_rename")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [p.name for p in (home / "releases/small").glob("v*")] == ["v0001"]
    done = _release(home, "--gate", "ppl/ppl<=1e6", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)["result"]
    assert (
        result["published"] and result["version"] == "v0001" and result["checkpoint"] == "runs/small/ckpt/step-000002"
    )
    assert _eval_starts(home) == 2  # the failed-gate release's and the killed one's: its two resumes reused it
    assert sorted(p.name for p in (home / "releases/small").iterdir()) == ["CURRENT", "v0001"]  # published once
    other = _release(home, "--gate", "ppl/ppl<=1e7")  # another request for the same digest: the same release
    assert other.returncode == 0 and "released small v0001" in other.stdout
    assert sorted(p.name for p in (home / "releases/small").iterdir()) == ["CURRENT", "v0001"]
    manifest = json.loads((home / "releases/small/v0001/manifest.json").read_text())
    assert manifest["checkpoint_digest"] == result["digest"] and manifest["corpus"]["checksum"]
    assert manifest["gates"][0]["passed"] and (home / "releases/small/v0001/model/model.pt").is_file()
    assert (home / "releases/small/CURRENT").read_text().strip() == "v0001"
    listed = ctl(home, "release", "--list")
    assert "releases/small/v0001  CURRENT  runs/small/ckpt/step-000002" in listed.stdout
    assert "releases/small/v0001" in ctl(home, "show", "train/small").stdout
    _release_interrupted_and_resumed(home)


def _descendants(pid: int) -> list[int]:
    from ctl.interrupt import descendants

    return descendants(pid)


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed child whose reparenting init does not reap it stays in /proc as Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _release_interrupted_and_resumed(home: Path) -> None:
    """SIGTERM to ctl release during its evaluation: a polite stop (issue 39), the one ``ctl: stopped by SIGTERM``
    line, exit 143 (as ctl train and ctl eval), the evaluation's process gone; the same command then finishes
    the release."""
    import signal
    import subprocess
    import sys
    import time

    from bi_helpers import env

    argv = [
        sys.executable,
        "-m",
        "ctl.cli",
        "release",
        "train/small",
        "--suite",
        "zoo",
        "--eval-max-items",
        "4",
        "--home",
        str(home),
    ]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    deadline = time.monotonic() + 120
    while not _descendants(p.pid) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    children = _descendants(p.pid)
    assert children, "the release's evaluation never started"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, out, err[-2000:])
    assert err.strip().splitlines()[-1].startswith("ctl: stopped by SIGTERM: release/small/"), err[-2000:]
    assert "Traceback" not in err and "Aborted" not in err, err[-2000:]
    time.sleep(0.5)
    assert not [c for c in children if _alive(c)], "the evaluation outlived ctl release"
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env())
    assert again.returncode == 0 and "released small v0001" in again.stdout, again.stderr[-2000:]
