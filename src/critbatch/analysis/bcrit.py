"""The critical batch size from finished runs: pure fitting functions, no I/O, no torch.

Three measurements of B_crit (formulas in `../shared/docs/science.md`, sections 1, 3-5):

1. **Tokens-equivalent, per run** (McCandlish et al. 2018). A small-batch baseline b at
   several budgets gives final loss versus tokens, L_b(E). A run with batch B that saw E
   tokens and reached loss L is worth E_eff = L_b^{-1}(L) baseline tokens. With
   E = E_min (1 + B/B_crit), E_eff = E_min (1 + b/B_crit) and r = E / E_eff:
   B_crit = (B - b r) / (r - 1).
2. **Pareto frontier.** For a target loss, each batch size needs E(B) tokens and
   S(B) = E(B) / (B seq_len) steps; S = S_min + E_min / B, so B_crit(L*) = E_min / S_min.
3. **Kaplan's law** (Kaplan et al. 2020, section 5.1): B_crit(L) = B* / L^(1/alpha_B) over
   the estimates above and the measured gradient noise scale B_noise.

Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token unless
a name ends in `_per_byte`; `tokens` are training tokens seen.

`analyse(runs)` runs everything on the runs loaded by `critbatch.analysis.results.load_runs`
and returns plain dicts and lists; `critbatch.analysis.bcrit_report` turns them into files.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from critbatch.analysis.results import is_finite
from critbatch.science.fits import LossCurve, fit_lr_scaling, refine_best_lr
from critbatch.science.laws import (
    KAPLAN_B_STAR_TOKENS,
    KAPLAN_EXPONENT,
    bcrit_corrected,
    bcrit_naive,
    fit_kaplan,
    fit_pareto,
    kaplan_prediction_tokens,
)

GROUP_KEYS = ("data_name", "vocab_size", "seq_len", "width", "depth", "optimizer")
MIN_BASELINE_BUDGETS = 3
PARETO_TARGETS = 5  # target losses per Pareto frontier

# The sweeps that fill each gap (make targets; see sweeps/).
FIX_BASELINE = "`make sweep-batch` (its baseline sweep trains the smallest batch at four budgets)"
FIX_BATCH = "`make sweep-batch` (batch sizes x learning rates at the main budget)"
FIX_PARETO = ("the baseline stage at a second batch size too, e.g. `python -m critbatch.train "
              "--config-dir sweeps --config-name baseline scale=cpu train.batch_size=32`")


# ---------------------------------------------------------------------------------------------
# Grouping


def group_name(key: tuple) -> str:
    """A readable label for a group key (GROUP_KEYS order)."""
    data, vocab, seq_len, width, depth, optimizer = key
    return f"{data} V{vocab} T{seq_len} w{width} d{depth} {optimizer}"


def split_runs(runs: list[dict]) -> tuple[dict[tuple, list[dict]], list[dict], list[str]]:
    """Group comparable runs and leave out the unusable ones.

    Runs are comparable when data, vocabulary, seq_len, width, depth and optimizer agree
    (GROUP_KEYS). Left out, each with a reason: `diverged` (status), `NaN` (a completed run
    whose final loss is not finite), `incomplete` (no eval point or no tokens) and
    `mismatched` (a data fingerprint that differs from the majority of its group: same
    corpus name, different text or tokenizer) and `scheduled batch` (a ramp or adaptive
    batch: no one batch size). Returns (groups, left_out, warnings).
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    left_out, warnings = [], []
    for run in runs:
        where = run.get("run_dir", "?")
        if run["status"] == "diverged":
            step = run.get("diverged_step")
            detail = run.get("status_reason") or "training loss blew up"
            left_out.append({"run_dir": where, "reason": "diverged",
                             "detail": f"{detail}" + (f" at step {step}" if step else "")})
        elif not is_finite(run["val_loss"]):
            left_out.append({"run_dir": where, "reason": "NaN",
                             "detail": f"final val_loss is {run['val_loss']}"})
        elif run.get("batch_schedule", "constant") != "constant":
            left_out.append({"run_dir": where, "reason": "scheduled batch", "detail": (
                f"a {run['batch_schedule']} batch ({run.get('batch_size_start')} -> "
                f"{run.get('batch_size_max', run['batch_size'])} sequences, mean "
                f"{run.get('batch_size_mean', float('nan')):.1f}, {run['steps']:,} steps for "
                f"{run['tokens']:,} tokens) has no single batch size to fit B_crit at; "
                "python analysis/schedules.py compares it by its steps and tokens")})
        elif not run["curve"] or not run["tokens"] or not run["batch_size"]:
            left_out.append({"run_dir": where, "reason": "incomplete",
                             "detail": "no eval point, tokens or batch_size recorded"})
        else:
            groups[tuple(run[k] for k in GROUP_KEYS)].append(run)
    for key, members in list(groups.items()):
        prints = Counter(r["data_fingerprint"] for r in members)
        majority = prints.most_common(1)[0][0]
        keep = [r for r in members if r["data_fingerprint"] == majority]
        for r in members:
            if r["data_fingerprint"] != majority:
                left_out.append({"run_dir": r["run_dir"], "reason": "mismatched",
                                 "detail": f"data_fingerprint differs from the other "
                                           f"{len(keep)} runs of {group_name(key)}"})
        groups[key] = keep
    seq_lens = sorted({k[2] for k in groups})
    if len(seq_lens) > 1:
        warnings.append(f"mixed seq_len {seq_lens}: runs with different contexts are not "
                        "comparable; each seq_len is analysed as its own group")
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0]))), left_out, warnings


