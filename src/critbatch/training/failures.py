"""Why a run failed, written in its own folder: `failed.txt`, one line beside its train.log.

The run folder is what every process of a sweep shares -- the sweep's workers, a Hydra
launcher's jobs, SLURM array tasks on other nodes -- so the sweep reads why a run did not
complete from there, not from a file in one machine's temp folder. The line says when and on
which host, so a reason left by an earlier attempt can be told from a fresh one; a run that
starts again in the sweep's workers clears it, and a run with a summary.json is finished
whatever the file says.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

FAILED_NAME = "failed.txt"


def record(run_dir: Path, reason: str) -> None:
    """Write `reason` (made one line) as the run's failure; a folder that cannot be written
    (a full disk, the failure itself) is left as it is."""
    line = " ".join(str(reason).split()) or "failed (see its train.log)"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / FAILED_NAME).write_text(f"{stamp} on {os.uname().nodename}: {line}\n")


def clear(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (run_dir / FAILED_NAME).unlink(missing_ok=True)


def reason(run_dir: Path) -> str | None:
    """The run's recorded failure ("<when> on <host>: <why>"), or None."""
    try:
        return (run_dir / FAILED_NAME).read_text().strip() or None
    except OSError:
        return None
