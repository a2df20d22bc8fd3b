"""The joint model in the B_crit study: every cell of an optimizer (all widths of one corpus,
tokenizer and seq_len) fitted at once by `science.joint`, its `joint` row in Kaplan's table,
the loss-alone test across widths, and the held-out predictions.

Per optimizer, `joint_fits` takes the groups' best-lr cells (cells of too few steps for
their warmup left out) with each cell's loss noise (the measured seed scatter, per batch
where the batches' seeds differ: `seed_noise`) and trunk (a run and its cooldown branches
share one), fits the shared law with the optional terms the data demand
(`science.joint_inference.select_form`), bootstraps it
(`science.joint_inference.bootstrap_joint`), fits one law per width where there are several widths
and tests the shared one against it, then refits without the largest budget (and, with
several widths, without the widest model's batches above its smallest) and predicts the
cells left out: the evidence that the law extrapolates; and it projects the exponent
interval's width for the same sweep longer, with larger batches or at more seeds
(`science.precision`): what a bigger sweep would pin. A range check refits without the
cells above the baseline's loss range (`range_check`): a law that moves out of its interval
without them leans on the example curve's form. Results go into fits.json as `joint` (per
optimizer) and as the `joint` method's rows of `kaplan`; where the runs hold two draws of
the sweep, `analysis.draws` adds whether a misfit is noise or the model's own error.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np

from critbatch.analysis.joint.verdict import (  # noqa: F401 (the verdict's names, here too)
    CANNOT,
    FAIL,
    HELD_OUT_SHARE,
    HELD_OUT_SIGMAS,
    PASS,
    RANGE_SHIFT_SIGMAS,
    RESOLVED,
    RESOLVED_WIDTH,
    UNRESOLVED,
    agrees,
    checks_of,
    decide,
    leans_on_extrapolation,
    passes,
)
from critbatch.science.fits import NoiseSplit, Sharing, fit_noise_split, trunk_sharing
from critbatch.science.intervals import SMOKE_RESAMPLES
from critbatch.science.joint import (
    SHARED_FRACTION,
    Form,
    JointData,
    JointFit,
    above_baseline,
    noise_scale,
)
from critbatch.science.joint_fit import fit_joint
from critbatch.science.joint_inference import (
    bootstrap_joint,
    bounds_of,
    chi2_range,
    loss_alone_test,
    prediction_spread,
    select_form,
    shared_law_map,
)
from critbatch.science.laws import KAPLAN_B_STAR_TOKENS, KAPLAN_EXPONENT
from critbatch.science.precision import exponent_sd, projected_widths

RESAMPLES = 100  # parametric bootstrap refits per optimizer (the coverage test's number)
MIN_CELLS = 8  # cells below which the joint model (>= 5 parameters) is not fitted
HELD_OUT_RESAMPLES = 40  # bootstrap refits per held-out set for the prediction's own spread
# nats/token: the weight of every cell of a group no run of which was repeated at another seed
# (the noise is unknown: every cell weighs the same, and the intervals are widened by the
# scatter about the fit, sqrt(chi2/dof))
NOMINAL_SIGMA = 1e-3


def width_label(key: dict) -> str:
    """The model of a group: its width (and depth), or in a table without widths its
    parameter count."""
    if key.get("width") is None and key.get("params_nonembedding") is not None:
        return f"N {key['params_nonembedding']:.3g}"
    return f"width {key['width']}" + (f" depth {key['depth']}" if key.get("depth") else "")


def width_order(key: dict) -> tuple[int, int, int, float]:
    """Narrowest first; a table without widths (None) sorts before every width, by its
    parameter count."""
    width, depth = key.get("width"), key.get("depth")
    return (width is not None, width or 0, depth or 0, key.get("params_nonembedding") or 0)


def comparable_groups(groups: list[dict]) -> dict[str, list[dict]]:
    """Per optimizer, its groups of the corpus, vocabulary and seq_len with the most cells
    (losses of other corpora are on another scale)."""
    by_opt: dict[str, Counter] = {}
    for g in groups:
        if g["cells"]:
            k = g["key"]
            by_opt.setdefault(k["optimizer"], Counter())[
                (k["data_name"], k["vocab_size"], k["seq_len"], k["group_label"])] += len(
                    g["cells"])
    out = {}
    for opt, corpora in sorted(by_opt.items()):
        keep = corpora.most_common(1)[0][0]
        out[opt] = [g for g in groups if g["cells"] and g["key"]["optimizer"] == opt and (
            g["key"]["data_name"], g["key"]["vocab_size"], g["key"]["seq_len"],
            g["key"]["group_label"]) == keep]
    return out


def seed_samples(group: dict) -> dict[int, tuple[list, list, list]]:
    """Per batch size, the (tokens, one run's sample variance, dof) of the group's cells
    trained at several seeds at their best lr (seeds that agree exactly say nothing)."""
    out: dict[int, tuple[list, list, list]] = {}
    for c in group["cells"]:
        if (c.sigma_source == "seeds" and c.n_seeds > 1 and math.isfinite(c.loss_sigma)
                and c.loss_sigma > 0):
            tokens, variances, dofs = out.setdefault(c.batch_size, ([], [], []))
            tokens.append(c.tokens)
            variances.append(c.loss_sigma**2 * c.n_seeds)
            dofs.append(c.n_seeds - 1)
    return out


def seed_noise(group: dict) -> NoiseSplit | None:
    """The group's seed noise against tokens (`science.fits.fit_noise_trend`) from its cells
    trained at several seeds at their best lr, or None without any: pooled over the batches,
    and per batch where the batches' own trends fit their seeds better (`fit_noise_split`).
    With no significant trend in the tokens a trend is the pooled scatter of
    `best_lr.seed_scatter`. At cpu scale AdamW's noise differs by batch and lr: one run's sd at
    1.5M tokens was 0.006 at batch 8 (lr 1.5e-3) and 0.125 at batch 32 (lr 3e-3)."""
    samples = seed_samples(group)
    return fit_noise_split(samples) if samples else None


def sharing_of(groups: list[dict]) -> tuple[Sharing | None, float]:
    """(the measured share of the seed noise a trunk's cells share, `science.fits.trunk_sharing`
    over the groups' seeded trunks, or None; the share the model uses: that, else
    SHARED_FRACTION)."""
    sharing = trunk_sharing([b for g in groups for b in g.get("seed_blocks", [])])
    return sharing, SHARED_FRACTION if sharing is None else sharing.fraction


def sharing_document(sharing: Sharing | None, shared: float) -> dict:
    """fits.json `joint.<optimizer>.trunk_sharing`: the share used and where it came from."""
    return {"fraction": shared, "source": "assumed" if sharing is None else "seeds",
            "dof": sharing.dof if sharing else 0, "trunks": sharing.trunks if sharing else 0,
            "budget_pairs": sharing.pairs if sharing else 0}


def noise_rows(width: str, split: NoiseSplit, shared: float = SHARED_FRACTION) -> list[dict]:
    """fits.json's seed-noise rows of one group: the pooled trend (batch_size None) and, where
    the batches differ, each batch's (`batches_differ_p`: the test's p, on every row;
    `budgets` and `effective_dof`: what the bootstrap redraws the estimate from)."""
    rows = [(None, split.pooled)] + sorted(split.by_key.items())
    return [{"width": width, "batch_size": b, **t.as_dict(), "budgets": t.budgets,
             "effective_dof": t.effective_dof(shared),
             "batches_differ_p": split.p_value} for b, t in rows]


def cells_of(groups: list[dict], trends: list[NoiseSplit | None] | None = None
             ) -> tuple[list[tuple], list[str]]:
    """(group, cell, sigma) triples the model can use, and why the others cannot. `trends`:
    each group's `seed_noise`, where the caller has it already."""
    used, notes = [], Counter()
    trends = [seed_noise(g) for g in groups] if trends is None else trends
    for g, trend in zip(groups, trends, strict=True):
        for c in g["cells"]:
            if getattr(c, "few_steps", False):
                notes["fewer steps than 3x the warmup"] += 1
                continue
            # the group's seed noise at the cell's batch and tokens, pooled over the budgets
            # where no trend is significant (the sd of two seeds alone has one degree of
            # freedom: at cpu scale 0.004 beside a pooled 0.017)
            if trend:
                sigma = float(trend.sd(c.batch_size, c.tokens)) / math.sqrt(c.n_seeds)
            elif c.sigma_source in ("seeds", "seed scatter"):
                sigma = c.loss_sigma
            else:  # no seeds: |grid - parabola| is no noise (it was 6e-8 on a public grid)
                sigma = NOMINAL_SIGMA
            if not (math.isfinite(sigma) and sigma > 0):
                notes["no seed noise"] += 1
                continue
            used.append((g, c, sigma))
    return used, [f"{n} cell(s): {why}" for why, n in sorted(notes.items())]


