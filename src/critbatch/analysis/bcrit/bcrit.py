"""The critical batch size from finished runs: pure fitting functions, no I/O, no torch.

Three measurements of B_crit (formulas in `docs/science.md`, sections 1, 3-5):

1. **Tokens-equivalent, per run** (McCandlish et al. 2018). A small-batch baseline b at
   several budgets gives final loss versus tokens, L_b(E). A run with batch B that saw E
   tokens and reached loss L is worth E_eff = L_b^{-1}(L) baseline tokens. With
   E = E_min (1 + B/B_crit), E_eff = E_min (1 + b/B_crit) and r = E / E_eff:
   B_crit = (B - b r) / (r - 1).
2. **Pareto frontier** (`analysis.pareto`). For a target loss, each batch size needs E(B)
   tokens and S(B) = E(B) / (B seq_len) steps; S = S_min + E_min / B, so
   B_crit(L*) = E_min / S_min. All targets of a group use one set of batch sizes, the most
   whose curves all reach a common range of losses, with the targets spread over it.
3. **Kaplan's law** (Kaplan et al. 2020, section 5.1; `analysis.kaplan`):
   B_crit(L) = B* / L^(1/alpha_B) over the estimates above, and apart from them over the
   measured gradient noise scale B_noise (noise.json, and the online tracker's series along
   training: `analysis.online_noise`).

Per-run and Pareto B_crit are compared at each Pareto target loss (`analysis.consistency`).
A sweep with cooldown branches (a wsd run per batch and lr, forked into branch run folders
that end at smaller budgets, `branch_of` naming their parent) needs nothing special: a branch
is a run at its own budget, so every batch size gets a loss curve of several budgets.

Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token unless
a name ends in `_per_byte`; `tokens` are training tokens seen.

`analyse(runs)` runs everything on the runs loaded by `critbatch.results.runs.load_runs`
(or read from a table by `critbatch.analysis.bcrit.tables`, with its steps-to-target rows as
`targets`) and returns plain dicts and lists; `critbatch.analysis.bcrit.report` turns them
into files. Its warnings say how to fill each gap in the words of the input (`FixHints`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from critbatch.analysis import render
from critbatch.analysis.bcrit.best_lr import (
    BUDGET_TOLERANCE,
    GROUP_KEYS,
    MIN_STEPS_PER_WARMUP,
    Cell,
    best_lr_cells,
    group_key,
    group_name,
    seed_blocks,
    seed_scatter,
    split_runs,
)
from critbatch.analysis.bcrit.consistency import consistency_rows
from critbatch.analysis.bcrit.kaplan import Z95, collect_points, kaplan_fits
from critbatch.analysis.bcrit.noise_ratio import constant_lr_readings, noise_ratios
from critbatch.analysis.bcrit.online_noise import noise_points, online_noise_rows
from critbatch.analysis.bcrit.pareto import pareto_frontiers, pareto_row
from critbatch.analysis.joint.joint import joint_fits
from critbatch.results.runs import scale_of
from critbatch.science.fits import LossCurve, fit_lr_scaling, nominal_budgets
from critbatch.science.laws import bcrit_corrected, bcrit_naive

MIN_BASELINE_BUDGETS = 3


@dataclass(frozen=True)
class FixHints:
    """How to fill each gap the analysis warns about, in the words of its input: sweeps to
    run (`SWEEP_HINTS`) or rows to add to a table (`analysis.tables.TABLE_HINTS`); each a
    sentence starting with its verb, formatted with `batch` (the batch size at issue,
    sequences) and `more` (how many budgets it lacks), which a hint may ignore."""

    baseline: str  # a baseline curve: one batch size at MIN_BASELINE_BUDGETS budgets
    batch: str  # more batch sizes (and learning rates) beside the baseline
    pareto: str  # several budgets at a second batch size: a Pareto frontier
    lr: str  # an lr grid per batch size with its optimum inside: the lr-scaling law
    losses: str  # B_crit at several losses: Kaplan's law
    seeds: str  # a second seed of the baseline: the seed noise the joint model weighs by
    warning_fixes: tuple | None = None  # `render.TABLE_WARNING_FIXES` for a table


SWEEP_HINTS = FixHints(
    baseline="run `make sweep-batch` (every batch size at four budgets: one wsd run per batch "
             "and lr with cooldown branches at 1/8, 1/4 and 1/2 of its budget)",
    batch="run `make sweep-batch` (batch sizes x learning rates, each with its cooldown "
          "branches)",
    lr="run `make sweep-batch` (batch sizes x learning rates, each with its cooldown branches)",
    pareto="run `make sweep-batch` (with train.schedule=wsd and "
           "train.branch_budgets=[0.125,0.25,0.5] every batch size gets four budgets)",
    losses="run `make sweep-batch` (its cooldown branches give every batch size four budgets, "
           "so B_crit at several losses)",
    seeds="train the baseline at two seeds for the seed noise (`grid.baseline_seeds`)")


# ---------------------------------------------------------------------------------------------
# B_crit per run (tokens-equivalent analysis)


EXTRAPOLATION_FORMS = "two extrapolations (power law, log-linear)"


def interval_label(*sources: str | None, widened: bool = False) -> str | None:
    """What a per-run B_crit interval is, from the sources of the loss uncertainties in it;
    `widened`: it also spans the spread of the two extrapolation forms (`per_run_bcrit`)."""
    if any(src is None for src in sources):
        return None
    if "lr refinement" in sources:
        label = ("+-1.96 x the lr refinement's size (one seed: not a confidence interval; "
                 "train a second seed of the baseline for one)")
    else:
        label = "95%, from the seed-to-seed scatter of the final loss"
    return f"{label}, widened by the spread of {EXTRAPOLATION_FORMS}" if widened else label


def per_run_bcrit(cell: Cell, baseline: LossCurve, baseline_batch: int, baseline_sigma: float,
                  seq_len: int, baseline_source: str | None = None) -> dict:
    """Effective tokens, r and B_crit (with its interval) for one cell against the baseline.

    The loss uncertainty is the cell's `loss_sigma` and the baseline's (`baseline_sigma`)
    added in quadrature; the interval is the B_crit of the losses L +- 1.96 sigma, inverted
    through the same baseline curve (None when a sigma is unknown); `interval` says what it
    is. r <= 1 means no measurable cost: `b_crit` is None and `b_crit_low` is the bound
    implied by the upper end of r (None when that end is <= 1 too). A batch not above the
    baseline's is never given a B_crit (`below_baseline`), nor is a run that lost more than
    the model allows (r >= B/b). An unbounded end of an interval is None; a B_crit whose
    interval is unbounded above (r within the noise of 1) is kept in the row but not in
    Kaplan's law (`in_kaplan`): its value is the noise's, and with no upper end it has no
    weight to give it. Nor is a cell of too few steps for its warmup (`few_steps`): its loss
    measures the warmup, so its B_crit is a diagnostic only.

    Beyond the baseline's budgets (`extrapolated`: E_eff outside them; or an end of the
    interval outside them) the answer depends on the curve's form, which the seeds know
    nothing of. So E_eff is also read off a second form, L = a + b ln E through the end point
    (`LossCurve.tokens_for_log_linear`), and the interval spans the union of both forms'
    seed intervals and both B_crit (`b_crit` stays the power law's; `b_crit_log_linear` is the
    other, None where E_eff is interpolated). Without a loss uncertainty there is no interval
    to widen, and none is given: the spread of the forms alone would pass for a narrow one.
    """
    sigma = math.hypot(cell.loss_sigma, baseline_sigma)  # NaN when either is unknown
    b, B = baseline_batch, cell.batch_size
    below = cell.batch_size <= baseline_batch
    # the losses whose E_eff is read: L, then L - 1.96 sigma (lower loss: more tokens worth,
    # the low end of r) and L + 1.96 sigma (the high end of r) when sigma is known
    losses = [cell.loss] + ([cell.loss - Z95 * sigma, cell.loss + Z95 * sigma]
                            if math.isfinite(sigma) else [])
    forms = {"power law": baseline.tokens_for, "log-linear": baseline.tokens_for_log_linear}
    ratios, outside = {}, []
    for form, tokens_for in forms.items():
        ratios[form] = []
        for loss in losses:
            e, ext = tokens_for(loss)
            ratios[form].append(cell.tokens / e if e > 0 else float("nan"))
            outside.append(ext)
    e_eff, extrapolated = baseline.tokens_for(cell.loss)
    r = ratios["power law"][0]
    r_ll = ratios["log-linear"][0]

    def raw(r_value: float) -> float:  # B_crit on the extended line: inf for r <= 1
        if below or not math.isfinite(r_value):
            return float("nan")
        return math.inf if r_value <= 1 else bcrit_corrected(B, b, r_value)

    def bc(r_value: float) -> float | None:
        value = raw(r_value)
        return value if 0 < value < math.inf else None

    def end(values: list[float], pick) -> float | None:  # one end of the union; None: unbounded
        if not values or any(math.isnan(v) for v in values):
            return None
        value = pick(values)
        return value if 0 < value < math.inf else None

    widened = (math.isfinite(sigma) and any(outside) and math.isfinite(r)
               and math.isfinite(r_ll))
    used = list(forms) if widened else ["power law"]
    lows = [raw(ratios[f][2]) for f in used if math.isfinite(sigma)]  # B_crit falls as r rises
    highs = [raw(ratios[f][1]) for f in used if math.isfinite(sigma)]
    if widened:
        lows += [raw(r), raw(r_ll)]
        highs += [raw(r), raw(r_ll)]
    b_crit = bc(r)
    b_crit_low = end(lows, min)
    b_crit_high = end(highs, max) if b_crit is not None else None
    note = None
    if below:
        note = f"below the baseline batch {b}: no B_crit against it"
    elif not math.isfinite(r):
        note = "outside the baseline's range and no extrapolation possible"
    elif r <= 1:
        note = "no measurable cost" + (f" (B_crit > {b_crit_low:.3g})" if b_crit_low else "")
    elif b_crit is None:
        note = f"r = {r:.3g} >= B/b: worse than the model allows (too few steps?)"
    unbounded = b_crit is not None and bool(highs) and b_crit_high is None
    if unbounded:  # r's lower end <= 1: the loss cannot tell B_crit from infinity
        note = "interval unbounded above: left out of Kaplan's law"
    if cell.few_steps:
        few = (f"{cell.steps} steps < {MIN_STEPS_PER_WARMUP} x {cell.warmup_steps} warmup: "
               "measures the warmup; left out of Kaplan's law")
        note = f"{note}; {few}" if note else few
    row = {
        "run_dir": cell.run_dir, "trunk": cell.trunk, "batch_size": B, "tokens": cell.tokens,
        "budget": cell.budget,
        "lr": cell.lr, "lr_edge": cell.edge, "val_loss": cell.loss,
        "val_loss_per_byte": cell.loss_per_byte, "val_loss_sigma": sigma,
        "effective_tokens": e_eff if math.isfinite(e_eff) else None,
        "r": r if math.isfinite(r) else None,
        "b_crit": b_crit,
        "b_crit_low": b_crit_low,
        "b_crit_high": b_crit_high,
        "b_crit_naive": bcrit_naive(B, r) if math.isfinite(r) and r > 1 and not below else None,
        "b_crit_log_linear": bc(r_ll) if extrapolated else None,
        "interval": interval_label(cell.sigma_source, baseline_source, widened=widened),
        "extrapolated": bool(extrapolated), "below_baseline": below,
        "baseline_batch": b, "note": note, "few_steps": cell.few_steps,
        "in_kaplan": b_crit is not None and not unbounded and not cell.few_steps,
    }
    for k in ("b_crit", "b_crit_low", "b_crit_high", "b_crit_naive", "b_crit_log_linear"):
        row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
    return row


def most_efficient_batch(cells: list[Cell]) -> int | None:
    """Among batch sizes with a loss curve (two budgets or more), the one with the lowest loss
    at the largest budget they all share: the most token-efficient. None without a shared
    budget."""
    budgets: dict[int, dict[int, float]] = defaultdict(dict)
    for c in cells:
        budgets[c.batch_size][c.budget] = c.loss
    curves = {b: v for b, v in budgets.items() if len(v) >= 2}
    shared = set.intersection(*(set(v) for v in curves.values())) if curves else set()
    if not shared:
        return None
    budget = max(shared)
    return min(curves, key=lambda b: (curves[b][budget], b))


def choose_baseline(cells: list[Cell], forced: int | str | None = None,
                    hints: FixHints = SWEEP_HINTS) -> tuple[int | None, str | None]:
    """The baseline batch: the smallest with >= 3 budgets, `forced` (with >= 2), or with
    "auto" the most token-efficient batch with a curve (`most_efficient_batch`).

    Returns (batch size or None, warning or None).
    """
    budgets = Counter(c.batch_size for c in cells)
    if forced == "auto":
        forced = most_efficient_batch(cells)
        if forced is None:
            return choose_baseline(cells, hints=hints)
    if forced is not None:
        if budgets.get(forced, 0) >= 2:
            warn = None if budgets[forced] >= MIN_BASELINE_BUDGETS else (
                f"baseline batch {forced} has only {budgets[forced]} budgets; its curve is a "
                "straight line between them and cannot be extrapolated")
            return forced, warn
        more = 2 - budgets.get(forced, 0)
        return None, (f"--baseline-batch {forced} has {budgets.get(forced, 0)} budget(s) here; "
                      f"it needs at least 2; " + hints.baseline.format(batch=forced, more=more))
    for batch in sorted(budgets):
        if budgets[batch] >= MIN_BASELINE_BUDGETS:
            return batch, None
    have = ", ".join(f"{b}: {n}" for b, n in sorted(budgets.items()))
    smallest = min(budgets)
    return None, (f"no batch size has {MIN_BASELINE_BUDGETS} token budgets (budgets per batch "
                  f"size: {have}), so there is no baseline curve and no per-run B_crit; "
                  + hints.baseline.format(batch=smallest,
                                          more=MIN_BASELINE_BUDGETS - budgets[smallest]))


def more_efficient_than_baseline(cells: list[Cell], baseline_batch: int) -> list[Cell]:
    """Cells of larger batches whose loss is below the baseline's at the same budget by more
    than their combined uncertainty (1.96 sigma; any margin when it is unknown).

    McCandlish's model has the loss at equal tokens rising with the batch; a larger batch
    that beats the baseline means the baseline is less token-efficient than the model assumes
    (a U-shaped E(B): too small a batch for its lr, or a noisy optimizer). Its curve then
    credits every run with more baseline tokens E_eff, so r = E / E_eff is too small, and
    since B_crit = (B - b r) / (r - 1) falls as r rises (dB_crit/dr = (b - B) / (r - 1)^2 < 0
    for B > b), per-run B_crit against it is biased high.
    """
    base = {c.budget: c for c in cells if c.batch_size == baseline_batch}
    better = []
    for c in cells:
        ref = base.get(c.budget)
        if c.batch_size <= baseline_batch or ref is None:
            continue
        margin = Z95 * math.hypot(c.loss_sigma, ref.loss_sigma)
        if c.loss < ref.loss - (margin if math.isfinite(margin) else 0.0):
            better.append(c)
    return better


# ---------------------------------------------------------------------------------------------
# The whole analysis


def lr_edge_cells(groups: list[dict]) -> dict[str, int]:
    """Per optimizer, the cells whose best lr is the lowest or highest lr tried (`Cell.edge`):
    each bounds its loss instead of measuring it. The lr search's goal is none."""
    counts: Counter = Counter()
    for g in groups:
        optimizer = g["key"]["optimizer"]
        counts[optimizer] += sum(c.edge in ("low", "high") for c in g["cells"])
    return dict(sorted(counts.items()))


