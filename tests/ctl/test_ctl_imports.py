"""ctl's read commands import only what they use (issue 42 item 4): ``ctl status``, ``list``, ``history``,
``show`` and ``--version`` load no torch, no rich (they draw nothing), no pydantic (no request is built), no
optional SDK (temporalio, mlflow, opentelemetry, transformers, lightning), and none of our own costly modules
(the workflows' and the spec's pydantic models, the engine's running side). bench/cli.py measures the time;
this pins what is imported, which does not depend on the machine's load.

How: a fresh interpreter (only a new process shows what a command path imports: this one has imported
everything already) runs the commands in-process through ``ctl.cli.main`` and prints ``sys.modules``. The
fast test's home is an engine database made here with the engine itself (one finished workflow: no trainer
is run, which is not the point); the slow one reads the finished real run of tests/ctl/conftest.py,
``show`` included.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NOT_FOR_READERS = (
    "torch", "numpy", "rich", "pydantic", "pydantic_core", "temporalio", "mlflow", "opentelemetry",
    "transformers", "lightning", "jinja2", "matplotlib",
    "workflows.models", "workflows.release", "tinyllm.spec", "engine._engine", "engine._worker",
    "engine._subprocess_runner", "importlib.metadata", "multiprocessing", "ctl.doctor",
)
"""Packages and modules no read command may load (a name and everything under it)."""

CHILD = r"""
import contextlib, io, json, sys
from ctl.cli import main
codes = {}
for args in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            main.main(args, standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = e.code
    codes[" ".join(args)] = [code, out.getvalue(), err.getvalue()]
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def loaded_by(commands: list[list[str]]) -> tuple[dict, list[str]]:
    """Run ``commands`` (ctl argument lists) in one fresh interpreter: their (exit code, stdout, stderr) and
    every module it loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CTL_HOME", None)
    env.pop("CTL_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    return out["codes"], out["modules"]


def forbidden(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_READERS
                                            if n not in allowed))


async def _count(rt, n):  # noqa: ANN001, ANN202 - a workflow of the engine's seam
    return n + 1


def test_status_list_history_and_version_import_nothing_heavy(tmp_path: Path) -> None:
    from engine import Engine

    home = tmp_path / "home"
    (home / ".ctl").mkdir(parents=True)
    with Engine(home / ".ctl" / "engine.db") as engine:
        engine.register_workflow("Count", _count)
        engine.start("Count", "count/1", 1)
        engine.run_until_complete("count/1")
    h = ["--home", str(home)]
    commands = [["status", *h], ["status", "count/1", *h], ["status", "count/1", "--json", *h],
                ["list", *h], ["list", "--json", *h], ["history", "count/1", *h], ["history", "count/1", "--json", *h],
                ["status", "nope/1", *h]]
    codes, modules = loaded_by(commands)
    assert {k: v[0] for k, v in codes.items()} == {**{" ".join(c): 0 for c in commands}, f"status nope/1 {h[0]} {h[1]}": 2}
    assert "count/1 (Count): completed" in codes[f"status count/1 {h[0]} {h[1]}"][1]
    assert "engine._reader" in modules  # the commands did read the database
    assert forbidden(modules) == []
    codes, modules = loaded_by([["--version"]])  # the installed metadata: importlib.metadata, nothing else
    assert codes["--version"][0] == 0 and "ctl (durable-train)" in codes["--version"][1], codes
    assert forbidden(modules, allowed=("importlib.metadata",)) == []


@pytest.mark.slow
def test_show_and_status_of_a_real_run_import_nothing_heavy(finished_home: Path) -> None:
    h = ["--home", str(finished_home)]
    commands = [["show", "train/mini", *h], ["show", "train/mini", "--json", *h], ["status", "train/mini", *h],
                ["status", "train/mini", "--json", *h], ["history", "train/mini", *h], ["status", *h]]
    codes, modules = loaded_by(commands)
    assert {k: v[0] for k, v in codes.items()} == {" ".join(c): 0 for c in commands}, codes
    assert "train/mini" in codes[f"show train/mini {h[0]} {h[1]}"][1]
    assert forbidden(modules) == []