def build_data(used: list[tuple], noise: tuple[list, list] | None = None,
               shared: float = SHARED_FRACTION) -> JointData:
    """The model's cells; widths indexed narrowest first (the held-out set is the widest).
    `noise`: `noise_sources`, where the sigmas are estimates the bootstrap should redraw;
    `shared`: the share of a cell's noise its trunk shares (`sharing_of`)."""
    ordered = sorted(used, key=lambda u: width_order(u[0]["key"]))
    return JointData.build(
        [width_label(g["key"]) for g, _, _ in used], [c.batch_size for _, c, _ in used],
        [c.tokens for _, c, _ in used], [c.loss for _, c, _ in used],
        [s for _, _, s in used], [c.trunk for _, c, _ in used],
        widths=tuple(dict.fromkeys(width_label(g["key"]) for g, _, _ in ordered)),
        upper=[upper_bound(c) for _, c, _ in used],
        noise_group=None if noise is None else noise[0],
        noise_dof=None if noise is None else noise[1], shared=shared)


def noise_sources(used: list[tuple], groups: list[dict], trends: list[NoiseSplit | None],
                  shared: float = SHARED_FRACTION) -> tuple[list[int], list[float]]:
    """Per used cell, which seed-noise estimate its sigma comes from (an int: its group's
    pooled trend or its batch's) and that estimate's effective degrees of freedom
    (`NoiseTrend.effective_dof`; inf where the sigma is the cell's own, not a trend's)."""
    index = {id(g): i for i, g in enumerate(groups)}
    sources: dict[tuple, int] = {}
    group, dof = [], []
    for g, c, _ in used:
        i = index[id(g)]
        split = trends[i]
        if split is None:
            key, nu = (i, "cell", len(group)), math.inf
        else:
            trend = split.trend(c.batch_size)
            key = (i, c.batch_size if trend is not split.pooled else None)
            nu = trend.effective_dof(shared)
        group.append(sources.setdefault(key, len(sources)))
        dof.append(nu)
    return group, dof


