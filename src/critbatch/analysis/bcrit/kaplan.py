"""Kaplan's B_crit(L) law fitted per optimizer and per method, never pooled across them.

Kaplan et al. 2020 (section 5.1): B_crit(L) = B* / L^(1/alpha_B), with B* ~ 2e8 tokens and
1/alpha_B ~ 4.8 for GPT-2 on WebText2. The points come from three routes:

- `per_run`: tokens-equivalent B_crit of each (batch, budget) cell, at the cell's loss;
- `pareto`: the steps/examples frontier B_crit = E_min / S_min, at its target loss;
- `noise`: the gradient noise scale B_noise (noise.json and the online tracker's end-of-run
  value), at the loss it was measured at;
- `online_noise`: the online tracker's B_noise on each eval point of the baseline's main runs,
  at that eval's validation loss (`analysis.online_noise`): B_noise(L) along training.

Per-run and Pareto measure the same quantity, yet they are not pooled: a group's per-run
B_crit and its Pareto frontier are read off the same cells, so a pooled fit counts each cell
twice and its only honest units are the groups (the range over a handful of them is no 95%
interval). B_noise is B_simple, a different quantity (equal to B_crit only for SGD on a
well-conditioned Hessian): both noise methods get their own rows, beside the others and
apart from each other. Optimizers have their own laws: every row is one optimizer.

Each point carries its uncertainty in log B_crit (from its interval) and the fit weighs
points by it. The exponent's interval is a percentile bootstrap over the independent units
the points come from: runs for per-run and noise points (a per-run point of a cooldown
branch belongs to the run it forked from: its `trunk`), Pareto frontiers (one per model)
for Pareto points, and for the online series blocks of consecutive
eval points (ONLINE_NOISE_BLOCKS per run: the EMA ties neighbouring evals together, so single
evals are not independent). With fewer than `science.laws.MIN_BOOTSTRAP_UNITS` units (three
Pareto frontiers, say) a percentile bootstrap undercovers, and the interval is the range of
the estimates fitted to each unit alone instead (`science.laws.bootstrap_kaplan`), labelled
as such. Pareto fits that are degenerate (`science.laws.pareto_degeneracy`) are
left out and named, and so are per-run B_crit whose interval is unbounded above (`in_kaplan`
false: r within the noise of 1) or whose run trained too few steps for its warmup
(`few_steps`).
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.science.laws import (
    KAPLAN_B_STAR_TOKENS,
    KAPLAN_EXPONENT,
    bootstrap_kaplan,
    fit_kaplan,
    kaplan_prediction_tokens,
)

METHODS = ("per_run", "pareto", "noise", "online_noise")
NOISE_METHODS = ("noise", "online_noise")
ONLINE_NOISE_BLOCKS = 4  # bootstrap units per run of the online series
Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 1000
NOISE_FIX = ("measure B_noise at other losses: `make noise RUN=<run dir>` on runs of other "
             "budgets, or train with micro-batches (train.micro_batch_size) for the online one")
ROW_KEYS = ("optimizer", "method", "b_star_tokens", "exponent", "exponent_low", "exponent_high",
            "b_star_tokens_low", "b_star_tokens_high", "n_points", "n_units", "interval")


# Routes whose 95% interval of the exponent does not keep its level on planted worlds
# (`make coverage`, docs/results/coverage.md, "Kaplan's table: the other routes"): such a row is
# kept in fits.json (`shown` false, `left_out` the reason) and left out of the report's table
NOT_COVERING = {
    "per_run": "its exponent is biased (each cell's effective tokens lean on the baseline "
               "curve's extrapolation) and its bootstrap over runs holds the planted exponent "
               "in far fewer than 95% of planted worlds (`make coverage`)",
    "range": "with fewer than 6 units its interval is the range of their own fits, which "
             "holds the planted exponent in fewer than 95% of planted worlds",
}


def left_out_reason(row: dict) -> str | None:
    """Why a row's exponent is not shown as a measurement (None: it is): the B_crit routes
    whose 95% interval does not keep its level on planted worlds (`NOT_COVERING`), or no
    interval at all (for every route, the B_noise rows too: every row has an interval or a
    reason)."""
    if row["exponent_low"] is None or row["exponent_high"] is None:
        return f"no interval ({row['interval']})"
    if row["method"] in NOISE_METHODS:
        return None
    if row["method"] == "per_run":
        return NOT_COVERING["per_run"]
    if row["interval"].startswith("range of"):
        return NOT_COVERING["range"]
    return None


def log_sigma(low: float | None, high: float | None, z: float) -> float | None:
    """The standard deviation in log B of a central interval [low, high] that spans +-z sigma."""
    if not low or not high or low <= 0 or high <= low:
        return None
    return math.log(high / low) / (2 * z)


def online_units(rows: list[dict]) -> list[str]:
    """The bootstrap unit of each online B_noise row: `<run_dir>#<block>`, the run's eval
    points cut in order into ONLINE_NOISE_BLOCKS blocks of consecutive evals (fewer when the
    run has fewer points)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["run_dir"]] = counts.get(row["run_dir"], 0) + 1
    seen: dict[str, int] = {}
    units = []
    for row in rows:
        n, i = counts[row["run_dir"]], seen.get(row["run_dir"], 0)
        seen[row["run_dir"]] = i + 1
        units.append(f"{row['run_dir']}#{i * min(ONLINE_NOISE_BLOCKS, n) // n}")
    return units


