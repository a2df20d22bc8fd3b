"""`recommend`: the batch size and lr of a larger run, predicted from a sweep (science.recommend).

Per optimizer, the sweep's best-lr cells of one corpus, vocabulary and seq_len, at every model
size, become one `SizedSweep`: the cells with their loss noise and trunk, and the size
(non-embedding parameters) of each. `fit_model` fits the joint model (one curve per size,
with the small-batch term when the data demand it), then the loss law across sizes started
from it, its parametric bootstrap and the lr law. `answer` gives the candidates and the
recommended batch for a target (params, tokens), `validate` the same for the sweep's largest
size (or largest budget) refitted without it, beside what those runs measured. The report
(printing, JSON, plot, W&B) is `report.py` beside it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from critbatch.analysis.bcrit.best_lr import (
    BUDGET_TOLERANCE,
    best_lr_cells,
    seed_blocks,
    seed_scatter,
    split_runs,
)
from critbatch.analysis.joint.joint import (
    MIN_CELLS,
    NOMINAL_SIGMA,
    seed_noise,
    sharing_of,
    upper_bound,
)
from critbatch.results.errors import ResultsError
from critbatch.science.fits import nominal_budgets
from critbatch.science.joint import SHARED_FRACTION, JointData
from critbatch.science.joint_inference import select_form
from critbatch.science.model_size import param_count
from critbatch.science.recommend import (
    FIXED_SIZE_EXPONENT,
    LrLaw,
    ScalingFit,
    bootstrap_scaling,
    fit_lr_law,
    fit_scaling,
    noise_scale,
    recommend,
    starts_from,
    to_target_loss,
)
from critbatch.science.rules import beta2_for_half_life, decay_half_life_tokens

RESAMPLES = 100  # bootstrap refits (the joint model's number)
DEFAULT_TOLERANCE = 0.01  # nats/token
FAR = 10.0  # a target beyond this many times the sweep's params or tokens gets a loud warning
LR_MATCH = 1.5  # validation: an lr within this factor of the measured optimum matches
BATCH_MATCH = 2.0  # validation: a batch within this factor (a doubling) matches


@dataclass
class SizedSweep:
    """One optimizer's cells over model sizes: parallel lists, one entry per cell."""

    optimizer: str
    seq_len: int
    cells: list  # best_lr.Cell
    sigma: list[float]  # nats/token
    params: list[float]  # non-embedding parameters of the cell's model
    depth: int | None  # the sweep's depth (for --width), when one
    notes: list[str] = field(default_factory=list)
    beta2_rule: dict | None = None  # `beta2_rule` of its runs
    # the share of a cell's noise its trunk shares, measured from the seeds where they can
    # (`analysis.joint.joint.sharing_of`), else science.joint.SHARED_FRACTION
    shared: float = SHARED_FRACTION

    @property
    def sizes(self) -> list[float]:
        return sorted(set(self.params))

    def data(self, keep: np.ndarray | None = None) -> tuple[JointData, np.ndarray]:
        """(JointData with width index = size rank, sizes) of the cells in `keep`."""
        keep = np.ones(len(self.cells), bool) if keep is None else keep
        picked = [i for i in range(len(self.cells)) if keep[i]]
        sizes = sorted({self.params[i] for i in picked})
        data = JointData.build([self.params[i] for i in picked],
                               [self.cells[i].batch_size for i in picked],
                               [self.cells[i].tokens for i in picked],
                               [self.cells[i].loss for i in picked],
                               [self.sigma[i] for i in picked],
                               [self.cells[i].trunk for i in picked], widths=tuple(sizes),
                               upper=[upper_bound(self.cells[i]) for i in picked],
                               shared=self.shared)
        return data, np.array(sizes, float)


def run_params(run: dict) -> float | None:
    """Non-embedding parameters of a run: its summary's (or table's) count, else the closed
    form of its width and depth."""
    if run.get("params_nonembedding"):
        return float(run["params_nonembedding"])
    if run.get("width") and run.get("depth"):
        return float(param_count(run["width"], run["depth"], run["seq_len"] or 0,
                                 run.get("vocab_size") or 0)[1])
    return None