def upper_bound(cell) -> bool:
    """The cell's loss bounds its best-lr loss from above: its best grid lr is on the grid's
    edge (`Cell.edge`), so a better lr lies outside the grid."""
    return getattr(cell, "edge", None) is not None


def held_out(data: JointData, used: list[tuple], keep: np.ndarray, what: str,
             form: Form, noise_unknown: bool = False,
             start: np.ndarray | None = None, resamples: int = HELD_OUT_RESAMPLES) -> dict:
    """Refit on `keep` and predict the other cells: measured, predicted and the residual in
    seed sigmas per cell, and how many lie within HELD_OUT_SIGMAS. With `noise_unknown` (no
    run repeated: every sigma is NOMINAL_SIGMA, a weight, not a noise) the sigma is the
    refit's own scatter, NOMINAL_SIGMA x sqrt(chi2/dof) of the cells it kept. Where the seed
    sigmas miss, the prediction's own spread comes from `resamples` refits."""
    why = cannot_hold_out(data, keep)
    if why:
        return {"held_out": what, "cannot": why, "n_cells": int((~keep).sum()),
                "within_2_sigma": 0, "within_2_predictive_sigma": None, "tokens_reach": None,
                "fit_exponent": None, "rows": []}
    kept = data.subset(keep)
    fit = fit_joint(kept, form=form, start=start)
    if not fit.usable:
        return {"held_out": what, "n_cells": int((~keep).sum()), "within_2_sigma": 0,
                "within_2_predictive_sigma": None, "tokens_reach": None, "fit_exponent": None,
                "rows": [], "refit_failed": fit.message}
    out = np.flatnonzero(~keep)
    where = (data.width[out], data.batch[out], data.tokens[out])
    predicted = fit.predict_loss(*where)
    # (at least 1e-3 of it: a refit through every cell exactly leaves no scatter to judge by)
    scale = max(math.sqrt(fit.chi2_per_dof), 1e-3) if noise_unknown and fit.dof > 0 else 1.0
    rows = []
    for i, p in zip(out, predicted, strict=True):
        _, c, sigma = used[i]
        sigma *= scale
        ok = math.isfinite(p)
        rows.append({"width": data.widths[data.width[i]], "batch_size": c.batch_size,
                     "tokens": c.tokens, "tokens_reach": tokens_reach(kept, data, i),
                     "val_loss": c.loss,
                     "predicted_loss": float(p) if ok else None, "loss_sigma": sigma,
                     "residual_sigmas": (data.loss[i] - p) / sigma if ok else None,
                     "predicted_loss_sd": None, "residual_predictive_sigmas": None,
                     "upper_bound": bool(data.upper[i])})
    # the refit's own spread (a wrong law or an uncertain refit?) only where the seed sigmas miss
    within = sum(1 for r in rows if agrees(r))
    passed = passes({"within_2_sigma": within, "n_cells": len(rows)})
    if not passed:
        spread = prediction_spread(kept, fit, *where, resamples=resamples)
        for row, sd in zip(rows, spread, strict=True):
            if row["predicted_loss"] is not None and math.isfinite(sd):
                row["predicted_loss_sd"] = float(sd)
                row["residual_predictive_sigmas"] = (
                    (row["val_loss"] - row["predicted_loss"]) / math.hypot(row["loss_sigma"], sd))
    loose = None if passed else too_loose(rows)
    return {"held_out": what, "n_cells": len(rows), "within_2_sigma": within,
            "within_2_predictive_sigma": None if passed or loose else sum(
                1 for r in rows if agrees(r, "residual_predictive_sigmas")),
            **({"cannot": loose} if loose else {}),
            "tokens_reach": max((r["tokens_reach"] for r in rows if r["tokens_reach"]),
                                default=None),
            "fit_exponent": fit.exponent, "rows": rows}