def cell_warnings(name: str, cells: list[Cell]) -> list[str]:
    """Edge optima, untuned cells and cells of too few steps (`too_few_steps`) of one group."""
    warnings = []
    for c in cells:
        if c.few_steps:
            warnings.append(
                f"{name}: batch {c.batch_size} at {c.tokens:,} tokens trained {c.steps} steps, "
                f"fewer than {MIN_STEPS_PER_WARMUP} x its {c.warmup_steps} warmup steps: its "
                "loss measures the warmup, not the batch; left out of the per-run Kaplan points "
                "and the Pareto fits")
    for c in cells:
        if c.edge in ("low", "high"):
            why = "the next lr diverged" if c.edge_diverged else "widen the lr grid"
            warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens has its best "
                            f"lr on the {c.edge} edge of the grid ({c.lr:.3g}); {why}")
    single = [c for c in cells if c.edge == "single"]
    if single:
        warnings.append(f"{name}: {len(single)} of {len(cells)} cells were trained at one lr "
                        "only: their loss is not at a tuned lr and has no uncertainty")
    return warnings


def baseline_rows(g: dict, cells: list[Cell], b: int, warnings: list[str],
                  hints: FixHints = SWEEP_HINTS) -> None:
    """The baseline curve of group `g` and the per-run B_crit of its other cells, in place."""
    name, seq_len, optimizer = g["name"], g["key"]["seq_len"], g["key"]["optimizer"]
    base_cells = [c for c in cells if c.batch_size == b]
    curve = LossCurve([c.tokens for c in base_cells], [c.loss for c in base_cells])
    if curve.dropped:
        warnings.append(f"{name}: baseline loss does not fall with tokens at {curve.dropped}; "
                        "those budgets were dropped from its curve")
    known = [c for c in base_cells if math.isfinite(c.loss_sigma)]
    sigma_b = float(np.mean([c.loss_sigma for c in known])) if known else float("nan")
    source_b = known[0].sigma_source if known else None
    if any(c.sigma_source == "lr refinement" for c in known):
        source_b = "lr refinement"
    g.update(baseline_batch=b, baseline=curve)
    for c in more_efficient_than_baseline(cells, b):
        base = next(x for x in base_cells if x.budget == c.budget)
        warnings.append(f"{name}: batch {c.batch_size} reaches a lower loss than the baseline "
                        f"{b} at {c.budget:,} tokens ({c.loss:.4f} < {base.loss:.4f} nats/token): "
                        "the baseline is less token-efficient, so per-run B_crit against it is "
                        "biased high; try --baseline-batch auto")
    below = sorted({c.batch_size for c in cells if c.batch_size < b})
    if below:
        warnings.append(f"{name}: batch sizes {below} are below the baseline {b}: listed, with "
                        "no B_crit")
    others = [c for c in cells if c.batch_size != b]
    if not others:
        warnings.append(f"{name}: only the baseline batch {b} was trained; "
                        + hints.batch.format(batch=b, more=0))
    for c in others:
        row = per_run_bcrit(c, curve, b, sigma_b, seq_len, source_b)
        row.update(optimizer=optimizer, group=name)
        g["per_run"].append(row)
        if row["extrapolated"] and not row["below_baseline"]:
            forms = ", ".join(f"{form} {value:.3g}" for form, value in (
                ("power law", row["b_crit"]), ("log-linear", row["b_crit_log_linear"]))
                if value is not None)
            warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens: effective "
                            "tokens extrapolated beyond the baseline's budgets"
                            + (f" (B_crit {forms} sequences; the interval spans both forms)"
                               if forms else ""))