def beta2_rule(runs: list[dict]) -> dict | None:
    """How the runs set AdamW's beta2 (summary.json `beta2`, `beta2_scaling`): {"scaling":
    "tokens", "half_life_tokens": H} when every run kept one half-life in tokens, {"scaling":
    "none", "beta2": b} when every run trained at one beta2; None when the runs do not
    record it (folders from before it was recorded, tables without it) or disagree."""
    seen = set()
    for r in runs:
        if r.get("beta2") is None or not r.get("seq_len"):
            return None
        if r.get("beta2_scaling") == "tokens":
            half = decay_half_life_tokens(r["beta2"], r["batch_size"], r["seq_len"])
            seen.add(("tokens", float(f"{half:.6g}")))
        else:
            seen.add(("none", float(r["beta2"])))
    if len(seen) != 1:
        return None
    scaling, value = seen.pop()
    return ({"scaling": "tokens", "half_life_tokens": value} if scaling == "tokens"
            else {"scaling": "none", "beta2": value})


def beta2_of(rule: dict | None, batch_size: int | None, seq_len: int) -> float | None:
    """The beta2 the sweep's rule gives at `batch_size` (None without a rule or a batch)."""
    if rule is None or batch_size is None:
        return None
    if rule["scaling"] == "tokens":
        return beta2_for_half_life(rule["half_life_tokens"], batch_size, seq_len)
    return rule["beta2"]


def width_params(width: int, depth: int) -> float:
    """Non-embedding parameters of a width at `depth` (`science.model_size.param_count`)."""
    return float(param_count(width, depth, 0, 0)[1])


