"""Atomic file writes shared by every layer (run results, caches, reports)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file in the same folder, fsync it, then rename over `path`:
    a reader sees the old file or the whole new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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
