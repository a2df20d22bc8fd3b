"""The local critical batch study's inputs: the base runs and their branches as the trainer
wrote them, read and checked (`load_base_run`); and the batch sweep's fits.json to compare with
(`read_batch_sweep`).

What the trainer writes (docs/science.md, section 7; Merrill et al. 2025, arXiv 2505.23971):
a base run folder (an ordinary run at batch B) holding, per checkpoint at `t` tokens,

    local_cbs/tokens=<t>/k=<k>/          one branch at k x B per multiplier k
    local_cbs/tokens=<t>/k=<k>,seed=<s>/ the ladder again at a replicate seed (or only k = 1)

each an ordinary run folder (summary.json with `local_cbs_of`, `local_cbs_at_tokens`,
`local_cbs_multiplier`, `local_cbs_window_tokens`; metrics.jsonl) plus `val_sequences.json`:
{"val_loss_per_sequence": [nats/token, one per fixed validation window, same order in every
branch], "seq_len": T, "tokens": tokens trained}.

Units: batch sizes in sequences; losses in nats/token.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from critbatch.results.errors import ResultsError
from critbatch.results.runs import (
    LOCAL_CBS_DIR,
    SKIP_DIRS,
    VAL_SEQUENCES,
    is_finite,
    read_metrics,
    read_summary,
)

CHECKPOINT_NAME = re.compile(r"tokens=(\d+)")
BRANCH_NAME = re.compile(r"k=(\d+)(?:,seed=(\d+))?")


@dataclass(frozen=True)
class Branch:
    """One branch folder: its per-sequence validation losses and training losses."""

    run_dir: Path
    multiplier: int  # k: the branch trains at k x the base batch
    seed: int | None  # None: trained at the base's seed; else a replicate's seed tag
    summary: dict
    losses: np.ndarray | None  # nats/token, one per validation sequence; None: diverged
    train_losses: np.ndarray  # nats/token, one per optimizer step after the fork


@dataclass(frozen=True)
class Checkpoint:
    tokens: int  # training tokens of the base run at the fork
    branches: tuple[Branch, ...]  # at the base's seed, ascending k
    replicates: tuple[Branch, ...]  # at other seeds (k = 1 only, or every k), by seed then k

    def ladder_seeds(self) -> list[int]:
        """Replicate seeds at which every k of `branches` was trained again."""
        ks = {b.multiplier for b in self.branches}
        seeds = sorted({b.seed for b in self.replicates})
        return [s for s in seeds
                if {b.multiplier for b in self.replicates if b.seed == s} >= ks]

    def at_seed(self, seed: int | None) -> list[Branch]:
        """The ladder trained at `seed` (None: the base's), ascending k."""
        return sorted((b for b in (*self.branches, *self.replicates) if b.seed == seed),
                      key=lambda b: b.multiplier)


@dataclass(frozen=True)
class BaseRun:
    run_dir: Path
    summary: dict
    checkpoints: tuple[Checkpoint, ...]  # ascending tokens

    @property
    def optimizer(self) -> str:
        return self.summary["optimizer"]

    @property
    def lr_scaling(self) -> str:
        """How the branches' lr followed their batch (optim.lr_scaling)."""
        return str(self.summary.get("lr_scaling", "unknown"))

    @property
    def label(self) -> str:
        return arm_label(self.optimizer, self.lr_scaling)

    @property
    def ladder(self) -> bool:
        """Every checkpoint has its whole ladder again at one replicate seed or more."""
        return all(c.ladder_seeds() for c in self.checkpoints)


def arm_label(optimizer: str, lr_scaling: str | None) -> str:
    """How tables, fits and plots name a base run's measurement: the optimizer and the rule
    its branches' lr followed ('muon, lr sqrt')."""
    return f"{optimizer}, lr {lr_scaling or 'unknown'}"


def label_of(row: dict) -> str:
    return arm_label(row["optimizer"], row.get("lr_scaling"))


def find_base_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Base run folders (a summary.json beside a `local_cbs/` folder) under `paths`, sorted."""
    found: set[Path] = set()
    for root in map(Path, paths):
        if not root.exists():
            raise ResultsError(f"{root} does not exist; pass base run folders or a folder "
                               "above them (e.g. runs/local_cbs/<scale>)")
        for dirpath, dirnames, filenames in os.walk(root):
            if LOCAL_CBS_DIR in dirnames and "summary.json" in filenames:
                found.add(Path(dirpath))
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and d != LOCAL_CBS_DIR]
    if not found:
        raise ResultsError(f"no local_cbs folders under {', '.join(map(str, paths))} (a base "
                           "run's summary.json beside local_cbs/tokens=<t>/k=<k>/); pass the "
                           "base run folders, or train the branches first")
    return sorted(found)


def read_val_sequences(run_dir: Path) -> np.ndarray:
    """The per-sequence validation losses (nats/token) of a branch's val_sequences.json."""
    path = run_dir / VAL_SEQUENCES
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path} does not exist: the branch did not finish its per-sequence "
                           "evaluation; rerun that branch") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} is not valid JSON ({err}); rerun that branch") from None
    values = data.get("val_loss_per_sequence") if isinstance(data, dict) else None
    if (not isinstance(values, list) or len(values) < 2
            or not all(isinstance(v, int | float) for v in values)):
        raise ResultsError(f"{path} lacks a list of two or more per-sequence losses "
                           "(val_loss_per_sequence); rerun that branch")
    losses = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(losses)):
        raise ResultsError(f"{path} holds non-finite losses (a diverged branch); rerun it or "
                           "remove its folder")
    return losses


