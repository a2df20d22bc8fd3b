"""Whether a sweep's report is up to date: a fingerprint of what its analysis reads.

A sweep rerun that trained nothing would otherwise analyse the same runs again (minutes at
gpu scale). The fingerprint covers every run's results files (path, size, modification time:
summary.json, noise.json, config.json), the analysis command's arguments, and the code that
turns them into a report (the analysis scripts and the `analysis`, `science` and `results`
packages), so a new run, a re-measured B_noise or an edited analysis each make the report
stale. It is written beside the report (`inputs.sha256`) only after an analysis succeeded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from critbatch.results.files import write_text_atomic

RESULT_FILES = ("summary.json", "noise.json", "config.json")
STAMP = "inputs.sha256"
PACKAGE = Path(__file__).parents[1]  # src/critbatch
ANALYSIS_CODE = ("analysis", "science", "results")  # the packages a report is computed by


def fingerprint(folders: list[str], args: list[str], scripts: Path) -> str:
    """The sha256 of the analysis inputs in `folders`, its `args` and the analysis code."""
    h = hashlib.sha256("\0".join(args).encode())
    for folder in sorted(folders):
        for name in RESULT_FILES:
            for path in sorted(Path(folder).rglob(name)):
                if "report" in path.relative_to(folder).parts:
                    continue
                stat = path.stat()
                h.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    code = [*scripts.glob("*.py"),
            *(path for package in ANALYSIS_CODE for path in (PACKAGE / package).rglob("*.py"))]
    for path in sorted(code):
        name = path.relative_to(scripts if path.is_relative_to(scripts) else PACKAGE)
        h.update(str(name).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def up_to_date(out: Path, stamp: str) -> bool:
    """The report in `out` was written from exactly these inputs."""
    try:
        return (out / "report.md").is_file() and (out / STAMP).read_text().strip() == stamp
    except OSError:
        return False


def record(out: Path, stamp: str) -> None:
    write_text_atomic(out / STAMP, stamp + "\n")
