"""The run-results format, shared by the trainer (writer) and the analysis (reader).

A run directory holds:

- `summary.json`  final results (keys in `SUMMARY_KEYS`), written atomically at the end;
- `metrics.jsonl` one line per optimizer step (`step, tokens, batch_size, lr, train_loss,
                  grad_norm, time_s`; `tokens` cumulative, `batch_size` that step's);
- `config.json`   the resolved config, and Hydra's `.hydra/` (composed config, overrides);
- `checkpoint.pt` the model weights, the config that built them and the step, plus the
                  optimizer and loop state a killed run resumes from (training/checkpoint.py);
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
from typing import TYPE_CHECKING, Any

from critbatch.results.errors import ResultsError
from critbatch.results.files import write_text_atomic
from critbatch.science.rules import decay_at

if TYPE_CHECKING:
    from critbatch.science.noise import NoiseEMA

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
CURVE_OPTIONAL_KEYS = ("b_noise",)  # sequences: the online B_noise at the eval (when tracked)

# noise.json (python -m critbatch.noise). B_noise in sequences unless `_tokens`; when the
# |G|^2 estimate is not positive, `resolved` is false and the b_noise fields are null.
NOISE_KEYS = (
    "schema_version", "step", "tokens", "seq_len", "micro_batches", "micro_batch_size",
    "val_loss", "val_loss_per_byte", "g2", "trace", "b_noise", "b_noise_tokens",
    "b_noise_low", "b_noise_high", "resolved",
)


# Types of the required keys (beyond presence), so a hand-edited or foreign file is reported
# as corrupt instead of crashing the analysis or sorting strings among numbers.
NUMBER_KEYS = (
    "seed", "lr", "width", "depth", "heads", "seq_len", "vocab_size", "params",
    "params_nonembedding", "batch_size", "steps", "tokens", "warmup_steps", "bytes_per_token",
    "val_loss", "val_loss_per_byte", "wall_time_s", "tokens_per_s",
)
TEXT_KEYS = ("status", "optimizer", "schedule", "data_name", "data_fingerprint")
NOISE_NUMBER_KEYS = ("step", "tokens", "seq_len", "micro_batches", "micro_batch_size", "val_loss",
                     "val_loss_per_byte", "g2", "trace")
NOISE_OPTIONAL_KEYS = ("b_noise", "b_noise_tokens", "b_noise_low", "b_noise_high")


def is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def wrong_types(record: dict, numbers: tuple, texts: tuple = (), optional: tuple = ()) -> list:
    """'key (value)' for each key whose value has the wrong type: numbers, strings, or
    numbers-or-null."""
    bad = [k for k in numbers if not is_number(record[k])]
    bad += [k for k in texts if not isinstance(record[k], str)]
    bad += [k for k in optional if record[k] is not None and not is_number(record[k])]
    return [f"{k} ({record[k]!r})" for k in bad]






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


def truncate_metrics(path: str | Path, step: int) -> None:
    """Keep only the rows of `metrics.jsonl` up to optimizer step `step` (a resumed run
    rewrites what came after its checkpoint); atomic, and an empty file when `step` is 0."""
    path = Path(path)
    rows = read_metrics(path.parent) if step > 0 and path.exists() else []
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))


def malformed_curve(curve: Any) -> bool:
    """Whether `curve` is not a list of eval points that each hold CURVE_KEYS."""
    return not isinstance(curve, list) or any(
        not isinstance(p, dict) or any(k not in p for k in CURVE_KEYS) for p in curve)


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
    if malformed_curve(curve):
        raise ResultsError(f"{where} has a malformed curve; rerun the run to rewrite it")
    bad = wrong_types(summary, NUMBER_KEYS, TEXT_KEYS, ("micro_batch_size",))
    bad += [f"curve {x}" for p in curve for x in wrong_types(p, CURVE_KEYS)]
    if bad:
        raise ResultsError(f"{where} has values of the wrong type: {', '.join(bad[:3])}; "
                           "rerun the run to rewrite it")
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


def read_config(run_dir: str | Path) -> dict | None:
    """The resolved config a run saved in `config.json`; None when missing or unreadable."""
    try:
        return json.loads((Path(run_dir) / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scale_of(runs: list[dict]) -> str | None:
    """The `scale` preset the runs were trained at: the first run's summary.json (or table
    row) that says, else its config.json."""
    for run in runs:
        if run.get("scale"):
            return str(run["scale"])
        config = read_config(run["run_dir"]) if run.get("run_dir") else None
        if config and config.get("scale"):
            return str(config["scale"])
    return None


def read_noise(run_dir: str | Path) -> dict | None:
    """Load and validate `<run_dir>/noise.json`; None when the run has none."""
    path = Path(run_dir) / "noise.json"
    if not path.exists():
        return None
    try:
        noise = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} is not valid JSON ({err}); rerun make noise") from None
    return validate_noise(noise, str(path), "rerun `make noise RUN=...`")


def validate_noise(noise: Any, where: str, fix: str) -> dict:
    """Check a noise.json object's keys and types (NOISE_KEYS); raise ResultsError naming
    `where` and ending with `fix`."""
    if not isinstance(noise, dict):
        raise ResultsError(f"{where} is not a JSON object; {fix}")
    missing = [k for k in NOISE_KEYS if k not in noise]
    if missing:
        raise ResultsError(f"{where} lacks {', '.join(missing)}; {fix}")
    bad = wrong_types(noise, NOISE_NUMBER_KEYS, optional=NOISE_OPTIONAL_KEYS)
    if not isinstance(noise["resolved"], bool):
        bad.append(f"resolved ({noise['resolved']!r})")
    if bad:
        raise ResultsError(f"{where} has values of the wrong type: {', '.join(bad[:3])}; {fix}")
    return noise


def wandb_group_name(logger_group: str | None, sweep: str | None) -> str:
    """The W&B group of a run and of every job about it: `logger.group`, else the sweep's
    name, else "single". The trainer logs under it; the analyses find runs by it."""
    return logger_group or sweep or "single"


def is_finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


SOURCE_ROOT = Path(__file__).resolve().parents[3]


def git_revision(root: Path = SOURCE_ROOT) -> str:
    """The commit of the source tree at `root`, with `-dirty` when it has uncommitted changes;
    else 'unknown'. It only reads the repository: `git status` would otherwise refresh the
    index under .git/index.lock, and a run killed at that moment (a cancelled SLURM task, a
    killed sweep) left the lock behind, so the user's next git command failed."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def short_revision() -> str:
    """`git_revision` in 7 characters (with its `-dirty`), for a page's provenance line."""
    rev = git_revision()
    return rev if rev == "unknown" else rev[:7] + ("-dirty" if rev.endswith("-dirty") else "")


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


