"""`make wandb-sync` (critbatch.wandb_sync): every offline W&B run not yet uploaded, under runs/,
report folders written anywhere in the checkout or in DIRS; nothing to upload needs no login."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from critbatch import wandb_sync

REPO = Path(__file__).resolve().parents[1]


def fake_run(folder: Path, run_id: str, synced: bool = False) -> Path:
    """An offline run as W&B leaves it: wandb/offline-run-<time>-<id>/run-<id>.wandb."""
    run = folder / "wandb" / f"offline-run-20250101_000000-{run_id}"
    run.mkdir(parents=True)
    (run / f"run-{run_id}.wandb").write_bytes(b"")
    if synced:
        (run / f"run-{run_id}.wandb.synced").write_bytes(b"")
    return run


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout's folder with runs of every kind; the current directory."""
    root = tmp_path / "checkout"
    fake_run(root / "runs/batch/cpu/optim=adamw,train.batch_size=8", "train1")
    fake_run(root / "runs/batch/cpu/report", "report1", synced=True)
    fake_run(root / "my_reports/fit", "outside1")  # analysis --out my_reports/fit
    fake_run(root / ".venv/lib/wandb_tests", "venv1")  # never searched
    elsewhere = tmp_path / "scratch"
    fake_run(elsewhere / "fit", "dirs1")
    monkeypatch.chdir(root)
    return root, elsewhere


def test_runs_anywhere_in_the_checkout_and_in_dirs_are_found_once(checkout):
    _, elsewhere = checkout
    found = wandb_sync.offline_runs([Path("."), Path("runs"), elsewhere])
    names = sorted(p.name.rsplit("-", 1)[1] for p in found)
    assert names == ["dirs1", "outside1", "report1", "train1"]  # runs/ searched twice, kept once
    to_upload = sorted(p.name.rsplit("-", 1)[1] for p in found if not wandb_sync.uploaded(p))
    assert to_upload == ["dirs1", "outside1", "train1"]


def test_runs_behind_a_linked_runs_folder_are_found(tmp_path, monkeypatch):
    disk = tmp_path / "disk" / "runs"
    fake_run(disk / "batch/cpu/a", "linked1")
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / "runs").symlink_to(disk)
    monkeypatch.chdir(tmp_path / "checkout")
    assert [p.name for p in wandb_sync.offline_runs([Path("."), Path("runs")])] == [
        "offline-run-20250101_000000-linked1"]


def test_each_run_to_upload_is_named_and_handed_to_wandb_sync(checkout, monkeypatch, capsys):
    _, elsewhere = checkout
    calls = []
    monkeypatch.setattr(wandb_sync.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert wandb_sync.main([str(elsewhere)]) == 0
    (command,) = calls
    assert Path(command[0]).name == "wandb" and command[1] == "sync"
    assert sorted(Path(p).name.rsplit("-", 1)[1] for p in command[2:]) == [
        "dirs1", "outside1", "train1"]
    out = capsys.readouterr().out
    assert "3 offline W&B run(s) to upload (1 already uploaded)" in out
    assert "my_reports/fit/wandb/offline-run-20250101_000000-outside1" in out


def test_nothing_to_upload_needs_no_login_and_says_so(tmp_path):
    """Through make, in a folder whose only run is uploaded, with W&B unconfigured: exit 0."""
    fake_run(tmp_path / "runs/a", "done1", synced=True)
    env = {**os.environ, "HOME": str(tmp_path), "WANDB_API_KEY": ""}
    proc = subprocess.run([sys.executable, "-m", "critbatch.wandb_sync"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("wandb-sync: nothing to upload (1 offline W&B run(s) under "
                                   ". runs/, all uploaded)")
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-o", "install", "wandb-sync",
                          "DIRS=/data/reports"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert dry.stdout.strip().endswith("-m critbatch.wandb_sync /data/reports")


def test_a_real_offline_run_is_found(tmp_path, monkeypatch):
    """What W&B itself writes for an analysis report (`dir=<report folder>`) matches."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", project="critbatch", dir=str(tmp_path / "report"),
                     settings=wandb.Settings(console="off", silent=True))
    run.log({"x": 1.0})
    run.finish()
    (found,) = wandb_sync.offline_runs([Path(".")])
    assert found.parent == Path("report/wandb") and not wandb_sync.uploaded(found)


def test_a_missing_dirs_folder_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert wandb_sync.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder" in err
