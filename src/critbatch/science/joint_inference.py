"""Inference on the joint model (`science.joint`): which optional terms the data demand, the
parametric bootstrap of its law, the spread of its predictions, and whether B_crit depends on
the loss alone (`loss_alone_test`).

`select_form` adds the small-batch factor, then the transition's power, each where a
likelihood-ratio test keeps it: the chi-square test (`extra_term_test`) and, where the
sigmas are estimated from a few seeds, a simulated one (`simulated_term_p`). The bootstrap
(`bootstrap_joint`) redraws every cell's loss around the fitted model with its noise (a
trunk and its cooldown branches sharing one draw; each noise estimate redrawn from its
degrees of freedom, `plausible_sigma`) and refits from the fit's own parameters; a refit
that fails is counted, never fatal. `prediction_spread` is the same bootstrap seen through
the losses it predicts. numpy/scipy only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from critbatch.science.intervals import CONFIDENCE, central_percentiles, percentile_band
from critbatch.science.joint import (
    REFIT_FTOL,
    TERM_TEST_DRAWS,
    TERM_TEST_LEVEL,
    Form,
    JointData,
    JointFit,
    draw_losses,
    noise_scale,
)
from critbatch.science.joint_fit import fit_joint

LINEAR_DRAWS = 4000  # noise draws of the linearised simulations (`noise_draws`)
CHI2_RANGE_LEVEL = 0.975  # chi2/dof above this quantile of its simulated range: a misfit


def fit_richer(data: JointData, base: JointFit, form: Form) -> JointFit:
    """The model with `form`'s terms (a superset of `base`'s), the lowest chi-square of
    three starts: `base` itself (a new term at its neutral value, B_s 0 or p 1: the richer
    fit is never worse than `base`), `base` with a new B_s at half the smallest batch (when
    the small-batch factor is the new term), and
    `fit_joint`'s own starts. From `base` alone it can stay near it where a term
    matters most: planted B_s 12 in a U-shaped world came back 2.3 with chi2/dof 2119, 12.2
    from the fresh starts."""
    b_smalls = [base.b_small]  # 0 where the base has no small-batch factor: neutral
    if form.small_batch and not base.form.small_batch:
        b_smalls.append(0.5 * float(data.batch.min()))
    fits = [fit_joint(data, per_width=base.per_width, form=form,
                      start=np.concatenate([base.without_terms(), form.tail(b_small, base.power)]))
            for b_small in b_smalls]
    fits.append(fit_joint(data, per_width=base.per_width, form=form))
    return min(fits, key=lambda f: f.chi2 if np.isfinite(f.chi2) else math.inf)


TERMS = ("small_batch", "power")  # the optional terms, in the order `select_form` tries them


def select_form(data: JointData, per_width: bool = False) -> tuple[JointFit, dict[str, dict]]:
    """The model with each optional term the data demand: the plain model, then the
    small-batch factor tested against it, then the power tested against the form so far.
    A term is kept where both its chi-square test (`extra_term_test`) and, where that keeps
    it and the sigmas are estimates (`JointData.noise_estimated`), the simulated test
    (`simulated_term_p`) give p < TERM_TEST_LEVEL: with known sigmas the simulation would
    only repeat the chi-square test by Monte Carlo. Returns the fit and each term's test by
    name (`TERMS`), with `p_value_simulated` (None where it did not run)."""
    fit = fit_joint(data, per_width=per_width)
    tests = {}
    for i, name in enumerate(TERMS):
        richer = fit_richer(data, fit, replace(fit.form, **{name: True}))
        test = extra_term_test(fit, richer)
        test["p_value_simulated"] = None
        if test["kept"] and data.noise_estimated:
            test["p_value_simulated"] = simulated_term_p(data, fit, richer, seed=i)
            test["kept"] = test["p_value_simulated"] < TERM_TEST_LEVEL
        if test["kept"]:
            fit = richer
        tests[name] = test
    return fit, tests


def plausible_sigma(rng: np.random.Generator, data: JointData) -> np.ndarray:
    """Each cell's sigma as the truth behind its estimate might be: every estimate
    (`data.noise_group`) with nu = `noise_dof` degrees of freedom scaled by one draw of
    sqrt(nu / chi2_nu), shared by the cells that use it (known sigmas, nu = inf, stay). The
    chi-square draw is held within its central 95% (at nu near 1 the rest reach factors of
    100 and more, losses no run could have). A sigma from a few seeds is as likely 0.6x as
    1.4x the truth; drawing the losses with the estimate alone made the 95% interval cover
    in 106 of 120 cpu-like planted worlds, 114 with the true sigmas."""
    if data.noise_group is None or data.noise_dof is None:
        return data.sigma
    _, first, cell_group = np.unique(data.noise_group, return_index=True, return_inverse=True)
    dof = data.noise_dof[first]  # one per estimate
    factor = np.ones(len(dof))
    finite = np.isfinite(dof) & (dof > 0)
    nu = dof[finite]
    low, high = central_chi2(tuple(nu.tolist()))
    drawn = np.clip(rng.chisquare(nu), low, high)
    factor[finite] = np.sqrt(nu / drawn)
    return data.sigma * factor[cell_group]


@functools.lru_cache(maxsize=64)
def central_chi2(dofs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The central CONFIDENCE (95%) of chi-square at each of `dofs` (remembered: every
    bootstrap draw of one fit asks for the same)."""
    from critbatch.science.distributions import chi2_quantile

    nu = np.array(dofs, dtype=float)
    low, high = (p / 100 for p in central_percentiles(CONFIDENCE))
    return chi2_quantile(low, nu), chi2_quantile(high, nu)