# ---------------------------------------------------------------------------------------------
# Best learning rate per cell




@dataclass
class Cell:
    """One (batch size, token budget) of a group at its best learning rate."""

    batch_size: int  # sequences
    tokens: int  # training tokens seen
    lr: float  # refined best lr
    loss: float  # nats/token at the refined best lr (mean over seeds)
    loss_sigma: float  # nats/token: seed std error, else the lr refinement's size; NaN: unknown
    bytes_per_token: float
    run_dir: str  # the grid run nearest the optimum
    edge: str | None  # None, "low", "high" or "single" (see refine_best_lr)
    edge_diverged: bool  # the neighbour beyond the edge was tried and diverged
    lrs: list[float] = field(default_factory=list)  # the grid, sorted
    losses: list[float] = field(default_factory=list)  # mean loss per grid lr
    n_seeds: int = 1
    curve: list[dict] = field(default_factory=list)  # eval points of run_dir

    @property
    def loss_per_byte(self) -> float:
        return self.loss / self.bytes_per_token


def best_lr_cells(runs: list[dict], diverged_lrs: dict | None = None) -> list[Cell]:
    """Collapse a group's runs into cells (batch size x tokens), each at its best lr.

    Seeds at the same lr are averaged; the standard error of the mean over seeds at the best
    grid lr is the loss uncertainty, or, with one seed, |grid minimum - refined minimum| (how
    much the refinement moved the answer). `diverged_lrs` maps (batch_size, tokens) to the lrs
    that diverged, to say whether an edge optimum has a diverged neighbour.
    """
    by_cell: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_cell[(run["batch_size"], run["tokens"])][float(run["lr"])].append(run)
    cells = []
    for (batch, tokens), by_lr in sorted(by_cell.items()):
        lrs = sorted(by_lr)
        means = [float(np.mean([r["val_loss"] for r in by_lr[lr]])) for lr in lrs]
        lr_star, loss_star, edge = refine_best_lr(lrs, means)
        i = int(np.argmin(means))
        seeds = [r["val_loss"] for r in by_lr[lrs[i]]]
        if len(seeds) > 1:
            sigma = float(np.std(seeds, ddof=1) / math.sqrt(len(seeds)))
        elif edge is None:
            sigma = abs(means[i] - loss_star)
        else:  # one seed and no refinement: the uncertainty is unknown, not zero
            sigma = float("nan")
        tried = (diverged_lrs or {}).get((batch, tokens), [])
        edge_diverged = (edge == "high" and any(lr > lrs[-1] for lr in tried)) or (
            edge == "low" and any(lr < lrs[0] for lr in tried))
        best_run = by_lr[lrs[i]][0]
        cells.append(Cell(batch_size=int(batch), tokens=int(tokens), lr=lr_star, loss=loss_star,
                          loss_sigma=sigma, bytes_per_token=float(best_run["bytes_per_token"]),
                          run_dir=best_run["run_dir"], edge=edge, edge_diverged=edge_diverged,
                          lrs=lrs, losses=means, n_seeds=len(seeds), curve=best_run["curve"]))
    return cells


