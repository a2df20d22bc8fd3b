"""Atomic file writes shared by every layer (run results, caches, reports)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` for the caller to write (by name, as libraries save).
    On a clean exit it is fsynced, renamed over `path`, and the folder fsynced so that the
    rename itself survives a power cut: a reader sees the old file or the whole new one, never
    a torn one. On an error the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """`atomic_path` as a binary file handle: write to it; `path` appears whole on exit."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        yield handle


def fsync_dir(folder: str | Path) -> None:
    """Make a rename in `folder` durable (POSIX: the directory entry lives in the folder)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably (`atomic_open`)."""
    with atomic_open(path) as handle:
        handle.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`write_bytes_atomic` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """JSON (indented, NaN allowed), written atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=True) + "\n")


def append_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Append rows as JSON lines and flush them to disk."""
    if not rows:
        return
    with open(path, "a") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
        handle.flush()
        os.fsync(handle.fileno())
