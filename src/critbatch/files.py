"""Atomic file writes shared by every layer (run results, caches, reports)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temporary file in the same folder, fsync it, then rename over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump(obj, handle, indent=2, allow_nan=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def append_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Append rows as JSON lines and flush them to disk."""
    if not rows:
        return
    with open(path, "a") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
        handle.flush()
        os.fsync(handle.fileno())