# ---------------------------------------------------------------------------------------------
# Loss versus tokens: monotone interpolation, power-law extrapolation, inversion






# ---------------------------------------------------------------------------------------------
# B_crit per run (tokens-equivalent analysis)






def per_run_bcrit(cell: Cell, baseline: LossCurve, baseline_batch: int, baseline_sigma: float,
                  seq_len: int) -> dict:
    """Effective tokens, r and B_crit (with its interval) for one cell against the baseline.

    The loss uncertainty is the cell's `loss_sigma` and the baseline's (`baseline_sigma`,
    the mean over its cells) added in quadrature; the interval is the B_crit of the losses
    L +- 1.96 sigma, inverted through the same baseline curve (None when a sigma is unknown:
    a single lr or an edge optimum with one seed). r <= 1 means no measurable
    cost: `b_crit` is None and `b_crit_low` is the bound implied by the upper end of r (None
    when that end is <= 1 too). An unbounded end of an interval is None.
    """
    z = 1.959963984540054
    sigma = math.hypot(cell.loss_sigma, baseline_sigma)  # NaN when either is unknown
    e_eff, extrapolated = baseline.tokens_for(cell.loss)
    e_hi = e_lo = float("nan")
    if math.isfinite(sigma):
        e_hi, _ = baseline.tokens_for(cell.loss - z * sigma)  # lower loss: more tokens worth
        e_lo, _ = baseline.tokens_for(cell.loss + z * sigma)
    r = cell.tokens / e_eff if e_eff > 0 else float("nan")
    r_hi = cell.tokens / e_lo if e_lo > 0 else float("nan")
    r_lo = cell.tokens / e_hi if e_hi > 0 else float("nan")
    b, B = baseline_batch, cell.batch_size

    def bc(r_value: float) -> float | None:
        if not math.isfinite(r_value) or r_value <= 1:
            return None
        return max(0.0, bcrit_corrected(B, b, r_value))

    b_crit = bc(r)
    note = None
    if not math.isfinite(r):
        note = "outside the baseline's range and no extrapolation possible"
    elif r <= 1:
        low = bc(r_hi)
        note = "no measurable cost" + (f" (B_crit > {low:.3g})" if low else "")
    elif b_crit == 0.0:
        note = f"r = {r:.3g} >= B/b: worse than the model allows (too few steps?)"
    row = {
        "run_dir": cell.run_dir, "batch_size": B, "tokens": cell.tokens, "lr": cell.lr,
        "lr_edge": cell.edge, "val_loss": cell.loss, "val_loss_per_byte": cell.loss_per_byte,
        "val_loss_sigma": sigma,
        "effective_tokens": e_eff if math.isfinite(e_eff) else None,
        "r": r if math.isfinite(r) else None,
        "b_crit": b_crit,
        "b_crit_low": bc(r_hi),
        "b_crit_high": bc(r_lo) if b_crit is not None else None,
        "b_crit_naive": bcrit_naive(B, r) if math.isfinite(r) and r > 1 else None,
        "extrapolated": bool(extrapolated),
        "baseline_batch": b, "note": note,
    }
    for k in ("b_crit", "b_crit_low", "b_crit_high", "b_crit_naive"):
        row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
    return row