def cannot_hold_out(data: JointData, keep: np.ndarray) -> str | None:
    """Why the held-out refit on `keep` cannot be made (None where it can): nothing left out,
    fewer than MIN_CELLS kept, a width with no cell kept, or too few cells above the baseline
    kept to pin the law."""
    if keep.all():
        return "no cell to hold out"
    if keep.sum() < MIN_CELLS:
        return f"{int(keep.sum())} cells would remain, the model needs {MIN_CELLS}"
    if len(set(data.width[keep].tolist())) < len(data.widths):
        return "a width would have no cell left"
    if (keep & ~smallest_batch(data)).sum() < 2:
        return "fewer than 2 cells above the smallest batch would remain to pin the law"
    return None


PREDICTIVE_LOOSE = 3.0  # a refit predicting with sd past this many seed sigmas tests nothing


def too_loose(rows: list[dict]) -> str | None:
    """Why a held-out refit's predictions are too uncertain to test the law (None where
    they are not): their own sd (`predicted_loss_sd`, measured where the seed-sigma test
    missed) has a median above PREDICTIVE_LOOSE seed sigmas, or could not be measured.
    Such a refit is unpinned: every cell would agree within its predictive sigma."""
    ratios = [r["predicted_loss_sd"] / r["loss_sigma"] for r in rows
              if r.get("predicted_loss_sd") is not None and r["loss_sigma"] > 0]
    if not ratios:
        return "the refit's own spread could not be measured"
    median = float(np.median(ratios))
    if median > PREDICTIVE_LOOSE:
        return (f"the refit predicts with a sd of {median:.1f} seed sigmas (median): too loose "
                "to test the law")
    return None