def model_center(data: JointData, fit: JointFit) -> np.ndarray:
    """Each cell's loss as the fit predicts it, the measured loss where the model has none;
    an upper bound stays at least its bound: what the parametric draws scatter around."""
    center = fit.predict_loss(data.width, data.batch, data.tokens)
    center = np.where(np.isfinite(center), center, data.loss)
    return np.where(data.upper, np.maximum(center, data.loss), center)


def redrawn_data(data: JointData, fit: JointFit, resamples: int, seed: int,
                 shared: float | None = None, scale: float | None = None):
    """`resamples` copies of `data`, every cell's loss redrawn around the fit's prediction
    (`draw_losses`, noise scaled by `scale`, default `noise_scale(fit)`; an upper bound
    stays at least its bound; where the sigmas are estimates, each draw with sigmas as the
    truth behind them might be, `plausible_sigma`). The stated sigmas stay the weights."""
    rng = np.random.default_rng(seed)
    center = model_center(data, fit)
    scale = noise_scale(fit) if scale is None else scale
    for _ in range(resamples):
        yield data.with_loss(draw_losses(rng, data, center, scale, shared,
                                         plausible_sigma(rng, data)))


def redrawn_refits(data: JointData, fit: JointFit, resamples: int, seed: int,
                   shared: float | None = None):
    """The parametric bootstrap's refits: `redrawn_data`, each refitted from the fit's
    parameters, weighted by the stated sigmas as the fit was; every refit, converged or not
    (`converged` tells: callers count the others)."""
    for drawn in redrawn_data(data, fit, resamples, seed, shared):
        yield fit_joint(drawn, fit.per_width, start=fit.as_vector(), form=fit.form,
                        ftol=REFIT_FTOL)


def converged(fit: JointFit) -> bool:
    """A refit that counts: the solver converged to finite parameters."""
    return fit.success and fit.usable


def term_statistic(base: JointFit, richer: JointFit) -> float:
    """The chi-square drop from `base` to `richer`, over the richer fit's chi2/dof where
    that exceeds 1 (the noise scaled as the misfit says): `extra_term_test`'s statistic."""
    return max(0.0, base.chi2 - richer.chi2) / noise_scale(richer) ** 2


