"""Find strays: the run home's layout, its exit codes and its activity-id grammar spelled outside contracts/.

Static (ast; nothing is imported). A stray is, outside docstrings and a CLI option's ``help=`` text:

- a layout name joined as a path (``x / "ckpt"``, ``/ "runs" /``) or the literal ``"ckpt"``, ``"LATEST"``,
  ``"manifest.json"``, ``"checkpoint_artifacts"``; a string with a ``/ckpt/`` or ``runs/`` path in it;
- a checkpoint directory name formatted by hand (``f"step-{s:06d}"``);
- an exit code of the contract written as a number: ``EXIT_X = 75``, ``sys.exit(130)``, ``returncode == 143``,
  ``rc in (2, 74)``;
- an activity id formatted or parsed by hand: ``"train-"`` / ``"eval-"`` / ``"corpus-"`` literals, or an
  f-string that starts with one.

Run this file directly to print every stray found.
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("engine", "workflows", "app", "ctl", "tinyllm", "simulator")
PATH_NAMES = {
    "runs",
    "ckpt",
    "LATEST",
    "manifest.json",
    "checkpoint_artifacts",
    "metrics.jsonl",
    "corpora",
    "releases",
    "evals",
    ".ctl",
    "activity",
    "engine.db",
}
LITERALS = {"LATEST", "manifest.json", "checkpoint_artifacts"}  # "ckpt" is also a ledger kind: as a path only
PATH_IN_TEXT = re.compile(r"(^|/)ckpt/|^runs/|/runs/")
EXIT_CODES = {2, 74, 75, 130, 143}
EXIT_WORDS = re.compile(r"returncode|exit|\brc\b|code")
ID_PREFIXES = ("train-", "eval-", "corpus-")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _int(node: ast.AST) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def strays_in(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each stray in one file."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    skip = _docstrings(tree) | {
        id(k.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        for k in n.keywords
        if k.arg == "help" and isinstance(k.value, ast.Constant)
    }  # a CLI's help: docs
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in PATH_NAMES:
                    out.append((node.lineno, f"path joined with {side.value!r}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in LITERALS and id(node) not in in_fstring:
                out.append((node.lineno, f"literal {node.value!r}"))
            elif PATH_IN_TEXT.search(node.value):
                out.append((node.lineno, f"home path in text {node.value[:40]!r}"))
            elif node.value in ID_PREFIXES and id(node) not in in_fstring:
                out.append((node.lineno, f"activity-id prefix {node.value!r}"))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for a, b in itertools.pairwise(parts):
                if isinstance(a, ast.Constant) and str(a.value).endswith("step-") and isinstance(b, ast.FormattedValue):
                    out.append((node.lineno, "step directory name formatted by hand"))
            if (
                parts
                and isinstance(parts[0], ast.Constant)
                and str(parts[0].value).startswith(ID_PREFIXES)
                and len(parts) > 1
            ):
                out.append((node.lineno, f"activity id formatted by hand ({parts[0].value!r}...)"))
        elif isinstance(node, ast.Assign) and _int(node.value) in EXIT_CODES | {0, 1, 3, 4}:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any(n.startswith("EXIT_") for n in names):
                out.append((node.lineno, f"exit code {_int(node.value)} defined again ({names[0]})"))
        elif isinstance(node, ast.Call) and node.args and _int(node.args[0]) in EXIT_CODES:
            fn = ast.unparse(node.func)
            if fn in ("sys.exit", "os._exit", "exit", "SystemExit"):
                out.append((node.lineno, f"{fn}({_int(node.args[0])})"))
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("Path", "os.path.join", "PurePath")
            and any(isinstance(a, ast.Constant) and a.value in PATH_NAMES for a in node.args)
        ):
            out.append((node.lineno, f"path built with {ast.unparse(node.func)}(...) of layout names"))
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(c, ast.Constant) and c.value in PATH_NAMES for c in node.comparators)
            and ast.unparse(node.left).endswith(".name")
        ):
            out.append((node.lineno, "a folder's name compared with a layout name"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            nums = [_int(s) for s in sides] + [
                _int(e) for s in sides if isinstance(s, (ast.Tuple, ast.Set, ast.List)) for e in s.elts
            ]
            codes = [n for n in nums if n in EXIT_CODES]
            if codes and any(EXIT_WORDS.search(ast.unparse(s)) for s in sides if _int(s) is None):
                out.append((node.lineno, f"exit code {codes[0]} compared as a number"))
    return sorted(out)


def scan() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for pkg in SCANNED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            s = strays_in(path)
            if s:
                found[str(path.relative_to(ROOT))] = s
    return found


def counts() -> Counter[str]:
    return Counter({f: len(s) for f, s in scan().items()})


if __name__ == "__main__":
    total = 0
    for f, items in scan().items():
        for line, what in items:
            print(f"{f}:{line}: {what}")
        total += len(items)
    if "--counts" in sys.argv:
        print({f: n for f, n in sorted(counts().items())})
    print(f"{total} strays")