def tokens_reach(kept: JointData, data: JointData, i: int) -> float | None:
    """How far held-out cell i extrapolates in tokens: its tokens over the most the refit saw
    at its width and batch (None where the refit saw none there: a reach in width, not
    tokens). A held-out budget one doubling beyond the rest is 2.0."""
    same = (kept.width == data.width[i]) & (kept.batch == data.batch[i])
    return float(data.tokens[i] / kept.tokens[same].max()) if same.any() else None


BUDGET_SET = "the largest budget"
ANCHORED_BUDGET_SET = "the largest budget above its smallest batch"


def held_out_sets(data: JointData, used: list[tuple], form: Form,
                  noise_unknown: bool = False, start: np.ndarray | None = None,
                  resamples: int = HELD_OUT_RESAMPLES) -> list[dict]:
    """The held-out refits: the largest budget (the example curve and the law extrapolate
    together); the largest budget above each width's smallest batch (the baseline's cell
    stays: the law alone extrapolates to the lowest losses, from a curve measured there);
    with several widths, the widest model above its smallest batch (the law across sizes)."""
    largest_budget = np.array([c.budget == max(x.budget for x in g["cells"])
                               for g, c, _ in used])
    baseline = smallest_batch(data)
    at = (form, noise_unknown, start, resamples)
    sets = [held_out(data, used, ~largest_budget, BUDGET_SET, *at),
            held_out(data, used, ~(largest_budget & ~baseline), ANCHORED_BUDGET_SET, *at)]
    if len(data.widths) >= 2:
        widest = data.width == len(data.widths) - 1
        sets.append(held_out(data, used, ~(widest & ~baseline),
                             f"{data.widths[-1]} above its smallest batch", *at))
    return sets


def smallest_batch(data: JointData) -> np.ndarray:
    """Cells of their width's smallest batch, the baseline (bool per cell)."""
    lowest = {w: data.batch[data.width == w].min() for w in set(data.width.tolist())}
    return np.array([b == lowest[w] for w, b in zip(data.width.tolist(), data.batch,
                                                    strict=True)])


def curve_not_law(sets: list[dict]) -> str | None:
    """Where the largest budget misses but its batches above the baseline are predicted from
    the baseline's own cell there, the miss is the example curve's extrapolation, not the
    law's: say so (None otherwise)."""
    by_name = {s["held_out"]: s for s in sets}
    whole, anchored = by_name.get(BUDGET_SET), by_name.get(ANCHORED_BUDGET_SET)
    if whole is None or anchored is None or passes(whole) or not passes(anchored):
        return None
    return (f"with the baseline's cell at the largest budget kept, {anchored['within_2_sigma']} "
            f"of {anchored['n_cells']} larger batches there are predicted: the miss is the "
            "example curve's extrapolation in tokens more than the law's")


def reference_loss(data: JointData) -> float:
    """The loss at which the report states B_crit with its interval: the lowest the first
    width's smallest batch measured (the sweep's best-measured point of the law; nats/token)."""
    mine = (data.width == 0) & smallest_batch(data)
    return float(data.loss[mine].min())


