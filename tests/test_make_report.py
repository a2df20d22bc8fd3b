"""`make report` (`python -m critbatch.sweep report`): every sweep under runs/ re-analysed
without training, each report where its sweep writes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from critbatch.analysis.bcrit.synthetic import synthetic_sweep

COMMANDS = {"sweep report": [sys.executable, "-m", "critbatch.sweep", "report"],
            "critbatch-report": [str(Path(sys.executable).parent / "critbatch-report")]}


def report(cwd, command: str = "sweep report"):
    return subprocess.run(COMMANDS[command], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_report_reanalyses_every_sweep_found(tmp_path, command):
    """`make report`'s module and the installed `critbatch-report` command, end to end."""
    synthetic_sweep(tmp_path / "runs" / "batch", sweep="smoke", batch_sizes=(64, 256))
    synthetic_sweep(tmp_path / "runs" / "widths", sweep="cpu", batch_sizes=(64,))
    proc = report(tmp_path, command)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs/batch/smoke/report/report.md").exists()
    assert (tmp_path / "runs/widths/cpu/report/fits.json").exists()
    assert "2/2 reports written" in proc.stdout
    assert not list(tmp_path.rglob("metrics.jsonl"))  # nothing trained


@pytest.mark.slow
def test_report_without_sweeps_is_one_line(tmp_path):
    proc = report(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no sweep folders under runs/" in proc.stderr and "make sweep-batch" in proc.stderr