def build_summary(
    config: dict, *, overrides: list[str], status: str, status_reason: str | None,
    diverged_step: int | None, steps: int, tokens: int, curve: list[dict],
    batch_size_start: int, batch_changes: list[dict], resumed_at: list[int], lr: float,
    micro_batch_size: int, params: int, params_nonembedding: int, bytes_per_token: float,
    data_fingerprint: str, wall_time_s: float, device: str, dtype: str, compile: bool,
    world_size: int, wandb_run_id: str | None, noise: NoiseEMA, gns_ema: float | None,
    checkpoint_saves: int, checkpoint_time_s: float, git_revision: str,
    versions: dict[str, str], branch_of: str | None = None, branch_at_tokens: int | None = None,
    backend: str | None = None,
) -> dict:
    """summary.json's dict: `SUMMARY_KEYS` first, then the rest, from plain values.

    `config` is the resolved config as a dict; `curve` the eval points with their
    `eval_time_s`, which tokens_per_s leaves out; `noise` the online tracker at the end
    (`gns_ema` None when it was off); `wandb_run_id` is kept unless logging was disabled;
    `branch_of` / `branch_at_tokens`: a cooldown branch's parent run folder and the tokens
    it forked at (training/branches.py).
    """
    m, t, o, data = config["model"], config["train"], config["optim"], config["data"]
    start = branch_at_tokens or 0  # a branch's time counts from its fork
    train_seconds = max(1e-9, wall_time_s - sum(p["eval_time_s"] for p in curve
                                                if p["tokens"] > start))
    final = curve[-1] if curve and status == "completed" else None
    batch_size_final = batch_changes[-1]["batch_size"] if batch_changes else batch_size_start
    return {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "sweep": config["sweep"],
        "seed": t["seed"],
        "optimizer": o["name"],
        "lr": lr,
        "width": m["width"],
        "depth": m["depth"],
        "heads": m["heads"],
        "seq_len": m["seq_len"],
        "vocab_size": data["vocab_size"],
        "params": params,
        "params_nonembedding": params_nonembedding,
        "batch_size": t["batch_size"],
        "micro_batch_size": micro_batch_size,
        "steps": steps,
        "tokens": tokens,
        "warmup_steps": t["warmup_steps"],
        "schedule": t["schedule"],
        "bytes_per_token": bytes_per_token,
        "val_loss": final["val_loss"] if final else float("nan"),
        "val_loss_per_byte": final["val_loss_per_byte"] if final else float("nan"),
        "curve": [{k: p[k] for k in CURVE_KEYS + CURVE_OPTIONAL_KEYS if k in p} for p in curve],
        "wall_time_s": wall_time_s,
        "tokens_per_s": (tokens - start) / train_seconds,
        "data_name": data["name"],
        "data_fingerprint": data_fingerprint,
        "git_revision": git_revision,
        "critbatch_version": versions["critbatch"],
        # beyond the required keys
        "scale": config["scale"],
        "status_reason": status_reason,
        "diverged_step": diverged_step,
        "lr_scaling": o["lr_scaling"],
        "base_lr": o["lr"],  # the lr at base_batch_size, before lr_scaling
        "base_batch_size": o["base_batch_size"],
        # AdamW's beta2 as trained (Muon: its AdamW on embeddings and gains), and its rule
        "beta2": decay_at(o["beta2"], o.get("beta2_scaling", "none"), t["batch_size"],
                          o["base_batch_size"]),
        "beta2_scaling": o.get("beta2_scaling", "none"),
        # Muon's momentum as trained, and its rule (None for AdamW)
        "momentum": decay_at(o["momentum"], o.get("momentum_scaling", "none"), t["batch_size"],
                             o["base_batch_size"]) if o["name"] == "muon" else None,
        "momentum_scaling": o.get("momentum_scaling", "none") if o["name"] == "muon" else None,
        # batch schedule (constant: start = final = mean = batch_size, no changes)
        "batch_schedule": t["batch_schedule"],
        "batch_size_start": batch_size_start,
        "batch_size_final": batch_size_final,  # the last step's
        "batch_size_max": max([batch_size_start] + [c["batch_size"] for c in batch_changes]),
        "batch_size_mean": tokens / max(1, steps) / m["seq_len"],
        "batch_changes": batch_changes,  # {step, tokens, batch_size}: the batch from `step` on
        "min_lr_ratio": t["min_lr_ratio"],
        "device": device,
        "dtype": dtype,
        "compile": compile,
        "overrides": overrides,
        "versions": versions,
        "wandb_run_id": wandb_run_id if config["logger"]["mode"] != "disabled" else None,
        # online gradient noise scale (EMA at the end; None when off or not resolved)
        "b_noise": noise.b_noise,  # sequences
        "b_noise_tokens": noise.b_noise * m["seq_len"] if noise.b_noise is not None else None,
        "b_noise_loss": noise.loss,  # train loss (nats/token, same EMA) it was measured at
        "b_noise_loss_per_byte": (noise.loss / bytes_per_token
                                  if noise.loss is not None else None),
        "gns_g2": noise.g2,
        "gns_trace": noise.trace,
        "gns_steps": noise.steps,
        "gns_skipped": noise.skipped,  # gradient spikes left out of the averages
        "gns_ema": gns_ema,
        "world_size": world_size,
        "backend": backend,  # torchrun's process group (gloo, nccl); null in one process
        "resumed_at": resumed_at,  # steps this run was resumed from (killed before)
        "checkpoint_saves": checkpoint_saves,  # by this process, the final one included
        "checkpoint_time_s": checkpoint_time_s,  # their total time
        # cooldown branches: the parent run folder's path and the tokens the branch forked at
        # (both None for a run trained from the start); its own share of the time is
        # wall_time_s, which counts from the fork
        "cooldown_fraction": t.get("cooldown_fraction"),
        "branch_of": branch_of,
        "branch_at_tokens": branch_at_tokens,
    }