def interval_of(data: JointData, fit: JointFit, optimizer: str,
                fit_range: dict | None = None, resamples: int = RESAMPLES) -> dict:
    """The parametric bootstrap's interval, each refit choosing its own form
    (`bootstrap_joint`), and B_crit's at `reference_loss`. It redraws the noise of every cell
    rather than resampling units, so it needs no minimum number of runs; its coverage on
    planted worlds of several kinds is measured by `make coverage` (docs/results/coverage.md)."""
    loss = reference_loss(data)
    boot = bootstrap_joint(data, fit, resamples=resamples, seed=sum(map(ord, optimizer)),
                           reference_loss=loss, fit_range=fit_range)
    return {"exponent_low": boot.exponent_low, "exponent_high": boot.exponent_high,
            "b_star_low": boot.b_star_low, "b_star_high": boot.b_star_high,
            "resamples": boot.resamples, "interval": boot.interval,
            "bootstrap_failed": boot.failed, "bootstrap_forms": boot.forms,
            "bootstrap_at_bounds": boot.at_bounds,
            # the refits' laws, paired: B_crit(L) = b_star L^-exponent with its band anywhere
            "law_draws": None if boot.b_stars is None else {
                "exponent": [float(f"{g:.6g}") for g in boot.exponents],
                "b_star": [float(f"{b:.6g}") for b in boot.b_stars], "unit": "sequences"},
            "b_crit_at_loss": {"loss": loss, "b_crit": float(fit.b_crit(np.array([loss]))[0]),
                               "low": boot.b_crit_low, "high": boot.b_crit_high,
                               "unit": "sequences", "interval": boot.interval}}


def range_check(data: JointData, fit: JointFit) -> tuple[dict, np.ndarray]:
    """The law refitted without the cells above their width's baseline range
    (`science.joint.above_baseline`: their E_min comes from the example curve's form, not
    from baseline data): how far the exponent leans on them, judged against the shift's own
    noise. Fewer cells pin the exponent less, so the refit moves by chance; for nested fits
    the shift's sd is sqrt(sd_refit^2 - sd_full^2) (linearised sds, `science.precision`,
    widened by the full fit's sqrt(chi2/dof) where it misfits). `shift_sigmas` is the shift
    over that sd. Returns the document and the cells' mask."""
    above = above_baseline(data)
    doc = {"n_cells": int(above.sum()), "exponent": None, "chi2_per_dof": None,
           "converged": None, "shift_sd": None, "shift_sigmas": None}
    if above.any() and (~above).sum() >= MIN_CELLS:
        # from the full fit: the same optimum as from fit_joint's own starts on the cpu
        # sweep's cells (5.19 and 2.21), in a tenth of the time on the report's test world
        kept = data.subset(~above)
        again = fit_joint(kept, start=fit.as_vector(), form=fit.form)
        if again.usable:
            doc.update(exponent=again.exponent, chi2_per_dof=again.chi2_per_dof,
                       converged=again.success)
            scale = noise_scale(fit)
            sd_refit, sd_full = (scale * exponent_sd(kept, again), scale * exponent_sd(data, fit))
            variance = sd_refit**2 - sd_full**2 if math.isfinite(sd_refit + sd_full) else math.nan
            shift_sd = math.sqrt(variance) if variance > 0 else sd_refit
            if math.isfinite(shift_sd) and shift_sd > 0:
                doc.update(shift_sd=shift_sd,
                           shift_sigmas=(again.exponent - fit.exponent) / shift_sd)
        else:
            doc.update(converged=False, refit_failed=again.message)
    return doc, above


def refit_failures(interval: dict, held: list[dict], in_range: dict) -> dict:
    """How many of the joint model's refits failed (a failed refit is left out, never fatal):
    the bootstrap's, the held-out sets' and the range check's, each as (failed, tried) and
    the bootstrap's share."""
    failed = interval["bootstrap_failed"]
    tried = interval["resamples"] + failed
    return {"bootstrap": failed, "bootstrap_tried": tried,
            "bootstrap_share": failed / tried if tried else None,
            "held_out": sum(1 for h in held if h.get("refit_failed")),
            "held_out_tried": len(held),
            "range_check": int(bool(in_range.get("refit_failed")))}


def model_data(groups: list[dict], shared: float | None = None
               ) -> tuple[list[tuple], list, list[str], JointData | None]:
    """The model's input from one optimizer's comparable groups: (the usable (group, cell,
    sigma) triples, each group's `seed_noise`, why other cells are not usable, and the
    JointData with its noise sources, None below MIN_CELLS usable cells). `shared`: the
    share of the noise a trunk shares, default measured from the groups (`sharing_of`)."""
    if shared is None:
        shared = sharing_of(groups)[1]
    trends = [seed_noise(g) for g in groups]
    used, notes = cells_of(groups, trends)
    data = (build_data(used, noise_sources(used, groups, trends, shared), shared)
            if len(used) >= MIN_CELLS else None)
    return used, trends, notes, data


