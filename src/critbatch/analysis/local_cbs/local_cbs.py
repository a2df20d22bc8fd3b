"""The local critical batch size by branched training: reading the branches and deciding.

What the trainer writes (docs/science.md, section 7; Merrill et al. 2025, arXiv 2505.23971):
a base run folder (an ordinary run at batch B) holding, per checkpoint at `t` tokens,

    local_cbs/tokens=<t>/k=<k>/          one branch at k x B per multiplier k
    local_cbs/tokens=<t>/k=<k>,seed=<s>/ the ladder again at a replicate seed (or only k = 1)

each an ordinary run folder (summary.json with `local_cbs_of`, `local_cbs_at_tokens`,
`local_cbs_multiplier`, `local_cbs_window_tokens`; metrics.jsonl) plus `val_sequences.json`:
{"val_loss_per_sequence": [nats/token, one per fixed validation window, same order in every
branch], "seq_len": T, "tokens": tokens trained}.

What this module computes, per base run (one optimizer and lr rule) and checkpoint:

- the decision. Replicated ladders (every checkpoint has every k at one replicate seed or
  more, `BaseRun.ladder`): `science.local_cbs_seeds.local_critical_batches_by_seed` on the ladders
  stacked by seed, the scatter of each seed-paired excess pooled over the checkpoints per k.
  Otherwise `science.local_cbs.local_critical_batch` with the branch noise of the k = 1
  replicates (`estimate_branch_noise`, pooled over the checkpoints; disjoint pairs: k = 1
  with the first replicate, then the next replicates two by two), which is also reported
  for the replicated design. A diverged branch (status "diverged", no val_sequences.json)
  at any seed is a rejection: the walk stops below it;
- beside it, the paper's EMA rule (`local_critical_batch_ema`, epsilon 0.01 nats) on each
  branch's training losses after the fork (metrics.jsonl rows with tokens > t);
- and per k the same branches in the per-run B_crit's currency
  (`science.local_cbs_tokens.tokens_equivalent`): the excess over k = 1 (seed-paired where the
  ladders are replicated) read off the k = 1 branch's loss over the window (`k1_curve`: the
  loss at the fork, then its summary.json `curve` points after it, averaged over seeds) as
  effective tokens, and B_crit = (k B - B r) / (r - 1);
- the loss at the checkpoint: the base run's validation curve at t (interpolated in log
  tokens), else the k = 1 branch's eval at the fork; the online B_noise there likewise.

Then Kaplan's B_crit(L) = B* / L^(1/alpha_B) per optimizer and lr rule over the local points
(`science.laws.fit_kaplan`, bootstrap over checkpoints), and what the branches cost (their
tokens and wall time against the base run's). `critbatch.analysis.local_cbs.report` writes
the report folder: `report.md`, the plots and `fits.json` with the keys FITS_KEYS:

- `local_cbs`: one row per (base run, checkpoint): ROW_KEYS (b_crit in sequences, margin in
  nats/token, `excess`/`upper`/`reference` keyed by k after the first, null for a k at or
  above a diverged one) and `lr_scaling`, `b_crit_tokens`, `first_step_rejected`, `diverged`,
  `b_noise` (online, sequences), `branch_pairs`, `seq_len`, `sequences`, `window_tokens`,
  `in_kaplan`, `tokens_equivalent` (keyed by k after the first: `excess` over k = 1 with
  `excess_low`/`excess_high`, `effective_tokens`, `r`, `b_crit` with `b_crit_low`/
  `b_crit_high` in sequences, `b_crit_tokens`, `note`) and `tokens_equivalent_points`;
- `local_cbs_kaplan`: per optimizer and lr rule (`label`), Kaplan's law over its local
  points (or why none);
- `local_cbs_cost`: per base run, the branches' tokens and wall time against the base's;
- `local_cbs_noise`: per base run, its design, the k = 1 branch sd and its degrees of
  freedom, and `per_k`: the sd of the excess each k's bounds used and (`equal_variance`,
  `equal_variance_vs_k1`) Bartlett's test across checkpoints before pooling, with the
  checkpoints pooled and those bound alone;
- `rule`: tolerance, confidence, windows and the statement of the rule, and
  `tokens_equivalent` (its statement and interval); `warnings`.

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

from critbatch.analysis.bcrit.kaplan import BOOTSTRAP_RESAMPLES
from critbatch.results.errors import ConfigError, ResultsError
from critbatch.results.runs import (
    LOCAL_CBS_DIR,
    SKIP_DIRS,
    VAL_SEQUENCES,
    is_finite,
    read_metrics,
    read_summary,
)
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
    PairedExcess,
    estimate_branch_noise,
    excesses_over_first,
    local_critical_batch,
    local_critical_batch_ema,
)
from critbatch.science.local_cbs_seeds import ReplicatedLadders, ScatterPool, replicated_ladders
from critbatch.science.local_cbs_tokens import tokens_equivalent

CHECKPOINT_NAME = re.compile(r"tokens=(\d+)")
BRANCH_NAME = re.compile(r"k=(\d+)(?:,seed=(\d+))?")
EMA_EPSILON = TOLERANCE  # nats: the paper's bare tolerance, whatever --tolerance says
ROUNDING = 1e-9  # an exponent this close to 0 is least squares' rounding of a flat B_crit
FITS_KEYS = ("local_cbs", "local_cbs_kaplan", "local_cbs_cost", "local_cbs_noise", "rule",
             "warnings")
ROW_KEYS = ("optimizer", "tokens", "val_loss", "b_crit", "b_crit_tokens", "margin",
            "lower_bound_only", "b_crit_ema", "base_batch_size", "multipliers", "excess",
            "upper", "branch_sd", "branch_sd_dof", "tolerance", "confidence", "run_dir",
            "tokens_equivalent")
INTERVALS = {  # per design, what the bound of an excess rests on
    "replicated ladders": "one-sided {level:.0%} upper bound from the scatter across seeds of "
                          "the seed-paired excess (every k trained again at each replicate "
                          "seed on the same data order, pooled over checkpoints per k)",
    "k = 1 replicates": "one-sided {level:.0%} upper bound from per-sequence pairs plus seed "
                        "replicates (branch variance from the k = 1 branches trained twice, "
                        "pooled over each base run's checkpoints)",
}


TE_INTERVALS = {  # per design, what the tokens-equivalent B_crit's interval rests on
    "replicated ladders": "the scatter across seeds of the seed-paired excess over k = 1, "
                          "pooled over the checkpoints per k where Bartlett's test allows",
    "k = 1 replicates": "per-sequence pairs plus twice the k = 1 branch variance",
}


def interval_text(designs: Sequence[str], level: float, texts: dict = INTERVALS) -> str:
    return "; ".join(f"{d}: {texts[d].format(level=level)}" if len(set(designs)) > 1
                     else texts[d].format(level=level) for d in sorted(set(designs)))


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


def k1_curve(base: BaseRun, checkpoint: Checkpoint,
             fork_loss: float | None) -> tuple[list[int], list[float], int]:
    """The k = 1 branch's validation loss over the window: the loss at the fork
    (`checkpoint_loss`, usually the base run's curve interpolated), then its eval points after
    the fork, averaged over the ladders' seeds where all have them; and the window (tokens)."""
    firsts = [ladder[0] for ladder in ladders_of(base, checkpoint)]
    end = int(firsts[0].summary["tokens"])
    seen: dict[int, list[float]] = {}
    for b in firsts:
        for p in b.summary["curve"]:
            if checkpoint.tokens < p["tokens"] <= end and is_finite(p.get("val_loss")):
                seen.setdefault(p["tokens"], []).append(p["val_loss"])
    points = sorted((t, float(np.mean(v))) for t, v in seen.items() if len(v) == len(firsts))
    if fork_loss is not None:
        points.insert(0, (checkpoint.tokens, fork_loss))
    return [t for t, _ in points], [v for _, v in points], end - checkpoint.tokens


def equivalent_fields(base: BaseRun, checkpoint: Checkpoint, fork_loss: float | None,
                      over_first: Sequence[PairedExcess]) -> dict:
    """`tokens_equivalent` (per k after the first: the excess over k = 1 with its bounds, E_eff,
    r, the local B_crit with its interval in sequences and tokens, a note; all null but the
    note at and above a diverged k) and `tokens_equivalent_points` (of the k = 1 curve)."""
    batch, seq_len = int(base.summary["batch_size"]), int(base.summary["seq_len"])
    tokens, losses, window = k1_curve(base, checkpoint, fork_loss)
    ks = [b.multiplier for b in checkpoint.branches]
    out = {}
    for k, c in zip(ks[1:], over_first, strict=False):
        te = tokens_equivalent(batch, k, checkpoint.tokens, window, tokens, losses, c.excess,
                               (c.lower, c.upper))
        out[str(k)] = {"excess": c.excess, "excess_low": c.lower, "excess_high": c.upper,
                       "effective_tokens": te.effective_tokens, "r": te.ratio,
                       "b_crit": te.b_crit, "b_crit_low": te.b_crit_low,
                       "b_crit_high": te.b_crit_high, "note": te.note,
                       "b_crit_tokens": None if te.b_crit is None else te.b_crit * seq_len}
    for k in ks[1 + len(over_first):]:
        out[str(k)] = {**dict.fromkeys(("excess", "excess_low", "excess_high",
                                        "effective_tokens", "r", "b_crit", "b_crit_low",
                                        "b_crit_high", "b_crit_tokens")),
                       "note": "diverged, or above a diverged k"}
    return {"tokens_equivalent": out, "tokens_equivalent_points": len(tokens)}


def checkpoint_row(base: BaseRun, checkpoint: Checkpoint, decided: dict,
                   over_first: Sequence[PairedExcess], noise: BranchNoise | None,
                   tolerance: float, confidence: float, warnings: list[str]) -> dict:
    """One row of fits.json `local_cbs` (ROW_KEYS and a few more) from the checkpoint's
    decision fields and excesses over k = 1 (`decide_base`)."""
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
        **equivalent_fields(base, checkpoint, loss, over_first),
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
                confidence: float) -> tuple[list[dict], list[dict], list[tuple]]:
    """Every checkpoint's decision fields (`decision_fields`); (replicated design) per k after
    the first the seed scatter its bounds used and how it was pooled (`scatter_rows`); and
    per checkpoint the excess of each k over k = 1 (empty where the first step up diverged).
    Replicated design (`BaseRun.ladder`): `replicated_ladders` on the ladders stacked by
    seed, the seed scatter pooled over the checkpoints per k where Bartlett's test allows;
    else `local_critical_batch` and `excesses_over_first` with the k = 1 branch noise."""
    batch = int(base.summary["batch_size"])
    where = [f"{base.run_dir.name} at {c.tokens:,} tokens" for c in base.checkpoints]
    ladders = [ladders_of(base, c) for c in base.checkpoints]
    cut = [usable(lad, w) for lad, w in zip(ladders, where, strict=True)]
    ks = [b.multiplier for b in base.checkpoints[0].branches]
    decided: list[LocalCriticalBatch | None] = [None] * len(ladders)
    over_first: list[tuple] = [()] * len(ladders)
    todo = [i for i, (kept, _) in enumerate(cut) if kept >= 2]
    per_k: list[dict] = []
    try:
        if base.ladder and todo:
            stacked = [[np.stack([lad[j].losses for lad in ladders[i]])
                        for j in range(cut[i][0])] for i in todo]
            result = replicated_ladders(batch, ks, stacked, tolerance=tolerance,
                                        confidence=confidence)
            for i, d, o in zip(todo, result.decisions, result.over_first, strict=True):
                decided[i], over_first[i] = d, o
            per_k = scatter_rows(result, [base.checkpoints[i].tokens for i in todo],
                                 [len(ladders[i]) for i in todo])
        else:
            for i in todo:
                losses = [b.losses for b in ladders[i][0][:cut[i][0]]]
                decided[i] = local_critical_batch(batch, ks[:cut[i][0]], losses, noise,
                                                  tolerance=tolerance, confidence=confidence)
                over_first[i] = excesses_over_first(losses, noise, confidence)
    except ValueError as err:
        raise ResultsError(f"{base.run_dir.name}: {err}") from None
    fields = [decision_fields(d, ks, kept, diverged, batch, tolerance)
              for d, (kept, diverged) in zip(decided, cut, strict=True)]
    return fields, per_k, over_first