def choose_baseline(cells: list[Cell], forced: int | None = None) -> tuple[int | None, str | None]:
    """The baseline batch: the smallest with >= 3 budgets (or `forced` with >= 2).

    Returns (batch size or None, warning or None).
    """
    budgets = Counter(c.batch_size for c in cells)
    if forced is not None:
        if budgets.get(forced, 0) >= 2:
            warn = None if budgets[forced] >= MIN_BASELINE_BUDGETS else (
                f"baseline batch {forced} has only {budgets[forced]} budgets; its curve is a "
                "straight line between them and cannot be extrapolated")
            return forced, warn
        return None, (f"--baseline-batch {forced} has {budgets.get(forced, 0)} budget(s) here; "
                      f"it needs at least 2; run {FIX_BASELINE}")
    for batch in sorted(budgets):
        if budgets[batch] >= MIN_BASELINE_BUDGETS:
            return batch, None
    have = ", ".join(f"{b}: {n}" for b, n in sorted(budgets.items()))
    return None, (f"no batch size has {MIN_BASELINE_BUDGETS} token budgets (budgets per batch "
                  f"size: {have}), so there is no baseline curve and no per-run B_crit; run "
                  f"{FIX_BASELINE}")


# ---------------------------------------------------------------------------------------------
# Pareto frontier S = S_min + E_min / B




def pareto_frontiers(cells: list[Cell], seq_len: int,
                     optimizer: str) -> tuple[list[dict], str | None]:
    """Pareto fits at PARETO_TARGETS target losses across the range all curves share.

    Uses every batch size with two budgets or more: its final loss versus tokens at the best
    lr (a `LossCurve`, interpolation only). Returns (rows, warning).
    """
    by_batch: dict[int, list[Cell]] = defaultdict(list)
    for c in cells:
        by_batch[c.batch_size].append(c)
    curves = {b: LossCurve([c.tokens for c in cs], [c.loss for c in cs], extrapolate=False)
              for b, cs in sorted(by_batch.items()) if len(cs) >= 2}
    curves = {b: c for b, c in curves.items() if c.pchip is not None}
    if len(curves) < 2:
        return [], (f"Pareto frontier needs two batch sizes with several budgets each "
                    f"({len(curves)} here); run {FIX_PARETO}")
    lo = max(c.loss_range[0] for c in curves.values())
    hi = min(c.loss_range[1] for c in curves.values())
    if lo >= hi:
        return [], ("Pareto frontier: the batch sizes' loss ranges do not overlap; add budgets "
                    f"with {FIX_PARETO}")
    rows = []
    for target in np.linspace(lo, hi, PARETO_TARGETS):
        batches = np.array(sorted(curves))
        tokens = np.array([curves[b].tokens_for(float(target))[0] for b in batches])
        steps = tokens / (batches * seq_len)
        fit = fit_pareto(batches, steps)
        row = {"optimizer": optimizer, "target_loss": float(target), **fit,
               "batch_sizes": batches.tolist(), "steps": steps.tolist(),
               "tokens": tokens.tolist()}
        for k in ("b_crit", "b_crit_low", "b_crit_high", "e_min"):
            row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
        rows.append(row)
    warn = None
    if len(curves) == 2:
        warn = (f"Pareto frontier for {optimizer} rests on two batch sizes: exact fit, no "
                f"confidence interval; add batch sizes with {FIX_PARETO}")
    return rows, warn


# ---------------------------------------------------------------------------------------------
# Kaplan's law and learning-rate scaling












# ---------------------------------------------------------------------------------------------
# The whole analysis


def noise_points(runs: list[dict]) -> list[dict]:
    """B_noise measurements: noise.json (kind `b_noise`) and the online tracker's
    summary keys `b_noise`, `b_noise_tokens`, `b_noise_loss` (kind `b_noise_online`)."""
    points = []
    for run in runs:
        group = group_name(tuple(run[k] for k in GROUP_KEYS))
        noise = run.get("noise")
        if noise and noise.get("resolved") and is_finite(noise.get("b_noise_tokens")):
            points.append({
                "kind": "b_noise", "run_dir": run["run_dir"], "group": group,
                "loss": noise["val_loss"],
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
                "loss": run["b_noise_loss"],
                "loss_per_byte": run["b_noise_loss"] / run["bytes_per_token"],
                "b_noise": run.get("b_noise"), "b_noise_tokens": run["b_noise_tokens"],
                "b_noise_low": None, "b_noise_high": None})
    return points


