"""The online gradient noise scale along training, B_noise(L), as its own series.

The trainer's online tracker (docs/science.md, section 2: the two-batch estimator from
micro-batches, numerator and denominator averaged separately by an EMA) writes its current
B_noise on each eval point of a run's `curve` as `b_noise` (sequences; absent or None when
tracking is off or not yet resolved). Paired with that eval point's validation loss, one run
gives B_noise at many losses: a B_simple(L) series for Kaplan's law, beside (never pooled
with) the B_crit estimates and the checkpoint measurements of noise.json.

The series of a group comes from the baseline batch's main runs (not cooldown branches, which
would repeat the trunk they forked from: `branch_of` absent) at the best grid lr of the
baseline's largest budget, every seed. Eval points without a positive, finite `b_noise` or
val_loss are skipped. Units: B_noise in sequences unless a name ends in `_tokens`; losses in
nats/token; `tokens` are training tokens seen at the eval.
"""

from __future__ import annotations

import numpy as np

from critbatch.results.runs import is_finite


def series_runs(members: list[dict], cells: list, baseline_batch: int,
                budgets: dict[int, int]) -> list[dict]:
    """The main runs (no `branch_of`) of the baseline batch at the best grid lr of its largest
    budget (`best_lr.Cell`s; `budgets` maps tokens to nominal budgets), sorted by seed."""
    base = [c for c in cells if c.batch_size == baseline_batch]
    if not base:
        return []
    cell = max(base, key=lambda c: c.budget)
    best_lr = cell.lrs[int(np.argmin(cell.losses))]
    runs = [r for r in members if r["batch_size"] == baseline_batch and not r.get("branch_of")
            and budgets.get(r["tokens"]) == cell.budget and float(r["lr"]) == best_lr]
    return sorted(runs, key=lambda r: (r["seed"], r["run_dir"]))


def online_noise_rows(members: list[dict], cells: list, baseline_batch: int | None,
                      budgets: dict[int, int], group: str, optimizer: str,
                      seq_len: int) -> list[dict]:
    """The online B_noise(L) series of one group (module docstring): one row per usable eval
    point, in training order per run; empty without a baseline or without `b_noise` values."""
    if baseline_batch is None:
        return []
    rows = []
    for run in series_runs(members, cells, baseline_batch, budgets):
        for point in run["curve"]:
            b_noise, loss = point.get("b_noise"), point.get("val_loss")
            if not (is_finite(b_noise) and b_noise > 0 and is_finite(loss) and loss > 0):
                continue
            rows.append({"optimizer": optimizer, "group": group, "run_dir": run["run_dir"],
                         "seed": run["seed"], "batch_size": run["batch_size"],
                         "lr": float(run["lr"]), "step": point["step"],
                         "tokens": point["tokens"], "val_loss": float(loss),
                         "b_noise": float(b_noise),
                         "b_noise_tokens": float(b_noise) * seq_len})
    return rows
