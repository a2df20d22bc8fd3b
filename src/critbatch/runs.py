"""The run-results format, shared by the trainer (writer) and the analysis (reader).

A run directory holds:

- `summary.json`  final results (keys in `SUMMARY_KEYS`), written atomically at the end;
- `metrics.jsonl` one line per optimizer step (`step, tokens, lr, train_loss, grad_norm, time_s`);
- `config.json`   the resolved config, and Hydra's `.hydra/` (composed config, overrides);
- `checkpoint.pt` the final model weights and the config that built them;
- `wandb/`        the W&B run (offline unless logger.mode=online);
- `noise.json`    optional: the gradient noise scale measured by `python -m critbatch.noise`.

Units: losses in nats/token unless the name ends in `_per_byte`; batch sizes in
sequences; `tokens` counts training tokens seen.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from critbatch.errors import ResultsError

SCHEMA_VERSION = 1
STATUSES = ("completed", "diverged")

SUMMARY_KEYS = (
    "schema_version", "status", "sweep", "seed", "optimizer", "lr", "width", "depth", "heads",
    "seq_len", "vocab_size", "params", "params_nonembedding", "batch_size", "micro_batch_size",
    "steps", "tokens", "warmup_steps", "schedule", "bytes_per_token", "val_loss",
    "val_loss_per_byte", "curve", "wall_time_s", "tokens_per_s", "data_name",
    "data_fingerprint", "git_revision", "critbatch_version",
)
CURVE_KEYS = ("step", "tokens", "val_loss", "val_loss_per_byte")

# noise.json (python -m critbatch.noise). B_noise in sequences unless `_tokens`; when the
# |G|^2 estimate is not positive, `resolved` is false and the b_noise fields are null.
NOISE_KEYS = (
    "schema_version", "step", "tokens", "seq_len", "micro_batches", "micro_batch_size",
    "val_loss", "val_loss_per_byte", "g2", "trace", "b_noise", "b_noise_tokens",
    "b_noise_low", "b_noise_high", "resolved",
)


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


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The per-step rows of `metrics.jsonl`; a torn last line (killed writer) is ignored."""
    rows = []
    with open(Path(run_dir) / "metrics.jsonl") as handle:
        for line in handle:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def validate_summary(summary: Any, where: str = "summary.json") -> dict:
    """Check a summary's keys and basic types; raise ResultsError naming what is wrong."""
    if not isinstance(summary, dict):
        raise ResultsError(f"{where} is not a JSON object; delete it and rerun the run")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ResultsError(f"{where} lacks {', '.join(missing)}; rerun the run to rewrite it")
    if summary["schema_version"] != SCHEMA_VERSION:
        raise ResultsError(
            f"{where} has schema_version {summary['schema_version']}, expected {SCHEMA_VERSION}"
        )
    if summary["status"] not in STATUSES:
        raise ResultsError(f"{where} has status {summary['status']!r}, not one of {STATUSES}")
    curve = summary["curve"]
    if not isinstance(curve, list) or any(
        not isinstance(p, dict) or any(k not in p for k in CURVE_KEYS) for p in curve
    ):
        raise ResultsError(f"{where} has a malformed curve; rerun the run to rewrite it")
    return summary


def read_summary(run_dir: str | Path) -> dict:
    """Load and validate `<run_dir>/summary.json`."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path} does not exist; the run has not finished") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} is not valid JSON ({err}); delete it and rerun") from None
    return validate_summary(summary, str(path))


def read_noise(run_dir: str | Path) -> dict | None:
    """Load and validate `<run_dir>/noise.json`; None when the run has none."""
    path = Path(run_dir) / "noise.json"
    if not path.exists():
        return None
    try:
        noise = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} is not valid JSON ({err}); rerun make noise") from None
    if not isinstance(noise, dict):
        raise ResultsError(f"{path} is not a JSON object; rerun `make noise RUN=...`")
    missing = [k for k in NOISE_KEYS if k not in noise]
    if missing:
        raise ResultsError(f"{path} lacks {', '.join(missing)}; rerun `make noise RUN=...`")
    return noise


def is_finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def git_revision() -> str:
    """The source tree's commit, with `-dirty` when it has uncommitted changes; else 'unknown'."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages that decide a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("critbatch", "torch", "numpy", "tokenizers", "hydra-core", "omegaconf"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
