"""No import circles, and no import running back up: the module graph of the imports (ast, nothing is
imported); and the engine's one front door: outside ``engine/``, code imports ``engine`` (its
``__init__``), its documented testing door ``engine.testing`` (for the simulator and tests) or the
optional ``engine.temporal`` subpackage, never a private ``engine._*`` module.

An edge ``a -> b`` is an import statement in ``a``'s module body (not inside a function: those
are the lazy ones, counted by the ``with-in-function-imports`` cases) of module ``b``, also one under
``if TYPE_CHECKING:`` (it never runs, but it ties the two files as much as any import: a circle hidden
behind it is still a circle); ``from p import n`` is an edge to ``p.n`` when that is a module, else to
``p`` (its ``__init__``). A circle is a strongly connected component of more than one module (or a
module importing itself). An import runs back up when the files and subfolders of one folder, each
taken whole, import each other in a circle (as ``tinyllm/spec.py`` once imported ``tinyllm/objectives/config.py``
while ``tinyllm/objectives/common.py`` imported ``tinyllm/spec.py``: no circle of files, but the folder
``objectives/`` stood both above and below ``spec.py``). Run this file directly to print both.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contracts", "engine", "workflows", "app", "ctl", "simulator", "tinyllm")


@functools.cache  # one parse per session: the graph is read by every test here (none changes it)
def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module, lazy: bool = False, typing: bool = True) -> list[ast.Import | ast.ImportFrom]:
    """Import statements of the module body, also under module-level if/try/with (not in defs);
    ``lazy``: also those in functions; ``typing``: also those under ``if TYPE_CHECKING:`` (counted in the
    graph; left out where the question is what a module loads when it runs)."""
    skip = (
        set() if typing else {id(n) for t in ast.walk(tree) if _type_checking(t) for b in t.body for n in ast.walk(b)}
    )
    if lazy:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif _type_checking(node):
            todo.extend(node.orelse if not typing else [*node.body, *node.orelse])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []) or [])
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return found


@functools.cache
def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)), lazy):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            graph[mod].update(t for t in targets if t in mods and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycles_touching(package: str, lazy: bool = False) -> list[list[str]]:
    return [c for c in cycles(import_graph(lazy)) if any(m == package or m.startswith(package + ".") for m in c)]


@pytest.mark.parametrize("lazy", [False, True], ids=["top-level", "with-in-function-imports"])
@pytest.mark.parametrize("package", ["contracts", "app", "ctl", "engine", "workflows", "simulator", "tinyllm"])
def test_no_import_cycles(package: str, lazy: bool) -> None:
    """No circle, also counting imports inside functions (a lazy import must not hide one)."""
    found = cycles_touching(package, lazy)
    for c in found:
        print(f"{package}: import circle: {' <-> '.join(c)}")
    assert not found, f"{package}: {len(found)} import circle(s): {found}"


def _folders() -> list[str]:
    """Every package folder: the top level ('') and each folder of these packages that holds modules."""
    mods = _modules()
    return [
        "",
        *sorted(
            {
                m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
                for m, path in mods.items()
                if "." in m or path.name == "__init__.py"
            }
        ),
    ]


def _child(folder: str, mod: str) -> str | None:
    """The file or subfolder of ``folder`` that holds ``mod`` (None: ``mod`` is outside it, or its
    ``__init__``)."""
    prefix = folder + "." if folder else ""
    if not mod.startswith(prefix) or mod == folder:
        return None
    return prefix + mod[len(prefix) :].split(".")[0]


def runs_back_up(lazy: bool = True) -> dict[str, list[list[str]]]:
    """Per folder, the circles among its files and subfolders (each taken whole): an import that runs back
    up. Counts every import, those under ``if TYPE_CHECKING:`` and (``lazy``) those inside functions."""
    graph, out = import_graph(lazy), {}
    for folder in _folders():
        children: dict[str, set[str]] = {}
        for mod, targets in graph.items():
            a = _child(folder, mod)
            if a is None:
                continue
            children.setdefault(a, set())
            for t in targets:
                b = _child(folder, t)
                if b is not None and b != a:
                    children[a].add(b)
                    children.setdefault(b, set())
        found = cycles(children)
        if found:
            out[folder or "."] = found
    return out


@pytest.mark.parametrize("lazy", [False, True], ids=["top-level", "with-in-function-imports"])
def test_no_import_runs_back_up(lazy: bool) -> None:
    """In every folder, its files and subfolders (each taken whole) import each other without a circle: a
    subfolder is wholly above or wholly below each of its siblings."""
    found = runs_back_up(lazy)
    for folder, circles in found.items():
        for c in circles:
            print(f"{folder}: an import runs back up: {' <-> '.join(c)}")
    assert not found, f"imports running back up (circles of a folder's files and subfolders): {found}"


def test_the_application_layer_sits_under_ctl() -> None:
    """``ctl -> app -> workflows -> engine``: ``app`` imports nothing of ``ctl``, and no click or rich (the
    terminal is ctl's), also inside functions; ``workflows`` and ``engine`` import nothing of ``app``."""
    mods = _modules()
    bad = []
    for mod, path in mods.items():
        top = mod.split(".")[0]
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)), lazy=True):
            for t in _resolve(mod, path.name == "__init__.py", node, mods):
                root = t.split(".")[0]
                if (
                    top == "app"
                    and root in ("ctl", "click", "rich")
                    or top in ("workflows", "engine")
                    and root == "app"
                ):
                    bad.append(f"{mod} -> {t}")
    assert not bad, f"imports against ctl -> app -> workflows -> engine: {sorted(set(bad))}"


