"""One answer behind every door: the batch and lr for (N params, D tokens) from a grid of runs.

A user's sweep (`make recommend`), a table of runs (`--table`), a public grid (`--peers`) and
the held-out checks (`--validate`, the peers report) all reach `fit` and `answer` with the
same cells (`science.answer.GridCell`: per (N, D) its batches, each with its lrs and losses),
so one question gets one answer. `fit` decides how the batch is read, and says which:

- ROUTE_OPTIMUM, where the grid has a loss optimum inside its batches at fixed tokens (Step
  Law's grid; `science.answer.has_interior_optimum`): the measured profile's windows and their
  laws (`science.answer`);
- ROUTE_B_CRIT, where loss keeps falling towards the smallest batch (critbatch's cpu sweeps):
  the joint model's loss law across sizes with its B_crit(L) (`science.recommend`), the
  loss-optimal batch then being the smallest the sweep trained.

Either way the answer has two batches, the loss-optimal one and the fastest within the promise
(`science.answer.Promise`: a compute overhead, 10% by default, or nats/token), each with its lr
and a 95% interval from refits of the whole choice; a verdict on the law the batch rests on;
how far the target lies beyond the data; and the cheap check that settles a doubtful answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from critbatch.analysis import plotting
from critbatch.analysis.parallel import process_map
from critbatch.analysis.recommend.recommend import (
    RESAMPLES,
    Model,
    SizedSweep,
    fit_model,
)
from critbatch.results.errors import ResultsError
from critbatch.science.answer import RESAMPLES as GRID_RESAMPLES
from critbatch.science.answer import (
    BatchRuns,
    GridCell,
    GridFit,
    GridTooSmall,
    Law,
    Promise,
    Replicates,
    bootstrap_answer,
    bootstrap_lr,
    chosen_terms,
    fit_answer,
    fit_lr,
    grid_answer,
    has_interior_optimum,
    keep_promise,
    lr_miss_cost,
    percentile_interval,
    room_for_lr,
)
from critbatch.science.recommend import (
    FIXED_SIZE_EXPONENT,
    ScalingFit,
    cost_steepness,
    fastest_within,
    noise_scale,
)

ROUTE_OPTIMUM = "optimum"  # the grid's loss optimum lies inside its batches
ROUTE_B_CRIT = "b_crit"  # loss keeps falling towards small batches: the joint model's B_crit
ROUTE_WORDS = {
    ROUTE_OPTIMUM: "the loss optimum lies inside the batches tried: read off the measured "
                   "profiles and their laws in size and tokens",
    ROUTE_B_CRIT: "loss keeps falling towards the smallest batch tried: read through the "
                  "joint model's B_crit(L)",
}
RESOLVED, UNRESOLVED, PIPELINE = "resolved", "unresolved", "pipeline test"
RESOLVED_WIDTH = 1.0  # B_crit route: 1/alpha_B known to +-0.5 (the joint model's verdict)
# optimum route: the batch law must predict held-out budgets and sizes within this many
# e-folds (root-mean-square; 0.3 is within about 35%)
HELD_OUT_OK = 0.3
FAR = 10.0  # beyond this factor of the data's largest size or budget: a loud warning


# ---------------------------------------------------------------------------------------------
# Cells


def grid_cells(sweep: SizedSweep, keep: np.ndarray | None = None) -> list[GridCell]:
    """The sweep's cells as (N, budget) grid cells: each best-lr cell's lrs and mean losses
    (branches included: a cooldown branch is a run of its own budget at its trunk's lr), and
    the lrs at which a run of that size and batch diverged."""
    keep = np.ones(len(sweep.cells), bool) if keep is None else keep
    groups: dict[tuple[float, float], list[BatchRuns]] = {}
    for i in np.flatnonzero(keep):
        c = sweep.cells[i]
        diverged = tuple(sorted(sweep.diverged.get((sweep.params[i], c.batch_size), ())))
        groups.setdefault((sweep.params[i], float(c.budget)), []).append(
            BatchRuns(float(c.batch_size), c.lrs, c.losses, diverged))
    return [GridCell(n, d, batches) for (n, d), batches in sorted(groups.items())]


def cell_keys(sweep: SizedSweep) -> list[tuple[float, float]]:
    return [(sweep.params[i], float(c.budget)) for i, c in enumerate(sweep.cells)]


def route_of(cells: list[GridCell]) -> str:
    return ROUTE_OPTIMUM if has_interior_optimum(cells) else ROUTE_B_CRIT


# ---------------------------------------------------------------------------------------------
# The fit


@dataclass
class Fitted:
    """What an answer needs from the data, fitted once (`fit`)."""

    route: str
    cells: list[GridCell]
    promise: Promise
    seq_len: int
    grid: GridFit | None = None  # ROUTE_OPTIMUM
    replicates: Replicates | None = None
    model: Model | None = None  # ROUTE_B_CRIT
    lr: Law | None = None  # ROUTE_B_CRIT: the lr law over every batch
    lr_replicates: list[tuple[Law, float]] = field(default_factory=list)
    verdict: dict = field(default_factory=dict)
    pipeline_test: bool = False
    noise_unknown: bool = False  # the sweep's: no run repeated at another seed
    route_note: str | None = None  # why the route is not the one the grid's shape asked for

    @property
    def sizes(self) -> list[float]:
        return sorted({c.params for c in self.cells})

    @property
    def budgets(self) -> list[float]:
        return sorted({c.tokens for c in self.cells})

    @property
    def lowest_loss(self) -> float:
        return min(c.best for c in self.cells)


def fit(cells: list[GridCell], promise: Promise, seq_len: int, sweep: SizedSweep | None = None,
        keep: np.ndarray | None = None, resamples: int | None = None, seed: int = 0,
        report_verdict: dict | None = None, pipeline_test: bool = False) -> Fitted:
    """The laws of `cells` by the route their shape asks for (`route_of`), with their
    bootstrap. The B_crit route needs the `sweep` the cells come from (`keep`: which of its
    cells) for the joint model's noise and trunks. `report_verdict`: the sweep report's
    verdict on B_crit(L) (fits.json `joint.<optimizer>`), read beside the fit's own."""
    if not cells:
        raise ResultsError("no cells to answer from")
    route = route_of(cells)
    out = Fitted(route, cells, promise, seq_len, pipeline_test=pipeline_test,
                 noise_unknown=bool(sweep and sweep.noise_unknown))
    try:
        if route == ROUTE_OPTIMUM:
            try:
                out.grid = fit_answer(cells, promise)
            except GridTooSmall as err:
                if sweep is None:
                    raise
                # too few cells for the profile's laws: a sweep still has its joint model
                out.route = route = ROUTE_B_CRIT
                out.route_note = (f"the runs' loss optimum lies inside their batches, but {err}: "
                                  "read through the joint model instead")
        if route == ROUTE_OPTIMUM:
            out.replicates = bootstrap_answer(
                cells, out.grid, GRID_RESAMPLES if resamples is None else resamples, seed,
                process_map(meanwhile=plotting.pyplot))  # the plot's library, while they refit
        else:
            if sweep is None:
                raise ResultsError("this grid's loss keeps falling towards its smallest batch, "
                                   "so its batch needs the joint model of a sweep's runs; pass "
                                   "the runs with --table")
            count = RESAMPLES if resamples is None else resamples
            out.model = fit_model(sweep, keep, count, seed)
            out.lr, _ = fit_lr(cells, {})
            out.lr_replicates = bootstrap_lr(cells, {}, count, seed)
    except GridTooSmall as err:
        raise ResultsError(f"the runs cannot give an answer: {err}") from None
    out.verdict = verdict_of(out, report_verdict)
    return out


def verdict_of(fitted: Fitted, report_verdict: dict | None = None) -> dict:
    """{"verdict": RESOLVED / UNRESOLVED / PIPELINE, "reasons": [...]}: whether the law the
    batch rests on is pinned (B_crit route: 1/alpha_B's 95% interval at most RESOLVED_WIDTH
    wide, and the sweep report's verdict where given (a misfit widens the intervals and is
    warned of, `size_warnings`); optimum route: the batch law predicting held-out budgets and
    sizes within HELD_OUT_OK e-folds)."""
    reasons = []
    if fitted.route == ROUTE_B_CRIT:
        model = fitted.model
        gammas = [r.gamma for r in model.refits]
        low, high = percentile_interval(gammas, log=False)
        if low is None:
            reasons.append("1/alpha_B has no interval (too few bootstrap refits converged)")
        elif high - low > RESOLVED_WIDTH:
            reasons.append(f"1/alpha_B's 95% interval [{low:.2f}, {high:.2f}] is wider than "
                           f"{RESOLVED_WIDTH:g}")
        if report_verdict and report_verdict.get("verdict") == UNRESOLVED:
            reasons += [f"the sweep report: {r}" for r in report_verdict.get("reasons", [])]
    else:
        held = fitted.grid.b_top.held_out
        error = held.get(held.get("chosen"), {}).get("mean", math.nan) if held else math.nan
        if not math.isfinite(error):
            reasons.append("the batch law has no held-out test (it needs two budgets of a "
                           "size, or three sizes)")
        elif error > HELD_OUT_OK:
            reasons.append(f"the batch law misses held-out budgets and sizes by {error:.2f} "
                           f"e-folds (more than {HELD_OUT_OK:g})")
    verdict = UNRESOLVED if reasons else RESOLVED
    if fitted.pipeline_test:
        verdict = PIPELINE
        reasons.insert(0, "smoke scale: runs of a few dozen steps test the pipeline and "
                          "measure nothing")
    return {"verdict": verdict, "reasons": reasons}


# ---------------------------------------------------------------------------------------------
# The answer


def frozen(fit: ScalingFit, loss: float) -> ScalingFit:
    """The law with B_crit held at its value at `loss` (no extrapolation in the loss)."""
    from dataclasses import replace

    return replace(fit, gamma=0.0, b_star=float(fit.b_crit(loss)))


def b_crit_answer(fitted: Fitted, params: float, tokens: float) -> dict:
    """The B_crit route's answer: `science.recommend.fastest_within` on the fit and on each
    bootstrap refit, the promise kept in expectation over them (`keep_promise`) with room for
    the lr's expected miss (`room_for_lr`), intervals their percentiles; an unresolved law's
    interval also spans the answer with B_crit held at the sweep's lowest loss (the law not
    extrapolated)."""
    model, promise = fitted.model, fitted.promise
    args = (params, tokens, model.smallest_batch, fitted.seq_len, promise.overhead,
            promise.tolerance)
    point = fastest_within(model.fit, *args)
    if point is None:
        raise ResultsError(f"the law predicts no loss at {tokens:.3g} tokens for "
                           f"{params:.3g} params from batch {model.smallest_batch} up")
    draws = [d for r in model.refits if (d := fastest_within(r, *args)) is not None]
    tops = np.log([d["batch_size"] for d in draws])
    g = cost_steepness(model.fit, params, tokens, point["batch_size"],
                       point["loss_optimal_batch"], promise.overhead)
    steep = math.isfinite(g) and g > 0
    batch = keep_promise(tops, g) if len(draws) >= 20 and steep else point["batch_size"]
    lr_cost = lr_miss_cost(fitted.cells, [math.log(law.predict(params, tokens, batch)) + dev
                                          for law, dev in fitted.lr_replicates])
    if steep:
        batch *= room_for_lr(point["loss_given_up"], lr_cost, g)
    low, high = percentile_interval(tops)
    lost = (fastest_within(frozen(model.fit, model.min_loss), *args)
            if point["predicted_loss"] < model.min_loss else None)
    widened = None
    if fitted.verdict["verdict"] != RESOLVED and lost is not None and low is not None:
        widened = lost["batch_size"]
        low, high = min(low, widened), max(high, widened)
    loss_low, loss_high = percentile_interval([d["predicted_loss"] for d in draws], log=False)
    crit_low, crit_high = percentile_interval([d["b_crit"] for d in draws], log=False)
    return {**point, "batch_size": batch, "batch_low": low, "batch_high": high,
            "batch_top": point["batch_size"], "steepness": g, "lr_miss_cost": lr_cost,
            "batch_without_extrapolation": widened,
            "loss_optimal_batch_low": None, "loss_optimal_batch_high": None,
            "predicted_loss_low": loss_low, "predicted_loss_high": loss_high,
            "b_crit_low": crit_low, "b_crit_high": crit_high,
            "resamples": len(draws), "failed_resamples": model.resamples - len(draws)}


def lr_of(fitted: Fitted, params: float, tokens: float, batch: float
          ) -> tuple[float, float | None, float | None]:
    """(lr, 95% prediction interval) at `batch` from the B_crit route's lr law and its
    replicates."""
    lr = fitted.lr.predict(params, tokens, batch)
    draws = [math.log(law.predict(params, tokens, batch)) + dev
             for law, dev in fitted.lr_replicates]
    return (lr, *percentile_interval(draws))


def extrapolation(fitted: Fitted, params: float, tokens: float, loss: float | None) -> dict:
    """How far the target lies beyond the data: ratios to the largest size and budget (and
    below the smallest: < 1), and how far its predicted loss lies below the data's lowest
    (nats/token; <= 0 inside)."""
    sizes, budgets = fitted.sizes, fitted.budgets
    return {"params_ratio": params / sizes[-1], "tokens_ratio": tokens / budgets[-1],
            "params_range": [sizes[0], sizes[-1]], "tokens_range": [budgets[0], budgets[-1]],
            "loss_below_data": None if loss is None else fitted.lowest_loss - loss}


def beyond(extra: dict) -> str | None:
    """Words for a target outside the data (None inside)."""
    words = []
    lo_n, hi_n = extra["params_range"]
    lo_d, hi_d = extra["tokens_range"]
    ratio_n = extra["params_ratio"]
    ratio_d = extra["tokens_ratio"]
    if ratio_n > 1.001:
        words.append(f"{ratio_n:.3g}x the largest model's params")
    elif ratio_n * hi_n < lo_n / 1.001:
        words.append(f"{lo_n / (ratio_n * hi_n):.3g}x below the smallest model")
    if ratio_d > 1.001:
        words.append(f"{ratio_d:.3g}x the largest budget")
    elif ratio_d * hi_d < lo_d / 1.001:
        words.append(f"{lo_d / (ratio_d * hi_d):.3g}x below the smallest budget")
    if (extra["loss_below_data"] or 0) > 0:
        words.append(f"a loss {extra['loss_below_data']:.3g} nats/token below the lowest "
                     "measured")
    return ", ".join(words) or None


def far(extra: dict) -> bool:
    """Whether the target lies more than FAR times beyond the data's sizes or budgets."""
    lo_n, hi_n = extra["params_range"]
    lo_d, hi_d = extra["tokens_range"]
    n, d = extra["params_ratio"] * hi_n, extra["tokens_ratio"] * hi_d
    return max(n / hi_n, lo_n / n, d / hi_d, lo_d / d) > FAR


def cheap_check(doc: dict) -> str:
    """The two short runs that settle a doubtful batch."""
    b = doc["batch_size"]
    return (f"two short runs with equal tokens at {b:,.0f} and {b / 2:,.0f} sequences, each "
            f"at its lr here: if the larger ends more than {doc['loss_given_up']:.3g} "
            "nats/token above the smaller, halve the batch (with fewer tokens than the "
            "target's the test is stricter)")


def answer(fitted: Fitted, params: float, tokens: float, width: int | None = None) -> dict:
    """The answer document for (params, tokens): the recommend.json fields (see
    docs/outputs.md) and `headline`, the warnings its first line carries."""
    promise = fitted.promise
    if fitted.route == ROUTE_OPTIMUM:
        out = grid_answer(fitted.grid, fitted.replicates, params, tokens, fitted.cells)
        out.update({"b_crit": None, "b_crit_low": None, "b_crit_high": None,
                    "tokens_over_min": None, "steps_over_min": None,
                    "predicted_loss_low": None, "predicted_loss_high": None,
                    "batch_without_extrapolation": None})
    else:
        out = b_crit_answer(fitted, params, tokens)
        out["lr"], out["lr_low"], out["lr_high"] = lr_of(fitted, params, tokens,
                                                         out["batch_size"])
        (out["loss_optimal_lr"], out["loss_optimal_lr_low"],
         out["loss_optimal_lr_high"]) = lr_of(fitted, params, tokens, out["loss_optimal_batch"])
    batch = out["batch_size"]
    doc = {"params": params, "tokens": tokens, "width": width, "seq_len": fitted.seq_len,
           "route": fitted.route,
           "route_words": fitted.route_note or ROUTE_WORDS[fitted.route],
           "overhead": promise.overhead, "tolerance": promise.tolerance,
           "promise": promise.words(), **out,
           "steps": int(tokens // (batch * fitted.seq_len)),
           "batch_power_of_two": 2 ** round(math.log2(batch)),
           "verdict": fitted.verdict["verdict"], "verdict_reasons": fitted.verdict["reasons"]}
    doc["extrapolation"] = extrapolation(fitted, params, tokens, doc.get("predicted_loss"))
    doc["check"] = cheap_check(doc)
    doc["headline"] = headline(doc)
    doc["model"] = model_summary(fitted)
    return doc


def headline(doc: dict) -> list[str]:
    """What the answer's first line must say before its numbers: a pipeline test, an
    unresolved law, a target beyond the data (each with what to do)."""
    out = []
    if doc["verdict"] == PIPELINE:
        out.append("PIPELINE TEST, NOT A MEASUREMENT (smoke scale): run SCALE=cpu or gpu for "
                   "numbers")
    elif doc["verdict"] == UNRESOLVED:
        out.append("UNRESOLVED: " + "; ".join(doc["verdict_reasons"]) + "; the interval "
                   "carries that, and two short runs settle it (below)")
    where = beyond(doc["extrapolation"])
    if where:
        out.append(("FAR OUTSIDE THE DATA: " if far(doc["extrapolation"]) else "EXTRAPOLATED: ")
                   + where)
    return out


def model_summary(fitted: Fitted) -> dict:
    """The laws behind the answer (recommend.json `model`)."""
    if fitted.route == ROUTE_OPTIMUM:
        g = fitted.grid
        loss = g.loss
        return {
            "route": fitted.route, "cells": g.cells, "top_cells": g.top_cells,
            "optimum_cells": g.optimum_cells, "lr_points": g.lr_points,
            "terms": chosen_terms(g),
            "held_out_rms_log": {"b_top": g.b_top.held_out, "b_opt": g.b_opt.held_out,
                                 "lr": g.lr.held_out},
            "exponents": {name: dict(zip(law.columns, law.coef[1:].tolist(), strict=True))
                          for name, law in (("b_top", g.b_top), ("b_opt", g.b_opt),
                                            ("lr", g.lr))},
            "residual_sd_log": {"b_top": g.b_top.residual_sd, "b_opt": g.b_opt.residual_sd,
                                "lr": g.lr.residual_sd},
            "loss": None if loss is None else {
                "form": "L* = E + A (N/1e8)^-alpha + C (D/1e10)^-beta", "e": loss.e,
                "a": loss.a, "alpha": loss.alpha, "c": loss.b, "beta": loss.beta,
                "residual_sd": loss.residual_sd},
            "resamples": len(fitted.replicates.fits),
            "failed_resamples": fitted.replicates.failed,
            "intervals": f"95% prediction intervals: {len(fitted.replicates.fits)} refits on "
                         "resampled cells, terms chosen again, a new cell's scatter drawn"}
    m = fitted.model
    f = m.fit
    return {
        "route": fitted.route,
        "form": "L = L_0 + A (N/1e6)^-a + C (E_min/1e6)^-b, E = "
                + f.form.formula.replace("B_crit", "B_crit(L)", 1) + ", B_crit = B* L^-gamma",
        "l0": f.l0, "a_size": f.a_size, "size_exponent": None if f.one_size else f.size_exponent,
        "size_exponent_fitted": f.size_terms == 2, "c": f.c, "b": f.b, "b_star": f.b_star,
        "gamma": f.gamma, "b_small": f.b_small if f.small_batch else None,
        "transition_power": f.power if f.form.power else None, "chi2_per_dof": f.chi2_per_dof,
        "small_batch_term": m.term_tests["small_batch"],
        "transition_power_term": m.term_tests["power"], "sizes": m.sizes.tolist(),
        "resamples": len(m.refits), "failed_refits": m.resamples - len(m.refits),
        "lr_law": {"terms": "+".join(fitted.lr.columns),
                   "exponents": dict(zip(fitted.lr.columns, fitted.lr.coef[1:].tolist(),
                                         strict=True)),
                   "residual_sd_log": fitted.lr.residual_sd,
                   "held_out_rms_log": fitted.lr.held_out},
        "intervals": f"95%: {len(m.refits)} refits of the law on resampled trunks, the "
                     "choice redone in each; the lr's from its law refitted on resampled "
                     "cells, a new cell's scatter drawn",
    }


def size_warnings(fitted: Fitted, params: float) -> list[str]:
    """What the data cannot say about a size it did not train."""
    out = []
    if fitted.route == ROUTE_B_CRIT:
        if fitted.noise_unknown:
            out.append("no run was repeated at another seed, so the loss noise is unknown: "
                       "every cell weighs the same in the joint model")
        f = fitted.model.fit
        if f.one_size and params not in fitted.sizes:
            out.append("the sweep has one model size, so how the loss moves with size is not "
                       "measured: the target is predicted with the sweep's own loss curve")
        if f.size_terms == 1:
            out.append(f"two model sizes: the size exponent is fixed at {FIXED_SIZE_EXPONENT} "
                       "(Hoffmann et al. 2022), not measured; a third size measures it")
        if "N" not in fitted.lr.columns and params not in fitted.sizes:
            out.append("the lr law has no size term: the lr is the sweep's sizes'")
        scale = noise_scale(f)
        if scale > 1.5:
            out.append(f"the law misfits the losses (chi2/dof {f.chi2_per_dof:.1f}); its "
                       f"intervals are widened by {scale:.2f}")
    return out


# ---------------------------------------------------------------------------------------------
# Held out in turn: what an answer costs on cells it never saw

SCORE_NOISE = 0.004  # nats/token: a promise counts as kept within this of grid noise
BATCH_MATCH = 2.0  # a batch within a doubling of the measured one matches
LR_MATCH = 1.5  # an lr within this factor of the measured optimum at that batch matches


def held_out_cases(cells: list[GridCell]) -> list[tuple[str, set, GridCell]]:
    """(name, held-out cell keys, target cell): with three sizes or more, the largest model
    (every budget of it) answered at its smallest budget; and each size's largest budget
    where the size has two or more. A name says how far a held-out budget lies beyond the
    size's next one."""
    sizes = sorted({c.params for c in cells})
    cases = []
    if len(sizes) >= 3:
        largest = [c for c in cells if c.params == sizes[-1]]
        target = min(largest, key=lambda c: c.tokens)
        cases.append((f"the {size_words(sizes[-1])} model at {tokens_words(target.tokens)} "
                      "tokens (the whole model held out)", {c.key for c in largest}, target))
    for n in sizes:
        mine = sorted((c for c in cells if c.params == n), key=lambda c: c.tokens)
        if len(mine) >= 2:
            top = mine[-1]
            cases.append((f"{size_words(n)} at its largest budget, {tokens_words(top.tokens)} "
                          f"tokens ({top.tokens / mine[-2].tokens:.1f}x its next)", {top.key},
                          top))
    return cases


def size_words(params: float) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.3g}M"


def tokens_words(tokens: float) -> str:
    return f"{tokens / 1e9:.3g}B" if tokens >= 1e9 else f"{tokens / 1e6:.3g}M"


def scored(cell: GridCell, batch: float, lr: float, promised: float | None) -> dict:
    """`science.answer.score` with the checks a held-out answer is judged by."""
    from critbatch.science.answer import score

    out = score(cell, batch, lr, promised)
    out["checks"] = {"lr_within_1.5x": bool(1 / LR_MATCH <= lr / out["measured_lr"]
                                            <= LR_MATCH)}
    if promised is not None:
        measured = out["measured_largest_within"]
        out["checks"].update({
            "promise_kept": bool(out["loss_given_up"] <= promised + SCORE_NOISE),
            "batch_within_a_doubling": bool(1 / BATCH_MATCH <= batch / measured <= BATCH_MATCH)})
    return out


def validate(cells: list[GridCell], promise: Promise, seq_len: int,
             sweep: SizedSweep | None = None, resamples: int | None = None,
             formula=None, progress=None) -> list[dict]:
    """Each held-out case (`held_out_cases`): the answer fitted without it, scored on the
    case's own grid (`science.answer.score`), beside `formula(params, tokens)` -> {"batch_size",
    "lr"} (a published rule, fitted on every cell) scored the same way."""
    rows = []
    keys = cell_keys(sweep) if sweep is not None else None
    for name, held, target in held_out_cases(cells):
        if progress:
            progress(f"held out: {name}")
        rest = [c for c in cells if c.key not in held]
        keep = None if keys is None else np.array([k not in held for k in keys])
        fitted = fit(rest, promise, seq_len, sweep, keep, resamples)
        doc = answer(fitted, target.params, target.tokens)
        ours = scored(target, doc["batch_size"], doc["lr"], doc["loss_given_up"])
        low, high = doc["batch_low"], doc["batch_high"]
        ours["checks"]["interval_holds"] = (None if low is None else
                                            bool(low <= ours["measured_largest_within"] <= high))
        optimum = scored(target, doc["loss_optimal_batch"], doc["loss_optimal_lr"], None)
        row = {"case": name, "params": target.params, "tokens": target.tokens,
               "answer": {k: doc[k] for k in (
                   "batch_size", "batch_low", "batch_high", "lr", "lr_low", "lr_high",
                   "loss_optimal_batch", "loss_optimal_lr", "loss_given_up", "predicted_loss",
                   "verdict", "route")},
               "measured": ours, "loss_optimal_measured": optimum,
               "best_loss": target.best}
        if formula is not None:
            theirs = formula(target.params, target.tokens)
            row["formula"] = {**theirs, **scored(target, theirs["batch_size"], theirs["lr"],
                                                 None)}
        rows.append(row)
    return rows


def validation_summary(rows: list[dict]) -> dict:
    """Counts over the held-out cases: promises kept, intervals holding the measured batch,
    batches within a doubling; the median measured loss given up of the loss-optimal answer
    and of the formula."""
    def count(key):
        values = [r["measured"]["checks"].get(key) for r in rows]
        return {"passed": sum(v is True for v in values), "of": sum(v is not None for v in values)}

    optimum = [r["loss_optimal_measured"]["loss_given_up"] for r in rows]
    formula = [r["formula"]["loss_given_up"] for r in rows if r.get("formula")]
    return {"promise_kept": count("promise_kept"), "interval_holds": count("interval_holds"),
            "batch_within_a_doubling": count("batch_within_a_doubling"),
            "median_loss_optimal_given_up": float(np.median(optimum)) if optimum else None,
            "median_formula_given_up": float(np.median(formula)) if formula else None}