def progress(what: str):
    """A printer of live progress for one long computation: each call names the step
    starting now (None: the end) on one line, with the seconds the previous step took."""
    t0 = [time.perf_counter()]

    def step(name: str | None) -> None:
        now = time.perf_counter()
        if step.started:
            print(f" {now - t0[0]:.1f} s", flush=True)
        if name:
            print(f"  {what}: {name} ...", end="", flush=True)
        t0[0], step.started = now, True

    step.started = False
    return step


def joint_fits(groups: list[dict], warnings: list[str],
               seeds_hint: str = "train the baseline at two seeds for the seed noise",
               pipeline_test: bool = False) -> tuple[dict, list[dict]]:
    """({optimizer: the joint model's document}, its Kaplan rows: method `joint`);
    `seeds_hint` says how to add seeds in the words of the input. A `pipeline_test` (the
    smoke scale) refits its bootstrap SMOKE_RESAMPLES times, not RESAMPLES, and each
    held-out prediction's spread as often, not HELD_OUT_RESAMPLES."""
    resamples = SMOKE_RESAMPLES if pipeline_test else RESAMPLES
    held_out_resamples = SMOKE_RESAMPLES if pipeline_test else HELD_OUT_RESAMPLES
    documents, rows = {}, []
    for optimizer, mine in comparable_groups(groups).items():
        sharing, shared = sharing_of(mine)
        used, trends, notes, data = model_data(mine, shared)
        if data is None:
            warnings.append(f"joint model ({optimizer}): {len(used)} usable cells, it needs "
                            f"{MIN_CELLS}" + (f" ({'; '.join(notes)})" if notes else "")
                            + f"; {seeds_hint}")
            continue
        seq_len = mine[0]["key"]["seq_len"]
        step = progress(f"joint model ({optimizer}), {len(used)} cells")
        step("the fit and its term tests")
        fit, terms = select_form(data)
        if not fit.usable:
            step(None)
            warnings.append(f"joint model ({optimizer}): no fit on its {len(data)} cells: "
                            f"{fit.message}")
            continue
        step(f"{resamples} bootstrap refits")
        # the noise alone's range of chi2/dof: the bootstrap's widening and the verdict's check
        fit_range = chi2_range(data, fit, seed=sum(map(ord, optimizer)))
        interval = interval_of(data, fit, optimizer, fit_range, resamples)
        step("the loss-alone test, the held-out refits and the range check")
        # the per-width law and the held-out refits start from the fit (as the range check
        # does): a fresh start's grid search cost three times as much for the same optimum
        per_width = shared_law_map(len(data.widths), fit.form.extra) @ fit.as_vector()
        test = (loss_alone_test(fit, fit_joint(data, per_width=True, form=fit.form,
                                               start=per_width), data)
                if len(data.widths) >= 2 else None)
        # where no run was repeated the sigmas are a nominal weight, not a noise: chi2/dof and
        # the largest residual measure nothing against them (the held-out sets use the refit's
        # own scatter there)
        noise_unknown = all(s == NOMINAL_SIGMA for _, _, s in used)
        if noise_unknown:
            fit_range = None
        tested = held_out_sets(data, used, fit.form,
                               noise_unknown=all(s == NOMINAL_SIGMA for _, _, s in used),
                               start=fit.as_vector(), resamples=held_out_resamples)
        in_range, above = range_check(data, fit)
        step(None)
        low, high = interval["exponent_low"], interval["exponent_high"]
        doc = {
            "optimizer": optimizer, "widths": list(data.widths), "seq_len": seq_len,
            "n_cells": len(data), "n_units": len(set(data.unit.tolist())),
            "n_upper_bounds": int(data.upper.sum()),
            "left_out": notes, "chi2": fit.chi2, "dof": fit.dof,
            "chi2_per_dof": fit.chi2_per_dof, "noise_scale": noise_scale(fit),
            "chi2_range": fit_range, "at_bounds": bounds_of(fit, data),
            "converged": fit.success,
            "failed_refits": refit_failures(interval, tested, in_range),
            "form": fit.form.formula,
            "b_small": fit.b_small if fit.small_batch else None,
            "small_batch_term": terms["small_batch"],
            "transition_power": fit.power if fit.form.power else None,
            "transition_power_term": terms["power"],
            "b_star_tokens": float(fit.b_star[0]) * seq_len, "exponent": fit.exponent,
            **{k: v for k, v in interval.items()
               if not k.startswith("b_star") and k != "bootstrap_failed"},
            "b_star_tokens_low": None if interval["b_star_low"] is None
            else interval["b_star_low"] * seq_len,
            "b_star_tokens_high": None if interval["b_star_high"] is None
            else interval["b_star_high"] * seq_len,
            "log_loss_span": float(np.ptp(np.log(data.loss))),
            "seed_noise": [row for g, trend in zip(mine, trends, strict=True) if trend
                           for row in noise_rows(width_label(g["key"]), trend, shared)],
            "trunk_sharing": sharing_document(sharing, shared),
            "curves": [{"width": w, "l_inf": float(fit.l_inf[i]), "a": float(fit.a[i]),
                        "alpha": float(fit.alpha[i]), "e_ref_tokens": 1e6}
                       for i, w in enumerate(data.widths)],
            "loss_alone": test, "held_out": tested, "above_baseline_range": in_range,
            "precision": None if low is None or high is None else projected_widths(
                data, fit, high - low, target=RESOLVED_WIDTH),
            "cells": [{"width": data.widths[data.width[i]], "batch_size": c.batch_size,
                       "tokens": c.tokens, "val_loss": c.loss, "loss_sigma": s,
                       "residual_sigmas": float(fit.residuals[i]),
                       "upper_bound": bool(data.upper[i]),
                       "above_baseline_range": bool(above[i]),
                       "b_crit": float(fit.b_crit(np.array([c.loss]))[0])}
                      for i, (_, c, s) in enumerate(used)],
        }
        doc.update(decide(doc))
        documents[optimizer] = doc
        if fit.power_at_bound:
            warnings.append(f"joint model ({optimizer}): the transition's power p = "
                            f"{fit.power:g} sits on its fitting bound: 1/alpha_B's interval "
                            "is conditional on it (p and 1/alpha_B trade against each other)")
        if fit.chi2_per_dof > 2:
            warnings.append(f"joint model ({optimizer}): chi2/dof = {fit.chi2_per_dof:.2f}: "
                            "the losses scatter about the model more than the seed noise "
                            "says; intervals are widened by sqrt(chi2/dof)")
        leans = leans_on_extrapolation(doc)
        if leans:
            warnings.append(f"joint model ({optimizer}): {leans}: the "
                            "law leans on losses the baseline batch never reached; train the "
                            "baseline at smaller budgets (more cooldown branches)")
        if test and test["holds"] is False:
            warnings.append(f"joint model ({optimizer}): B_crit does not depend on the loss "
                            f"alone across widths (p = {test['p_value']:.3g}); the per-width "
                            "exponents are in fits.json joint.loss_alone")
        rows.append({
            "optimizer": optimizer, "method": "joint", "b_star_tokens": doc["b_star_tokens"],
            "exponent": doc["exponent"], "exponent_low": doc["exponent_low"],
            "exponent_high": doc["exponent_high"], "b_star_tokens_low": doc["b_star_tokens_low"],
            "b_star_tokens_high": doc["b_star_tokens_high"], "n_points": len(data),
            "n_units": doc["n_units"], "interval": doc["interval"], "weighted": True,
            "chi2_per_dof": doc["chi2_per_dof"],
            "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS, "kaplan_exponent": KAPLAN_EXPONENT,
            "shown": low is not None and high is not None,
            "left_out": None if low is not None and high is not None else doc["interval"]})
    return documents, rows
