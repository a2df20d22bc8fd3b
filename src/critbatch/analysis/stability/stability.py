"""The small-batch stability study (science.md section 6): the verdicts per run.

Science.md section 6: `Var(g_B) = Var(g_1) / B`, so the smallest batches take the noisiest
steps. Below about 8 sequences even Adam can diverge (its second-moment estimate is too
noisy), 8-16 converge slowly, 32 and more are stable. Gradient accumulation over k
micro-batches of m sequences computes exactly the gradient of a batch of k*m (it only saves
memory), so its loss curve must match the plain batch to float precision. The classic study:
batch sizes 1, 4, 16, 64, 256; the learning rate tuned at 64 and carried to the others by the
square-root rule; 500 steps; loss and gradient norm logged every step; 16 x 4 accumulated
against a plain 64.

The sweeps write three stages, `runs/<stage>/<scale>/<override_dirname>/`:

- `stability_lr`     the lr grid at the base batch (64), one run per lr per optimizer;
- `stability`        every batch size at the tuned lr, scaled by `optim.lr_scaling`;
- `stability_accum`  the base batch computed as micro-batches (gradient accumulation).

`report.run_analysis` (what `analysis/stability.py` calls) loads them
(`inputs.load_stability_runs`), judges them here (`analyse`, a pure function of the loaded
runs; the thresholds and rules are in `rules`, the accumulation check in `accumulation`)
and writes, through `render.run_study`, report.md, the plots and `stability.json` (the same
numbers, machine-readable).

Units: batch sizes in sequences, losses in nats/token (nats/byte when the name ends in
`_per_byte`), steps are optimizer steps.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from critbatch.analysis.stability.accumulation import accumulation_entry, find_plain_run
from critbatch.analysis.stability.rules import (
    ACCUM_FIRST_STEPS,
    ACCUM_STAGE,
    BATCH_STAGE,
    LR_RTOL,
    LR_STAGE,
    RULES,
    SPIKE_FACTOR,
    TAIL_SPIKE_RATIO,
    TAIL_STEPS,
    UNSTABLE_CV_FLOOR,
    UNSTABLE_RATIO,
)
from critbatch.results.runs import is_finite

DEFAULT_BASE_BATCH = 64  # sequences: the tuned batch when no summary names base_batch_size


# ---------------------------------------------------------------------------------------------
# Statistics of one run


def tail_window(planned_steps: int) -> int:
    """Steps in the tail window: `TAIL_STEPS`, or half the planned steps when a run plans
    fewer than `2 * TAIL_STEPS` (at least 1)."""
    return max(1, min(TAIL_STEPS, planned_steps // 2))


def detrended_variance(steps: np.ndarray, values: np.ndarray) -> float:
    """Population variance of `values` around their least-squares parabola in `steps`.

    The step-to-step noise of a train loss that is still falling, without its trend (a slope
    and a bend: over a tail window a decaying loss is close to a parabola, and a straight line
    alone would leave its curvature in the residuals). NaN with fewer than 4 points or any
    non-finite value.
    """
    if len(values) < 4 or not np.all(np.isfinite(values)):
        return math.nan
    x = (steps - steps.mean()) / steps.std()
    residuals = values - np.polyval(np.polyfit(x, values, 2), x)
    return float(np.mean(residuals ** 2))


def tail_stats(rows: list[dict], window: int, batch_size: int) -> dict:
    """What the verdicts read from a run's per-step rows (clean, sorted by step).

    Over the whole run: the first and final train loss, the largest grad norm (NaN ignored),
    the first step with a non-finite loss or grad norm. Over the tail (the last `window`
    rows): the population mean and variance of the train loss and of the grad norm, the
    grad norm's coefficient of variation std/mean, and the loss noise `B x Var` (Var: see
    `detrended_variance`; B x Var is batch-independent for a stable run, science.md section 6:
    Var(g_B) = Var(g_1) / B).
    """
    steps = np.array([r["step"] for r in rows], dtype=float)
    loss = np.array([r["train_loss"] for r in rows], dtype=float)
    gnorm = np.array([r["grad_norm"] for r in rows], dtype=float)
    bad = ~(np.isfinite(loss) & np.isfinite(gnorm))
    t_steps, t_loss, t_gnorm = steps[-window:], loss[-window:], gnorm[-window:]
    with np.errstate(all="ignore"):
        gn_mean, gn_var = float(np.mean(t_gnorm)), float(np.var(t_gnorm))
        cv = math.sqrt(gn_var) / gn_mean if gn_mean > 0 else math.nan
        finite_gn = gnorm[~np.isnan(gnorm)]
        return {
            "n_steps_logged": len(rows),
            "first_train_loss": float(loss[0]),
            "final_train_loss": float(loss[-1]),
            "first_nonfinite_step": int(steps[bad][0]) if bad.any() else None,
            "max_grad_norm": float(finite_gn.max()) if finite_gn.size else math.nan,
            "tail_steps": len(t_steps),
            "tail_first_step": int(t_steps[0]),
            "tail_last_step": int(t_steps[-1]),
            "tail_mean_train_loss": float(np.mean(t_loss)),
            "tail_var_train_loss": float(np.var(t_loss)),
            "tail_mean_grad_norm": gn_mean,
            "tail_var_grad_norm": gn_var,
            "grad_norm_cv": cv,
            "tail_spike_ratio": (float(np.max(t_gnorm) / np.median(t_gnorm))
                                 if np.median(t_gnorm) > 0 else math.nan),
            "grad_norm_spikes": (int(np.sum(finite_gn > SPIKE_FACTOR * np.median(finite_gn)))
                                 if finite_gn.size else 0),
            "loss_noise": batch_size * detrended_variance(t_steps, t_loss),
        }


EMPTY_STATS = {k: None for k in (
    "first_train_loss", "final_train_loss", "first_nonfinite_step", "max_grad_norm",
    "tail_steps", "tail_first_step", "tail_last_step", "tail_mean_train_loss",
    "tail_var_train_loss", "tail_mean_grad_norm", "tail_var_grad_norm", "grad_norm_cv",
    "tail_spike_ratio", "grad_norm_spikes", "loss_noise")} | {"n_steps_logged": 0}


def batch_row(run: dict, window: int) -> dict:
    """One run of the stability stage as a per-batch row: its summary's numbers, its tail
    statistics (`tail_stats`; None without metrics) and, later, its verdict."""
    stats = tail_stats(run["metrics"], window, run["batch_size"]) if run["metrics"] else (
        dict(EMPTY_STATS))
    return {
        "run_dir": run["run_dir"], "stage": run["stage"], "seed": run["seed"],
        "batch_size": run["batch_size"], "micro_batch_size": run["micro_batch_size"],
        "lr": run["lr"], "base_lr": run.get("base_lr"), "lr_scaling": run.get("lr_scaling"),
        "steps": run["steps"], "status": run["status"], "status_reason": run.get("status_reason"),
        "diverged_step": run.get("diverged_step"), "val_loss": run["val_loss"],
        "val_loss_per_byte": run["val_loss_per_byte"], **stats,
        "grad_norm_cv_ratio": None, "grad_norm_cv_excess": None, "loss_noise_ratio": None,
        "verdict": None, "verdict_reason": None,
    }


def divergence(row: dict) -> str | None:
    """Why a per-batch row counts as diverged (RULES["diverged"]), or None."""
    if row["status"] == "diverged":
        why = f" ({row['status_reason']})" if row.get("status_reason") else ""
        return f"the trainer stopped it at step {row.get('diverged_step')}{why}"
    if row["first_nonfinite_step"] is not None:
        return f"non-finite train loss or grad norm at step {row['first_nonfinite_step']}"
    if not is_finite(row["val_loss"]):
        return "non-finite final validation loss"
    tail, first = row["tail_mean_train_loss"], row["first_train_loss"]
    if tail is not None and first is not None and tail > first:
        return f"tail mean train loss {tail:.4f} > first-step train loss {first:.4f}"
    return None


def _ratio(x: float | None, ref: float | None) -> float | None:
    if is_finite(x) and is_finite(ref) and ref > 0:
        return x / ref
    return None


def instability(row: dict) -> str | None:
    """Why a non-diverged row counts as unstable (RULES["unstable"]), or None. Reads the
    ratios to the reference that `analyse_group` filled in."""
    cv, excess, noise_ratio = row["grad_norm_cv"], row["grad_norm_cv_excess"], (
        row["loss_noise_ratio"])
    spike = row["tail_spike_ratio"]
    reasons = []
    if spike is not None and is_finite(spike) and spike > TAIL_SPIKE_RATIO:
        reasons.append(f"a tail grad norm {spike:.3g}x the tail's median")
    if excess is not None and excess > UNSTABLE_RATIO and cv > UNSTABLE_CV_FLOOR:
        reasons.append(f"tail grad-norm CV {cv:.3g} is {excess:.1f}x the reference's after the "
                       "sqrt(B) scaling of sampling noise")
    if noise_ratio is not None and noise_ratio > UNSTABLE_RATIO:
        reasons.append(f"tail loss noise B x Var {row['loss_noise']:.3g} is {noise_ratio:.1f}x "
                       "the reference's")
    return "; ".join(reasons) or None


# ---------------------------------------------------------------------------------------------
# Learning-rate tuning at the base batch


def lr_tuning(runs: list[dict], base_batch_size: int) -> dict:
    """The lr grid at the base batch: final validation loss per lr, the best lr marked.

    Runs at the same lr (seeds, several lr_scaling values) are averaged over those that
    completed with a finite loss; an lr where none did counts as diverged. The best lr is the
    grid minimum; `edge` says "low"/"high" when it is the smallest/largest lr of the grid
    (the optimum may lie beyond it: science.md section 5), "single" for a one-lr grid, else
    None. Returns {optimizer, batch_sizes, rows: [{lr, val_loss, val_loss_per_byte, status,
    n_runs, run_dirs, best}], best_lr, best_val_loss, edge, warnings}.
    """
    by_lr: dict[float, list[dict]] = defaultdict(list)
    for run in runs:
        key = next((k for k in by_lr if math.isclose(k, run["lr"], rel_tol=LR_RTOL)), run["lr"])
        by_lr[key].append(run)
    rows, warnings = [], []
    for lr in sorted(by_lr):
        group = by_lr[lr]
        ok = [r for r in group if r["status"] == "completed" and is_finite(r["val_loss"])]
        rows.append({
            "lr": lr,
            "val_loss": float(np.mean([r["val_loss"] for r in ok])) if ok else math.nan,
            "val_loss_per_byte": (float(np.mean([r["val_loss_per_byte"] for r in ok]))
                                  if ok else math.nan),
            "status": "completed" if ok else "diverged", "n_runs": len(group),
            "run_dirs": sorted(r["run_dir"] for r in group), "best": False})
        losses = {r["val_loss"] for r in ok}
        if len(losses) > 1:  # seeds, say; a run repeated under another lr rule is not news
            warnings.append(f"{len(ok)} runs at lr {lr:.3g} with different final losses: their "
                            "mean val loss is used")
    optimizer = runs[0]["optimizer"]
    batch_sizes = sorted({r["batch_size"] for r in runs})
    if batch_sizes != [base_batch_size]:
        warnings.append(f"lr-tuning runs at batch sizes {batch_sizes}, expected only the base "
                        f"batch {base_batch_size}")
    finite = [r for r in rows if is_finite(r["val_loss"])]
    best = min(finite, key=lambda r: r["val_loss"]) if finite else None
    edge = None
    if best is None:
        warnings.append(f"every lr of the {optimizer} grid diverged: no tuned lr")
    else:
        best["best"] = True
        grid = f"{rows[0]['lr']:.3g}..{rows[-1]['lr']:.3g}"
        if len(rows) == 1:
            edge = "single"
            warnings.append(f"{optimizer}: one lr only ({best['lr']:.3g}): the lr is not tuned")
        elif best is rows[0]:
            edge = "low"
            warnings.append(f"{optimizer}: the best lr {best['lr']:.3g} is the lowest of the "
                            f"grid ({grid}): the optimum may lie lower; extend the grid down")
        elif best is rows[-1]:
            edge = "high"
            warnings.append(f"{optimizer}: the best lr {best['lr']:.3g} is the highest of the "
                            f"grid ({grid}): the optimum may lie higher; extend the grid up")
    return {"optimizer": optimizer, "batch_sizes": batch_sizes, "rows": rows,
            "best_lr": best["lr"] if best else None,
            "best_val_loss": best["val_loss"] if best else None, "edge": edge,
            "warnings": warnings}


# ---------------------------------------------------------------------------------------------
# Groups and the whole analysis


def scale_of(run: dict) -> str:
    return str(run.get("scale") or f"w{run['width']}_d{run['depth']}_T{run['seq_len']}")


def _most_common(values: list) -> Any:
    values = [v for v in values if v is not None]
    return Counter(values).most_common(1)[0][0] if values else None


def lr_rule_warnings(rows: list[dict], base_lr: float | None, base_batch: int) -> list[str]:
    """A warning per run whose lr used is not base_lr x f(B / base batch) of its lr_scaling."""
    if base_lr is None:
        return []
    from critbatch.science.rules import lr_multiplier

    out = []
    for row in rows:
        rule = row["lr_scaling"]
        try:
            expected = base_lr * lr_multiplier(rule, row["batch_size"], base_batch)
        except KeyError:
            continue
        if not math.isclose(row["lr"], expected, rel_tol=LR_RTOL):
            out.append(f"batch {row['batch_size']}: lr used {row['lr']:.4g} is not base lr "
                       f"{base_lr:.4g} x {rule}({row['batch_size']}/{base_batch}) = "
                       f"{expected:.4g} ({row['run_dir']})")
    return out


def analyse_group(key: tuple, runs: list[dict], lr_runs: list[dict], all_runs: list[dict],
                  name: str) -> dict:
    """One (scale, optimizer, lr_scaling) group: lr tuning, per-batch rows with verdicts,
    accumulation comparisons and warnings. `runs` are the group's stability and
    stability_accum runs, `lr_runs` the lr grid of its scale and optimizer, `all_runs` the
    pool searched for the plain runs."""
    scale, optimizer, lr_scaling = key
    warnings: list[str] = []
    batch_runs = sorted((r for r in runs if r["stage"] == BATCH_STAGE),
                        key=lambda r: (r["batch_size"], r["seed"], r["lr"], r["run_dir"]))
    accum_runs = sorted((r for r in runs if r["stage"] == ACCUM_STAGE),
                        key=lambda r: r["run_dir"])
    base_batch = (_most_common([r.get("base_batch_size") for r in runs + lr_runs])
                  or _most_common([r["batch_size"] for r in lr_runs]) or DEFAULT_BASE_BATCH)
    base_lr = (_most_common([r.get("base_lr") for r in batch_runs])  # older runs lack it
               or _most_common([r["lr"] for r in batch_runs if r["batch_size"] == base_batch]))

    completed = [r["steps"] for r in batch_runs + accum_runs if r["status"] == "completed"]
    planned = max(completed or [r["steps"] for r in batch_runs + accum_runs] or [0])
    window = tail_window(planned)

    tuning = lr_tuning(lr_runs, base_batch) if lr_runs else None
    if tuning:
        warnings += tuning["warnings"]
    else:
        warnings.append(f"no {LR_STAGE} runs for {optimizer}: the lr tuning is not shown")
    if (tuning and tuning["best_lr"] is not None and base_lr is not None
            and not math.isclose(base_lr, tuning["best_lr"], rel_tol=LR_RTOL)):
        warnings.append(f"the {BATCH_STAGE} runs used base lr {base_lr:.4g}, but the best lr of "
                        f"the grid at batch {base_batch} is {tuning['best_lr']:.4g}")

    rows = [batch_row(r, window) for r in batch_runs]
    if not rows:
        warnings.append(f"no {BATCH_STAGE} runs in this group yet: no per-batch verdicts")
    for row in rows:
        reason = divergence(row)
        if reason:
            row["verdict"], row["verdict_reason"] = "diverged", reason
    reference = next((r for r in rows if r["batch_size"] == base_batch and r["verdict"] is None),
                     None)
    if rows and reference is None:
        warnings.append(f"no run at the base batch {base_batch} that did not diverge: only the "
                        "tail-spike rule decides 'unstable'")
    for row in rows:
        if reference is not None:
            row["grad_norm_cv_ratio"] = _ratio(row["grad_norm_cv"], reference["grad_norm_cv"])
            if row["grad_norm_cv_ratio"] is not None:  # sampling noise alone: sqrt(B_ref / B)
                row["grad_norm_cv_excess"] = row["grad_norm_cv_ratio"] * math.sqrt(
                    row["batch_size"] / reference["batch_size"])
            row["loss_noise_ratio"] = _ratio(row["loss_noise"], reference["loss_noise"])
        if row["verdict"] is None:
            reason = instability(row)
            row["verdict"] = "unstable" if reason else "stable"
            row["verdict_reason"] = reason or ("" if row["n_steps_logged"] else
                                               "no per-step metrics: only the summary's status "
                                               "and val loss were checked")
    warnings += lr_rule_warnings(rows, base_lr, base_batch)

    accumulation = []
    for run in accum_runs:
        if run["micro_batch_size"] in (None, run["batch_size"]):
            warnings.append(f"{run['run_dir']} is in {ACCUM_STAGE} but does not accumulate "
                            f"(micro-batch {run['micro_batch_size']} of batch {run['batch_size']})")
        plain = find_plain_run(run, all_runs)
        if plain is None:
            warnings.append(f"no plain batch-{run['batch_size']} run with the same optimizer, "
                            f"model, seed and lr {run['lr']:.4g} to compare {run['run_dir']} with")
        entry = accumulation_entry(run, plain)
        if plain is not None and entry["first_steps_max_rel_diff"] is not None and (
                entry["steps_compared"] < ACCUM_FIRST_STEPS):
            warnings.append(f"only {entry['steps_compared']} common steps between the "
                            f"accumulation run and its plain run (wanted {ACCUM_FIRST_STEPS})")
        accumulation.append(entry)
    return {
        "name": name, "scale": scale, "optimizer": optimizer, "lr_scaling": lr_scaling,
        "base_batch_size": base_batch, "base_lr": base_lr,
        "tail_window": {"steps": window, "planned_steps": planned, "rule": RULES["tail_window"]},
        "lr_tuning": tuning, "per_batch": rows, "accumulation": accumulation,
        "warnings": warnings,
    }


def analyse(runs: list[dict], left_out: list[dict] | None = None,
            warnings: list[str] | None = None) -> dict:
    """Group the runs of the three stages by (scale, optimizer, lr_scaling) and analyse each.

    `runs` are `load_stability_runs` runs (summary + stage + metrics). The lr grid belongs to
    (scale, optimizer): at the base batch every lr_scaling rule uses the same lr, so one grid
    serves each scaling rule's group; an optimizer with only an lr grid gets a group of its
    own. Returns {n_runs, groups, left_out, warnings (every group's, prefixed by its name),
    curves ({run_dir: (steps, train_loss, grad_norm)} for the plots)}.
    """
    lr_runs: dict[tuple, list[dict]] = defaultdict(list)
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        if run["stage"] == LR_STAGE:
            lr_runs[(scale_of(run), run["optimizer"])].append(run)
        else:
            by_key[(scale_of(run), run["optimizer"], run.get("lr_scaling") or "unknown")].append(
                run)
    for (scale, optimizer), grid in lr_runs.items():
        if not any(k[:2] == (scale, optimizer) for k in by_key):
            rule = _most_common([r.get("lr_scaling") for r in grid]) or "unknown"
            by_key[(scale, optimizer, rule)] = []
    several_scales = len({k[0] for k in by_key}) > 1
    groups = []
    for key in sorted(by_key):
        name = f"{key[1]}, lr_scaling {key[2]}" + (f" ({key[0]})" if several_scales else "")
        groups.append(analyse_group(key, by_key[key], lr_runs.get(key[:2], []), runs, name))
    all_warnings = list(warnings or [])
    all_warnings += [f"{g['name']}: {w}" for g in groups for w in g["warnings"]]
    curves = {r["run_dir"]: (np.array([m["step"] for m in r["metrics"]], dtype=float),
                             np.array([m["train_loss"] for m in r["metrics"]], dtype=float),
                             np.array([m["grad_norm"] for m in r["metrics"]], dtype=float))
              for r in runs}
    return {"n_runs": len(runs), "groups": groups, "left_out": list(left_out or []),
            "warnings": all_warnings, "curves": curves}

