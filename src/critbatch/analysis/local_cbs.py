"""The local critical batch size by branched training: the report of `analysis/local_cbs.py`.

What the trainer writes (docs/science.md, section 7; Merrill et al. 2025, arXiv 2505.23971):
a base run folder (an ordinary run at batch B) holding, per checkpoint at `t` tokens,

    local_cbs/tokens=<t>/k=<k>/          one branch at k x B per multiplier k
    local_cbs/tokens=<t>/k=1,seed=<s>/   the k = 1 branch again with another seed (replicates)

each an ordinary run folder (summary.json with `local_cbs_of`, `local_cbs_at_tokens`,
`local_cbs_multiplier`, `local_cbs_window_tokens`; metrics.jsonl) plus `val_sequences.json`:
{"val_loss_per_sequence": [nats/token, one per fixed validation window, same order in every
branch], "seq_len": T, "tokens": tokens trained}.

What this module computes, per base run (one optimizer) and checkpoint:

- the branch noise: `science.local_cbs.estimate_branch_noise` over the replicate pairs of all
  the base run's checkpoints, pooled (disjoint pairs: k = 1 with the first replicate, then the
  next replicates two by two);
- the decision: `science.local_cbs.local_critical_batch` on the branches' per-sequence
  losses (a one-sided upper bound per step up in k, from the per-sequence pairs plus the seed
  replicates' branch variance); a diverged branch (status "diverged", no val_sequences.json)
  is a rejection: the walk stops below it;
- beside it, the paper's EMA rule (`local_critical_batch_ema`, epsilon 0.01 nats) on each
  branch's training losses after the fork (metrics.jsonl rows with tokens > t);
- the loss at the checkpoint: the base run's validation curve at t (interpolated in log
  tokens), else the k = 1 branch's eval at the fork; the online B_noise there likewise.

Then Kaplan's B_crit(L) = B* / L^(1/alpha_B) per optimizer over the local points
(`science.laws.fit_kaplan`, bootstrap over checkpoints), and what the branches cost (their
tokens and wall time against the base run's).

Writes to the report folder (default `<last RUN_DIR>/report/`), atomically: `report.md`, the
plots of PLOTS and `fits.json` with the keys FITS_KEYS:

- `local_cbs`: one row per (base run, checkpoint): ROW_KEYS (b_crit in sequences, margin in
  nats/token, `excess`/`upper`/`reference` keyed by k after the first, null for a k at or
  above a diverged one) and `b_crit_tokens`, `first_step_rejected`, `diverged`, `b_noise`
  (online, sequences), `branch_pairs`, `seq_len`, `sequences`, `window_tokens`, `in_kaplan`;
- `local_cbs_kaplan`: per optimizer, Kaplan's law over its local points (or why none);
- `local_cbs_cost`: per base run, the branches' tokens and wall time against the base's;
- `local_cbs_noise`: per base run, the branch sd and its degrees of freedom;
- `rule`: tolerance, confidence, windows and the statement of the rule; `warnings`.

It also logs the folder to W&B like fit_bcrit (offline unless told otherwise).
Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from critbatch.analysis import plotting, render
from critbatch.analysis.kaplan import BOOTSTRAP_RESAMPLES
from critbatch.analysis.render import fmt, fmt_interval, md_table
from critbatch.analysis.results import SKIP_DIRS, is_finite, read_metrics, read_summary
from critbatch.errors import ConfigError, ResultsError
from critbatch.files import write_json_atomic, write_text_atomic
from critbatch.science.laws import (
    KAPLAN_B_STAR_TOKENS,
    KAPLAN_EXPONENT,
    bootstrap_kaplan,
    fit_kaplan,
)
from critbatch.science.local_cbs import (
    CONFIDENCE,
    TOLERANCE,
    BranchNoise,
    LocalCriticalBatch,
    estimate_branch_noise,
    local_critical_batch,
    local_critical_batch_ema,
    local_critical_batches_by_seed,
)

LOCAL_CBS_DIR = "local_cbs"  # inside a base run folder
VAL_SEQUENCES = "val_sequences.json"
CHECKPOINT_NAME = re.compile(r"tokens=(\d+)")
BRANCH_NAME = re.compile(r"k=(\d+)(?:,seed=(\d+))?")
EMA_EPSILON = TOLERANCE  # nats: the paper's bare tolerance, whatever --tolerance says
FITS_KEYS = ("local_cbs", "local_cbs_kaplan", "local_cbs_cost", "local_cbs_noise", "rule",
             "warnings")
ROW_KEYS = ("optimizer", "tokens", "val_loss", "b_crit", "b_crit_tokens", "margin",
            "lower_bound_only", "b_crit_ema", "base_batch_size", "multipliers", "excess",
            "upper", "branch_sd", "branch_sd_dof", "tolerance", "confidence", "run_dir")
PLOTS = {
    "local_bcrit_vs_tokens": "Local B_crit (sequences) versus tokens trained, per optimizer",
    "local_bcrit_vs_loss": "Local B_crit, online B_noise and the batch sweep's B_crit "
                           "(sequences) versus loss (nats/token)",
}
INTERVALS = {  # per design, what the bound of an excess rests on
    "replicated ladders": "one-sided {level:.0%} upper bound from the scatter across seeds of "
                          "the seed-paired excess (every k trained again at each replicate "
                          "seed on the same data order, pooled over checkpoints per k)",
    "k = 1 replicates": "one-sided {level:.0%} upper bound from per-sequence pairs plus seed "
                        "replicates (branch variance from the k = 1 branches trained twice, "
                        "pooled over each base run's checkpoints)",
}


def interval_text(designs: Sequence[str], level: float) -> str:
    return "; ".join(f"{d}: {INTERVALS[d].format(level=level)}" if len(set(designs)) > 1
                     else INTERVALS[d].format(level=level) for d in sorted(set(designs)))


# ---------------------------------------------------------------------------------------------
# Reading the folders


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


# ---------------------------------------------------------------------------------------------
# The analysis


def replicate_pairs(checkpoint: Checkpoint) -> list[tuple[np.ndarray, np.ndarray]]:
    """Disjoint pairs of identically trained k = 1 branches (module docstring)."""
    same = [b for b in (*checkpoint.branches, *checkpoint.replicates)
            if b.multiplier == 1 and b.losses is not None]
    return [(same[i].losses, same[i + 1].losses) for i in range(0, len(same) - 1, 2)]


def curve_value(curve: list[dict], tokens: float, key: str) -> float | None:
    """`key` of a run's eval points at `tokens`: the point itself, else interpolated in log
    tokens between its neighbours (in log value too for B_noise); None outside the curve or
    where the points lack finite positive values."""
    points = sorted((p["tokens"], p[key]) for p in curve
                    if is_finite(p.get("tokens")) and p["tokens"] > 0 and is_finite(p.get(key))
                    and p[key] > 0)
    if not points or not points[0][0] <= tokens <= points[-1][0]:
        return None
    xs = np.log([t for t, _ in points])
    ys = np.array([v for _, v in points], dtype=float)
    if key == "b_noise":
        return float(np.exp(np.interp(math.log(tokens), xs, np.log(ys))))
    return float(np.interp(math.log(tokens), xs, ys))


def checkpoint_loss(base: BaseRun, checkpoint: Checkpoint) -> float | None:
    """The loss at the checkpoint: the base run's curve, else the k = 1 branch's first eval
    (at the fork)."""
    loss = curve_value(base.summary["curve"], checkpoint.tokens, "val_loss")
    if loss is not None:
        return loss
    k1 = checkpoint.branches[0].summary["curve"]
    return curve_value(k1, checkpoint.tokens, "val_loss") if k1 else None


def ema_rule(base_batch: int, checkpoint: Checkpoint, where: str,
             warnings: list[str]) -> int | None:
    """The paper's rule (`local_critical_batch_ema`) on the branches' training losses (a
    diverged branch's ends at infinity), or None (with a warning) when a branch logged no
    step after the fork."""
    empty = [b.run_dir.name for b in checkpoint.branches
             if len(b.train_losses) == 0 and b.losses is not None]
    if empty:
        warnings.append(f"{where}: no metrics.jsonl rows after the fork in {', '.join(empty)}; "
                        "the paper's EMA rule is left blank there")
        return None
    return local_critical_batch_ema(base_batch, [b.multiplier for b in checkpoint.branches],
                                    [b.train_losses if b.losses is not None else [math.inf]
                                     for b in checkpoint.branches], epsilon=EMA_EPSILON)


def checkpoint_row(base: BaseRun, checkpoint: Checkpoint, decided: dict,
                   noise: BranchNoise | None, tolerance: float, confidence: float,
                   warnings: list[str]) -> dict:
    """One row of fits.json `local_cbs` (ROW_KEYS and a few more) from the checkpoint's
    decision fields (`decide_base`)."""
    s = base.summary
    batch, seq_len = int(s["batch_size"]), int(s["seq_len"])
    where = f"{base.run_dir.name} at {checkpoint.tokens:,} tokens"
    for b in (*checkpoint.branches, *checkpoint.replicates):
        if b.summary["batch_size"] != b.multiplier * batch:
            warnings.append(f"{where}: branch {b.run_dir.name} trained at batch "
                            f"{b.summary['batch_size']}, not {b.multiplier} x {batch}")
    ks = [b.multiplier for b in checkpoint.branches]
    loss = checkpoint_loss(base, checkpoint)
    if loss is None:
        warnings.append(f"{where}: no validation loss at the checkpoint (neither the base run's "
                        "curve nor the k=1 branch's covers it); left out of the fit")
    return {
        "optimizer": base.optimizer, "lr_scaling": base.lr_scaling, "tokens": checkpoint.tokens,
        "val_loss": loss, **decided, "b_crit_tokens": decided["b_crit"] * seq_len,
        "b_crit_ema": ema_rule(batch, checkpoint, where, warnings),
        "base_batch_size": batch, "multipliers": list(ks),
        "branch_sd": noise.sd if noise else None, "branch_sd_dof": noise.dof if noise else None,
        "branch_pairs": noise.pairs if noise else 0,
        "tolerance": tolerance, "confidence": confidence, "run_dir": str(base.run_dir),
        "b_noise": curve_value(s["curve"], checkpoint.tokens, "b_noise"),
        "seq_len": seq_len, "sequences": len(checkpoint.branches[0].losses),
        "window_tokens": checkpoint.branches[0].summary.get("local_cbs_window_tokens"),
        "in_kaplan": (loss is not None and not decided["lower_bound_only"]
                      and not decided["first_step_rejected"]),
    }


def ladders_of(base: BaseRun, checkpoint: Checkpoint) -> list[list[Branch]]:
    """The ladders a checkpoint's decision uses: the base seed's, then (replicated design)
    each replicate seed's, every one ascending in k."""
    seeds = checkpoint.ladder_seeds() if base.ladder else []
    return [checkpoint.at_seed(None), *(checkpoint.at_seed(s) for s in seeds)]


def usable(ladders: list[list[Branch]], where: str) -> tuple[int, list[int]]:
    """How many k, from the smallest, every ladder trained without diverging, and the
    multipliers that diverged in any ladder (a diverged branch is a rejection)."""
    if any(ladder[0].losses is None for ladder in ladders):
        raise ResultsError(f"{where}: a k={ladders[0][0].multiplier} branch diverged, so there "
                           "is nothing to compare the larger batches with; retrain it, or "
                           "remove the checkpoint's folder")
    ks = [b.multiplier for b in ladders[0]]
    broken = [i for i in range(len(ks)) if any(ladder[i].losses is None for ladder in ladders)]
    return (broken[0] if broken else len(ks)), [ks[i] for i in broken]


def decision_fields(d: LocalCriticalBatch | None, ks: list[int], kept: int,
                    diverged: list[int], batch: int, tolerance: float) -> dict:
    """A checkpoint's decision as row fields: b_crit, margin, lower_bound_only,
    first_step_rejected (the first step up was rejected: no lower end), noise_limited (the
    rejecting comparison's excess was within tolerance, only its bound was not), excess,
    upper and reference per k after the first (infinity and null at and above a diverged
    k), diverged (its multipliers). `d` is None when the first step up diverged."""
    rejected = [str(k) for k in ks[kept:]]
    inf = dict.fromkeys(rejected, math.inf)
    if d is None:
        return {"b_crit": batch * ks[0], "margin": None, "noise_limited": False,
                "lower_bound_only": False, "first_step_rejected": True, "excess": inf,
                "upper": inf, "reference": dict.fromkeys(rejected), "diverged": diverged}
    pairs = list(zip(ks[1:kept], d.comparisons, d.references, strict=True))
    stop = next((c for c in d.comparisons if c.upper >= tolerance), None)
    return {"b_crit": d.b_crit, "margin": d.margin,
            "noise_limited": stop is not None and stop.excess < tolerance,
            "lower_bound_only": d.lower_bound_only and not diverged,
            "first_step_rejected": d.margin is None,
            "excess": {**{str(k): c.excess for k, c, _ in pairs}, **inf},
            "upper": {**{str(k): c.upper for k, c, _ in pairs}, **inf},
            "reference": {**{str(k): r for k, _, r in pairs}, **dict.fromkeys(rejected)},
            "diverged": diverged}


def decide_base(base: BaseRun, noise: BranchNoise | None, tolerance: float,
                confidence: float) -> tuple[list[dict], list[dict]]:
    """Every checkpoint's decision fields (`decision_fields`), and per k after the first the
    noise its bounds used. Replicated design (`BaseRun.ladder`):
    `local_critical_batches_by_seed` on the ladders stacked by seed, the seed scatter pooled
    over the checkpoints per k; else `local_critical_batch` with the k = 1 branch noise."""
    batch = int(base.summary["batch_size"])
    where = [f"{base.run_dir.name} at {c.tokens:,} tokens" for c in base.checkpoints]
    ladders = [ladders_of(base, c) for c in base.checkpoints]
    cut = [usable(lad, w) for lad, w in zip(ladders, where, strict=True)]
    ks = [b.multiplier for b in base.checkpoints[0].branches]
    decided: list[LocalCriticalBatch | None] = [None] * len(ladders)
    todo = [i for i, (kept, _) in enumerate(cut) if kept >= 2]
    try:
        if base.ladder and todo:
            stacked = [[np.stack([lad[j].losses for lad in ladders[i]])
                        for j in range(cut[i][0])] for i in todo]
            for i, d in zip(todo, local_critical_batches_by_seed(
                    batch, ks, stacked, tolerance=tolerance, confidence=confidence),
                    strict=True):
                decided[i] = d
        else:
            for i in todo:
                decided[i] = local_critical_batch(
                    batch, ks[:cut[i][0]], [b.losses for b in ladders[i][0][:cut[i][0]]],
                    noise, tolerance=tolerance, confidence=confidence)
    except ValueError as err:
        raise ResultsError(f"{base.run_dir.name}: {err}") from None
    fields = [decision_fields(d, ks, kept, diverged, batch, tolerance)
              for d, (kept, diverged) in zip(decided, cut, strict=True)]
    return fields, scatter_rows(base, decided, ks)


def scatter_rows(base: BaseRun, decided: list[LocalCriticalBatch | None],
                 ks: list[int]) -> list[dict]:
    """Per k after the first: the sd of one seed's (replicated design) or one branch pair's
    excess the bounds used, with its degrees of freedom."""
    rows = []
    for j, k in enumerate(ks[1:]):
        comparisons = [(d.comparisons[j], len(lad)) for d, lad in zip(
            decided, (ladders_of(base, c) for c in base.checkpoints), strict=True)
            if d is not None and len(d.comparisons) > j]
        if comparisons:
            c, seeds = comparisons[0]
            rows.append({"multiplier": k, "sd": c.se * math.sqrt(seeds) if base.ladder
                         else c.se, "dof": c.dof, "seeds": seeds})
    return rows


def kaplan_rows(rows: list[dict], warnings: list[str]) -> list[dict]:
    """Kaplan's law over each optimizer's local points (fit_kaplan, unweighted: the local
    B_crit is resolved to a doubling) with a bootstrap over checkpoints; a row saying why when
    there is no fit. Lower-bound-only points and those rejected at the first step (no lower
    end) are left out and named."""
    out = []
    for label in sorted({label_of(r) for r in rows}):
        mine = [r for r in rows if label_of(r) == label]
        opt = mine[0]["optimizer"]
        pts = [r for r in mine if r["in_kaplan"]]
        left = [f"{r['tokens']:,} tokens ("
                + ("no loss" if r["val_loss"] is None else "lower bound only"
                   if r["lower_bound_only"] else "rejected at the first step up") + ")"
                for r in mine if not r["in_kaplan"]]
        row = {"optimizer": opt, "lr_scaling": mine[0].get("lr_scaling"), "label": label,
               "method": "local", "b_star_tokens": None, "exponent": None,
               "exponent_low": None, "exponent_high": None, "b_star_tokens_low": None,
               "b_star_tokens_high": None, "n_points": len(pts), "n_units": len(pts),
               "interval": None, "left_out": left, "seq_len": mine[0]["seq_len"],
               "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS, "kaplan_exponent": KAPLAN_EXPONENT}
        losses = [r["val_loss"] for r in pts]
        if len(set(losses)) < 2:
            row["interval"] = (f"none: no fit, {len(pts)} usable checkpoint(s) at "
                               f"{len(set(losses))} loss(es) (a fit needs two)")
            warnings.append(f"Kaplan fit of the local B_crit ({label}): {row['interval']}; "
                            "branch at more checkpoints")
            out.append(row)
            continue
        b_tokens = [r["b_crit_tokens"] for r in pts]
        fit = fit_kaplan(losses, b_tokens)
        units = [f"{r['run_dir']}@{r['tokens']}" for r in pts]
        boot = bootstrap_kaplan(losses, b_tokens, units, resamples=BOOTSTRAP_RESAMPLES,
                                unit_name="checkpoints")
        row.update({k: fit[k] for k in ("b_star_tokens", "exponent")})
        row.update({k: boot[k] for k in ("exponent_low", "exponent_high", "b_star_tokens_low",
                                         "b_star_tokens_high", "n_units")})
        row["interval"] = (
            boot["interval"] if boot["exponent_low"] is not None else
            f"none: {boot['n_units']} checkpoints (a bootstrap needs 3)" if boot["n_units"] < 3
            else "none: too few bootstrap draws spread in loss")
        out.append(row)
    return out


def cost_row(base: BaseRun) -> dict:
    """What the branches cost against their base run: tokens trained after the forks (summary
    tokens are cumulative) and wall time (each branch's `wall_time_s` counts from its fork)."""
    branches = [(c.tokens, b) for c in base.checkpoints for b in (*c.branches, *c.replicates)]
    tokens = sum(max(0, int(b.summary["tokens"]) - t) for t, b in branches)
    wall_s = sum(float(b.summary["wall_time_s"]) for _, b in branches)
    base_tokens, base_wall = int(base.summary["tokens"]), float(base.summary["wall_time_s"])
    return {"optimizer": base.optimizer, "lr_scaling": base.lr_scaling,
            "run_dir": str(base.run_dir),
            "checkpoints": len(base.checkpoints), "branches": len(branches),
            "replicates": sum(len(c.replicates) for c in base.checkpoints),
            "branch_tokens": tokens, "base_tokens": base_tokens,
            "token_fraction": tokens / base_tokens if base_tokens else None,
            "branch_wall_time_s": wall_s, "base_wall_time_s": base_wall,
            "wall_fraction": wall_s / base_wall if base_wall else None}


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


def check_rule(tolerance: float, confidence: float) -> None:
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError(f"--tolerance {tolerance}: give a loss excess >= 0 in nats/token, "
                          f"e.g. {TOLERANCE}")
    if not 0.5 < confidence < 1:
        raise ConfigError(f"--confidence {confidence}: give a one-sided level in (0.5, 1), "
                          f"e.g. {CONFIDENCE}")


def analyse(bases: list[BaseRun], tolerance: float = TOLERANCE,
            confidence: float = CONFIDENCE, batch_sweep: dict | None = None) -> dict:
    """Every checkpoint's decision, the Kaplan fits, the cost and the branch noise."""
    check_rule(tolerance, confidence)
    warnings: list[str] = []
    rows, noise_rows = [], []
    for base in bases:
        pairs = [p for c in base.checkpoints for p in replicate_pairs(c)]
        if not pairs and not base.ladder:
            raise ResultsError(f"{base.run_dir / LOCAL_CBS_DIR} has no seed replicates "
                               "(k=<k>,seed=<s> folders): without them the noise is unknown "
                               "and identical branches would be called different; train the "
                               "branches again at a replicate seed (train.local_cbs."
                               "replicate_seeds)")
        noise = estimate_branch_noise(pairs) if pairs else None
        decided, scatter = decide_base(base, noise, tolerance, confidence)
        noise_rows.append({"optimizer": base.optimizer, "lr_scaling": base.lr_scaling,
                           "run_dir": str(base.run_dir),
                           "design": "replicated ladders" if base.ladder else "k = 1 replicates",
                           "branch_sd": noise.sd if noise else None,
                           "branch_sd_dof": noise.dof if noise else None,
                           "pairs": noise.pairs if noise else 0, "per_k": scatter})
        if noise and noise.dof == 0 and not base.ladder:
            warnings.append(f"{base.run_dir.name}: the seed replicates differ no more than their "
                            "sequence scatter explains; no branch term in the bounds")
        mine = [checkpoint_row(base, c, d, noise, tolerance, confidence, warnings)
                for c, d in zip(base.checkpoints, decided, strict=True)]
        limited = [r for r in mine if r["noise_limited"]]
        if limited:
            width = max(u - e for r in limited for e, u in zip(r["excess"].values(),
                                                               r["upper"].values(), strict=True)
                        if math.isfinite(u))
            advice = ("train more replicate seeds" if base.ladder else
                      "replicate every k (train.local_cbs.replicate_ladder=true)")
            warnings.append(f"{base.run_dir.name}: at {len(limited)} of {len(mine)} checkpoints "
                            "the walk stopped on noise (excess within tolerance, its bound not): "
                            f"bounds reach {width:.3g} nats/token above the excess against a "
                            f"tolerance of {tolerance:g}; {advice}")
        rows += mine
    windows = sorted({r["window_tokens"] for r in rows if r["window_tokens"]})
    interval = interval_text([n["design"] for n in noise_rows], confidence)
    rule = {"tolerance": tolerance, "confidence": confidence, "window_tokens": windows,
            "interval": interval, "ema_epsilon": EMA_EPSILON,
            "statement": rule_statement(tolerance, confidence, windows, interval)}
    return {"rows": rows, "kaplan": kaplan_rows(rows, warnings),
            "cost": [cost_row(b) for b in bases], "noise": noise_rows, "rule": rule,
            "bases": bases, "batch_sweep": batch_sweep, "warnings": warnings}


def rule_statement(tolerance: float, confidence: float, windows: list[int],
                   interval: str) -> str:
    window = (", ".join(f"{w:,}" for w in windows) + " tokens" if windows
              else "an unrecorded number of tokens")
    return (f"From each checkpoint, branches at k x B (k = 1, 2, 4, ...) train a window of "
            f"{window}; each is then evaluated on the same validation windows. Walking k "
            "upwards, a branch is within tolerance when the "
            f"{interval} of its excess loss over the best smaller "
            f"branch is below {tolerance:g} nats/token; the local B_crit is k x B for the last "
            "k accepted before the first rejection (noise makes it smaller, never larger). "
            "When every k is accepted it is a lower bound only. The paper's rule (EMA of the "
            f"training loss, decay 0.5, bare epsilon {EMA_EPSILON:g} nats) is shown beside it.")


# ---------------------------------------------------------------------------------------------
# fits.json and report.md


def document(result: dict) -> dict:
    """fits.json: exactly FITS_KEYS (module docstring)."""
    values = (result["rows"], result["kaplan"], result["cost"], result["noise"], result["rule"],
              result["warnings"])
    return dict(zip(FITS_KEYS, values, strict=True))


def bcrit_cell(r: dict) -> str:
    """'k x B = b' (sequences); '>= ...' when every k was accepted (the largest k), '< ...'
    the second k when the first step up was rejected."""
    base = r["base_batch_size"]
    k = r["b_crit"] // base
    if r["first_step_rejected"]:
        k1 = r["multipliers"][1]
        return f"< {k1} x {base} = {k1 * base:,} (first step up rejected)"
    text = f"{k} x {base} = {r['b_crit']:,}"
    return f">= {text} (largest k)" if r["lower_bound_only"] else text


def steps_cell(r: dict) -> str:
    """Per k after the first: 'k: excess (upper)', nats/token."""
    return "; ".join(f"{k}: diverged" if int(k) in r["diverged"] else
                     f"{k}: {r['excess'][k]:+.4f} ({r['upper'][k]:+.4f})" for k in r["excess"])


def checkpoint_table(rows: list[dict]) -> str:
    return md_table(
        ["base run", "tokens", "loss (nats/token)", "local B_crit k x B (seq)",
         "B_crit (tokens)", "margin (nats/token)", "EMA rule (seq)", "online B_noise (seq)",
         "per k: excess (upper bound) vs best smaller, nats/token"],
        [[Path(r["run_dir"]).name, f"{r['tokens']:,}", fmt(r["val_loss"], ".4f"),
          bcrit_cell(r), fmt(r["b_crit_tokens"], ",.0f"), fmt(r["margin"], "+.4f"),
          fmt(r["b_crit_ema"], ",d"), fmt(r["b_noise"], ".3g"), steps_cell(r)]
         for r in rows])


def kaplan_table(rows: list[dict]) -> str:
    table = [[label_of(r),
              fmt_interval(r["b_star_tokens"], r["b_star_tokens_low"], r["b_star_tokens_high"]),
              fmt_interval(r["exponent"], r["exponent_low"], r["exponent_high"]),
              str(r["n_points"]), r["interval"], "; ".join(r["left_out"]) or "none"]
             for r in rows]
    table.append(["Kaplan et al. 2020", f"{KAPLAN_B_STAR_TOKENS:.0e}", f"{KAPLAN_EXPONENT:g}",
                  "-", "GPT-2 tokenizer on WebText2", "-"])
    return md_table(["optimizer, lr rule", "B* (tokens) [interval]", "1/alpha_B [interval]",
                     "checkpoints", "interval", "left out"], table)


def cost_table(rows: list[dict]) -> str:
    return md_table(
        ["optimizer, lr rule", "base run", "checkpoints", "branches (replicates)",
         "branch tokens",
         "base tokens", "tokens / base", "branch wall time (s)", "base wall time (s)",
         "wall time / base"],
        [[label_of(r), Path(r["run_dir"]).name, str(r["checkpoints"]),
          f"{r['branches']} ({r['replicates']})", f"{r['branch_tokens']:,}",
          f"{r['base_tokens']:,}", fmt(r["token_fraction"], ".2f"),
          fmt(r["branch_wall_time_s"], ",.1f"), fmt(r["base_wall_time_s"], ",.1f"),
          fmt(r["wall_fraction"], ".2f")] for r in rows])


def noise_table(rows: list[dict]) -> str:
    """Per base run: its design, the k = 1 replicates' branch sd, and per k the sd of the
    excess its bounds used (replicated design: one seed's excess; else one branch pair's)."""
    return md_table(
        ["optimizer, lr rule", "base run", "design", "k = 1 branch sd (nats/token) [dof, pairs]",
         "per k: sd of the excess the bounds use (nats/token) [dof]"],
        [[label_of(r), Path(r["run_dir"]).name, r.get("design", "k = 1 replicates"),
          f"{fmt(r['branch_sd'], '.2e')} [{fmt(r['branch_sd_dof'], '.3g')}, {r['pairs']}]",
          "; ".join(f"{x['multiplier']}: {x['sd']:.2e} [{x['dof']:.3g}]"
                    for x in r.get("per_k", [])) or "-"] for r in rows])


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str]) -> str:
    rows = result["rows"]
    lines = ["# Local critical batch size by branched training", "",
             f"Inputs: {', '.join(inputs)}; {len(result['bases'])} base run(s), {len(rows)} "
             "checkpoint(s).", "", "## The rule", "", result["rule"]["statement"], "",
             f"The interval: {result['rule']['interval']}.", "",
             "## Noise", "",
             "The k = 1 branch sd is how much one branch's loss moves with the seed (data "
             "order) alone; with replicated ladders every k shares each seed's data order, so "
             "the excess of one k over another scatters far less, and that scatter is what "
             "the bounds use.", "", noise_table(result["noise"]), "",
             "## Local B_crit per checkpoint", "",
             "Batch sizes in sequences; margin = tolerance minus the upper bound of the last "
             "accepted k (room the accepted B_crit had; '-' when the first step up was "
             "rejected); online B_noise: the base run's tracker at that point (B_simple, a "
             "different quantity).", ""]
    for label in sorted({label_of(r) for r in rows}):
        lines += [f"### {label}", "",
                  checkpoint_table([r for r in rows if label_of(r) == label]), ""]
    lines += ["## Kaplan's law over the local points", "",
              "B_crit(L) = B* / L^(1/alpha_B), unweighted least squares in logs over the "
              "checkpoints with a two-sided B_crit; interval: percentile bootstrap over "
              "checkpoints.", "", kaplan_table(result["kaplan"]), "",
              "## Cost", "",
              "Tokens the branches trained after their forks and their wall time, against the "
              "base run's.", "", cost_table(result["cost"]), ""]
    sweep = result["batch_sweep"]
    if sweep:
        lines += [f"Batch sweep drawn for comparison: {sweep['file']} ({len(sweep['per_run'])} "
                  f"per-run and {len(sweep['pareto'])} Pareto B_crit).", ""]
    lines += render.plots_section(plots, PLOTS) + render.warnings_section(result["warnings"])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots


