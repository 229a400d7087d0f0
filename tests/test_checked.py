"""The code is checked: ruff's lint, ruff's format check and mypy report nothing (issue 41 item 5).

Fast lane and CI (.ci/run runs every test but soak). The rules and the type checker's settings live in
pyproject.toml ([tool.ruff], [tool.mypy]) with the reasons for each choice; `ruff check .` and `mypy` at
the repository root give the same answers as these tests. mypy keeps its cache in .mypy_cache/, so a
second run takes seconds (a first, cold one about a minute on 2 loaded cores).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_ruff_lint_finds_nothing() -> None:
    """Every Python file of the repository (packages, tests, bench, examples) under the rules of [tool.ruff]."""
    done = _run("ruff", "check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff check . reported:\n{done.stdout}{done.stderr}"


def test_ruff_format_leaves_everything_as_it_is() -> None:
    """Every Python file as `ruff format` writes it (line length 120). Import order is not enforced: several
    modules must set the environment or a signal mask before an import (torch, the runtime settings)."""
    done = _run("ruff", "format", "--check", ".")
    assert done.returncode == 0, f"ruff format --check . would reformat:\n{done.stdout}{done.stderr}"


def test_mypy_checks_every_package() -> None:
    """[tool.mypy] files names every installed package, so that a new package is type-checked from day one."""
    packages = {p.rstrip("*") for p in _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    checked = set(_pyproject()["tool"]["mypy"]["files"])
    assert packages == checked, f"[tool.mypy] files {sorted(checked)} != the packages {sorted(packages)}"


def test_mypy_finds_no_type_error(mypy_result: tuple[int, str]) -> None:
    """The packages under mypy's settings in [tool.mypy] (check_untyped_defs: the bodies of unannotated
    functions too). A finding is printed with its file, line and error code."""
    returncode, output = mypy_result  # started in the background at collection (tests/conftest.py)
    assert returncode == 0, f"mypy reported:\n{output}"