def analyse_group(key: tuple, members: list[dict], diverged: dict, baseline_batch,
                  warnings: list[str], hints: FixHints = SWEEP_HINTS) -> dict:
    """Cells, baseline, per-run B_crit, online B_noise series and Pareto rows of one group
    of comparable runs."""
    name = group_name(key)
    seq_len, optimizer = key[GROUP_KEYS.index("seq_len")], key[GROUP_KEYS.index("optimizer")]
    budgets = nominal_budgets([r["tokens"] for r in members], BUDGET_TOLERANCE)
    scatter = seed_scatter(members, budgets)
    nominal = sorted(set(budgets.values()))

    def budget_of(tokens: int) -> int:  # a diverged run's tokens, on the members' budgets
        return min(nominal, key=lambda n: abs(n - tokens))

    cells = best_lr_cells(members, {(b, budget_of(t)): v for (k, b, t), v in diverged.items()
                                    if k == key}, scatter[0] if scatter else None)
    warnings += cell_warnings(name, cells)
    batches = sorted({c.batch_size for c in cells})
    g = {"key": dict(zip(GROUP_KEYS, key, strict=True)), "name": name, "cells": cells,
         "n_runs": len(members), "batch_sizes": batches,
         "budgets": sorted({c.budget for c in cells}), "baseline_batch": None,
         "baseline": None, "per_run": [], "pareto": [], "lr_scaling": None,
         "seed_scatter": scatter[0] if scatter else None,
         "seed_scatter_dof": scatter[1] if scatter else 0,
         "seed_blocks": seed_blocks(members, budgets),
         "sweep": Counter(r["sweep"] for r in members).most_common(1)[0][0]}
    if len(batches) < 2:
        warnings.append(f"{name}: one batch size only ({batches[0]}); B_crit needs several: "
                        + hints.batch.format(batch=batches[0], more=0))
    b, warn = choose_baseline(cells, baseline_batch, hints)
    if warn:
        warnings.append(f"{name}: {warn}")
    if b is not None:
        baseline_rows(g, cells, b, warnings, hints)
    g["online_noise"] = online_noise_rows(members, cells, b, budgets, name, optimizer, seq_len)
    g["noise_readings"] = constant_lr_readings(members, cells, name, optimizer)
    rows, warn = pareto_frontiers(cells, seq_len, optimizer, hints.pareto)
    if warn and len(batches) >= 2:
        warnings.append(f"{name}: {warn}")
    g["pareto"] = name_pareto_rows(name, rows, warnings)
    return g