OPTIMIZER_COLORS = [f"C{i}" for i in range(10)]


def draw_local(ax, rows: list[dict], x_key: str, color: str, label: str) -> None:
    """Local B_crit (filled; '^' for lower bounds, 'v' for upper bounds) and the EMA rule."""
    rows = sorted((r for r in rows if r[x_key] is not None), key=lambda r: r[x_key])
    two = [r for r in rows if not r["lower_bound_only"] and not r["first_step_rejected"]]
    for subset, marker, text in ((two, "o-", ""), ([r for r in rows if r["lower_bound_only"]],
                                                   "^", " (lower bound)"),
                                 ([r for r in rows if r["first_step_rejected"]], "v",
                                  " (first step rejected)")):
        if subset:
            ax.plot([r[x_key] for r in subset], [r["b_crit"] for r in subset],
                    marker if len(subset) > 1 else marker[0], color=color, ms=6,
                    label=f"{label} local B_crit{text}")
    ema = [r for r in rows if r["b_crit_ema"]]
    if ema:
        ax.plot([r[x_key] for r in ema], [r["b_crit_ema"] for r in ema], "x", color=color,
                ms=7, label=f"{label} paper's EMA rule")


def plot_vs_tokens(result: dict, path: Path) -> None:
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.11, top=0.9)
    labels = sorted({label_of(r) for r in result["rows"]})
    for color, label in zip(OPTIMIZER_COLORS, labels, strict=False):
        draw_local(ax, [r for r in result["rows"] if label_of(r) == label], "tokens", color,
                   label)
    plotting.log_axes(ax, x=True, y=True)
    plotting.label_axes(ax, "tokens trained at the checkpoint (tokens)",
                        "local B_crit (sequences)", PLOTS["local_bcrit_vs_tokens"])
    plotting.save_figure(fig, path)