def scatter_rows(result: ReplicatedLadders, tokens: list[int], seeds: list[int]) -> list[dict]:
    """Replicated design, per k after the first: the pooled sd of one seed's excess that the
    bounds used and its degrees of freedom (null when every checkpoint stands alone), the
    seeds, and how the pool was made (`pool_fields`) for the decision's comparisons
    (`equal_variance`) and for the excess over k = 1 (`equal_variance_vs_k1`); `tokens[i]`
    and `seeds[i]`: checkpoint i's."""
    rows = []
    for k, pool in result.pools.items():
        first = next(c for c, x in enumerate(pool.scatters) if x is not None)
        rows.append({"multiplier": k, "sd": pool.main.sd if pool.main else None,
                     "dof": pool.main.dof if pool.main else None, "seeds": seeds[first],
                     "equal_variance": pool_fields(pool, tokens),
                     "equal_variance_vs_k1": pool_fields(result.pools_over_first[k], tokens)})
    return rows


def pool_fields(pool: ScatterPool, tokens: list[int]) -> dict:
    """Bartlett's test over the checkpoints (statistic, p; `p_value_pooled`: over those pooled
    at the end) and the checkpoints (tokens) pooled and left alone."""
    return {"test": "Bartlett", "level": pool.level,
            "statistic": pool.test.statistic if pool.test else None,
            "p_value": pool.test.p_value if pool.test else None,
            "p_value_pooled": pool.kept.p_value if pool.kept else None,
            "pooled_tokens": [tokens[i] for i in pool.pooled],
            "alone_tokens": [tokens[i] for i in pool.alone]}


