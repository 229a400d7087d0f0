"""ctl's read commands import only what they use (issue 42 item 4): ``ctl status``, ``list``, ``history``,
``show`` and ``--version`` load no torch, no rich (they draw nothing), no pydantic (no request is built), no
optional SDK (temporalio, mlflow, opentelemetry, transformers, lightning), and none of our own costly modules
(the workflows' and the spec's pydantic models, the engine's running side). bench/cli.py measures the time;
this pins what is imported, which does not depend on the machine's load.

How: a fresh interpreter (only a new process shows what a command path imports: this one has imported
everything already) runs the commands in-process through ``ctl.cli.main`` and prints ``sys.modules``; one
process for all of them keeps it in the fast lane (~1 s). The home is a synthetic TrainRun history written
in the engine's own schema (tests/ui/synth.py): no trainer is run, which is not the point here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NOT_FOR_READERS = (
    "torch",
    "numpy",
    "rich",
    "pydantic",
    "pydantic_core",
    "temporalio",
    "mlflow",
    "opentelemetry",
    "transformers",
    "lightning",
    "jinja2",
    "matplotlib",
    "workflows.models",
    "workflows.release",
    "tinyllm.spec",
    "engine._engine",
    "engine._worker",
    "engine._subprocess_runner",
    "importlib.metadata",
    "multiprocessing",
    "ctl.doctor",
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
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    return out["codes"], out["modules"]


def forbidden(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_READERS if n not in allowed)
    )


def test_read_commands_import_nothing_heavy(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "ui"))
    try:
        import synth  # the UI tests' synthetic homes: a TrainRun history in the engine's own schema
    finally:
        sys.path.remove(str(ROOT / "tests" / "ui"))
    home = tmp_path / "home"
    w = synth.Writer(home)
    try:
        wid = synth.train_run(w, "small", segments=3)
    finally:
        w.close()
    h = ["--home", str(home)]
    commands = [
        ["status", *h],
        ["status", wid, "--json", *h],
        ["list", *h],
        ["list", "--json", *h],
        ["history", wid, *h],
        ["history", wid, "--json", *h],
        ["show", wid, *h],
        ["show", wid, "--json", *h],
        ["status", "nope/1", *h],
    ]
    codes, modules = loaded_by(commands)
    nope = " ".join(commands[-1])
    assert {k: v[0] for k, v in codes.items()} == {**{" ".join(c): 0 for c in commands}, nope: 2}, codes
    assert "train/small: completed; 30 steps in 3 segment(s)" in codes[" ".join(commands[6])][1]
    assert "engine._reader" in modules  # the commands did read the database
    assert forbidden(modules) == []
    codes, modules = loaded_by([["--version"]])  # the installed metadata: importlib.metadata, nothing else
    assert codes["--version"][0] == 0 and "ctl (durable-train)" in codes["--version"][1], codes
    assert forbidden(modules, allowed=("importlib.metadata",)) == []
