"""One installed command per job (pyproject's [project.scripts]), each answering --help outside an
activated venv; the analysis/ scripts are the same commands, and with a python that lacks
critbatch they say so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
ANALYSIS_SCRIPTS = sorted((REPO / "analysis").glob("*.py"))
BIN = Path(sys.executable).parent  # .venv/bin: where `pip install -e .` put the commands


def test_every_job_has_a_command():
    for name in ("train", "sweep", "report", "fit", "recommend", "stability", "schedules",
                 "branch-check", "local-cbs", "peers", "noise"):
        assert f"critbatch-{name}" in SCRIPTS, name
    assert SCRIPTS["critbatch-report"] == "critbatch.report:main"
    for script in ANALYSIS_SCRIPTS:  # each analysis/<name>.py is a study's command: one main()
        study = "bcrit" if script.stem == "fit_bcrit" else script.stem
        target = f"critbatch.analysis.{study}.cli:main"
        assert target in SCRIPTS.values(), f"{script.name}: no console script runs {target}"
        assert f"from critbatch.analysis.{study}.cli import main" in script.read_text()


@pytest.mark.parametrize("command", sorted(SCRIPTS))
@pytest.mark.slow
def test_each_command_answers_help_outside_the_venv(command, tmp_path):
    path = BIN / command
    assert path.exists(), f"{path} is missing: `pip install -e .` (make install) installs it"
    clean = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(path), "--help"], cwd=tmp_path, env=clean, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # argparse's usage, or the Hydra app's own help (conf/hydra/help/critbatch.yaml)
    assert "usage:" in proc.stdout or proc.stdout.startswith(f"{command} (python -m ")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("script", ANALYSIS_SCRIPTS, ids=lambda p: p.name)
def test_a_python_without_critbatch_gets_one_line_naming_the_venv(script, tmp_path):
    """-I -S: no site-packages (where critbatch is installed), no PYTHONPATH, no script dir."""
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "No module named 'critbatch'" in proc.stderr
    assert f".venv/bin/python analysis/{script.name}" in proc.stderr
    assert "make install" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_hung_test_fails_by_name(tmp_path):
    """pytest-timeout (pyproject's `timeout`) stops a test that hangs and names it, instead of
    CI's own limit killing the whole suite."""
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_that_hangs():\n"
                                           "    time.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--timeout", "2", str(tmp_path / "test_hang.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "Timeout" in proc.stdout and "test_that_hangs" in proc.stdout, proc.stdout[-2000:]
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < ini["timeout"] <= 1800
