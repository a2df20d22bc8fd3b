"""Per-run against Pareto B_crit at the same loss: two routes to one quantity.

docs/science.md (section 3, "What may and may not be fitted together"): the tokens-equivalent
B_crit of each (batch, budget) cell and the Pareto frontier's E_min / S_min measure the same
B_crit, so at each Pareto target loss they should agree. A ratio far from 1 says one of them
is off: a baseline that is not the most token-efficient batch (per-run biased high), a Pareto
fit on batch sizes all far below or above B_crit, or a loss curve bent by the schedule.

How the per-run B_crit at a target loss L* is read: for each batch size, the two per-run rows
of adjacent budgets whose losses bracket L* (a run's loss falls with its budget), with
log B_crit interpolated linearly in the loss between them; batch sizes whose rows do not
bracket L*, or where one of the two has no B_crit (r <= 1, below the baseline) or is out of
Kaplan's law (`in_kaplan` false: an interval unbounded above, r within the noise of 1, or a
run of too few steps for its warmup), are left out.
The batch sizes' values are then combined as a weighted mean of log B_crit, each weighted by
1/sigma^2 of its interpolated log interval (equal weights when any is unknown). The rows share
one baseline curve, so their errors are correlated: the spread across batch sizes is reported
(`per_run_b_crit_min`, `_max`), never an interval of the mean.

Units: B_crit in sequences; losses in nats/token.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from critbatch.analysis.bcrit.kaplan import Z95, log_sigma


def bracketed(rows: list[dict], target: float) -> tuple[float, float | None] | None:
    """(log B_crit, its sigma or None) of one batch size at `target`: linear in the loss
    between the two rows of adjacent budgets that bracket it; None when none do."""
    rows = sorted(rows, key=lambda r: r["tokens"])
    for a, b in zip(rows, rows[1:], strict=False):
        lo, hi = sorted((a["val_loss"], b["val_loss"]))
        if not lo <= target <= hi:
            continue
        if not all(row["b_crit"] and row.get("in_kaplan", True) for row in (a, b)):
            return None
        w = 0.0 if hi == lo else (target - a["val_loss"]) / (b["val_loss"] - a["val_loss"])
        log_b = (1 - w) * math.log(a["b_crit"]) + w * math.log(b["b_crit"])
        sa = log_sigma(a["b_crit_low"], a["b_crit_high"], Z95)
        sb = log_sigma(b["b_crit_low"], b["b_crit_high"], Z95)
        return log_b, None if sa is None or sb is None else (1 - w) * sa + w * sb
    return None


def per_run_at_loss(per_run: list[dict], target: float) -> dict:
    """The per-run B_crit at `target` (module docstring): the weighted geometric mean over
    batch sizes, how many and which entered, their spread and whether it was weighted."""
    by_batch: dict[int, list[dict]] = defaultdict(list)
    for row in per_run:
        if not row.get("below_baseline"):
            by_batch[row["batch_size"]].append(row)
    found = {b: v for b, rows in sorted(by_batch.items())
             if (v := bracketed(rows, target)) is not None}
    out = {"per_run_b_crit": None, "per_run_b_crit_min": None, "per_run_b_crit_max": None,
           "per_run_batch_sizes": sorted(found), "n_per_run": len(found),
           "per_run_weighted": False}
    if not found:
        return out
    logs = np.array([v[0] for v in found.values()])
    sigmas = [v[1] for v in found.values()]
    weighted = all(s for s in sigmas)
    w = 1.0 / np.square(sigmas) if weighted else np.ones(len(logs))
    out.update(per_run_b_crit=float(np.exp(np.sum(w * logs) / np.sum(w))),
               per_run_b_crit_min=float(np.exp(logs.min())),
               per_run_b_crit_max=float(np.exp(logs.max())), per_run_weighted=weighted)
    return out


def consistency_rows(pareto: list[dict], per_run: list[dict]) -> list[dict]:
    """One row per Pareto target of one group: the Pareto B_crit with its interval beside the
    per-run B_crit at that loss (`per_run_at_loss`) and their ratio per-run / Pareto
    (None where either is missing); `within_pareto_interval` None without an interval."""
    rows = []
    for p in pareto:
        mine = [r for r in per_run if r["optimizer"] == p["optimizer"]
                and r.get("group") == p.get("group")]
        here = per_run_at_loss(mine, p["target_loss"])
        value, low, high = p["b_crit"], p["b_crit_low"], p["b_crit_high"]
        est = here["per_run_b_crit"]
        rows.append({
            "optimizer": p["optimizer"], "group": p.get("group"),
            "target_loss": p["target_loss"], "pareto_b_crit": value,
            "pareto_b_crit_low": low, "pareto_b_crit_high": high,
            "pareto_interval": p.get("interval"), "pareto_degenerate": p.get("degenerate"),
            "pareto_batch_sizes": p["batch_sizes"], **here,
            "ratio": est / value if est and value else None,
            "within_pareto_interval": (low <= est <= high) if est and low and high else None})
    return rows
