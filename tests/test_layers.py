"""The layers of the project, read from its source: no import cycle (imports inside functions
count: a local import hides a loop, it does not remove it), lower layers never import upper ones,
the predictor never imports the runner, the modules every report reads import without torch, and a
project module imported inside a function says why (a heavy package deferred, a cycle broken).
Each failure names the import that breaks the rule, as file:line."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("suite", "analysis", "cli", "leaderboard")
ABOVE = {"suite": ("analysis", "leaderboard", "cli"), "analysis": ("leaderboard", "cli"), "leaderboard": ("cli",)}
"""Each layer and the layers above it, which it never imports (`suite` < `analysis` < `leaderboard`
< the commands)."""
PREDICTOR = "suite.predict"
RUNNER = (
    "suite.launch",
    "suite.runner",
    "suite.worker",
    "suite.engines",
    "suite.cluster",
    "suite.slurm",
    "suite.tracking",
    "suite.calibrate",
    "suite.microbench",
    "suite.warm",
)
"""What runs processes and trials: the pure predictor reaches none of them, even through others."""
LIGHT = (
    "suite.record",
    "suite.store",
    "suite.config",
    "suite.stats",
    "suite.labels",
    "suite.metrics",
    "suite.methods",
    "suite.models.arch",
    "suite.predict",
)
"""Modules that every report, the leaderboard and the search read: importing one imports no torch."""


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.source} imports {self.target})"


@cache
def modules() -> dict[str, Path]:
    """Every module of the project's packages by its dotted name (a package by its __init__.py)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _owner(name: str) -> str | None:
    """The project's module that `name` (a module, or a name in one) belongs to."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


@cache
def imports() -> tuple[Import, ...]:
    """Every import of a project module by a project module, at any depth (functions, classes,
    TYPE_CHECKING blocks), with the packages it runs on the way (`_with_packages`); but of a
    module's own package or an enclosing one (which Python has begun to import already)."""
    found = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            seen = set()
            for name in _targets(node, module, path.name == "__init__.py"):
                for target in _with_packages(_owner(name)):
                    if target == module or module.startswith(target + ".") or target in seen:
                        continue
                    seen.add(target)
                    found.append(Import(module, target, path, node.lineno))
    return tuple(found)


def _with_packages(module: str | None) -> list[str]:
    """`module` and the packages around it, whose __init__.py an import of it runs first."""
    if module is None:
        return []
    parts = module.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules()]


def _graph() -> dict[str, list[Import]]:
    graph: dict[str, list[Import]] = {m: [] for m in modules()}
    for imp in imports():
        graph[imp.source].append(imp)
    return graph


def _cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            for imp in edges:
                w = imp.target
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_import_graph_is_read_whole():
    """The walk sees the project (a guard for the tests below: an empty graph has no cycle)."""
    names = {(imp.source, imp.target) for imp in imports()}
    assert ("suite.store", "suite.record") in names  # a top-level import
    assert ("suite.worker", "suite.engines") in names  # an import inside a function
    assert ("suite.models.build", "suite.models.arch") in names
    assert {m.partition(".")[0] for m in modules()} == set(PACKAGES)


def test_no_import_cycle():
    graph = _graph()
    problems = []
    for component in _cycles(graph):
        inside = [str(imp) for m in component for imp in graph[m] if imp.target in component]
        problems.append(f"cycle {' <-> '.join(component)}:\n    " + "\n    ".join(inside))
    assert not problems, "\n".join(problems)


def _local_imports() -> list[tuple[Path, int, list[str]]]:
    """Every import of a project module inside a function (benchmarks too), with its source lines
    and the lines of the import block above it in the same function."""
    found = []
    for path in sorted(p for pkg in (*PACKAGES, "benchmarks") for p in (ROOT / pkg).rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                if not any(n.partition(".")[0] in (*PACKAGES, "benchmarks") for n in names):
                    continue
                first = node.lineno - 1
                while first > 0 and lines[first - 1].strip().startswith(("import ", "from ", "#")):
                    first -= 1  # the block this import belongs to, and a comment above it
                found.append((path, node.lineno, lines[first : node.end_lineno]))
    return found


def test_local_imports_of_the_project_say_why():
    """A project module imported inside a function hides the dependency graph; it is there only to
    defer a heavy package (torch, matplotlib) or to break a named cycle, and says so in a comment
    on its line or on its import block."""
    found = _local_imports()
    assert any(path.name == "worker.py" for path, _, _ in found)  # the walk sees them
    silent = [f"{path.relative_to(ROOT)}:{line}" for path, line, block in found if not any("#" in b for b in block)]
    assert not silent, "function-local project imports without a reason:\n" + "\n".join(silent)


def test_lower_layers_never_import_upper_ones():
    wrong = [
        str(imp) for imp in imports() if imp.target.partition(".")[0] in ABOVE.get(imp.source.partition(".")[0], ())
    ]
    assert not wrong, "a layer imports one above it (suite < analysis < leaderboard < cli):\n" + "\n".join(wrong)


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_predictor_never_reaches_the_runner():
    """No chain of imports leads from `suite.predict` to what runs trials: each offending chain
    is named import by import."""
    graph = _graph()
    wrong = []
    for start in (m for m in graph if _under(m, PREDICTOR)):
        chain: dict[str, list[Import]] = {start: []}
        todo = [start]
        while todo:
            for imp in graph[todo.pop()]:
                if imp.target in chain:
                    continue
                chain[imp.target] = chain[imp.source] + [imp]
                if any(_under(imp.target, r) for r in RUNNER):
                    wrong.append(" -> ".join(str(i) for i in chain[imp.target]))
                else:
                    todo.append(imp.target)
    assert not wrong, "the predictor reaches the runner:\n" + "\n".join(sorted(set(wrong)))


WATCH = """
import importlib, os, sys, traceback

root, module, packages = sys.argv[1], sys.argv[2], sys.argv[3:]
ours = tuple(os.path.join(root, p) + os.sep for p in packages)


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":  # the first import of torch: the project's imports on the way to it
            chain = [f"{os.path.relpath(f.filename, root)}:{f.lineno}" for f in traceback.extract_stack()
                     if f.filename.startswith(ours)]
            print(" -> ".join(chain) or "no import of the project's")
            sys.stdout.flush()
            os._exit(3)
        return None


sys.meta_path.insert(0, Watch())
importlib.import_module(module)
"""


@pytest.mark.parametrize("module", LIGHT)
def test_light_modules_import_without_torch(module):
    """In a fresh process, importing the module imports no torch; where it does, the chain of
    the project's imports that led there (outermost first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-c", WATCH, str(ROOT), module, *PACKAGES]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 3, f"import {module} imports torch: {out.stdout.strip()}"
    assert out.returncode == 0, out.stderr[-2000:]