def simulated_term_p(data: JointData, base: JointFit, richer: JointFit,
                     draws: int = TERM_TEST_DRAWS, seed: int = 0) -> float:
    """The p-value of `richer`'s extra term by simulation: `draws` data sets drawn from
    `base` (`redrawn_data`: the noise scaled by the richer fit's misfit, each noise estimate
    redrawn from its degrees of freedom), each fitted with and without the term; the share
    of statistics (`term_statistic`, scaled by each simulated fit's own misfit) at least the
    one measured, (1 + exceed) / (1 + the draws whose fits converged). Where the sigmas rest
    on two seeds per width the chi-square test is not calibrated: in 60 planted worlds of
    the cpu widths sweep's design, with neither term, it kept one in 20 of them.

    Each simulated richer fit starts from its null fit with the term neutral (B_s 0, p 1;
    for time), the measured one also from `fit_richer`'s other starts; that can only lower
    the simulated statistics (a liberal p), yet the two tests together kept a term in 6 of
    those worlds' 120 tests (40 draws, with the nudged B_s start as well), the nominal 5%."""
    observed = term_statistic(base, richer)
    exceed = valid = 0
    for drawn in redrawn_data(data, base, draws, seed, scale=noise_scale(richer)):
        null = fit_joint(drawn, base.per_width, start=base.as_vector(), form=base.form,
                         ftol=REFIT_FTOL)
        again = fit_joint(drawn, base.per_width, form=richer.form, ftol=REFIT_FTOL,
                          start=np.concatenate([null.without_terms(),
                                                richer.form.tail(null.b_small, null.power)]))
        if null.success and again.success and np.isfinite([null.chi2, again.chi2]).all():
            valid += 1
            exceed += term_statistic(null, again) >= observed
    return (1 + exceed) / (1 + valid)


@dataclass
class Bootstrap:
    """The parametric bootstrap of one fit: percentile intervals of gamma, B_star and B_crit
    at `reference_loss`, over refits that each chose their own form (`reselect_form`)."""

    exponent_low: float | None
    exponent_high: float | None
    b_star_low: float | None  # sequences
    b_star_high: float | None
    resamples: int  # refits that converged
    noise_scale: float
    exponents: np.ndarray
    interval: str
    failed: int = 0  # refits that did not converge (left out of the percentiles)
    reference_loss: float | None = None  # nats/token
    b_crit_low: float | None = None  # sequences, B_crit at reference_loss
    b_crit_high: float | None = None
    forms: dict | None = None  # refits per form formula
    at_bounds: dict | None = None  # refits with a parameter on its fitting bound, per name
    b_stars: np.ndarray | None = None  # sequences, each refit's B_star beside `exponents`


def term_column(form: Form, name: str, n_parameters: int) -> int:
    """The column of optional term `name` in a parameter vector of `form` (which has it)."""
    return n_parameters - form.extra + (0 if name == "small_batch" else int(form.small_batch))


def with_term(fit: JointFit, name: str) -> tuple[Form, np.ndarray]:
    """`fit`'s form with term `name` and its parameters with the term at its current value,
    or neutral (B_s 0, p 1) where the fit lacks it."""
    form = replace(fit.form, **{name: True})
    return form, np.concatenate([fit.without_terms(), form.tail(fit.b_small, fit.power)])