def draw_batch_sweep(ax, sweep: dict | None, opt: str) -> None:
    if not sweep:
        return
    per_run = [r for r in sweep["per_run"] if r.get("optimizer") == opt]
    pareto = [r for r in sweep["pareto"] if r.get("optimizer") == opt]
    if per_run:
        ax.plot([r["val_loss"] for r in per_run], [r["b_crit"] for r in per_run], "s",
                mfc="none", color="C2", label="batch sweep per-run B_crit")
    if pareto:
        ax.plot([r["target_loss"] for r in pareto], [r["b_crit"] for r in pareto], "D",
                mfc="none", color="C3", label="batch sweep Pareto B_crit")


def plot_vs_loss(result: dict, path: Path) -> None:
    """Per optimizer: the local B_crit and the EMA rule against loss, the base runs' online
    B_noise series, the local Kaplan fit and, with a batch sweep, its per-run and Pareto
    B_crit; everything in sequences."""
    labels = plotting.shown_groups(sorted({label_of(r) for r in result["rows"]}),
                                   result["warnings"])
    fig, axes = plotting.panel_grid(len(labels), PLOTS["local_bcrit_vs_loss"],
                                    panel_in=(6.0, 4.6), max_cols=2)
    for label, ax in zip(labels, axes, strict=True):
        rows = [r for r in result["rows"] if label_of(r) == label]
        opt = rows[0]["optimizer"]
        draw_local(ax, rows, "val_loss", "C0", label)
        for i, base in enumerate(b for b in result["bases"] if b.label == label):
            pts = sorted((p["val_loss"], p["b_noise"]) for p in base.summary["curve"]
                         if is_finite(p.get("b_noise")) and p["b_noise"] > 0
                         and is_finite(p.get("val_loss")) and p["val_loss"] > 0)
            if pts:
                ax.plot(*zip(*pts, strict=True), "-", color="C1", lw=1,
                        label="online B_noise (base run)" if i == 0 else None)
        fit = next(k for k in result["kaplan"] if k["label"] == label)
        losses = [r["val_loss"] for r in rows if r["val_loss"]]
        if fit["exponent"] is not None and fit["b_star_tokens"]:
            grid = np.geomspace(min(losses) / 1.02, max(losses) * 1.02, 50)
            ax.plot(grid, fit["b_star_tokens"] / grid ** fit["exponent"] / fit["seq_len"], "--",
                    color="C0", lw=1, label=f"local fit: B*/L^{fit['exponent']:.2f}")
        draw_batch_sweep(ax, result["batch_sweep"], opt)
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "validation loss L (nats/token)", "batch size (sequences)",
                            label)
    plotting.save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    plot_vs_tokens(result, out / "local_bcrit_vs_tokens.png")
    plot_vs_loss(result, out / "local_bcrit_vs_loss.png")
    return {name: f"{name}.png" for name in PLOTS}