# Branch folders inside a run folder, as training writes them and the analysis reads them:
BRANCHES_DIR = "branches"  # <run>/branches/tokens=N/: cooldown branches (training/branches.py)
LOCAL_CBS_DIR = "local_cbs"  # <run>/local_cbs/tokens=<t>/k=<k>[,seed=<s>]/: local-CBS branches
VAL_SEQUENCES = "val_sequences.json"  # a local-CBS branch's loss on each validation window


# ---------------------------------------------------------------------------------------------
# Discovery and loading of many runs (used by the analysis; never imports the trainer).

SKIP_DIRS = frozenset({"wandb", ".hydra", "report", "__pycache__", ".git"})
PROGRESS_MIN_RUNS = 50  # show a progress bar when loading at least this many runs


def find_run_dirs(paths: list[str | Path]) -> tuple[list[Path], list[Path]]:
    """Run directories under `paths`, searched recursively, sorted.

    Returns (finished, unfinished): `finished` hold a `summary.json`; `unfinished` hold a
    `config.json` or `metrics.jsonl` but no summary (a run that is still going or was killed).
    A path that is itself a run directory counts as one. W&B, Hydra and report folders are not
    searched.
    """
    finished: set[Path] = set()
    unfinished: set[Path] = set()
    for root in map(Path, paths):
        if not root.exists():
            raise ResultsError(f"{root} does not exist; pass run directories or a sweep folder")
        if root.is_file():
            root = root.parent
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            names = set(filenames)
            if "summary.json" in names:
                finished.add(Path(dirpath))
            elif "config.json" in names or "metrics.jsonl" in names:
                unfinished.add(Path(dirpath))
    return sorted(finished), sorted(unfinished)


