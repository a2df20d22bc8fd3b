"""The B_noise measurements of a sweep: the noise program's and the online tracker's
(`noise_points`), and the tracker's B_noise(L) along training as its own series.

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

from critbatch.analysis.bcrit.best_lr import group_key, group_name
from critbatch.results.runs import is_finite


def lr_phase(run: dict, step: int) -> str:
    """Where step `step` (steps taken) of `run` sat in its lr schedule, from its summary:
    "warmup", "constant" (every step since the warmup at the peak lr) or "decaying" (a wsd
    cooldown, a cosine or linear decay, a scheduled batch's lr). The tracker's EMA reads
    |G|^2 falling as the lr decays, so only "constant" readings measure B_noise(L) at a
    state the schedule has not moved (docs/science.md, the noise scale checked)."""
    warmup, steps = int(run.get("warmup_steps") or 0), int(run["steps"])
    if step <= warmup:
        return "warmup"
    schedule = run.get("schedule")
    if run.get("batch_schedule", "constant") != "constant" or schedule not in ("wsd",
                                                                               "constant"):
        return "decaying"
    if schedule == "constant":
        return "constant"
    # the trainer's wsd_decay_start: the last cooldown_fraction of the steps decays
    start = max(warmup, steps - max(1, round(float(run.get("cooldown_fraction") or 0.2)
                                                 * steps)))
    return "constant" if step <= start else "decaying"


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
                         "b_noise_tokens": float(b_noise) * seq_len,
                         "lr_phase": lr_phase(run, int(point["step"]))})
    return rows


def noise_points(runs: list[dict]) -> list[dict]:
    """B_noise measurements: noise.json (kind `b_noise`) and the online tracker's
    summary keys `b_noise`, `b_noise_tokens`, `b_noise_loss` (kind `b_noise_online`)."""
    points = []
    for run in runs:
        group = group_name(group_key(run))
        noise = run.get("noise")
        if noise and noise.get("resolved") and is_finite(noise.get("b_noise_tokens")):
            points.append({
                "kind": "b_noise", "run_dir": run["run_dir"], "group": group,
                "optimizer": run["optimizer"], "loss": noise["val_loss"],
                "loss_per_byte": noise["val_loss_per_byte"], "b_noise": noise["b_noise"],
                "b_noise_tokens": noise["b_noise_tokens"], "b_noise_low": noise["b_noise_low"],
                "b_noise_high": noise["b_noise_high"], "trace": noise["trace"],
                "g2": noise["g2"], "micro_batches": noise["micro_batches"],
                "interval": noise.get("interval") or "as written by the noise program",
                "micro_batch_size": noise["micro_batch_size"]})
        elif noise is not None:
            points.append({"kind": "b_noise", "run_dir": run["run_dir"], "unresolved": True,
                           "micro_batches": noise.get("micro_batches")})
        if is_finite(run.get("b_noise_tokens")) and is_finite(run.get("b_noise_loss")) and (
                run["b_noise_tokens"] > 0):
            points.append({
                "kind": "b_noise_online", "run_dir": run["run_dir"], "group": group,
                "optimizer": run["optimizer"], "loss": run["b_noise_loss"],
                "loss_per_byte": run["b_noise_loss"] / run["bytes_per_token"],
                "b_noise": run.get("b_noise"), "b_noise_tokens": run["b_noise_tokens"],
                "b_noise_low": None, "b_noise_high": None})
    return points