def unresolved_imports() -> list[tuple[str, str]]:
    """(module, imported name) for each import, also inside functions, of a module of these packages
    that does not exist (a rename that missed an import: the graph would silently drop the edge)."""
    mods = _modules()
    out = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)), lazy=True):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([base] if base else []))
                names = [
                    base
                    if base in mods or f"{base}.{a.name}" not in mods and not a.name.startswith("_")
                    else f"{base}.{a.name}"
                    for a in node.names
                ]
            out += [(mod, n) for n in names if n.split(".")[0] in PACKAGES and n not in mods]
    return sorted(set(out))


def test_contracts_is_below_everything_and_engine_asks_only_it() -> None:
    """contracts/ (the run home's contract) imports none of the packages; engine imports, of them, only contracts."""
    graph = import_graph(lazy=True)
    up = sorted(
        (m, t)
        for m, ts in graph.items()
        if m.split(".")[0] == "contracts"
        for t in ts
        if t.split(".")[0] != "contracts"
    )
    assert not up, f"contracts/ imports the project: {up}"
    engine_out = sorted(
        (m, t)
        for m, ts in graph.items()
        if m.split(".")[0] == "engine"
        for t in ts
        if t.split(".")[0] not in ("engine", "contracts")
    )
    assert not engine_out, f"engine imports a package above it: {engine_out}"


def test_every_import_of_these_packages_names_a_module_that_exists() -> None:
    missing = unresolved_imports()
    assert not missing, f"imports of modules that do not exist: {missing}"


def _engine_imports_outside() -> set[tuple[str, str]]:
    """(module outside engine/, engine module it imports), counting imports inside functions."""
    graph = import_graph(lazy=True)
    return {
        (m, t)
        for m, targets in graph.items()
        if not (m == "engine" or m.startswith("engine."))
        for t in targets
        if t == "engine" or t.startswith("engine.")
    }


DOORS = ("engine", "engine.testing", "engine.temporal")  # the front door, the testing door, the optional backend


def _door(target: str) -> bool:
    return target in DOORS or target.startswith("engine.temporal.")


def test_outside_engine_only_the_front_door_is_imported() -> None:
    """The simulator reaches the engine's inside through ``engine.testing`` only (no private module)."""
    bad = sorted((m, t) for m, t in _engine_imports_outside() if not _door(t))
    assert not bad, f"import engine's front door (engine/__init__.py) or engine.testing instead: {bad}"


def _private_engine_imports_of_tests() -> list[str]:
    """``file:line: module`` of each import of a private ``engine._*`` module by a test outside tests/engine/
    (the engine's own tests test its inside; every other test goes through a door)."""
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if (ROOT / "tests" / "engine") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" if node.module == "engine" else node.module or "" for a in node.names]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            out += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.startswith("engine._")]
    return sorted(set(out))


def test_tests_outside_the_engine_use_its_doors() -> None:
    bad = _private_engine_imports_of_tests()
    assert not bad, f"tests reaching a private engine module (use engine or engine.testing): {bad}"


def test_engine_modules_are_private() -> None:
    """engine/'s modules but its doors (front, testing; the optional temporal subpackage) start with ``_``."""
    public = sorted(
        m for m in _modules() if m.startswith("engine.") and not _door(m) and not m.rsplit(".", 1)[1].startswith("_")
    )
    assert not public, f"engine modules that look public: {public} (name them engine/_x.py, export from __init__)"