def load_runs(paths: list[str | Path], progress: bool | None = None) -> dict:
    """Read every run under `paths` with `read_summary` (and `read_noise`).

    Returns {"runs": [...], "left_out": [...], "warnings": [...]}. Each run is its validated
    summary plus `run_dir` (str) and `noise` (the noise.json dict or None). A corrupt or
    partial summary.json, or a run directory without one, goes to `left_out` as
    {"run_dir", "reason", "detail"} (reason "corrupt" or "incomplete") instead of stopping the
    load; a corrupt noise.json keeps the run and adds a warning. `progress`: None shows a tqdm
    bar when there are at least PROGRESS_MIN_RUNS runs.
    """
    from tqdm import tqdm

    finished, unfinished = find_run_dirs(paths)
    runs, left_out, warnings = [], [], []
    for run_dir in unfinished:
        left_out.append({"run_dir": str(run_dir), "reason": "incomplete",
                         "detail": "no summary.json: the run has not finished (or was killed)"})
    show = len(finished) >= PROGRESS_MIN_RUNS if progress is None else progress
    for run_dir in tqdm(finished, desc="load runs", unit="run", disable=not show):
        try:
            summary = read_summary(run_dir)
        except ResultsError as err:
            left_out.append({"run_dir": str(run_dir), "reason": "corrupt", "detail": str(err)})
            continue
        try:
            noise = read_noise(run_dir)
        except ResultsError as err:
            noise = None
            warnings.append(f"noise.json ignored: {err}")
        runs.append({**summary, **beta2_from_config(summary, run_dir), "run_dir": str(run_dir),
                     "noise": noise})
    return {"runs": runs, "left_out": left_out, "warnings": warnings}