# ---------------------------------------------------------------------------------------------
# The pipeline


def default_paths(runs_root: str | Path = "runs") -> list[Path]:
    """The most recently written runs/local_cbs/<scale> folder (a line says which)."""
    folders = render.sweep_folders(runs_root, (LOCAL_CBS_DIR,))
    if not folders:
        raise ResultsError(f"no base runs under {runs_root}/{LOCAL_CBS_DIR}/<scale>/; pass the "
                           "base run folders, or train the branches first")
    print(f"no paths given: analysing {folders[0].path} (its newest run finished "
          f"{folders[0].age()})", flush=True)
    return [folders[0].path]


def summary_lines(result: dict) -> list[str]:
    lines = []
    for r in result["rows"]:
        lines.append(f"  {label_of(r)} {Path(r['run_dir']).name} tokens={r['tokens']:,} "
                     f"loss={fmt(r['val_loss'], '.4f')} local B_crit {bcrit_cell(r)} seq, "
                     f"margin={fmt(r['margin'], '+.4f')} EMA rule={fmt(r['b_crit_ema'], 'd')}")
    for k in result["kaplan"]:
        lines.append(f"  Kaplan {k['label']} local: 1/alpha_B = "
                     f"{fmt_interval(k['exponent'], k['exponent_low'], k['exponent_high'])} "
                     f"({k['interval']}; Kaplan: {KAPLAN_EXPONENT:g})")
    return lines


