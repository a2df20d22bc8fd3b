"""results/files.py: the one atomic, durable write every layer uses."""

from __future__ import annotations

import os
import stat

import pytest

from critbatch.results import files


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), files.atomic_open(path) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_write_fsyncs_the_file_and_then_its_folder(tmp_path, monkeypatch):
    """The rename is durable only once the folder is fsynced: planted fault, the folder's
    fsync dropped (a power cut could undo a finished run's summary.json)."""
    synced = []
    real = os.fsync

    def record(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    files.write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert synced == ["file", "folder"]
    assert (tmp_path / "a.json").read_text() == '{\n  "x": 1\n}\n'
    synced.clear()
    with files.atomic_path(tmp_path / "by_name.txt") as tmp:  # a library saving by name
        tmp.write_text("saved")
    assert synced == ["file", "folder"] and (tmp_path / "by_name.txt").read_text() == "saved"