def name_pareto_rows(name: str, rows: list[dict], warnings: list[str]) -> list[dict]:
    """`rows` with their group's name; a warning for each degenerate one."""
    for row in rows:
        row["group"] = name
        if row["degenerate"]:
            warnings.append(f"{name}: Pareto fit at {row['target_loss']:.4f} nats/token is "
                            f"degenerate ({row['degenerate']}); left out of Kaplan's law")
    return rows


def target_frontiers(targets: list[dict], out_groups: list[dict], warnings: list[str],
                     hints: FixHints = SWEEP_HINTS) -> None:
    """Pareto fits of steps-to-target rows, added in place to `out_groups`.

    Each row holds `group_label`, `optimizer`, `seq_len`, `target_loss`, `batch_size`,
    `steps` (optimizer steps to first reach the target) and `sweep` (where it came from),
    as `analysis.tables` reads them. One fit S = S_min + E_min / B per (group, optimizer,
    seq_len, target loss); several rows of one batch size (e.g. one per lr) count their
    fewest steps. The fits join the run group of the same key, or form a group of their own.
    """
    frontiers: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for t in targets:
        frontiers[group_key(t)][float(t["target_loss"])].append(t)
    by_key = {tuple(g["key"].values()): g for g in out_groups}
    for key, by_target in sorted(frontiers.items(), key=lambda kv: str(kv[0])):
        name, rows = group_name(key), []
        seq_len, optimizer = key[GROUP_KEYS.index("seq_len")], key[GROUP_KEYS.index("optimizer")]
        for target, points in sorted(by_target.items()):
            fewest: dict[int, float] = {}
            for p in points:
                fewest[p["batch_size"]] = min(fewest.get(p["batch_size"], math.inf), p["steps"])
            batches = sorted(fewest)
            if len(batches) < 2:
                warnings.append(f"{name}: target loss {target:.4g} has one batch size only "
                                f"({batches[0]}); " + hints.pareto.format(batch=batches[0],
                                                                          more=1))
                continue
            if len(batches) == 2:
                warnings.append(f"{name}: the Pareto fit at {target:.4g} nats/token rests on "
                                "two batch sizes: exact fit, no confidence interval")
            rows.append(pareto_row(batches, [fewest[b] for b in batches], seq_len, optimizer,
                                   target))
        rows = name_pareto_rows(name, rows, warnings)
        batches = sorted({p["batch_size"] for pts in by_target.values() for p in pts})
        n_rows = sum(len(pts) for pts in by_target.values())
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = {
                "key": dict(zip(GROUP_KEYS, key, strict=True)), "name": name, "cells": [],
                "n_runs": 0, "batch_sizes": [], "budgets": [], "baseline_batch": None,
                "baseline": None, "per_run": [], "pareto": [], "lr_scaling": None,
                "seed_scatter": None, "seed_scatter_dof": 0, "seed_blocks": [],
                "sweep": Counter(p["sweep"] for pts in by_target.values()
                                 for p in pts).most_common(1)[0][0]}
            out_groups.append(g)
        g["pareto"] += rows
        g["batch_sizes"] = sorted(set(g["batch_sizes"]) | set(batches))
        g["n_target_rows"] = n_rows


