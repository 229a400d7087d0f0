"""Issue 40 item 10: click's usage errors and pydantic's wording become ONE ``ctl:`` line in the project's own
words, exit 2, nothing written, for every command (ctl/cli_common.py ``CtlGroup``; tinyllm/spec.py's
``format_validation_error`` for spec values). Real ``ctl`` processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_helpers import SPEC, ctl, one_line_error, snapshot, write_json

pytestmark = pytest.mark.slow  # real ctl processes

CASES = {
    "missing --spec": (["train"], ["ctl: train: --spec FILE is required", "ctl train --help"]),
    "heartbeat 0": (
        ["train", "--spec", "spec.json", "--heartbeat-timeout", "0"],
        ["--heartbeat-timeout 0", "must be at least 1 (seconds)"],
    ),
    "unknown command": (["statsu"], ["unknown command 'statsu' (did you mean status?)", "commands: cancel,"]),
    "unknown option": (["list", "--jsn"], ["list: unknown option --jsn (did you mean --json?)"]),
    "choice": (
        ["verify-resume", "--spec", "spec.json", "--signal", "x"],
        ["--signal x: must be one of kill, term, both"],
    ),
    "not an integer": (["train", "--spec", "spec.json", "--eval-seed", "abc"], ["--eval-seed abc: must be an integer"]),
    "extra argument": (["status", "train/a", "train/b"], ["status: unexpected argument 'train/b'"]),
    "release range": (
        ["release", "train/mini", "--suite", "ppl", "--eval-max-items", "0"],
        ["release: --eval-max-items 0: must be at least 1"],
    ),
    "global choice": (["--backend", "nope", "list"], ["--backend nope: must be one of embedded, temporal"]),
    "a flag's value": (["status", "--json=3"], ["status: --json takes no value"]),
    "eval items": (
        ["eval", "--suite", "ppl", "--subject", "a=ck", "--max-items", "0"],
        ["invalid eval request: --max-items: must be at least 1, got 0"],
    ),
}

SPEC_CASES = {
    "bound": ({**SPEC, "steps": 0}, ["invalid train spec: steps: must be at least 1, got 0"]),
    "validator": (
        {**SPEC, "model": {**SPEC["model"], "n_embd": 9, "n_head": 2}},
        ["invalid train spec: model: n_embd (9) must be a multiple of n_head (2)"],
    ),
    "top level": (
        {**SPEC, "distributed": {"world_size": 2}, "batch_size": 3},
        ["invalid train spec: distributed: batch_size 3 is not a multiple of world_size 2"],
    ),
    "name": (
        {**SPEC, "name": "bad name!"},
        ['name: "bad name!" is not a valid name (use letters, digits and . _ -, starting with a letter or digit)'],
    ),
}
LEAKS = ("Usage:", "Error:", "Try '", "Value error", "(top level)", "Input should", "String should match", "^[")


def _check(proc, needles: list[str]) -> None:
    err = one_line_error(proc, 2, *needles)
    assert err.startswith("ctl: "), err
    assert not any(leak in err for leak in LEAKS), err


@pytest.mark.parametrize("case", sorted(CASES))
def test_click_usage_errors_are_one_ctl_line(tmp_path: Path, case: str) -> None:
    args, needles = CASES[case]
    write_json(tmp_path / "spec.json", SPEC)
    (tmp_path / "ck").mkdir()
    before = snapshot(tmp_path)
    _check(ctl(tmp_path, *args), needles)
    assert snapshot(tmp_path) == before  # nothing written (no database, no runs/)


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_spec_values_are_said_in_the_projects_words(tmp_path: Path, case: str) -> None:
    spec, needles = SPEC_CASES[case]
    write_json(tmp_path / "spec.json", spec)
    before = snapshot(tmp_path)
    _check(ctl(tmp_path, "train", "--spec", str(tmp_path / "spec.json")), needles)
    assert snapshot(tmp_path) == before


def test_help_and_version_still_exit_0(tmp_path: Path) -> None:
    for args in (["train", "--help"], ["list", "--help"]):
        proc = ctl(tmp_path, *args)
        assert proc.returncode == 0 and "Usage: ctl" in proc.stdout, proc.stderr


def test_an_option_without_its_value_names_the_command(tmp_path: Path) -> None:
    """The option last on the line (bi_helpers.ctl would append --home after it, as its value)."""
    import subprocess
    import sys

    from bi_helpers import env

    proc = subprocess.run(
        [sys.executable, "-m", "ctl.cli", "train", "--spec"],  # home: the cwd
        capture_output=True,
        text=True,
        env=env(),
        cwd=tmp_path,
        timeout=120,
    )
    _check(proc, ["ctl: train: --spec needs a value; see `ctl train --help`"])
