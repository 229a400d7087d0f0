"""``ctl verify-resume`` names each broken rule of the trainer contract instead of a verdict on
exactness (exit 4, verdict ``contract_broken``): a tiny torch-free trainer (toy_trainer.py) breaks one
rule at a time; the same trainer unbroken is EXACT, so each verdict is the broken rule's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = Path(__file__).with_name("toy_trainer.py")

pytestmark = pytest.mark.slow  # real trainer processes, ~1-3 s each


def verify(tmp_path: Path, bad: str = "", *args: str, **config) -> tuple[int, dict | None, str]:
    spec = {
        "name": "toy",
        "steps": 12,
        "seed": 0,
        "checkpoint_every": 3,
        "trainer": {"command": ["python", str(TOY)]},
        "config": {"bad": bad, **config},
    }
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(path),
            "--home",
            str(tmp_path),
            "--json",
            "--kills",
            "2",
            "--seed",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    try:
        report = json.loads(p.stdout)
    except ValueError:
        report = None
    return p.returncode, report, p.stderr


def test_the_toy_trainer_unbroken_is_exact_through_kill_and_term(tmp_path) -> None:
    rc, report, err = verify(tmp_path, "", "--signal", "both")
    assert rc == 0 and report["verdict"] == "exact", err[-2000:]
    assert all(i["resumed_from"] > 0 for i in report["interruptions"]) and report["interruptions"], report
    assert report["segments"] == {
        "ends": [6, 12],
        "exact": True,
        "final_loss_hex": report["final_loss_hex"]["resumed"],
        "digest": report["digest"]["resumed"],
        "first_differing_step": None,
    }, report


def test_an_interruption_after_the_last_checkpoint_proves_nothing(tmp_path) -> None:
    """A trainer that does not hold at the planned step is signalled when its step records reach it; one that
    writes them only at the end is killed after its last checkpoint, and the restart resumes at ``steps``,
    training nothing: no resume from a mid-run checkpoint was exercised, so NOT PROVEN (exit 3), never EXACT."""
    rc, report, err = verify(
        tmp_path, "", "--signal", "kill", "--kills", "1", "--segments", "1", metrics_at_end=True, end_s=1.0
    )
    assert [i["resumed_from"] for i in report["interruptions"]] == [12], report
    assert rc == 3 and report["verdict"] == "not_proven" and not report["exact"], (rc, report, err[-2000:])
    assert "no interruption resumed from a mid-run checkpoint" in report["diagnosis"], report["diagnosis"]


def test_the_recorded_verdict_counts_the_interruptions_that_landed_not_those_asked_for(tmp_path) -> None:
    """--kills 5 on a run with room for 3 (checkpoints at 3, 6, 9 of 12): ctl status/show's resume proof line
    said '5 interruption(s)', what was asked, not what was exercised."""
    from simulator.proving.record import verdict_line

    rc, report, err = verify(tmp_path, "", "--signal", "kill", "--kills", "5", "--segments", "1")
    assert rc == 0 and report["kills_planned"] == 3 and report["kills_landed"] == 3, (rc, report, err[-2000:])
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / ".ctl/verified").glob("*.json")]
    assert record["kills"] == 3, record
    assert "(3 interruption(s), seed 1)" in verdict_line(record), verdict_line(record)


def test_an_early_stop_is_no_broken_rule_and_the_interruptions_land_before_it(tmp_path) -> None:
    """A trainer that stops early (exit 0 at step 7 of 12, ``stopped_early`` in its result, as tinyllm with
    ``early_stopping`` and as TrainRun accepts it) was called CONTRACT BROKEN (exit codes) by verify-resume.
    Now the run's end is the uninterrupted run's stop: the kills are planned before it and EXACT is proven."""
    rc, report, err = verify(tmp_path, "", "--signal", "both", "--kills", "2", stop_at=7)
    assert rc == 0 and report["verdict"] == "exact", (rc, report.get("diagnosis") if report else None, err[-2000:])
    assert report["final_loss_hex"]["uninterrupted"] == report["final_loss_hex"]["resumed"]
    assert report["interruptions"] and all(0 < i["resumed_from"] < 7 for i in report["interruptions"]), report
    assert report["steps_compared"] == 7 and report["segments"]["exact"] is True, report


def test_kills_0_is_not_proven_and_says_so_not_the_cadence(tmp_path) -> None:
    """--kills 0: NOT PROVEN because nothing was interrupted; the diagnosis blamed 'steps 12 / checkpoint_every
    3 allow no kill after a mid-run checkpoint', which is false (they allow three)."""
    rc, report, err = verify(tmp_path, "", "--kills", "0", "--segments", "1")
    assert rc == 3 and report["verdict"] == "not_proven", (rc, err[-2000:])
    assert report["diagnosis"] == "no interruption resumed from a mid-run checkpoint: --kills 0 plans none", report