def term_critical(data: JointData, fit: JointFit, draws: int = LINEAR_DRAWS,
                  seed: int = 0) -> dict[str, float]:
    """Per optional term, the statistic (`term_statistic`) above which the data demand it:
    the larger of chi-square's 1 - TERM_TEST_LEVEL quantile (one parameter) and the same
    quantile of the statistic's distribution without the term, linearised at the fit with
    the term added (the share of `noise_draws` the term's direction absorbs beyond the other
    parameters', over each draw's own misfit). The bootstrap's refits choose their form by
    it (`reselect_form`): with sigmas from two or three seeds chi-square alone kept a term
    far more often than the measured fit's simulated test, and widened the interval of
    1/alpha_B by 30% on the model's own worlds (30 planted: sd of the error over the
    interval's half-width 0.72 against 0.93 with the form held)."""
    from critbatch.science.distributions import chi2_quantile

    base = float(chi2_quantile(1 - TERM_TEST_LEVEL, 1))
    out = {}
    z = noise_draws(data, draws, seed)
    z = np.where(data.upper[None, :], np.maximum(z, 0.0), z)
    for name in TERMS:
        form, vector = with_term(fit, name)
        jac = fit_jacobian(data, fit, vector, form)
        column = term_column(form, name, len(vector))
        rich = column_basis(jac)
        poor = column_basis(np.delete(jac, column, axis=1))
        dof = len(data) - len(vector)
        if dof <= 0:
            out[name] = base
            continue
        absorbed = ((z @ rich) ** 2).sum(axis=1)
        misfit = np.maximum(1.0, ((z**2).sum(axis=1) - absorbed) / dof)
        statistic = np.maximum(0.0, absorbed - ((z @ poor) ** 2).sum(axis=1)) / misfit
        out[name] = max(base, float(np.quantile(statistic, 1 - TERM_TEST_LEVEL)))
    return out


def score_statistic(drawn: JointData, fit: JointFit, name: str) -> float:
    """The score (Lagrange multiplier) statistic of adding optional term `name` to `fit`:
    the share of the whitened residuals the term's direction would absorb at its neutral
    value (B_s 0, p 1), over the fit's misfit; no refit. B_s >= 0 is one-sided: a score that
    asks for B_s < 0 gives 0."""
    from critbatch.science.joint_fit import residuals

    form, vector = with_term(fit, name)
    r = residuals(vector, drawn, len(fit.l_inf), fit.per_width, form, steps=8)
    jac = fit_jacobian(drawn, fit, vector, form)
    if name == "small_batch" and float(r @ jac[:, term_column(form, name, len(vector))]) >= 0:
        return 0.0  # chi2 grows with B_s > 0: the bound holds it at 0
    q = column_basis(jac)
    return float(((r @ q) ** 2).sum()) / noise_scale(fit) ** 2


def wald_statistic(drawn: JointData, fit: JointFit, name: str) -> float:
    """The Wald statistic of optional term `name` in `fit`: its distance from the neutral
    value (B_s 0, p 1) squared over its linearised variance (widened by the fit's misfit);
    no refit. Infinite where the variance cannot be had (the term is kept)."""
    jac = fit_jacobian(drawn, fit)
    column = term_column(fit.form, name, jac.shape[1])
    var = float(np.linalg.pinv(jac.T @ jac)[column, column]) * noise_scale(fit) ** 2
    value = fit.b_small if name == "small_batch" else fit.power - 1.0
    if not (var > 0 and math.isfinite(var)):
        return math.inf
    return value**2 / var


def reselect_form(drawn: JointData, fit: JointFit, critical: dict[str, float]) -> JointFit:
    """A bootstrap refit's own choice of form, term by term in `TERMS` order as
    `select_form` chooses on the measured cells: a term is in where the chi-square drop it
    brings (`term_statistic`) exceeds its `critical` value (`term_critical`). The refit with
    the other form is run only where a linearised statistic says it may win (a lacking term's
    score, a present term's Wald, against the same value): on the model's own worlds most
    replicates need none."""
    for name in TERMS:
        if not fit.usable:
            return fit
        if not getattr(fit.form, name):
            if score_statistic(drawn, fit, name) <= critical[name]:
                continue
            form, start = with_term(fit, name)
            richer = fit_joint(drawn, fit.per_width, form=form, ftol=REFIT_FTOL, start=start)
            if converged(richer) and term_statistic(fit, richer) > critical[name]:
                fit = richer
        else:
            if wald_statistic(drawn, fit, name) > critical[name]:
                continue
            form = replace(fit.form, **{name: False})
            keep = np.ones(len(fit.as_vector()), dtype=bool)
            keep[term_column(fit.form, name, len(keep))] = False
            poorer = fit_joint(drawn, fit.per_width, form=form, ftol=REFIT_FTOL,
                               start=fit.as_vector()[keep])
            if converged(poorer) and term_statistic(poorer, fit) <= critical[name]:
                fit = poorer
    return fit


