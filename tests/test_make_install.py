"""`make install TORCH=cuda` (or TORCH_INDEX=<url>): the CUDA build of torch from its wheel index,
the CPU build by default, and a switch noticed by the install stamp. Dry runs (`make -n`) on a
stand-in venv folder: nothing is installed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_INDEX = "https://download.pytorch.org/whl/cu126"


def dry_install(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-n", "install", f"VENV={venv}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def installed_venv(tmp_path: Path, torch_pip: str) -> Path:
    """A venv folder as `make install` leaves it: a python, the torch record, a fresh stamp."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".torch").write_text(torch_pip + "\n")
    stamp = venv / ".installed"
    stamp.touch()
    later = time.time() + 3600  # newer than pyproject.toml
    os.utime(stamp, (later, later))
    return venv


def torch_installs(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if "pip install" in line and "torch" in line]


def test_a_fresh_install_takes_the_cpu_build_or_the_cuda_one(tmp_path):
    (line,) = torch_installs(dry_install(tmp_path / "new"))
    assert line.endswith("pip install --quiet --disable-pip-version-check --no-compile "
                         "torch==2.13.0")
    proc = dry_install(tmp_path / "new", "TORCH=cuda")
    (line,) = torch_installs(proc)
    assert line.endswith(f"torch==2.13.0 --index-url {CUDA_INDEX}")
    assert "uninstall" not in proc.stdout  # nothing to replace
    assert f"echo 'torch==2.13.0 --index-url {CUDA_INDEX}' > {tmp_path / 'new' / '.torch'}" in (
        proc.stdout)


def test_switching_the_build_reinstalls_torch_and_unset_keeps_it(tmp_path):
    cpu = installed_venv(tmp_path / "cpu", "torch==2.13.0")
    for args in ((), ("TORCH=cpu",)):
        assert "pip" not in dry_install(cpu, *args).stdout, args  # the stamp is up to date
    proc = dry_install(cpu, "TORCH=cuda")
    assert "pip uninstall --quiet --yes torch" in proc.stdout  # 2.13.0+cpu satisfies ==2.13.0
    assert torch_installs(proc)[0].endswith(f"--index-url {CUDA_INDEX}")
    assert torch_installs(dry_install(cpu, "TORCH_INDEX=https://example.org/whl/cu130"))[0] \
        .endswith("torch==2.13.0 --index-url https://example.org/whl/cu130")

    cuda = installed_venv(tmp_path / "cuda", f"torch==2.13.0 --index-url {CUDA_INDEX}")
    for args in ((), ("TORCH=cuda",)):  # `make train` after `make install TORCH=cuda`
        assert "pip" not in dry_install(cuda, *args).stdout, args
    proc = dry_install(cuda, "TORCH=cpu")
    assert "pip uninstall --quiet --yes torch" in proc.stdout
    assert torch_installs(proc)[0].endswith("torch==2.13.0")


@pytest.mark.parametrize("value", ["gpu", "cu126"])
def test_an_unknown_torch_is_one_line(tmp_path, value):
    proc = dry_install(tmp_path / "new", f"TORCH={value}")
    assert proc.returncode == 2 and not proc.stdout
    assert f"TORCH={value} is not cpu or cuda" in proc.stderr