def sized_sweeps(runs: list[dict], warnings: list[str]) -> dict[str, SizedSweep]:
    """Per optimizer, its groups of runs (one per model) of the corpus, vocabulary and seq_len
    with the most runs, as one SizedSweep. Groups without a size are left out with a warning;
    cells of too few steps for their warmup too."""
    groups, left_out, more = split_runs(runs)
    warnings += more
    if left_out:
        counts = Counter(d["reason"] for d in left_out)
        warnings.append("left out: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    by_opt: dict[str, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for key, members in groups.items():
        data_name, vocab, seq_len, _width, _depth, optimizer, _label, _params = key
        by_opt[optimizer][(data_name, vocab, seq_len)].append(members)
    out = {}
    for optimizer, corpora in sorted(by_opt.items()):
        corpus = max(corpora, key=lambda c: sum(len(m) for m in corpora[c]))
        sweep = SizedSweep(optimizer, int(corpus[2]), [], [], [], None)
        depths, blocks = set(), []
        for members in corpora[corpus]:
            size = run_params(members[0])
            if size is None:
                warnings.append(f"{optimizer}: {len(members)} runs without a model size left "
                                "out; give the table a params column (non-embedding "
                                "parameters)")
                continue
            depths.add(members[0].get("depth"))
            budgets = nominal_budgets([r["tokens"] for r in members], BUDGET_TOLERANCE)
            blocks += seed_blocks(members, budgets)
            scatter = seed_scatter(members, budgets)
            cells = best_lr_cells(members, None, scatter[0] if scatter else None)
            noise = seed_noise({"cells": cells})  # the joint model's: per batch and tokens
            for c in cells:
                if c.few_steps:
                    sweep.notes.append("fewer steps than 3x the warmup")
                    continue
                if noise:
                    sigma = float(noise.sd(c.batch_size, c.tokens)) / math.sqrt(c.n_seeds)
                else:  # seeds only at lrs that are no cell's best: their pooled scatter
                    sigma = (scatter[0] / math.sqrt(c.n_seeds) if scatter and scatter[0] > 0
                             else math.nan)
                sweep.cells.append(c)
                sweep.sigma.append(sigma)
                sweep.params.append(size)
        if not sweep.cells:
            continue
        sweep.beta2_rule = beta2_rule([r for m in corpora[corpus] for r in m])
        sweep.shared = sharing_of([{"seed_blocks": blocks}])[1]
        if not any(math.isfinite(s) for s in sweep.sigma):
            warnings.append(f"{optimizer}: no run was repeated at another seed, so the loss "
                            "noise is unknown: every cell weighs the same and the intervals "
                            "come from the scatter about the fit")
        sweep.sigma = [s if math.isfinite(s) else NOMINAL_SIGMA for s in sweep.sigma]
        sweep.depth = depths.pop() if len(depths) == 1 else None
        out[optimizer] = sweep
    return out


@dataclass
class Model:
    """What a recommendation needs from a sweep."""

    fit: ScalingFit
    refits: list[ScalingFit]
    lr_law: LrLaw | None
    term_tests: dict  # per optional term (`joint_inference.TERMS`) its tests (`select_form`)
    sizes: np.ndarray
    smallest_batch: int
    max_tokens: float
    min_loss: float
    beta2_rule: dict | None = None  # the sweep's (`beta2_rule`), carried to the answer
    resamples: int = RESAMPLES  # bootstrap refits tried (`refits` holds those that converged)


def lr_points(sweep: SizedSweep, keep: np.ndarray) -> tuple[list, list, list, list]:
    """(batch, params, lr, tokens) of the cells with an interior lr optimum, at every budget
    of a full run (a cooldown branch shares its trunk's lr, so its cell says nothing of the
    lr at its own budget)."""
    rows = [(c.batch_size, sweep.params[i], c.lr, c.tokens) for i in np.flatnonzero(keep)
            if (c := sweep.cells[i]).edge is None and c.trunk in ("", c.run_dir)]
    return tuple(map(list, zip(*rows, strict=True))) if rows else ([], [], [], [])


def fit_model(sweep: SizedSweep, keep: np.ndarray | None = None, resamples: int = RESAMPLES,
              seed: int = 0) -> Model:
    """The loss law across sizes (with the joint model's optional terms where
    `science.joint_inference.select_form`'s tests keep them), its bootstrap refits and the lr law,
    on the cells in `keep`."""
    keep = np.ones(len(sweep.cells), bool) if keep is None else keep
    data, sizes = sweep.data(keep)
    if len(data) < MIN_CELLS:
        raise ResultsError(f"{sweep.optimizer}: {len(data)} usable cells, the model needs "
                           f"{MIN_CELLS}; train more batch sizes or budgets")
    joint, terms = select_form(data)
    if not joint.usable:
        raise ResultsError(f"{sweep.optimizer}: the joint model cannot be fitted to its "
                           f"{len(data)} cells ({joint.message})")
    fit = fit_scaling(data, sizes, starts_from(joint, sizes, data), form=joint.form)
    if not math.isfinite(fit.chi2):
        raise ResultsError(f"{sweep.optimizer}: the loss law across sizes could not be fitted "
                           f"to its {len(data)} cells; check the table's losses")
    refits = bootstrap_scaling(data, sizes, fit, resamples, seed=seed)
    lr_law = fit_lr_law(*lr_points(sweep, keep))
    return Model(fit, refits, lr_law, terms, sizes, int(data.batch.min()),
                 float(data.tokens.max()), float(data.loss.min()), sweep.beta2_rule, resamples)


def extrapolation(model: Model, params: float, tokens: float, loss: float | None) -> dict:
    """How far a target lies beyond the sweep: ratios to its largest size and budget, and how
    far below its lowest measured loss the prediction goes (nats/token; <= 0 inside)."""
    return {"params_ratio": params / float(model.sizes.max()),
            "tokens_ratio": tokens / model.max_tokens,
            "loss_below_sweep": None if loss is None else model.min_loss - loss}


def target_warnings(model: Model, params: float, tokens: float, extra: dict) -> list[str]:
    out = []
    if extra["params_ratio"] > FAR or extra["tokens_ratio"] > FAR:
        out.append(f"FAR OUTSIDE THE SWEEP: the target has {extra['params_ratio']:.3g}x the "
                   f"sweep's largest params and {extra['tokens_ratio']:.3g}x its largest "
                   "budget; the laws are extrapolated that far: check the answer with a "
                   "short run before committing to it")
    elif extra["params_ratio"] > 1 or extra["tokens_ratio"] > 1:
        out.append(f"extrapolated: {extra['params_ratio']:.3g}x the sweep's largest params, "
                   f"{extra['tokens_ratio']:.3g}x its largest budget")
    if model.fit.one_size and params not in model.sizes:
        out.append("the sweep has one model size, so how the loss moves with size is not "
                   "measured: the target is predicted with the sweep's own loss curve")
    if model.fit.size_terms == 1:
        out.append(f"two model sizes: the size exponent is fixed at {FIXED_SIZE_EXPONENT} "
                   "(Hoffmann et al. 2022), not measured; a third size measures it")
    if model.lr_law is None:
        out.append("no lr law: fewer interior lr optima than it has coefficients (train three "
                   "lrs or more per batch, with the best inside the grid)")
    elif model.lr_law.one_size and params not in model.sizes:
        out.append("the lr law has no size term (one size with interior optima): the lr is the "
                   "sweep size's")
    scale = noise_scale(model.fit)
    if scale > 1.5:
        out.append(f"the law misfits the losses (chi2/dof {model.fit.chi2_per_dof:.1f}); its "
                   f"intervals are widened by {scale:.2f}")
    if len(model.refits) < RESAMPLES // 2:
        out.append(f"only {len(model.refits)} of {RESAMPLES} bootstrap refits converged: "
                   "intervals are missing or rough")
    return out


def answer(model: Model, optimizer: str, params: float, tokens: float, seq_len: int,
           tolerance: float = DEFAULT_TOLERANCE, width: int | None = None,
           target_loss: float | None = None) -> dict:
    """The recommendation document (the JSON keys of `python analysis/recommend.py`)."""
    out = recommend(model.fit, model.refits, model.lr_law, params, tokens,
                    model.smallest_batch, seq_len, tolerance)
    rows, pick = out["candidates"], out["pick"]
    chosen = rows[pick] if rows else {}
    extra = extrapolation(model, params, tokens, chosen.get("predicted_loss"))
    warnings = [f"{optimizer}: {w}" for w in target_warnings(model, params, tokens, extra)]
    if not rows:
        warnings.append(f"{optimizer}: no candidate batch: the law predicts no loss at "
                        f"{tokens:.3g} tokens from batch {model.smallest_batch} up")
    doc = {"optimizer": optimizer, "width": width, "params": params, "tokens": tokens,
           "seq_len": seq_len, "tolerance": tolerance,
           **{k: chosen.get(k) for k in ("batch_size", "lr", "lr_low", "lr_high",
                                         "predicted_loss", "predicted_loss_low",
                                         "predicted_loss_high", "b_crit", "b_crit_low",
                                         "b_crit_high", "steps")},
           # AdamW's beta2 at the batch by the sweep's rule (None: the runs did not record it)
           "beta2": beta2_of(model.beta2_rule, chosen.get("batch_size"), seq_len),
           "beta2_rule": model.beta2_rule,
           "candidates": rows, "extrapolation": extra, "warnings": warnings,
           "model": model_summary(model)}
    if target_loss is not None:
        doc["target_loss"] = to_target_loss(model.fit, params, target_loss,
                                            [r["batch_size"] for r in rows] or
                                            [model.smallest_batch], seq_len, tolerance)
        if doc["target_loss"]["batch_size"] is None:
            warnings.append(f"{optimizer}: the law never reaches {target_loss} nats/token at "
                            f"{params:.3g} params (its floor there is "
                            f"{float(model.fit.l_inf(params)):.4g})")
    return doc


def model_summary(model: Model) -> dict:
    f = model.fit
    law = model.lr_law
    return {
        "form": "L = L_0 + A (N/1e6)^-a + C (E_min/1e6)^-b, E = "
                + f.form.formula.replace("B_crit", "B_crit(L)", 1) + ", B_crit = B* L^-gamma",
        "l0": f.l0, "a_size": f.a_size,
        "size_exponent": None if f.one_size else f.size_exponent,
        "size_exponent_fitted": f.size_terms == 2, "c": f.c, "b": f.b, "b_star": f.b_star,
        "gamma": f.gamma,
        "b_small": f.b_small if f.small_batch else None,
        "transition_power": f.power if f.form.power else None, "chi2_per_dof": f.chi2_per_dof,
        "small_batch_term": model.term_tests["small_batch"],
        "transition_power_term": model.term_tests["power"], "sizes": model.sizes.tolist(),
        "resamples": len(model.refits), "failed_refits": model.resamples - len(model.refits),
        "lr_law": None if law is None else {
            "batch_exponent": law.batch_exponent, "size_exponent": law.size_exponent,
            "budget_exponent": law.budget_exponent, "budget_term": law.budget_test,
            "points": law.n_points, "residual_sd_log": law.residual_sd},
        "intervals": "95%: predicted loss and B_crit from the law's parametric bootstrap "
                     f"({len(model.refits)} refits, {model.resamples - len(model.refits)} failed "
                     f"and left out, seed noise x {noise_scale(f):.2f}); lr "
                     "from the lr law's t interval of the mean",
    }


def measured_answer(cells: list, tolerance: float) -> dict | None:
    """What held-out cells of one size and budget measured: the largest batch within
    `tolerance` of their best loss, its lr optimum and loss."""
    if not cells:
        return None
    best = min(c.loss for c in cells)
    pick = max((c for c in cells if c.loss <= best + tolerance), key=lambda c: c.batch_size)
    return {"batch_size": pick.batch_size, "lr": pick.lr, "lr_edge": pick.edge,
            "loss": pick.loss, "best_loss": best,
            "losses": {c.batch_size: c.loss for c in sorted(cells, key=lambda c: c.batch_size)}}


def validate(sweep: SizedSweep, tolerance: float = DEFAULT_TOLERANCE,
             resamples: int = RESAMPLES) -> dict:
    """Hold out the largest size (with one size: its largest budget), recommend for it from
    the rest at its largest budget, and compare with what its runs measured."""
    params = np.array(sweep.params)
    budgets = np.array([c.budget for c in sweep.cells])
    if len(sweep.sizes) >= 2:
        held = params == max(sweep.sizes)
        what = f"the largest model ({max(sweep.sizes):,.0f} params)"
    else:
        held = budgets == budgets.max()
        what = f"the largest budget ({budgets.max():,} tokens)"
    target_params = float(params[held][0])
    top = budgets[held].max()
    target = [sweep.cells[i] for i in np.flatnonzero(held & (budgets == top))]
    tokens = float(np.median([c.tokens for c in target]))
    model = fit_model(sweep, ~held, resamples)
    doc = answer(model, sweep.optimizer, target_params, tokens, sweep.seq_len, tolerance)
    measured = measured_answer(target, tolerance)
    rows = {r["batch_size"]: r for r in doc["candidates"]}
    at = rows.get(measured["batch_size"]) if measured else None
    checks = {}
    if measured and doc["batch_size"]:
        ratio = doc["batch_size"] / measured["batch_size"]
        checks["batch_within_a_doubling"] = bool(1 / BATCH_MATCH <= ratio <= BATCH_MATCH)
        if doc["lr"] and measured["lr_edge"] is None:
            lr_at = at["lr"] if at else None
            checks["lr_within_1.5x"] = (None if lr_at is None else
                                        bool(1 / LR_MATCH <= lr_at / measured["lr"] <= LR_MATCH))
        if at and at["predicted_loss_low"] is not None:
            checks["loss_within_interval"] = bool(
                at["predicted_loss_low"] <= measured["loss"] <= at["predicted_loss_high"])
    return {"held_out": what, "recommendation": doc, "measured": measured,
            "predicted_at_measured_batch": at, "checks": checks}
