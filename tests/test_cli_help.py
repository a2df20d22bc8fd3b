"""`critbatch-train` before any training: tab completion without torch, a `--help` that
starts with what the command does and its units, every bad value of a multirun named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("critbatch-train")


def _imported(args: list[str], cwd: Path, env: dict | None = None) -> tuple[set[str], str]:
    """(top-level modules the console script imported, its stdout), from `-X importtime`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), *args], cwd=cwd,
                          text=True, capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip() for line in lines}, proc.stdout


def test_tab_completion_does_not_import_torch(tmp_path):
    """A completion query runs on every Tab: torch (about a second to import) stays out."""
    modules, out = _imported(["-sc", "query=bash"], tmp_path,
                             {"COMP_LINE": "critbatch-train optim.l"})
    assert "optim.lr=" in out.split() and "optim.lr_scaling=" in out.split()
    assert "hydra" in modules and "torch" not in modules
    assert not (tmp_path / "runs").exists()