def collect_points(per_run: list[dict], pareto: list[dict], noise: list[dict],
                   online: list[dict] | None = None) -> list[dict]:
    """Every B_crit(L) point: optimizer, method, loss (nats/token), B in tokens, its log
    uncertainty (None when unknown) and the unit it belongs to (for the bootstrap).
    `online`: the online B_noise series (`analysis.online_noise`), method `online_noise`."""
    points = []
    for row in per_run:
        if row["b_crit_tokens"] and row.get("in_kaplan", True):
            points.append({"method": "per_run", "optimizer": row["optimizer"],
                           "group": row["group"], "loss": row["val_loss"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": row["run_dir"],
                           "unit": row.get("trunk") or row["run_dir"],
                           "log_sigma": log_sigma(row["b_crit_low"], row["b_crit_high"], Z95)})
    for row in pareto:
        if row["b_crit_tokens"] and not row.get("degenerate"):
            points.append({"method": "pareto", "optimizer": row["optimizer"],
                           "group": row["group"], "loss": row["target_loss"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": None,
                           "unit": f"pareto:{row['group']}",
                           "log_sigma": log_sigma(row["b_crit_low"], row["b_crit_high"], Z95)})
    for p in noise:
        points.append({"method": "noise", "kind": p["kind"], "optimizer": p["optimizer"],
                       "group": p["group"], "loss": p["loss"],
                       "b_crit_tokens": p["b_noise_tokens"], "run_dir": p["run_dir"],
                       "unit": p["run_dir"],  # 68% intervals: +-1 sigma
                       "log_sigma": log_sigma(p.get("b_noise_low"), p.get("b_noise_high"), 1.0)})
    online = online or []
    for row, unit in zip(online, online_units(online), strict=True):
        points.append({"method": "online_noise", "optimizer": row["optimizer"],
                       "group": row["group"], "loss": row["val_loss"],
                       "b_crit_tokens": row["b_noise_tokens"], "run_dir": row["run_dir"],
                       "step": row["step"], "unit": unit, "log_sigma": None})
    return points


def fill_sigmas(sigmas: list[float | None]) -> list[float] | None:
    """Unknown uncertainties take the median of the known ones; None when none is known
    (the fit then weighs every point equally)."""
    known = [s for s in sigmas if s]
    if not known:
        return None
    median = float(np.median(known))
    return [s if s else median for s in sigmas]


def fit_row(optimizer: str, method: str, points: list[dict], seed: int = 0) -> dict:
    """Kaplan's law over `points` (one optimizer, one method): the weighted fit, and the
    interval of the exponent over the points' units (`bootstrap_kaplan`: a percentile
    bootstrap, or the range of per-unit estimates with few units)."""
    losses = [p["loss"] for p in points]
    b_tokens = [p["b_crit_tokens"] for p in points]
    sigmas = fill_sigmas([p["log_sigma"] for p in points])
    fit = fit_kaplan(losses, b_tokens, sigmas)
    units = [p["unit"] for p in points]
    kinds = {"per_run": "runs", "noise": "runs", "pareto": "Pareto frontiers",
             "online_noise": f"blocks of consecutive eval points (up to {ONLINE_NOISE_BLOCKS} "
                             "per run)"}
    boot = bootstrap_kaplan(losses, b_tokens, units, sigmas, resamples=BOOTSTRAP_RESAMPLES,
                            seed=seed, unit_name=kinds[method])
    row = {"optimizer": optimizer, "method": method, "b_star_tokens": fit["b_star_tokens"],
           "exponent": fit["exponent"], "exponent_low": boot["exponent_low"],
           "exponent_high": boot["exponent_high"],
           "b_star_tokens_low": boot["b_star_tokens_low"],
           "b_star_tokens_high": boot["b_star_tokens_high"], "n_points": len(points),
           "n_units": boot["n_units"],
           "interval": boot["interval"],
           "weighted": sigmas is not None,
           "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS, "kaplan_exponent": KAPLAN_EXPONENT}
    row["left_out"] = left_out_reason(row)
    row["shown"] = row["left_out"] is None
    return row


def kaplan_fits(points: list[dict], warnings: list[str], fix_hint: str) -> list[dict]:
    """One row per (optimizer, method) with two or more points (`METHODS` order); each point
    gets its row's prediction (`fit_tokens`) and Kaplan's (`kaplan_tokens`)."""
    rows = []
    for optimizer in sorted({p["optimizer"] for p in points}):
        mine = [p for p in points if p["optimizer"] == optimizer]
        by_method = {m: [p for p in mine if p["method"] == m] for m in METHODS}
        for method in METHODS:
            pts = by_method.get(method, [])
            if not pts:
                continue
            row = fit_row(optimizer, method, pts)
            if row["exponent"] is None:
                hint = NOISE_FIX if method in NOISE_METHODS else fix_hint
                warnings.append(f"Kaplan fit ({optimizer}, {method}) needs points at two losses "
                                f"or more ({len(pts)} here); {hint}")
                continue
            rows.append(row)
            for p in pts:
                p["fit_tokens"] = kaplan_prediction_tokens(p["loss"], row["b_star_tokens"],
                                                           row["exponent"])
    for p in points:
        p["kaplan_tokens"] = kaplan_prediction_tokens(p["loss"], KAPLAN_B_STAR_TOKENS,
                                                      KAPLAN_EXPONENT)
        p.setdefault("fit_tokens", None)
    if not rows:
        warnings.append(f"Kaplan fit needs B_crit at two losses or more for one optimizer and "
                        f"method ({len(points)} point(s) in all); {fix_hint}")
    return rows