def excess_scale(data: JointData, fit: JointFit, seed: int = 0,
                 fit_range: dict | None = None) -> float:
    """How much to widen the bootstrap's noise: sqrt of chi2/dof over the chi2/dof the noise
    alone gives on average (`chi2_range`'s draws: with sigmas estimated from a few seeds
    and redrawn from their degrees of freedom that mean is above 1), where the fit misfits
    beyond it, else 1. Widening by all of chi2/dof counted the noise model's own spread
    twice: on 200 planted worlds of the model's own form the intervals were 19% wider than
    the estimates' scatter."""
    if fit_range is None:
        fit_range = chi2_range(data, fit, seed=seed)
    mean = fit_range.get("mean")
    if mean is None or not math.isfinite(fit.chi2_per_dof):
        return noise_scale(fit)
    return math.sqrt(max(1.0, fit.chi2_per_dof / max(mean, 1.0)))


def bounds_of(fit: JointFit, data: JointData) -> list[str]:
    """The fitted parameters on a fitting bound: 1/alpha_B, the transition's power p, the
    small-batch scale B_s at its largest (`joint_fit.b_small_max`)."""
    from critbatch.science.joint_fit import b_small_max

    out = []
    if fit.at_bound:
        out.append("1/alpha_B")
    if fit.power_at_bound:
        out.append("p")
    if fit.small_batch and fit.b_small >= b_small_max(data) * (1 - 1e-3):
        out.append("B_s")
    return out