def analyse(runs: list[dict], baseline_batch: int | None = None,
            left_out: list[dict] | None = None, warnings: list[str] | None = None) -> dict:
    """Every fit of the report, from loaded runs (see module docstring).

    Returns a dict with `groups` (per group: key, cells, baseline curve, per-run rows,
    Pareto rows, lr scaling), the public `fits` (per_run, pareto, kaplan, lr_scaling,
    warnings), `left_out`, `noise`, `n_runs` and `warnings` (the list in `fits`). Never
    raises on thin data: what cannot be computed is named in the warnings together with the
    sweep that fills it.
    """
    warnings = list(warnings or [])
    groups, dropped, split_warnings = split_runs(runs)
    left_out = list(left_out or []) + dropped
    warnings += split_warnings
    if dropped:
        counts = Counter(d["reason"] for d in dropped)
        warnings.append("left out: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                        + " (see the table of left-out runs)")
    diverged = defaultdict(list)
    for run in runs:
        if run["status"] == "diverged":
            diverged[(tuple(run[k] for k in GROUP_KEYS), run["batch_size"], run["tokens"])].append(
                float(run["lr"]))
    per_run, pareto, out_groups = [], [], []
    lr_by_opt: dict[str, list] = defaultdict(list)
    for key, members in groups.items():
        name = group_name(key)
        seq_len, optimizer = key[2], key[5]
        cells = best_lr_cells(members, {(b, t): v for (k, b, t), v in diverged.items()
                                        if k == key})
        for c in cells:
            if c.edge in ("low", "high"):
                why = ("the next lr diverged" if c.edge_diverged else "widen the lr grid")
                warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens has its "
                                f"best lr on the {c.edge} edge of the grid ({c.lr:.3g}); {why}")
        single = [c for c in cells if c.edge == "single"]
        if single:
            warnings.append(f"{name}: {len(single)} of {len(cells)} cells were trained at one lr "
                            "only: their loss is not at a tuned lr and has no uncertainty")
        batches = sorted({c.batch_size for c in cells})
        g = {"key": dict(zip(GROUP_KEYS, key, strict=True)), "name": name, "cells": cells,
             "n_runs": len(members), "batch_sizes": batches,
             "budgets": sorted({c.tokens for c in cells}), "baseline_batch": None,
             "baseline": None, "per_run": [], "pareto": [], "lr_scaling": None,
             "sweep": Counter(r["sweep"] for r in members).most_common(1)[0][0]}
        out_groups.append(g)
        if len(batches) < 2:
            warnings.append(f"{name}: one batch size only ({batches[0]}); B_crit needs several: "
                            f"run {FIX_BATCH}")
        b, warn = choose_baseline(cells, baseline_batch)
        if warn:
            warnings.append(f"{name}: {warn}")
        if b is not None:
            base_cells = [c for c in cells if c.batch_size == b]
            curve = LossCurve([c.tokens for c in base_cells], [c.loss for c in base_cells])
            if curve.dropped:
                warnings.append(f"{name}: baseline loss does not fall with tokens at "
                                f"{curve.dropped}; those budgets were dropped from its curve")
            sigma_b = float(np.mean([c.loss_sigma for c in base_cells]))  # NaN if any unknown
            g.update(baseline_batch=b, baseline=curve)
            others = [c for c in cells if c.batch_size != b]
            if not others:
                warnings.append(f"{name}: only the baseline batch {b} was trained; run "
                                f"{FIX_BATCH}")
            for c in others:
                row = per_run_bcrit(c, curve, b, sigma_b, seq_len)
                row.update(optimizer=optimizer, group=name)
                g["per_run"].append(row)
                if row["extrapolated"]:
                    warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens: "
                                    "effective tokens extrapolated beyond the baseline's "
                                    "budgets (power law)")
            per_run += g["per_run"]
        rows, warn = pareto_frontiers(cells, seq_len, optimizer)
        if warn and len(batches) >= 2:
            warnings.append(f"{name}: {warn}")
        for row in rows:
            row["group"] = name
        g["pareto"] = rows
        pareto += rows
        # lr scaling: at the budget shared by the most batch sizes (the largest such budget)
        budgets = Counter(c.tokens for c in cells)
        if budgets:
            best_budget = max(budgets, key=lambda t: (budgets[t], t))
            pts = [c for c in cells if c.tokens == best_budget and c.edge is None]
            if len(pts) >= 2:
                lr_by_opt[optimizer].append((len(pts), name, pts))
    lr_scaling = {}
    for opt, options in sorted(lr_by_opt.items()):
        _, name, pts = max(options, key=lambda o: o[0])
        fit = fit_lr_scaling([c.batch_size for c in pts], [c.lr for c in pts])
        if fit:
            lr_scaling[opt] = {**fit, "group": name}
            for g in out_groups:
                if g["name"] == name:
                    g["lr_scaling"] = lr_scaling[opt]
    if not lr_scaling and groups:
        warnings.append("lr scaling: no group has two batch sizes with an interior best lr at "
                        f"one budget; run {FIX_BATCH}")
    noise = noise_points(runs)
    for p in noise:
        if p.get("unresolved"):
            warnings.append(f"B_noise not resolved in {p['run_dir']} (|G|^2 <= 0 with "
                            f"K = {p['micro_batches']}); increase K")
    kaplan = kaplan_analysis(groups, per_run, pareto, [p for p in noise if "loss" in p],
                             warnings)
    return {"groups": out_groups, "left_out": left_out, "noise": noise, "n_runs": len(runs),
            "warnings": warnings, "fits": {"per_run": per_run, "pareto": pareto, "kaplan": kaplan,
                     "lr_scaling": lr_scaling, "warnings": warnings}}


