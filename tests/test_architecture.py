"""The package's shape: three layers with one-way imports, and code that fits on a screen.

    science/   pure maths (numpy/scipy); imports nothing of critbatch above it, never torch
    training/  may use science/, the results format (results/runs.py) and files.py
    analysis/  reads results; never imports torch or training/

Every import is counted, the ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "critbatch"
MAX_FUNCTION_LINES = 150
MAX_MODULE_LINES = 600
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


def is_entry_point(module: str) -> bool:
    return (module.startswith("critbatch.") and module.count(".") == 1 and module in MODULES
            and MODULES[module].name != "__init__.py")


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) in ("analysis", "peers")])
def test_analysis_never_imports_torch_or_training(module):
    bad = [i for i in imports_of(MODULES[module])
           if i.split(".")[0] == "torch" or is_entry_point(i)
           or layer(i) in ("training", "orchestration", "bench")]
    assert not bad, f"{module} imports {bad}: analysis/ and peers/ read results only"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "results"])
def test_the_results_contract_imports_no_party_to_it(module):
    bad = [i for i in imports_of(MODULES[module])
           if i.split(".")[0] in ("critbatch", "torch") and layer(i) not in ("results", "science")]
    assert not bad, f"{module} imports {bad}: results/ is below training and analysis"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "training"])
def test_training_writes_results_without_reading_analysis(module):
    bad = [i for i in imports_of(MODULES[module])
           if is_entry_point(i) or layer(i) in ("analysis", "peers", "orchestration", "bench")]
    assert not bad, f"{module} imports {bad}: training/ uses only science/ and results/"


def test_only_commands_at_the_top():
    """Every module at the top of the package is a command; the code lives in packages."""
    loose = [m for m in MODULES if is_entry_point(m)
             and 'if __name__ == "__main__"' not in MODULES[m].read_text()
             and not m.endswith("__main__")]
    assert not loose, f"modules at the top of src/critbatch/ that are no command: {loose}"


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


EXTRAS_ONLY = {"datasets": "hub"}  # imported only on the path that needs it, named in its error


def declared(extra: str | None = None) -> set[str]:
    """The distributions pyproject.toml declares: its dependencies, or one extra's."""
    import re
    import tomllib

    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    specs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-")
            for spec in specs}


def test_every_imported_package_is_a_declared_dependency():
    """`pip install .` brings every package the code imports (none only by chance, through
    another's dependencies), and an extra's package is imported only where it is asked for:
    planted fault, an import of a package no dependency names, or a private torch module."""
    import sys
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    third_party = {}
    for name, path in MODULES.items():
        for imported in imports_of(path):
            top = imported.split(".")[0]
            if top != "critbatch" and top not in sys.stdlib_module_names:
                third_party.setdefault(top, set()).add(name)
            assert not any(part.startswith("_") and part != "__future__"
                           for part in imported.split(".")[1:]) or top == "critbatch", \
                f"{name} imports the private module {imported}"
    core = declared()
    for top, users in sorted(third_party.items()):
        dist = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
        if top in EXTRAS_ONLY:
            assert dist & declared(EXTRAS_ONLY[top]), top
            assert users == {"critbatch.training.corpus"}, (top, users)
            continue
        assert dist & core, f"{top} (imported by {sorted(users)[0]}) is no direct dependency"


def test_one_atomic_write_helper():
    """Files appear whole through results/files.py alone (`atomic_path`: fsync of the file and
    of its folder): planted fault, a module renaming its own temporary file."""
    for name, path in MODULES.items():
        source = path.read_text()
        if name != "critbatch.results.files":
            assert not any(call in source for call in ("os.replace(", "os.rename(", ".rename(")), \
                f"{name} renames a file itself: write it with results.files.atomic_path"


def test_no_percentile_hard_codes_a_level():
    """Every central interval comes from science/intervals.py, which takes the confidence
    level: planted fault, an `np.percentile(x, [2.5, 97.5])` anywhere else."""
    import re

    for name, path in MODULES.items():
        if name == "critbatch.science.intervals":
            continue
        source = path.read_text()
        assert "np.percentile(" not in source, f"{name}: use science.intervals.percentile_band"
        assert not re.search(r"np\.quantile\([^)]*,\s*\[?\s*0?\.\d", source), \
            f"{name}: a quantile at a literal level; name the level"


def test_central_percentiles_take_the_level():
    import numpy as np

    from critbatch.science.intervals import central_percentiles, percentile_band

    assert central_percentiles(0.95) == pytest.approx((2.5, 97.5))
    assert central_percentiles(0.68) == pytest.approx((16.0, 84.0))
    low, high = percentile_band(np.arange(1001.0), 0.9)
    assert (low, high) == pytest.approx((50.0, 950.0))
    band = percentile_band(np.outer(np.arange(101.0), [1.0, 2.0]), 0.5, axis=0)
    assert np.allclose(band, [[25.0, 50.0], [75.0, 150.0]])
    with pytest.raises(ValueError, match="between 0 and 1"):
        central_percentiles(95)


# scipy.stats's import takes about half a second of a process's start-up: the analysis takes
# its distributions from science/distributions.py (scipy.special); Bartlett's test alone, in
# the local-CBS seed comparison, still imports it
SCIPY_STATS_USERS = {"critbatch.science.local_cbs_seeds"}


def test_only_bartletts_test_imports_scipy_stats():
    users = {m for m, path in MODULES.items()
             if any(i == "scipy.stats" or i.startswith("scipy.stats.") for i in imports_of(path))}
    assert users == SCIPY_STATS_USERS, (
        f"{sorted(users - SCIPY_STATS_USERS)} import scipy.stats: take the distribution from "
        "critbatch.science.distributions")