def branch_train_losses(run_dir: Path, at_tokens: int) -> np.ndarray:
    """Training losses (nats/token) of a branch's metrics.jsonl rows after the fork; empty
    when it has none."""
    try:
        rows = read_metrics(run_dir)
    except FileNotFoundError:
        return np.empty(0)
    return np.array([r["train_loss"] for r in rows
                     if r.get("tokens", 0) > at_tokens and is_finite(r.get("train_loss"))])


def read_branch(run_dir: Path, at_tokens: int) -> Branch:
    match = BRANCH_NAME.fullmatch(run_dir.name)
    k, seed = int(match.group(1)), match.group(2)
    summary = read_summary(run_dir)
    diverged = summary["status"] == "diverged"  # it wrote no val_sequences.json
    for key, expected in (("local_cbs_multiplier", k), ("local_cbs_at_tokens", at_tokens)):
        if summary.get(key) is not None and summary[key] != expected:
            raise ResultsError(f"{run_dir}/summary.json has {key} {summary[key]} but its folder "
                               f"says {expected}; move the branch to the folder of its "
                               "checkpoint and multiplier")
    return Branch(run_dir=run_dir, multiplier=k, seed=None if seed is None else int(seed),
                  summary=summary, losses=None if diverged else read_val_sequences(run_dir),
                  train_losses=branch_train_losses(run_dir, at_tokens))


def read_checkpoint(folder: Path, tokens: int) -> Checkpoint:
    names = sorted(p for p in folder.iterdir() if p.is_dir() and BRANCH_NAME.fullmatch(p.name))
    branches = [read_branch(p, tokens) for p in names]
    main = sorted((b for b in branches if b.seed is None), key=lambda b: b.multiplier)
    replicates = sorted((b for b in branches if b.seed is not None),
                        key=lambda b: (b.seed, b.multiplier))
    return Checkpoint(tokens=tokens, branches=tuple(main), replicates=tuple(replicates))


def load_base_run(run_dir: Path) -> BaseRun:
    """A base run and its checkpoints, checked: every checkpoint has the same multipliers
    (two or more) and every branch the same number of validation sequences."""
    folders = sorted((int(m.group(1)), p) for p in (run_dir / LOCAL_CBS_DIR).iterdir()
                      if p.is_dir() and (m := CHECKPOINT_NAME.fullmatch(p.name)))
    if not folders:
        raise ResultsError(f"{run_dir / LOCAL_CBS_DIR} has no tokens=<t> checkpoint folders; "
                           "train the branches first")
    checkpoints = [read_checkpoint(p, t) for t, p in folders]
    all_ks = sorted({b.multiplier for c in checkpoints for b in c.branches})
    for c, (_, folder) in zip(checkpoints, folders, strict=True):
        missing = sorted(set(all_ks) - {b.multiplier for b in c.branches})
        if missing:
            raise ResultsError(f"{folder} lacks the branch(es) k={', k='.join(map(str, missing))}"
                               f" that other checkpoints of {run_dir.name} have; train them, or "
                               "remove the larger k everywhere")
    if len(all_ks) < 2:
        raise ResultsError(f"{run_dir / LOCAL_CBS_DIR} has branches at k={all_ks} only; the "
                           "decision compares k = 1 with larger k: train k = 2, 4, ...")
    every = [b for c in checkpoints for b in (*c.branches, *c.replicates)
             if b.losses is not None]
    for b, previous in zip(every[1:], every, strict=False):
        if len(b.losses) != len(previous.losses):
            raise ResultsError(f"{b.run_dir}/{VAL_SEQUENCES} has {len(b.losses)} per-sequence "
                               f"losses but {previous.run_dir}/{VAL_SEQUENCES} has "
                               f"{len(previous.losses)}: every branch must be evaluated on the "
                               "same validation windows; rerun the odd one")
    return BaseRun(run_dir=run_dir, summary=read_summary(run_dir),
                   checkpoints=tuple(checkpoints))


def read_batch_sweep(path: str | Path) -> dict:
    """The batch sweep report's per-run and Pareto B_crit (fits.json of fit_bcrit), from the
    sweep folder (its report/fits.json), the report folder, or the file itself."""
    path = Path(path)
    candidates = [path] if path.is_file() else [path / "report" / "fits.json",
                                                path / "fits.json"]
    file = next((c for c in candidates if c.is_file()), None)
    if file is None:
        raise ResultsError(f"no fits.json at {path} (looked for {candidates[0]}); run "
                           f"`python analysis/fit_bcrit.py {path}` first")
    try:
        fits = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{file} is not valid JSON ({err}); rerun fit_bcrit") from None
    if not isinstance(fits, dict) or not isinstance(fits.get("per_run"), list) \
            or not isinstance(fits.get("pareto"), list):
        raise ResultsError(f"{file} lacks the per_run and pareto lists of fit_bcrit's "
                           "fits.json; rerun fit_bcrit")
    per_run = [r for r in fits["per_run"] if is_finite(r.get("b_crit")) and r["b_crit"] > 0
               and is_finite(r.get("val_loss")) and r.get("in_kaplan", True)]
    pareto = [r for r in fits["pareto"] if is_finite(r.get("b_crit")) and r["b_crit"] > 0
              and is_finite(r.get("target_loss")) and not r.get("degenerate")]
    return {"file": str(file), "per_run": per_run, "pareto": pareto}