def run_analysis(paths: Sequence[str | Path] | None = None, out: str | Path | None = None,
                 tolerance: float = TOLERANCE, confidence: float = CONFIDENCE,
                 batch_sweep: str | Path | None = None, wandb_mode: str = "offline",
                 project: str = "critbatch", runs_root: str | Path = "runs") -> dict:
    """Read the base runs under `paths` (default: the latest runs/local_cbs/<scale>), decide
    every checkpoint, write the report folder (`out`, default `<last path>/report`); returns
    {"out", "result", "document"}. Raises ResultsError (one line) on bad input."""
    check_rule(tolerance, confidence)
    roots = [Path(p) for p in paths] if paths else default_paths(runs_root)
    bases = [load_base_run(d) for d in find_base_runs(roots)]
    sweep = read_batch_sweep(batch_sweep) if batch_sweep else None
    result = analyse(bases, tolerance, confidence, sweep)
    folder = Path(out) if out else roots[-1] / "report"
    folder.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, folder)
    doc = render.json_clean(document(result))
    write_json_atomic(folder / "fits.json", doc)
    inputs = [str(p) for p in roots]
    write_text_atomic(folder / "report.md", report_markdown(result, inputs, plots))
    summary = {f"local_cbs_exponent/{k['optimizer']}_{k['lr_scaling']}": k["exponent"]
               for k in result["kaplan"]}
    render.publish_report(
        folder, name="local_cbs", group=render.logged_group(bases[0].run_dir,
                                                            bases[0].summary.get("sweep")),
        mode=wandb_mode, project=project,
        config={"inputs": inputs, "tolerance": tolerance, "confidence": confidence},
        images=plots, files=["report.md", "fits.json", *plots.values()],
        summary={**summary, "n_checkpoints": len(result["rows"])},
        tables={"local_cbs": (ROW_KEYS, [[json.dumps(r[k]) if isinstance(r[k], dict | list)
                                          else r[k] for k in ROW_KEYS]
                                         for r in result["rows"]])})
    print(f"{len(bases)} base run(s), {len(result['rows'])} checkpoint(s)", flush=True)
    for line in summary_lines(result):
        print(line)
    for w in result["warnings"]:
        print(f"warning: {w}")
    print(f"report: {folder / 'report.md'}", flush=True)
    return {"out": folder, "result": result, "document": doc}