def beta2_from_config(summary: dict, run_dir: str | Path) -> dict:
    """`beta2` and `beta2_scaling` for a summary.json written before they were recorded,
    from the run's config.json (its beta2 was then the same at every batch); {} when the
    summary has them or the config is unreadable."""
    if "beta2" in summary:
        return {}
    optim = (read_config(run_dir) or {}).get("optim") or {}
    if optim.get("beta2") is None or not optim.get("base_batch_size"):
        return {}
    scaling = optim.get("beta2_scaling", "none")
    return {"beta2": decay_at(optim["beta2"], scaling, summary["batch_size"],
                              optim["base_batch_size"]), "beta2_scaling": scaling}


# W&B config paths (nested dicts of the resolved config) for summary keys that a W&B run
# summary may lack (W&B keeps only scalar summary values; None values are dropped).
WANDB_CONFIG_PATHS = {
    "sweep": ("sweep",), "seed": ("train", "seed"), "optimizer": ("optim", "name"),
    "width": ("model", "width"), "depth": ("model", "depth"), "heads": ("model", "heads"),
    "seq_len": ("model", "seq_len"), "vocab_size": ("data", "vocab_size"),
    "batch_size": ("train", "batch_size"), "micro_batch_size": ("train", "micro_batch_size"),
    "warmup_steps": ("train", "warmup_steps"), "schedule": ("train", "schedule"),
    "data_name": ("data", "name"),
}


def summary_from_wandb(config: dict, summary: dict, history: list[dict], run_path: str) -> dict:
    """Rebuild a run's summary dict from what the W&B API returns for it.

    `config` is `run.config` (the trainer logs the resolved config, nested by group),
    `summary` is `dict(run.summary)` (the trainer copies every scalar of summary.json there),
    `history` the logged rows holding `val_loss` (the eval points, with `_step`). The result
    is validated with `validate_summary` exactly like a local summary.json, with `run_dir`
    set to `wandb:<run_path>`.
    """
    out = {k: v for k, v in summary.items() if not k.startswith("_")}
    for key, path in WANDB_CONFIG_PATHS.items():
        if out.get(key) is not None:
            continue
        node: Any = config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and set(node) == {"value"}:  # raw W&B config format
            node = node["value"]
        if node is not None or key == "sweep":
            out[key] = node
    curve = []
    for row in sorted(history, key=lambda r: r.get("_step", r.get("step", 0))):
        if row.get("val_loss") is None:
            continue
        curve.append({"step": row.get("_step", row.get("step")), "tokens": row.get("tokens"),
                      "val_loss": row["val_loss"],
                      "val_loss_per_byte": row.get("val_loss_per_byte")})
    out["curve"] = curve
    for key in ("val_loss", "val_loss_per_byte"):
        if out.get(key) is None:
            out[key] = float("nan")
    validated = validate_summary(out, f"W&B run {run_path}")
    return {**validated, "run_dir": f"wandb:{run_path}", "noise": None}


def load_wandb_runs(project_path: str, group: str | None = None) -> dict:
    """Read the training runs of a W&B project (ENTITY/PROJECT), optionally one group.

    Every run but those of the reports and the noise program (job types "analysis" and
    "noise": they trained nothing): the sweeps log their runs under their stage's job type
    ("baseline", "batch", ...), single runs under "train". Same return shape as `load_runs`.
    Needs network access and a W&B login.
    """
    import wandb
    from tqdm import tqdm

    filters: dict = {"group": group} if group else {}
    try:
        api_runs = [run for run in wandb.Api().runs(project_path, filters=filters)
                    if getattr(run, "job_type", None) not in ("analysis", "noise")]
    except Exception as err:  # the API raises many types (network, auth, not found)
        raise ResultsError(f"cannot read W&B project {project_path}: {err}") from None
    runs, left_out = [], []
    for run in tqdm(api_runs, desc="W&B runs", unit="run",
                    disable=len(api_runs) < PROGRESS_MIN_RUNS):
        run_path = "/".join(run.path)
        try:
            history = list(run.scan_history(keys=["tokens", "val_loss", "val_loss_per_byte"]))
            runs.append(summary_from_wandb(dict(run.config), dict(run.summary), history,
                                           run_path))
        except ResultsError as err:
            left_out.append({"run_dir": f"wandb:{run_path}", "reason": "corrupt",
                             "detail": str(err)})
    return {"runs": runs, "left_out": left_out, "warnings": []}
