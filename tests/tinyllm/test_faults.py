"""tinyllm/faults.py: every fault point declared there is used in production code and reachable (armed,
it fires: a real SIGKILL in a real process); ``TINYLLM_FAULT``'s grammar is enforced (an unknown name
or a retired variable is one line, exit 2, nothing written); the hold point holds only at its step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tinyllm import faults
from tinyllm.durable import DurableError, DurableRun

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("fault_points_driver.py")


@pytest.fixture(autouse=True)
def disarmed():
    faults.arm(None)
    yield
    faults.arm(None)  # nothing armed leaks into the next test of this process


def test_the_grammar_arms_named_points_and_refuses_everything_else() -> None:
    assert faults.parse(
        "checkpoint.between_renames@4, retention.after_rename@6#0,durable.fingerprint,"
        "durable.checkpoint_write@armed:a/b"
    ) == {
        "checkpoint.between_renames": "4",
        "retention.after_rename": "6#0",
        "durable.fingerprint": "",
        "durable.checkpoint_write": "armed:a/b",
    }
    assert faults.parse("") == {}
    for bad, says in [
        ("checkpoint.between_rename@4", "unknown fault point 'checkpoint.between_rename'"),
        ("checkpoint.between_renames@x", "is not of the form checkpoint.between_renames@S"),
        ("retention.after_rename@6", "is not of the form retention.after_rename@S#I"),
        ("trainer.hold", "is not of the form trainer.hold@S"),
        ("durable.fingerprint@1", "is a switch"),
        ("trainer.hold@1,trainer.hold@2", "named twice"),
    ]:
        with pytest.raises(faults.FaultError) as e:
            faults.parse(bad)
        assert says in str(e.value) and "\n" not in str(e.value)


def test_a_bad_value_or_a_retired_variable_arms_nothing(monkeypatch) -> None:
    monkeypatch.setenv(faults.ENV, "trainer.hold@3")
    faults.arm_from_env()
    assert faults.hold(3, lambda: True, lambda: None)
    monkeypatch.setenv(faults.ENV, "trainer.hold@3,typo@1")
    with pytest.raises(faults.FaultError, match="unknown fault point 'typo'"):
        faults.arm_from_env()
    assert not faults.hold(3, lambda: True, lambda: None)
    monkeypatch.setenv(faults.ENV, "trainer.hold@3")
    monkeypatch.setenv("TINYLLM_HOLD_AT", "3")
    with pytest.raises(faults.FaultError, match="TINYLLM_HOLD_AT is retired: use TINYLLM_FAULT=trainer.hold@S"):
        faults.arm_from_env()
    assert not faults.hold(3, lambda: True, lambda: None)


def test_the_helper_refuses_a_misspelled_fault_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(faults.ENV, "durable.checkpoint_writes@1")
    with pytest.raises(DurableError, match="unknown fault point 'durable.checkpoint_writes'"):
        DurableRun({"name": "d", "steps": 2}, home=tmp_path)
    spec = tmp_path / "d.json"
    spec.write_text(json.dumps({"name": "d", "steps": 2}))
    with pytest.raises(SystemExit) as e:
        DurableRun.from_args(["--spec", str(spec), "--home", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("durable: TINYLLM_FAULT: unknown fault point") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_hold_holds_at_its_step_only_and_lets_go_on_stop() -> None:
    calls: list[str] = []
    never = lambda: calls.append("asked") or False  # noqa: E731
    assert not faults.hold(6, never, lambda: calls.append("alive"))  # unarmed: no hold (would never end)
    faults.arm("trainer.hold@6")
    assert not faults.hold(5, never, lambda: calls.append("alive"))  # another step: no hold
    assert calls == []  # nothing asked either (on distributed ranks a stop check is a collective)
    polls = iter([False, False, True])
    assert faults.hold(6, lambda: next(polls), lambda: calls.append("alive"))
    assert calls == ["alive", "alive"]  # held, alive, until the stop request


def production_uses() -> dict[str, int]:
    """Fault point name -> how many call sites name it in tinyllm/ and workflows/ (outside faults.py;
    workflows/release.py's publish activity has the release points)."""
    uses: dict[str, int] = {}
    for path in [*(ROOT / "tinyllm").rglob("*.py"), *(ROOT / "workflows").rglob("*.py")]:
        if path.name == "faults.py" and path.parent.name == "tinyllm":
            continue
        text = path.read_text(encoding="utf-8")
        # faults.point("x.y"), or a point hook that defaults to faults.point (workflows/release.py's publish)
        for name in re.findall(r"(?:faults\.(?:point|switch|fires)|\bpoint)\(\s*\"([a-z_]+\.[a-z_]+)\"", text):
            uses[name] = uses.get(name, 0) + 1
        uses["trainer.hold"] = uses.get("trainer.hold", 0) + len(re.findall(r"faults\.hold\(", text))
        for name in re.findall(r"faults\.hold_at\(\s*\"([a-z_]+\.[a-z_]+)\"", text):  # eval.hold, corpus.hold
            uses[name] = uses.get(name, 0) + 1
        for call, name in (("hold_validation", "validation.hold"), ("hold_write", "checkpoint.hold_write")):
            uses[name] = uses.get(name, 0) + len(re.findall(rf"faults\.{call}\(", text))
        assert not re.search(r"environ[^\n]*(_KILL|HOLD_AT|DURABLE_FAULT|FINGERPRINT|TINYLLM_FAULT)", text), path
    return {k: v for k, v in uses.items() if v}


def test_every_declared_point_is_used_and_every_used_point_declared() -> None:
    uses = production_uses()
    assert set(uses) == set(faults.POINTS), "declare a new point in tinyllm/faults.py POINTS, and reach it below"


@pytest.mark.slow  # one real process (torch imported once), forked once per point
def test_every_declared_point_fires_in_a_real_process(built_corpus: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    subprocess.run([sys.executable, str(DRIVER), str(built_corpus), str(tmp_path)], env=env, check=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    # the release points fire in ctl's publish activity, not in a trainer: tests/ctl/test_ctl_selection.py
    # kills a real `ctl release` at each of them
    # the stop tests' hold points are not kills: each is reached by a real signal in its own test
    # (tests/tinyllm/test_polite_stop.py, test_stop_eval_corpus.py, tests/validation/test_val_stop.py)
    holds = {"validation.hold", "checkpoint.hold_write", "eval.hold", "corpus.hold"}
    trainer_points = {p for p in faults.POINTS if not p.startswith("release.") and p not in holds}
    kills = [p for p in trainer_points if p not in ("trainer.hold", "durable.fingerprint")]
    assert {p.split(" ")[0] for p in report} == trainer_points  # a case for every declared trainer point
    for name in kills + ["durable.checkpoint_write armed"]:
        assert report[name]["signal"] == signal.SIGKILL, (
            name,
            report[name],
            (Path(report[name]["home"]) / "child.log").read_text(),
        )
    armed = report["durable.checkpoint_write armed"]["files"]
    assert any(f.startswith("arm.fired-") for f in armed) and "arm" not in armed  # claimed by the rename
    assert report["durable.checkpoint_write"]["frames_with_state"] == 0  # the switch is off unless named
    fingerprint = report["durable.fingerprint"]
    assert fingerprint["exit"] == 0 and fingerprint["frames_with_state"] == 4  # a state in each step's frame
    held = report["trainer.hold"]  # of 40 steps, still at step 2 a second after reaching it; SIGTERM: 130
    assert (held["exit"], held["latest_after_1s"], held["latest_after_stop"]) == (130, "step-000002", "step-000002")


@pytest.mark.slow  # a real tinyllm train: refused before anything is written
def test_tinyllm_train_refuses_a_misspelled_fault_in_one_line(home: Path) -> None:
    spec = home / "s.json"
    spec.write_text(
        json.dumps(
            {
                "name": "s",
                "steps": 2,
                "threads": 1,
                "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
            }
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, faults.ENV: "checkpoint.between_rename@4"},
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("tinyllm: TINYLLM_FAULT: unknown fault point 'checkpoint.between_rename'")
    assert p.stderr.count("\n") == 1 and p.stdout == ""
    assert not (home / "runs").exists()