def _toys_of(home: Path) -> list[int]:
    """The live toy trainer processes started in ``home`` (from /proc)."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if any(b"toy_trainer.py" in w for w in cmd) and any(str(home).encode() in w for w in cmd) and state != "Z":
            pids.append(int(name))
    return pids


def test_a_killed_verify_resume_leaves_no_trainer_behind(tmp_path) -> None:
    """SIGKILL of ctl verify-resume (OOM, kill -9) takes its trainer with it: an orphan would train on into
    the scratch folder that the next verify-resume of the spec empties and fills again."""
    import signal
    import time

    spec = {
        "name": "orphan",
        "steps": 12,
        "checkpoint_every": 3,
        "trainer": {"command": ["python", str(TOY)]},
        "config": {"step_s": 1.0},
    }
    (tmp_path / "o.json").write_text(json.dumps(spec))
    p = subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "verify-resume", "--spec", str(tmp_path / "o.json"), "--home", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _toys_of(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _toys_of(tmp_path), "the trainer never started"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.monotonic() + 10
    while _toys_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _toys_of(tmp_path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"trainer(s) {left} outlived the killed ctl verify-resume"


@pytest.mark.parametrize(
    "bad, args, rule, words",
    [
        ("short", (), "exit codes", "exited 0 at step 8 of 12"),
        ("no-result", (), "result line", "nothing on stdout"),
        ("malformed", (), "result line", "is not float.hex(final_loss)"),
        ("not-last", (), "result line", "not the last"),
        ("term-exit0", ("--signal", "term"), "SIGTERM", "answered with exit 0"),
        ("term-no-ckpt", ("--signal", "term"), "SIGTERM", "but LATEST is at step"),
        (
            "term-train-on",
            ("--signal", "term"),
            "SIGTERM",
            "a graceful stop lost 2 step(s): SIGTERM at step 8, checkpoint at step 6",
        ),
        (
            "resume-cadence",
            ("--signal", "term"),
            "SIGTERM",
            "a graceful stop lost 2 step(s): SIGTERM at step 11, checkpoint at step 9",
        ),
        ("silent", ("--heartbeat-timeout", "1"), "liveness", "no progress line for"),
    ],
)
def test_a_broken_rule_is_named_never_exact(tmp_path, bad, args, rule, words) -> None:
    rc, report, err = verify(tmp_path, bad, *args, silent_s=2.5)
    assert rc == 4, (rc, err[-2000:])
    assert report["verdict"] == "contract_broken" and not report["exact"], report
    line = report["diagnosis"]
    assert line.startswith(f"trainer broke the contract ({rule}): ") and words in line, line
    assert "\n" not in line


def test_steps_lost_are_reported_per_interruption_and_fail_only_a_graceful_stop(tmp_path) -> None:
    """Issue 39: each interruption says the steps it lost (done when the signal came, from the trainer's
    ``stopping`` line or its per-step records, minus the checkpoint the next attempt resumed from). A SIGKILL
    may lose the steps after its checkpoint (reported, EXACT); a graceful stop may lose none: the same trainer
    resuming from its cadence's checkpoint instead of the stop's is CONTRACT BROKEN though its bits are exact."""
    rc, report, err = verify(tmp_path, "resume-cadence", "--signal", "kill", "--segments", "1")
    assert rc == 0 and report["verdict"] == "exact", (rc, report, err[-2000:])
    assert [i["steps_lost"] for i in report["interruptions"]] == [2, 1], report["interruptions"]
    rc, report, err = verify(tmp_path, "", "--signal", "term", "--segments", "1")
    assert rc == 0 and report["verdict"] == "exact", (rc, report, err[-2000:])
    stops = report["interruptions"]
    assert [i["steps_lost"] for i in stops] == [0, 0] and all(i["stopping_step"] == i["resumed_from"] for i in stops), (
        stops
    )
    rc, report, err = verify(tmp_path, "resume-cadence", "--signal", "term", "--segments", "1")
    assert rc == 4 and report["verdict"] == "contract_broken", (rc, report, err[-2000:])
    assert report["final_loss_hex"]["uninterrupted"] == report["final_loss_hex"]["resumed"], report
    assert [(i["steps_done"], i["resumed_from"], i["steps_lost"]) for i in report["interruptions"]] == [
        (6, 6, 0),
        (11, 9, 2),
    ], report["interruptions"]


def test_the_human_report_of_a_graceful_stop_that_lost_steps(tmp_path) -> None:
    spec = {
        "name": "toy",
        "steps": 12,
        "checkpoint_every": 3,
        "trainer": {"command": ["python", str(TOY)]},
        "config": {"bad": "term-train-on"},
    }
    (tmp_path / "toy.json").write_text(json.dumps(spec))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(tmp_path / "toy.json"),
            "--home",
            str(tmp_path),
            "--signal",
            "term",
            "--kills",
            "1",
            "--seed",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    lines = p.stdout.splitlines()
    assert p.returncode == 4 and lines[0] == "toy: CONTRACT BROKEN after 1 interruption(s)", p.stdout + p.stderr[-2000:]
    assert "a graceful stop lost 2 step(s)" in lines[1], lines
    assert "2 step(s) lost (graceful: none allowed)" in lines[2], lines


def test_the_human_output_is_one_line_naming_the_rule(tmp_path) -> None:
    spec = {
        "name": "toy",
        "steps": 12,
        "checkpoint_every": 3,
        "trainer": {"command": ["python", str(TOY)]},
        "config": {"bad": "term-exit0"},
    }
    (tmp_path / "toy.json").write_text(json.dumps(spec))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(tmp_path / "toy.json"),
            "--home",
            str(tmp_path),
            "--signal",
            "term",
            "--kills",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 4 and "EXACT" not in p.stdout, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines()[0] == "toy: CONTRACT BROKEN (nothing compared)", p.stdout
    assert "trainer broke the contract (SIGTERM)" in p.stdout.splitlines()[1]


def test_a_schedule_over_steps_is_exact_under_kills_but_caught_in_segments(tmp_path) -> None:
    rc, report, err = verify(tmp_path, "schedule-over-steps", "--signal", "kill", "--segments", "3")
    assert rc == 1 and report["verdict"] == "not_exact", err[-2000:]
    assert report["interruptions"] and report["segments"]["ends"] == [4, 8, 12] and not report["segments"]["exact"]
    assert report["first_differing_step"] == 2 and report["suspects"] == ["segments"], report  # lr(2) uses steps
    assert "step 2 is the first that differs, inside the first segment (its spec says steps 4)" in report["diagnosis"]
    assert "(the learning rate differs)" in report["diagnosis"]
    assert (
        "the trajectory depends on the spec's steps" in report["diagnosis"] and "run.run_steps" in report["diagnosis"]
    )


def _train(home: Path, spec: dict) -> subprocess.CompletedProcess:
    path = home / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return subprocess.run(
        [sys.executable, "-m", "ctl.cli", "train", "--spec", str(path), "--home", str(home), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_ctl_train_says_once_when_the_trainer_is_unverified_and_not_after_an_exact_verdict(tmp_path) -> None:
    spec = {
        "name": "toy",
        "steps": 6,
        "seed": 0,
        "checkpoint_every": 3,
        "trainer": {"command": ["python", str(TOY)]},
        "config": {"bad": ""},
    }
    p = _train(tmp_path, {**spec, "name": "fresh"})  # never verified
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count("unverified for this trainer") == 1 and "ctl verify-resume --spec" in p.stderr, p.stderr
    (tmp_path / "toy.json").write_text(json.dumps(spec))
    v = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "verify-resume",
            "--spec",
            str(tmp_path / "toy.json"),
            "--home",
            str(tmp_path),
            "--kills",
            "1",
            "--signal",
            "kill",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert v.returncode == 0, v.stdout + v.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / ".ctl/verified").glob("*.json")]
    assert [r["verdict"] for r in records] == ["exact"], records
    p = _train(tmp_path, {**spec, "steps": 9})  # the same trajectory and code: verified (steps may change)
    assert p.returncode == 0 and "unverified" not in p.stderr, p.stderr[-2000:]
    p = _train(tmp_path, {**spec, "name": "other", "config": {"bad": "", "step_s": 0.01}})  # another trajectory
    assert p.returncode == 0 and "unverified for this trainer" in p.stderr, p.stderr[-2000:]
    for name, verdict in (("fresh", "unverified"), ("toy", "exact"), ("other", "unverified")):  # status/show say it
        for cmd in ("status", "show"):
            out = _ctl(tmp_path, cmd, f"train/{name}", "--json")
            assert out["resume_proof"]["verdict"] == verdict, (name, cmd, out)
            text = subprocess.run(
                [sys.executable, "-m", "ctl.cli", cmd, f"train/{name}", "--home", str(tmp_path)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=60,
            ).stdout
            want = (
                "resume proof: unverified" if verdict == "unverified" else "resume proof: ctl verify-resume said EXACT"
            )
            assert want in text, (name, cmd, text)


def _ctl(home, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ctl.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_a_trainer_refusing_the_contracts_arguments_fails_once_with_one_line_not_retried(tmp_path) -> None:
    script = tmp_path / "configurator.py"  # nanoGPT-style: every argument must be --key=value
    script.write_text("import sys\nfor arg in sys.argv[1:]:\n    assert arg.startswith('--') and '=' in arg, arg\n")
    spec = {"name": "cfg", "steps": 4, "trainer": {"command": ["python", str(script)]}}
    p = _train(tmp_path, spec)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "trainer broke the contract (arguments): on its first attempt it exited 1" in p.stdout + p.stderr
    assert "--spec FILE --home DIR" in p.stdout + p.stderr
    hist = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "history", "train/cfg", "--json", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    starts = [e for e in json.loads(hist.stdout)["events"] if e["type"] == "activity_started"]
    assert len(starts) == 1, starts  # not retried


@pytest.mark.parametrize(
    "bad, suspects, words",
    [
        ("read-ahead", ["data/read-ahead"], "the loader reads 1 batch(es) ahead of the step"),
        # a position that restarts and an unregistered generator that restarts from its seed give the same batches:
        ("plain-cursor", ["cursor", "rng/data"], "keep it in run.cursor"),
        ("unregistered-shuffle", ["cursor", "rng/data"], "register it: run.track(generators={'data': g})"),
        ("draw-after-restore", ["rng"], "DataLoader.__iter__"),
    ],
)
def test_each_real_data_mistake_gets_its_own_fix(tmp_path, bad, suspects, words) -> None:
    rc, report, err = verify(tmp_path, bad, "--signal", "kill", "--kills", "1", "--segments", "1")
    assert rc == 1 and report["verdict"] == "not_exact", err[-2000:]
    resumed = report["interruptions"][0]["resumed_from"]
    assert resumed > 0 and report["first_differing_step"] == resumed + 1, report
    assert report["suspects"] == suspects and words in report["diagnosis"], report["diagnosis"]