def bootstrap_joint(data: JointData, fit: JointFit, resamples: int = 200, seed: int = 0,
                    confidence: float = CONFIDENCE, shared: float | None = None,
                    reference_loss: float | None = None, reselect: bool = True,
                    fit_range: dict | None = None) -> Bootstrap:
    """The central `confidence` percentiles of gamma, B_star (the shared law, or the first
    width's) and, with `reference_loss`, B_crit there, over the parametric bootstrap's
    refits (`redrawn_data` around the fit, each refitted from the fit's parameters and, with
    `reselect`, choosing its own form, `reselect_form`, by the critical values
    `term_critical` sets once: the interval includes the choice).
    Refits with a parameter on its bound are counted and named in the label; `fit_range`:
    the fit's `chi2_range`, where the caller has it. None for a fit on gamma's bound: a
    percentile interval cut by the bound is no interval, and such refits run to their
    evaluation limit."""
    if not fit.usable:
        return Bootstrap(None, None, None, None, 0, 1.0, np.array([]),
                         f"none: the fit failed ({fit.message})")
    scale = excess_scale(data, fit, seed, fit_range)
    if fit.at_bound:
        return Bootstrap(None, None, None, None, 0, scale, np.array([]),
                         f"none: 1/alpha_B sits on its bound ({fit.exponent:g}): the cells do "
                         "not pin the law")
    gammas, log_b, log_crit, failed = [], [], [], 0
    forms: dict[str, int] = {}
    bounds: dict[str, int] = {}
    critical = term_critical(data, fit, seed=seed) if reselect else {}
    for drawn in redrawn_data(data, fit, resamples, seed, shared, scale):
        again = fit_joint(drawn, fit.per_width, start=fit.as_vector(), form=fit.form,
                          ftol=REFIT_FTOL)
        if reselect and converged(again):
            again = reselect_form(drawn, again, critical)
        if not converged(again):
            failed += 1
            continue
        gammas.append(again.exponent)
        log_b.append(math.log(again.b_star[0]))
        if reference_loss is not None:
            log_crit.append(math.log(float(again.b_crit(np.array([reference_loss]))[0])))
        forms[again.form.formula] = forms.get(again.form.formula, 0) + 1
        for name in bounds_of(again, drawn):
            bounds[name] = bounds.get(name, 0) + 1
    estimated = data.noise_estimated
    chosen = ("" if not reselect else ", each choosing its form (" + ", ".join(
        f"{f} in {n}" for f, n in sorted(forms.items(), key=lambda kv: -kv[1])) + ")")
    on_bound = "".join(f"; {name} on its fitting bound in {n} refits"
                       for name, n in sorted(bounds.items()))
    label = (f"{confidence:.0%} parametric bootstrap: every cell's loss redrawn with its seed "
             f"noise{f' x {scale:.2f} (chi2/dof beyond the noise alone)' if scale > 1 else ''}"
             f"{' (each noise estimate redrawn from its degrees of freedom)' if estimated else ''}"
             f", a trunk and its branches sharing "
             f"{data.shared if shared is None else shared:.0%} of the variance, refitted "
             f"{len(gammas)} times{chosen}" + (f" ({failed} refits failed)" if failed else "")
             + on_bound)
    if len(gammas) < max(10, resamples // 2):
        return Bootstrap(None, None, None, None, len(gammas), scale, np.array(gammas),
                         f"none: {len(gammas)} of {resamples} refits converged", failed,
                         forms=forms, at_bounds=bounds)
    lo, hi = percentile_band(gammas, confidence)
    b_lo, b_hi = np.exp(percentile_band(log_b, confidence))
    c_lo, c_hi = np.exp(percentile_band(log_crit, confidence)) if log_crit else (None, None)
    return Bootstrap(float(lo), float(hi), float(b_lo), float(b_hi), len(gammas), scale,
                     np.array(gammas), label, failed, reference_loss,
                     None if c_lo is None else float(c_lo), None if c_hi is None else float(c_hi),
                     forms, bounds, np.exp(log_b))


def prediction_spread(data: JointData, fit: JointFit, width, batch, tokens,
                      resamples: int = 40, seed: int = 0,
                      shared: float | None = None) -> np.ndarray:
    """Standard deviation of the loss `fit` predicts at (width, batch, tokens) over a
    parametric bootstrap of `fit` on `data` (`bootstrap_joint`'s draws): the prediction's
    own uncertainty, beside the seed noise of the cells it is compared with. NaN where fewer
    than half the refits converged to a finite prediction, and for a fit on gamma's bound
    (see `bootstrap_joint`)."""
    if fit.at_bound or not fit.usable:
        return np.full(np.shape(np.atleast_1d(tokens)), np.nan)
    predictions = [again.predict_loss(width, batch, tokens)
                   for again in redrawn_refits(data, fit, resamples, seed, shared)
                   if converged(again)]
    if not predictions:
        return np.full(np.shape(np.atleast_1d(tokens)), np.nan)
    stack = np.array(predictions)
    enough = np.isfinite(stack).sum(axis=0) >= max(2, resamples // 2)
    with np.errstate(invalid="ignore"):
        return np.where(enough, np.nanstd(stack, axis=0, ddof=1), np.nan)


def extra_term_test(plain: JointFit, richer: JointFit) -> dict:
    """Do the data demand `richer`'s extra term? The chi-square drop from `plain` to
    `richer` (one more parameter), the noise scaled by the richer fit's chi2/dof when that
    exceeds 1; `kept` where p < TERM_TEST_LEVEL (the chi-square half of `select_form`'s
    test, which also asks `simulated_term_p`). With the richer fit's term values
    (`b_small`, `power`; None for a term it lacks)."""
    from critbatch.science.distributions import chi2_sf

    delta = term_statistic(plain, richer)
    p = float(chi2_sf(delta, 1))
    return {"delta_chi2": delta, "p_value": p, "noise_scale": noise_scale(richer),
            "kept": bool(p < TERM_TEST_LEVEL), "chi2_per_dof_without": plain.chi2_per_dof,
            "chi2_per_dof_with": richer.chi2_per_dof, "chi2_without": plain.chi2,
            "chi2_with": richer.chi2, "dof_with": richer.dof,
            "b_small": richer.b_small if richer.small_batch else None,
            "power": richer.power if richer.form.power else None}


def noise_draws(data: JointData, draws: int, seed: int) -> np.ndarray:
    """`draws` x cells whitened noise, as `draw_losses` draws it (a trunk's share once, each
    noise estimate redrawn from its degrees of freedom as `plausible_sigma` does), over the
    stated sigmas: what (measured - truth) / sigma looks like where the model is right."""
    rng = np.random.default_rng(seed)
    per_unit = rng.standard_normal((draws, int(data.unit.max()) + 1))[:, data.unit]
    own = rng.standard_normal((draws, len(data)))
    z = math.sqrt(data.shared) * per_unit + math.sqrt(1 - data.shared) * own
    if data.noise_group is None or data.noise_dof is None:
        return z
    _, first, cell_group = np.unique(data.noise_group, return_index=True, return_inverse=True)
    dof = data.noise_dof[first]
    factor = np.ones((draws, len(dof)))
    finite = np.isfinite(dof) & (dof > 0)
    nu = dof[finite]
    if len(nu):
        low, high = central_chi2(tuple(nu.tolist()))
        drawn = np.clip(rng.chisquare(nu, size=(draws, len(nu))), low, high)
        factor[:, finite] = np.sqrt(nu / drawn)
    return z * factor[:, cell_group]


def column_basis(jac: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the columns of `jac` (the directions a fit can absorb),
    rank-revealing: directions below 1e-9 of the largest singular value are left out."""
    u, sv, _ = np.linalg.svd(jac, full_matrices=False)
    if not len(sv) or sv[0] <= 0:
        return np.zeros((jac.shape[0], 0))
    return u[:, sv > 1e-9 * sv[0]]


def fit_jacobian(data: JointData, fit: JointFit, vector: np.ndarray | None = None,
                 form: Form | None = None) -> np.ndarray:
    """d residual / d parameter at `vector` (default the fit's own) for `form` (default the
    fit's), the fit's law per width or shared as it is."""
    from critbatch.science.joint_fit import residual_jacobian

    return residual_jacobian(fit.as_vector() if vector is None else vector, data,
                             len(fit.l_inf), fit.per_width, fit.form if form is None else form,
                             steps=8)


def chi2_range(data: JointData, fit: JointFit, draws: int = LINEAR_DRAWS,
               seed: int = 0) -> dict:
    """Is the fit's chi2/dof within what the noise alone would give? Its distribution where
    the model is right, linearised at the fit: the whitened noise (`noise_draws`: trunks
    shared, noise estimates redrawn) less its part the fit absorbs (its projection on the
    Jacobian's columns). With sigmas from two or three seeds and noise shared within trunks,
    that range is far wider than chi-square's (dof). `p_value`: the share of draws at least
    the fit's; `high`: the CHI2_RANGE_LEVEL quantile of chi2/dof; `holds` where chi2/dof is
    at most that; the same for the largest |residual| (seed sigmas) of any cell
    (`largest_residual`, `_high`, `_p`, `_holds`)."""
    if fit.dof <= 0 or not fit.usable:
        return {"chi2_per_dof": fit.chi2_per_dof, "high": None, "mean": None, "p_value": None,
                "holds": None, "draws": 0}
    q = column_basis(fit_jacobian(data, fit))
    z = noise_draws(data, draws, seed)
    z = np.where(data.upper[None, :], np.maximum(z, 0.0), z)  # a bound counts above it only
    absorbed = z @ q
    left = (z**2).sum(axis=1) - (absorbed**2).sum(axis=1)
    simulated = left / fit.dof
    high = float(np.quantile(simulated, CHI2_RANGE_LEVEL))
    # the largest |residual| the noise alone leaves: a heavier tail than the model's shows
    # there first (on planted worlds of Student-t noise chi2/dof stayed in range)
    largest = np.abs(z - absorbed @ q.T).max(axis=1)
    largest_high = float(np.quantile(largest, CHI2_RANGE_LEVEL))
    observed = float(np.abs(fit.residuals).max()) if len(fit.residuals) else math.nan
    return {"chi2_per_dof": fit.chi2_per_dof, "high": high, "mean": float(simulated.mean()),
            "p_value": float((1 + np.sum(simulated >= fit.chi2_per_dof)) / (1 + draws)),
            "holds": bool(fit.chi2_per_dof <= high), "draws": draws,
            "largest_residual": observed, "largest_residual_high": largest_high,
            "largest_residual_p": float((1 + np.sum(largest >= observed)) / (1 + draws)),
            "largest_residual_holds": bool(observed <= largest_high)}


def shared_law_map(n_widths: int, extra: int) -> np.ndarray:
    """The matrix that maps the shared law's parameters to one law per width's (every
    width's ln B_star and gamma the shared one's; the curves and the optional terms as they
    are): the shared model is the per-width one on this subspace."""
    w = n_widths
    small = 3 * w + 2 + extra
    big = 5 * w + extra
    m = np.zeros((big, small))
    m[:3 * w, :3 * w] = np.eye(3 * w)
    m[3 * w:4 * w, 3 * w] = 1.0
    m[4 * w:5 * w, 3 * w + 1] = 1.0
    m[5 * w:, 3 * w + 2:] = np.eye(extra)
    return m


def loss_alone_test(shared: JointFit, per_width: JointFit, data: JointData | None = None,
                    draws: int = LINEAR_DRAWS, seed: int = 0) -> dict:
    """Does B_crit depend on the loss alone? The chi-square difference between the shared
    law and one law per width, over the extra parameters (2 per extra width), with the
    noise scaled by the per-width fit's chi2/dof when that exceeds 1; p < 0.05 rejects it.
    With `data`, p comes from the statistic's own distribution where the shared law holds,
    linearised at the per-width fit (the difference of the two fits' projections applied to
    `noise_draws`, each draw scaled by its own misfit): chi-square's p assumed known,
    independent sigmas, and rejected true loss-alone worlds far above its 5%. Without `data`
    (or where the simulation cannot be made) p is chi-square's. No test (p NaN, `holds`
    None) where the per-width fit could not be made."""
    from critbatch.science.distributions import chi2_sf

    extra = 2 * (len(shared.widths) - 1)
    scale2 = noise_scale(per_width) ** 2
    delta = max(0.0, shared.chi2 - per_width.chi2) / scale2
    p_chi2 = float(chi2_sf(delta, extra)) if extra > 0 and per_width.usable else math.nan
    p, calibration = p_chi2, "chi-square"
    if data is not None and math.isfinite(p_chi2) and per_width.dof > 0:
        jac = fit_jacobian(data, per_width)
        big = column_basis(jac)
        small = column_basis(jac @ shared_law_map(len(shared.widths), shared.form.extra))
        z = noise_draws(data, draws, seed)
        z = np.where(data.upper[None, :], np.maximum(z, 0.0), z)
        absorbed_big = ((z @ big) ** 2).sum(axis=1)
        absorbed_small = ((z @ small) ** 2).sum(axis=1)
        misfit = np.maximum(1.0, ((z**2).sum(axis=1) - absorbed_big) / per_width.dof)
        simulated = np.maximum(0.0, absorbed_big - absorbed_small) / misfit
        p = float((1 + np.sum(simulated >= delta)) / (1 + draws))
        calibration = (f"simulated: {draws} noise draws through the fits linearised at the "
                       "per-width fit (trunks shared, noise estimates redrawn)")
    return {"delta_chi2": delta, "extra_parameters": extra, "p_value": p,
            "p_value_chi2": p_chi2, "calibration": calibration,
            "noise_scale": math.sqrt(scale2),
            "holds": None if not math.isfinite(p) else bool(p >= 0.05),
            "per_width_exponents": [float(g) for g in per_width.gamma],
            "per_width_b_star": [float(b) for b in per_width.b_star]}