# A function-level import only keeps something heavy or optional out of processes that may not need
# it: the imported module (or what its top-level imports load, transitively) is an optional extra's
# SDK, torch (it must also load after tinyllm.runtime_env.prepare(), which sets what libgomp and MKL
# read), or numpy (optional for the helper); or the one start-up saving measured, listed here.
LAZY_FOR = (
    "torch",
    "numpy",
    "temporalio",
    "mlflow",
    "tensorboard",
    "matplotlib",
    "jinja2",
    "opentelemetry",
    "transformers",
    "lightning",
    "selenium",
    "engine.temporal",
)  # the last: the optional Temporal backend


# Our own modules that are costly to import, kept out of the processes that only read a home (ctl status, list,
# history, show: tests/ctl/test_ctl_imports.py pins it; bench/cli.py measures it): a function may import them (or
# a module loading them) lazily. Measured as process CPU over `import engine, workflows, pydantic` on 2 loaded cores.
SLOW_TO_IMPORT = {
    "workflows.models": "the workflows' pydantic model classes: ~60 ms",
    "workflows.release": "ModelRelease's pydantic models",
    "tinyllm.spec": "the spec's pydantic model classes (objectives, validation, selection): ~100 ms",
    "engine._engine": "the engine's running side (worker loop, replay, attempts): ~20 ms",
    "engine._subprocess_runner": "the activity runner (subprocess, tempfile, process trees)",
    "pydantic": "pydantic_core and the plugin loader: ~15 ms before any model is built",
    "importlib.metadata": "the standard library's (email, zipfile, csv): ~15 ms; only --version and MLflow need it",
}


def _heavy_name(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in LAZY_FOR) or name in SLOW_TO_IMPORT


LAZY_MEASURED = {
    ("ctl.cli", "ctl.display"): "rich costs ~0.2 s of every ctl start; only a followed run's display needs it",
    # engine's front door loads its running side on first use of these names (engine/__init__.py's _LAZY)
    ("app.runs", "engine"): "engine.Engine (worker loop, replay: ~20 ms); a read-only command gets an engine.Reader",
    ("ctl.cli", "engine"): "engine.STOP_SIGNAL_ENV loads the subprocess runner; only a command that runs workflows",
    ("ctl.cli_inspect", "ctl.doctor"): "~9 ms (MLflow sink state: logging, subprocess; run locks: multiprocessing); "
    "only ctl doctor, not status/list/history/show",
    ("tinyllm.sinks.mlflow_sink", "tinyllm.errors"): "~5 ms (tinyllm.stopping: multiprocessing); the trainer's stop "
    "flag, not for ctl show/doctor reading the sink's state",
    ("ctl.restart", "tinyllm.runlock"): "~5 ms (tinyllm.errors -> stopping: multiprocessing); only ctl train --restart",
    ("ctl.release", "tinyllm.eval_figures"): "~5 ms (importlib.resources); only a release's gates",
}


def _resolve(mod: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, mods: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _in_function_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) of each import statement inside a function."""
    mods, out = _modules(), []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        out += [(mod, node.lineno, t) for t in _resolve(mod, path.name == "__init__.py", node, mods)]
    return sorted(set(out))


def _loads_heavy(target: str, mods: dict, cache: dict) -> bool:
    """``target`` is, or at its top level loads (transitively), one of ``LAZY_FOR``."""
    if _heavy_name(target):
        return True
    if target not in mods:
        return False
    if target not in cache:
        cache[target] = False  # a circle ends here (there are none: test_no_import_cycles)
        path = mods[target]
        nodes = _top_level_imports(ast.parse(path.read_text(), str(path)), typing=False)
        cache[target] = any(
            _loads_heavy(t, mods, cache) for n in nodes for t in _resolve(target, path.name == "__init__.py", n, mods)
        )
    return cache[target]


def test_imports_inside_functions_only_keep_an_optional_or_heavy_dependency_lazy() -> None:
    mods, cache = _modules(), {}
    bad = [
        f"{m}:{line}: {t}"
        for m, line, t in _in_function_imports()
        if not _loads_heavy(t, mods, cache) and (m, t) not in LAZY_MEASURED
    ]
    assert not bad, f"imports inside functions that load nothing heavy or optional (move them to the top): {bad}"


def test_every_measured_lazy_import_is_still_made() -> None:
    made = {(m, t) for m, _line, t in _in_function_imports()}
    assert set(LAZY_MEASURED) <= made, sorted(set(LAZY_MEASURED) - made)


if __name__ == "__main__":  # --lazy: count the imports inside functions too
    for pkg in PACKAGES:
        found = cycles_touching(pkg, lazy="--lazy" in sys.argv)
        print(f"{pkg}: {len(found)} circle(s)")
        for c in found:
            print("   ", " <-> ".join(c))
    for folder, circles in runs_back_up(lazy="--lazy" in sys.argv).items():
        for c in circles:
            print(f"{folder}: an import runs back up: {' <-> '.join(c)}")
