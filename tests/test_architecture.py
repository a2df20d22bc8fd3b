"""The package's shape: three layers with one-way imports, and code that fits on a screen.

    science/   pure maths (numpy/scipy); imports nothing of critbatch above it, never torch
    training/  may use science/, the results format (analysis/results.py) and files.py
    analysis/  reads results; never imports torch or training/

Every import is counted, the ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "critbatch"
MAX_FUNCTION_LINES = 150
MAX_MODULE_LINES = 800
SCIENCE_MAY_IMPORT = {"__future__", "collections", "dataclasses", "functools", "itertools",
                      "math", "typing", "warnings", "numpy", "scipy"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (`from a import b` gives a.b when a.b is a
    module of the package, else a)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "critbatch" else None


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "science"])
def test_science_is_pure_maths(module):
    bad = [i for i in imports_of(MODULES[module])
           if i.split(".")[0] not in SCIENCE_MAY_IMPORT and layer(i) != "science"]
    assert not bad, f"{module} imports {bad}: science/ takes numpy and scipy only"
    source = MODULES[module].read_text()
    assert "open(" not in source, f"{module} opens files: science/ does no I/O"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "analysis"])
def test_analysis_never_imports_torch_or_training(module):
    bad = [i for i in imports_of(MODULES[module])
           if i.split(".")[0] == "torch" or layer(i) == "training"
           or i in ("critbatch.bench", "critbatch.sweep", "critbatch.train", "critbatch.noise")]
    assert not bad, f"{module} imports {bad}: analysis/ reads results only"


def test_no_import_cycles():
    graph = {m: {i for i in imports_of(p) if i in MODULES and i != m}
             for m, p in MODULES.items()}
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycle = path[path.index(n):] + [n] if n in path else [m, n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_functions_and_modules_fit_on_a_screen():
    long_modules, long_functions = [], []
    for name, path in MODULES.items():
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{name} ({source.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines >= MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name} ({lines} lines)")
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions of {MAX_FUNCTION_LINES}+ lines: {long_functions}"
