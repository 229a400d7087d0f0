"""ctl's edges without training: bad input (exit 2, one message, nothing written), starting
and attaching (--detach: nothing runs), refusing a different spec under the same name, and
the read commands (status, list, history) on a real database. In process, via click's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctl.cli import main

SPEC = {
    "name": "mini",
    "steps": 24,
    "eval_every": 12,
    "checkpoint_every": 3,
    "batch_size": 4,
    "threads": 1,
    "model": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
}


def run(home: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [*args, "--home", str(home)], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def write_spec(home: Path, file: str = "spec.json", **over) -> Path:
    p = home / file
    p.write_text(json.dumps({**SPEC, **over}))
    return p


def files_under(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*")}


BAD_TRAIN = {
    "missing file": (lambda h: ["train", "--spec", str(h / "nope.json")], "not found"),
    "not json": (lambda h: ["train", "--spec", str(_raw(h, "{name: "))], "not valid JSON"),
    "no name": (lambda h: ["train", "--spec", str(_raw(h, json.dumps({"steps": 5})))], "name"),
    "bad name": (lambda h: ["train", "--spec", str(write_spec(h, file="s.json", **{"name": "../up"}))], "name"),
    "negative eval_every": (
        lambda h: ["train", "--spec", str(write_spec(h, file="s.json", eval_every=-1))],
        "eval_every",
    ),
    "unknown suite": (lambda h: ["train", "--spec", str(write_spec(h, file="s.json")), "--suite", "nosuch"], "nosuch"),
    "suite and no-eval": (
        lambda h: ["train", "--spec", str(write_spec(h, file="s.json")), "--suite", "ppl", "--no-eval"],
        "--no-eval",
    ),
    "missing corpus spec": (
        lambda h: ["train", "--spec", str(write_spec(h, file="s.json")), "--corpus-spec", str(h / "nope.json")],
        "not found",
    ),
    "malformed corpus spec": (
        lambda h: ["train", "--spec", str(write_spec(h, file="s.json")), "--corpus-spec", str(_raw(h, "[1, "))],
        "not valid JSON",
    ),
    "corpus spec of another corpus": (
        lambda h: [
            "train",
            "--spec",
            str(write_spec(h, file="s.json")),
            "--corpus-spec",
            str(_raw(h, json.dumps({"name": "other"}))),
        ],
        "'default'",
    ),
    "bad eval-max-items": (
        lambda h: ["train", "--spec", str(write_spec(h, file="s.json")), "--eval-max-items", "0"],
        "--eval-max-items",
    ),
    "spec is a list": (lambda h: ["train", "--spec", str(_raw(h, "[]"))], "spec"),
}


def _raw(home: Path, text: str) -> Path:
    p = home / "raw.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize("case", sorted(BAD_TRAIN))
def test_bad_train_input_exits_2_and_writes_nothing(tmp_path: Path, case: str) -> None:
    args, needle = BAD_TRAIN[case]
    argv = args(tmp_path)
    before = files_under(tmp_path)
    code, out, err = run(tmp_path, *argv)
    assert code == 2, (code, out, err)
    assert needle in err and err.startswith("ctl: ") and len(err.strip().splitlines()) == 1, err
    assert files_under(tmp_path) == before  # no database, no run directory


def test_read_commands_need_a_database(tmp_path: Path) -> None:
    for args in (["status"], ["list"], ["history", "train/mini"], ["cancel", "train/mini"]):
        code, _, err = run(tmp_path, *args)
        assert code == 2 and "no ctl database" in err
    assert files_under(tmp_path) == set()


def test_detach_attach_and_different_spec_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--detach", "--json")
    assert code == 0, err
    assert json.loads(out)["workflow_id"] == "train/mini" and json.loads(out)["state"] == "running"
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--detach")
    assert code == 0 and "attached to train/mini" in err

    other = write_spec(tmp_path, file="other.json", seed=99)
    code, out, err = run(tmp_path, "train", "--spec", str(other), "--detach")
    assert code == 2 and "different" in err and "spec.seed" in err, err
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--suite", "ppl", "--detach")
    assert code == 0 and "attached to train/mini" in err  # ppl is the default suite: the same request
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--no-eval", "--detach")
    assert code == 2 and '--suite/--no-eval: [] now, ["ppl"] when started' in err, err
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--eval-seed", "3", "--detach")
    assert code == 2 and "--eval-seed: 3 now, 0 when started" in err, err  # it picks the evaluated items
    # an operational setting is not the run's identity (issue 27, 2): the run continues, with it
    code, out, err = run(tmp_path, "train", "--spec", str(spec), "--heartbeat-timeout", "10", "--detach")
    assert code == 0 and "attached to train/mini" in err, err
    assert "--heartbeat-timeout 10 s from now on (the run had 60 s)" in err, err

    code, out, _ = run(tmp_path, "status", "train/mini", "--json")
    assert code == 0 and json.loads(out)["state"] == "running"
    code, out, _ = run(tmp_path, "list")
    assert code == 0 and "train/mini" in out and "running" in out
    code, out, _ = run(tmp_path, "history", "train/mini", "--json")
    events = json.loads(out)["events"]
    assert code == 0 and events[0]["type"] == "workflow_started"
    assert events[0]["attrs"]["input"]["spec"]["name"] == "mini"
    assert events[0]["attrs"]["input"]["eval_suites"] == ["ppl"]  # evaluated by default
    code, out, _ = run(tmp_path, "history", "train/mini")
    assert code == 0 and "workflow_started" in out
    code, out, err = run(tmp_path, "history", "train/mini/1", "--json")  # the first workflow itself
    assert code == 0 and json.loads(out)["workflow_id"] == "train/mini", err

    code, out, _ = run(tmp_path, "cancel", "train/mini")
    assert code == 0 and "cancel requested" in out
    code, out, _ = run(tmp_path, "status", "train/mini")
    assert "cancel requested" in out
    assert not (tmp_path / "runs").exists()  # nothing ran: no worker


@pytest.mark.parametrize("command", ["status", "cancel", "history"])
def test_unknown_and_malformed_ids(tmp_path: Path, command: str) -> None:
    spec = write_spec(tmp_path)
    run(tmp_path, "train", "--spec", str(spec), "--detach")
    for wid, needle in (("train/nosuch", "no workflow"), ("../etc", "malformed")):
        code, out, err = run(tmp_path, command, wid)
        assert code == 2 and needle in err and err.startswith("ctl: ") and len(err.strip().splitlines()) == 1, err
        assert out == ""
    code, out, _ = run(tmp_path, "status", "train/mini", "--json")
    assert json.loads(out)["cancel_requested"] is False  # the bad cancel touched nothing


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["list"],
        ["history", "train/mini"],
        ["cancel", "train/mini"],
        ["worker"],
        ["train", "--spec", "spec.json", "--detach"],
        ["eval", "--suite", "ppl", "--subject", "a=ckpt"],
    ],
)
def test_corrupt_database_is_one_line_exit_2_and_left_untouched(tmp_path: Path, args: list[str]) -> None:
    write_spec(tmp_path)
    (tmp_path / "ckpt").mkdir()
    db = tmp_path / ".ctl" / "engine.db"
    db.parent.mkdir()
    garbage = b"this is not a database, but somebody's file\n" * 10
    db.write_bytes(garbage)
    args = [str(tmp_path / a) if a == "spec.json" else a for a in args]
    code, out, err = run(tmp_path, *args)
    assert code == 2 and "not an SQLite database" in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err
    assert db.read_bytes() == garbage and sorted(p.name for p in db.parent.iterdir()) == ["engine.db"]


COMMANDS = ["train", "eval", "cancel", "status", "list", "history", "show", "plot", "worker"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_explains_itself(command: str) -> None:
    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert "Exit codes:" in text and ("Example:" in text or "Examples:" in text), text
    assert f"ctl {command}" in text  # the example is a command line
    assert "--home" in text and "$CTL_HOME" in text


def test_ctl_help_names_every_command_and_the_exit_codes() -> None:
    r = CliRunner().invoke(main, ["--help"])
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "Exit codes:" in text and "ctl train --spec specs/tiny.json" in text
    assert all(c in text for c in COMMANDS)
    train_help = " ".join(CliRunner().invoke(main, ["train", "--help"]).stdout.split())
    assert "Default: ppl" in train_help and "--no-eval" in train_help


@pytest.mark.parametrize(
    "args,needle",
    [
        (["eval", "--suite", "ppl", "--subject", "no-equals-sign"], "ID=CHECKPOINT"),
        (["eval", "--suite", "ppl", "--subject", "a=runs/x/ckpt/step-000001"], "not found"),
        (["eval", "--suite", "bogus", "--subject", "a=b"], "bogus"),
        (["eval", "--suite", "ppl", "--subject", "a=b", "--name", "../x"], "eval name"),
        (["eval", "--suite", "ppl", "--subject", "../x=b"], "subject id"),
        (["eval", "--suite", "ppl", "--subject", "a="], "ID=CHECKPOINT"),
        (["eval", "--suite", "ppl", "--subject", "a=b", "--tag", "a/b"], "tag"),
    ],
)
def test_bad_eval_input(tmp_path: Path, args: list[str], needle: str) -> None:
    code, _, err = run(tmp_path, *args)
    assert code == 2 and needle in err, err
    assert files_under(tmp_path) == set()


def test_version_prints_package_and_torch_versions_without_importing_torch():
    import subprocess
    import sys
    from importlib.metadata import version

    code = (
        "import sys; from ctl.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n"
        "    print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(e.code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(Path(__file__).parents[2])
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"ctl (durable-train) {version('durable-train')}, torch {version('torch')}",
        "no torch",
    ], proc.stdout
