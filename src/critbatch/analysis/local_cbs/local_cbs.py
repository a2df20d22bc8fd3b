"""The local critical batch size by branched training: every checkpoint decided, then fitted.

The branches as the trainer writes them (docs/science.md, section 7; Merrill et al. 2025,
arXiv 2505.23971) are read by `critbatch.analysis.local_cbs.reading`. What `analyse`
computes, per base run (one optimizer and lr rule) and checkpoint:

- the decision (`critbatch.analysis.local_cbs.decision`): the walk over k with one-sided
  bounds, from replicated ladders where every checkpoint has them, else with the branch noise
  of the k = 1 replicates, which is also reported for the replicated design;
- beside it (`critbatch.analysis.local_cbs.checkpoint_rows`), the paper's EMA rule, the same
  branches in the per-run B_crit's currency (tokens-equivalent) and the loss and online
  B_noise at the checkpoint.

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

import math
from collections.abc import Sequence

from critbatch.analysis.bcrit.kaplan import BOOTSTRAP_RESAMPLES
from critbatch.analysis.local_cbs.checkpoint_rows import (
    EMA_EPSILON,
    checkpoint_row,
    curve_warnings,
)
from critbatch.analysis.local_cbs.decision import decide_base, pool_warnings, replicate_pairs
from critbatch.analysis.local_cbs.reading import BaseRun, label_of
from critbatch.results.errors import ConfigError, ResultsError
from critbatch.results.runs import LOCAL_CBS_DIR
from critbatch.science.laws import (
    KAPLAN_B_STAR_TOKENS,
    KAPLAN_EXPONENT,
    bootstrap_kaplan,
    fit_kaplan,
)
from critbatch.science.local_cbs import CONFIDENCE, TOLERANCE, estimate_branch_noise

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