def lr_scaling_fits(out_groups: list[dict], warnings: list[str],
                    hints: FixHints = SWEEP_HINTS) -> dict:
    """Per optimizer, the lr-scaling power law of the group with the most batch sizes that
    have an interior best lr at one nominal budget (the largest such budget)."""
    by_opt: dict[str, list] = defaultdict(list)
    for g in out_groups:
        budgets = Counter(c.budget for c in g["cells"])
        if not budgets:
            continue
        best_budget = max(budgets, key=lambda t: (budgets[t], t))
        pts = [c for c in g["cells"] if c.budget == best_budget and c.edge is None]
        if len(pts) >= 2:
            by_opt[g["key"]["optimizer"]].append((len(pts), g, pts))
    lr_scaling = {}
    for opt, options in sorted(by_opt.items()):
        _, g, pts = max(options, key=lambda o: o[0])
        fit = fit_lr_scaling([c.batch_size for c in pts], [c.lr for c in pts])
        if fit:
            lr_scaling[opt] = g["lr_scaling"] = {**fit, "group": g["name"]}
    batches = sorted({c.batch_size for g in out_groups for c in g["cells"]})
    if not lr_scaling and batches:
        warnings.append("lr scaling: no group has two batch sizes with an interior best lr at "
                        "one budget; " + hints.lr.format(batch=batches[0], more=0))
    return lr_scaling