def kaplan_analysis(groups: dict, per_run: list[dict], pareto: list[dict], noise: list[dict],
                    warnings: list[str]) -> dict:
    """Collect B_crit(L) points of every kind and fit Kaplan's law over them (`fit_kaplan`).

    Points: per-run B_crit (at the run's loss), Pareto B_crit (at the target loss), B_noise
    (noise.json and online, at the loss measured with it); all in tokens and nats/token. Only
    one corpus and vocabulary can share a fit (the loss scale depends on them): the one with
    the most runs; a warning names any other left out.
    """
    points = []
    for row in per_run:
        if row["b_crit_tokens"]:
            points.append({"kind": "per_run", "loss": row["val_loss"], "group": row["group"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": row["run_dir"]})
    for row in pareto:
        if row["b_crit_tokens"]:
            points.append({"kind": "pareto", "loss": row["target_loss"], "group": row["group"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": None})
    for p in noise:
        points.append({"kind": p["kind"], "loss": p["loss"], "group": p["group"],
                       "b_crit_tokens": p["b_noise_tokens"], "run_dir": p["run_dir"]})
    corpora = Counter()
    for key, members in groups.items():
        corpora[key[:2]] += len(members)
    if len(corpora) > 1:
        keep = corpora.most_common(1)[0][0]
        names = {group_name(k) for k in groups if k[:2] == keep}
        warnings.append(f"Kaplan fit uses {keep[0]} V{keep[1]} only; losses of other corpora or "
                        "vocabularies are on another scale")
        points = [p for p in points if p["group"] in names]
    fit = fit_kaplan([p["loss"] for p in points], [p["b_crit_tokens"] for p in points])
    fit["n_by_kind"] = dict(Counter(p["kind"] for p in points))
    for p in points:
        p["kaplan_tokens"] = kaplan_prediction_tokens(p["loss"], KAPLAN_B_STAR_TOKENS,
                                                      KAPLAN_EXPONENT)
        p["fit_tokens"] = (kaplan_prediction_tokens(p["loss"], fit["b_star_tokens"],
                                                    fit["exponent"])
                           if fit["exponent"] is not None else None)
    fit["points"] = points
    if fit["exponent"] is None:
        warnings.append(f"Kaplan fit needs B_crit at two losses or more ({len(points)} "
                        f"point(s)); run {FIX_PARETO} for B_crit across losses")
    elif fit["exponent_low"] is None:
        warnings.append("Kaplan fit rests on two points: no interval")
    return fit