def pool_warnings(name: str, per_k: list[dict]) -> list[str]:
    """One line per k and comparison whose checkpoints were not all pooled."""
    out = []
    for row in per_k:
        for key, what in (("equal_variance", "excess over the best smaller branch"),
                          ("equal_variance_vs_k1", "excess over k = 1")):
            v = row[key]
            if v["alone_tokens"]:
                out.append(f"{name}: the seed scatter of k = {row['multiplier']}'s {what} differs "
                           f"between checkpoints (Bartlett p = {v['p_value']:.2g} < "
                           f"{v['level']:g}); pooled over {len(v['pooled_tokens'])} checkpoint(s),"
                           " each of the rest bound on its own seeds (wider): "
                           + ", ".join(f"{t:,}" for t in v["alone_tokens"]) + " tokens")
    return out


def curve_warnings(name: str, base: BaseRun, rows: list[dict]) -> list[str]:
    """What biases the tokens-equivalent B_crit of a base run (both make it high)."""
    out = []
    chords = sum(r["tokens_equivalent_points"] <= 2 for r in rows)
    if chords:
        out.append(f"{name}: at {chords} of {len(rows)} checkpoints the k = 1 curve over the "
                   "window is only its two ends (the fork's loss read off the base run's curve): "
                   "E_eff is read off a straight line in log tokens, which credits too many "
                   "tokens on a convex curve, so the tokens-equivalent B_crit is biased high")
    k1 = base.checkpoints[0].branches[0].summary
    if k1.get("schedule") == "wsd" and k1.get("cooldown_fraction"):
        out.append(f"{name}: the branches end their window with a cooldown; the k = 1 curve's "
                   "inner points are not annealed but its end and the larger branches are, so "
                   "E_eff comes out long and the tokens-equivalent B_crit high")
    return out


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
        # a checkpoint is one point, so there are no per-unit estimates to take the range
        # of: a bootstrap from 3 checkpoints on, whose label says when it undercovers
        boot = bootstrap_kaplan(losses, b_tokens, units, resamples=BOOTSTRAP_RESAMPLES,
                                unit_name="checkpoints", min_units=3)
        row.update({k: fit[k] for k in ("b_star_tokens", "exponent")})
        row.update({k: boot[k] for k in ("exponent_low", "exponent_high", "b_star_tokens_low",
                                         "b_star_tokens_high", "n_units")})
        for key in ("exponent", "exponent_low", "exponent_high"):  # a flat B_crit fits 0 exactly
            if row[key] is not None and abs(row[key]) < ROUNDING:  # (not -8e-15)
                row[key] = 0.0
        row["interval"] = boot["interval"]
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
        decided, scatter, over_first = decide_base(base, noise, tolerance, confidence)
        noise_rows.append({"optimizer": base.optimizer, "lr_scaling": base.lr_scaling,
                           "run_dir": str(base.run_dir),
                           "design": "replicated ladders" if base.ladder else "k = 1 replicates",
                           "branch_sd": noise.sd if noise else None,
                           "branch_sd_dof": noise.dof if noise else None,
                           "pairs": noise.pairs if noise else 0, "per_k": scatter})
        if noise and noise.dof == 0 and not base.ladder:
            warnings.append(f"{base.run_dir.name}: the seed replicates differ no more than their "
                            "sequence scatter explains; no branch term in the bounds")
        mine = [checkpoint_row(base, c, d, o, noise, tolerance, confidence, warnings)
                for c, d, o in zip(base.checkpoints, decided, over_first, strict=True)]
        warnings += pool_warnings(base.run_dir.name, scatter)
        warnings += curve_warnings(base.run_dir.name, base, mine)
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
    designs = [n["design"] for n in noise_rows]
    interval = interval_text(designs, confidence)
    rule = {"tolerance": tolerance, "confidence": confidence, "window_tokens": windows,
            "interval": interval, "ema_epsilon": EMA_EPSILON,
            "statement": rule_statement(tolerance, confidence, windows, interval),
            "tokens_equivalent": equivalent_statement(designs, confidence)}
    return {"rows": rows, "kaplan": kaplan_rows(rows, warnings),
            "cost": [cost_row(b) for b in bases], "noise": noise_rows, "rule": rule,
            "bases": bases, "batch_sweep": batch_sweep, "warnings": warnings}


def equivalent_statement(designs: list[str], confidence: float) -> dict:
    """What the tokens-equivalent local B_crit is and what its interval rests on."""
    interval = (f"two-sided {2 * confidence - 1:.0%} interval: the local B_crit at the "
                f"one-sided {confidence:.0%} lower and upper bounds of the excess over k = 1, "
                f"from {interval_text(designs, confidence, TE_INTERVALS)}; the k = 1 curve is "
                "taken as exact")
    return {"interval": interval, "statement": (
        "The same branches in the per-run B_crit's currency: the k branch's final loss, read "
        "off the k = 1 branch's loss over the window (monotone in log tokens, never "
        "extrapolated), is worth E_eff tokens of k = 1; with r = window / E_eff, B_crit = "
        "(k B - B r) / (r - 1) in sequences. r <= 1: no measurable cost (a lower bound at "
        "most); a loss outside the k = 1 curve, or r >= k: none. Unlike the rule's, it is "
        "the batch at which training needs twice the minimum tokens (k B = B_crit where "
        "r = 2k / (k + 1)), as the per-run, Pareto and joint B_crit are.")}


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