def one_corpus(groups: dict, points: list[dict], warnings: list[str]) -> list[dict]:
    """Only one corpus and vocabulary share a fit (the loss scale depends on them): the one
    with the most runs; a warning names the others left out."""
    corpora: Counter = Counter()
    for key, members in groups.items():
        corpora[key[:2]] += len(members)  # (data_name, vocab_size)
    if len(corpora) <= 1:
        return points
    keep = corpora.most_common(1)[0][0]
    names = {group_name(k) for k in groups if k[:2] == keep}
    warnings.append(f"Kaplan fits use {keep[0]} V{keep[1]} only; losses of other corpora or "
                    "vocabularies are on another scale")
    return [p for p in points if p["group"] in names]


def analyse(runs: list[dict], baseline_batch: int | str | None = None,
            left_out: list[dict] | None = None, warnings: list[str] | None = None,
            targets: list[dict] | None = None, hints: FixHints = SWEEP_HINTS) -> dict:
    """Every fit of the report, from loaded runs (see module docstring).

    Returns a dict with `groups` (per group: key, cells, baseline curve, per-run rows,
    Pareto rows, online B_noise series and peak-lr readings, consistency rows, lr scaling), the
    public `fits` (per_run, pareto, kaplan: one row per optimizer and method, kaplan_points,
    lr_scaling, warnings, online_noise: the online B_noise(L) series, consistency: per-run
    against Pareto B_crit at each target loss, joint: `analysis.joint`'s model per optimizer,
    whose rows also join kaplan, noise_ratio: B_crit over B_noise, `analysis.noise_ratio`),
    `left_out`, `noise`, `n_runs` and `warnings` (the list in `fits`).
    `baseline_batch`: a batch size, "auto" or None (see `choose_baseline`). `targets`: steps to a
    target (`target_frontiers`), fitted as Pareto frontiers beside the runs'. Never raises
    on thin data: what cannot be computed is named in the warnings together with what fills it,
    in the words of `hints` (sweeps to run, or rows to add to a table).
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
            diverged[(group_key(run), run["batch_size"], run["tokens"])].append(float(run["lr"]))
    out_groups = [analyse_group(key, members, diverged, baseline_batch, warnings, hints)
                  for key, members in groups.items()]
    target_frontiers(targets or [], out_groups, warnings, hints)
    for g in out_groups:
        g.setdefault("online_noise", [])
        g["consistency"] = consistency_rows(g["pareto"], g["per_run"])
    per_run = [row for g in out_groups for row in g["per_run"]]
    pareto = [row for g in out_groups for row in g["pareto"]]
    online = [row for g in out_groups for row in g["online_noise"]]
    lr_scaling = lr_scaling_fits(out_groups, warnings, hints)
    noise = noise_points(runs)
    for p in noise:
        if p.get("unresolved"):
            warnings.append(f"B_noise not resolved in {p['run_dir']} (|G|^2 <= 0 with "
                            f"K = {p['micro_batches']}); increase K")
    # Kaplan's "noise" method: the noise program's measurements; the online tracker enters as
    # its own series (online_noise), not by every run's end-of-run value
    points = collect_points(per_run, pareto,
                            [p for p in noise if p["kind"] == "b_noise" and "loss" in p], online)
    points = one_corpus(groups, points, warnings)
    kaplan = kaplan_fits(points, warnings, hints.losses)
    joint, joint_rows = joint_fits(out_groups, warnings, hints.seeds,  # analysis.joint
                                   pipeline_test=scale_of(runs) == "smoke")
    edge_cells = lr_edge_cells(out_groups)
    return {"groups": out_groups, "left_out": left_out, "noise": noise, "n_runs": len(runs),
            "warning_fixes": hints.warning_fixes or render.WARNING_FIXES,
            "warnings": warnings,
            "fits": {"per_run": per_run, "pareto": pareto, "kaplan": kaplan + joint_rows,
                     "kaplan_points": points, "lr_scaling": lr_scaling, "warnings": warnings,
                     "online_noise": online, "joint": joint, "lr_edge_cells": edge_cells,
                     "noise_ratio": noise_ratios(out_groups, joint),
                     "consistency": [row for g in out_groups for row in g["consistency"]]}}
