"""The critical batch size from measured costs (docs/science.md, sections 1, 3 and 4).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training") relate the optimizer
steps S and the examples E = B S needed to reach a loss:

    S / S_min = 1 + B_crit / B,    E / E_min = 1 + B / B_crit,    B_crit = E_min / S_min.

Three routes to B_crit follow, each a pure function here:

- **per run** (tokens-equivalent): a run with batch B that saw E tokens is worth E_eff tokens
  of a small-batch baseline b; with r = E / E_eff, B_crit = (B - b r) / (r - 1)
  (`bcrit_corrected`; `bcrit_naive` drops the baseline's own batch, for comparison);
- **Pareto frontier**: at one target loss S(B) = S_min + E_min / B is linear in 1/B
  (`fit_pareto`);
- **Kaplan et al. 2020's law** B_crit(L) = B* / L^(1/alpha_B) across losses (`fit_kaplan`).

Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token.
numpy/scipy only.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from critbatch.science.fits import fit_log_linear
from critbatch.science.intervals import CONFIDENCE, percentile_band

KAPLAN_B_STAR_TOKENS = 2e8  # Kaplan et al. 2020, GPT-2 tokenizer on WebText2
KAPLAN_EXPONENT = 4.8  # 1/alpha_B, alpha_B ~ 0.21
MIN_BOOTSTRAP_UNITS = 6  # fewer independent units: a range of per-unit estimates, no bootstrap


def bcrit_corrected(batch_size: float, baseline_batch: float, r: float) -> float:
    """B_crit = (B - b r) / (r - 1): McCandlish et al. 2018 with the baseline's own batch.

    From E = E_min (1 + B/B_crit) and E_eff = E_min (1 + b/B_crit), r = E / E_eff. Defined for
    r > 1; r >= B/b gives B_crit <= 0 (the run lost more than the model allows). Units: those
    of B and b.
    """
    return (batch_size - baseline_batch * r) / (r - 1)


def bcrit_naive(batch_size: float, r: float) -> float:
    """B_crit = B / (r - 1): the formula that treats the baseline as an infinitely small batch.

    Overestimates B_crit when b is not far below B_crit; reported only for comparison.
    """
    return batch_size / (r - 1)


def fit_pareto(batch_sizes, steps) -> dict:
    """Fit S(B) = S_min + E_min / B at one target loss (McCandlish et al. 2018, eq. 2.11).

    `batch_sizes` in sequences, `steps` the optimizer steps each needs to reach the target.
    Weighted least squares (scipy `curve_fit`), each point with sigma proportional to its S
    (relative errors: reading E off a loss curve errs by a fraction of E), and the covariance
    scaled by the residuals. B_crit = E_min / S_min (sequences) with a 95% interval from the
    delta method on log B_crit and Student's t (needs three batch sizes or more; with two the
    fit is exact and the intervals are None; an upper end past a float's range is None, an
    open interval). Assumes the model holds at this loss.
    """
    from scipy.optimize import OptimizeWarning, curve_fit

    from critbatch.science.distributions import t_quantile

    x = 1.0 / np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    n = len(s)
    out = {"n_batch_sizes": n, "s_min": None, "e_min": None, "b_crit": None,
           "b_crit_low": None, "b_crit_high": None, "s_min_low": None, "s_min_high": None,
           "e_min_low": None, "e_min_high": None}
    if n < 2:
        return out
    a = np.stack([np.ones_like(x), x], axis=1) / s[:, None]  # weighted linear system
    (s_min, e_min), *_ = np.linalg.lstsq(a, np.ones_like(s), rcond=None)
    if n > 2:
        with warnings.catch_warnings():  # an inestimable covariance is inf: no interval below
            warnings.simplefilter("ignore", OptimizeWarning)
            (s_min, e_min), cov = curve_fit(lambda x, s0, e0: s0 + e0 * x, x, s,
                                            p0=(s_min, e_min), sigma=s, absolute_sigma=False)
    out.update(s_min=float(s_min), e_min=float(e_min))
    if s_min <= 0 or e_min <= 0:
        return out
    out["b_crit"] = float(e_min / s_min)
    if n > 2 and np.all(np.isfinite(cov)):
        tq = float(t_quantile(0.5 + CONFIDENCE / 2, n - 2))
        sd_s, sd_e = math.sqrt(max(cov[0, 0], 0)), math.sqrt(max(cov[1, 1], 0))
        var_log = cov[1, 1] / e_min**2 + cov[0, 0] / s_min**2 - 2 * cov[0, 1] / (e_min * s_min)
        sd_log = math.sqrt(max(var_log, 0.0))
        out.update(b_crit_low=out["b_crit"] * math.exp(-min(tq * sd_log, 700.0)),
                   b_crit_high=exp_or_none(math.log(out["b_crit"]) + tq * sd_log),
                   s_min_low=s_min - tq * sd_s, s_min_high=s_min + tq * sd_s,
                   e_min_low=e_min - tq * sd_e, e_min_high=e_min + tq * sd_e)
    return out


def exp_or_none(x: float) -> float | None:
    """exp(x), or None where it overflows a float (an interval too wide to state)."""
    return math.exp(x) if x < 700 else None


def fit_kaplan(losses, b_crit_tokens, log_sigma=None) -> dict:
    """Fit Kaplan et al. 2020's B_crit(L) = B* / L^(1/alpha_B) (their eq. 5.3).

    Least squares of log B_crit = log B* - (1/alpha_B) log L, L in nats/token, B_crit in
    tokens. `log_sigma`: each point's uncertainty in log B_crit (weights 1/sigma^2); None
    weighs every point equally. Returns B* (tokens) and the exponent 1/alpha_B with 95%
    Student-t intervals of the fit (None with fewer than three points), next to Kaplan's
    2e8 tokens and 4.8; the constants depend on corpus and tokenizer, the exponent less so.
    """
    out = {"b_star_tokens": None, "b_star_tokens_low": None, "b_star_tokens_high": None,
           "exponent": None, "exponent_low": None, "exponent_high": None,
           "n_points": len(losses), "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS,
           "kaplan_exponent": KAPLAN_EXPONENT}
    fit = (fit_log_linear(np.log(losses), np.log(b_crit_tokens), log_sigma)
           if len(losses) else None)
    if fit is None:
        return out
    out.update(b_star_tokens=exp_or_none(fit["intercept"]), exponent=-fit["slope"])
    if fit["t"] is not None:
        t = fit["t"]
        out.update(b_star_tokens_low=exp_or_none(fit["intercept"] - t * fit["intercept_sd"]),
                   b_star_tokens_high=exp_or_none(fit["intercept"] + t * fit["intercept_sd"]),
                   exponent_low=-fit["slope"] - t * fit["slope_sd"],
                   exponent_high=-fit["slope"] + t * fit["slope_sd"])
    return out


def per_unit_kaplan(losses, b_crit_tokens, units, log_sigma=None) -> list[tuple[float, float]]:
    """(exponent 1/alpha_B, log B*) of Kaplan's law fitted (`fit_kaplan`'s weighted least
    squares) to each unit's own points, for the units whose points lie at two losses or more;
    in the order of the sorted unit names."""
    losses, b_tokens = np.asarray(losses, float), np.asarray(b_crit_tokens, float)
    sigma = None if log_sigma is None else np.asarray(log_sigma, float)
    out = []
    for name in sorted(set(units), key=str):
        pick = np.flatnonzero(np.array([u == name for u in units]))
        if np.ptp(np.log(losses[pick])) < 1e-12:
            continue
        fit = fit_log_linear(np.log(losses[pick]), np.log(b_tokens[pick]),
                             None if sigma is None else sigma[pick])
        out.append((-fit["slope"], fit["intercept"]))
    return out


def bootstrap_kaplan(losses, b_crit_tokens, units, log_sigma=None, resamples: int = 2000,
                     confidence: float = CONFIDENCE, seed: int = 0,
                     unit_name: str = "runs", min_units: int = MIN_BOOTSTRAP_UNITS) -> dict:
    """Interval of Kaplan's exponent and B* from the independent units the points come from:
    a percentile bootstrap over units, or with fewer than `min_units` (MIN_BOOTSTRAP_UNITS) the
    range of the per-unit estimates.

    `units` names the independent source of each point (a run, or a seed): points of one
    unit are drawn together, so several points read off one run count once (`unit_name`
    says what a unit is, for the label). Each of `resamples` draws takes as many units as
    there are, with replacement, and refits (`fit_kaplan`, same weights); draws whose losses
    do not spread are skipped. Returns the central `confidence` interval of the exponent and
    of B* (tokens), the draws used and a label saying what the interval is.

    A percentile bootstrap over few units undercovers: over 3 units (3 Pareto frontiers) it
    covers only 85-91% where it claims 95%, for a resample can repeat one unit only so many
    ways. So with fewer than `min_units` units the interval is instead the range (min, max)
    of Kaplan's law fitted to each unit alone (`per_unit_kaplan`: the units with points at two
    losses or more), labelled as such: a spread, not a percentile interval. With fewer than
    two per-unit estimates there is none, and the label says why. A caller whose units are
    single points (which give no per-unit estimate) may lower `min_units` (to 3 at least); a
    bootstrap over fewer than MIN_BOOTSTRAP_UNITS units then says in its label that it
    undercovers.
    """
    losses, b_tokens = np.asarray(losses, float), np.asarray(b_crit_tokens, float)
    sigma = None if log_sigma is None else np.asarray(log_sigma, float)
    names = sorted(set(units), key=str)
    members = [np.flatnonzero(np.array([u == name for u in units])) for name in names]
    out = {"exponent_low": None, "exponent_high": None, "b_star_tokens_low": None,
           "b_star_tokens_high": None, "resamples": 0, "n_units": len(names),
           "interval": f"{confidence:.0%} percentile bootstrap over {len(names)} {unit_name}"}
    if len(names) < max(3, min_units):
        estimates = per_unit_kaplan(losses, b_tokens, units, sigma)
        few = f"fewer than {max(3, min_units)} independent units: no percentile interval"
        if not estimates:
            out["interval"] = (f"none: no unit of the {len(names)} {unit_name} has points at "
                               f"two losses, so there is no per-unit estimate ({few})")
            return out
        if len(estimates) == 1:
            out["interval"] = (f"none: one per-unit estimate over {len(names)} {unit_name}, "
                               f"and a range needs two ({few})")
            return out
        exponents, log_b_stars = zip(*estimates, strict=True)
        out.update(exponent_low=float(min(exponents)), exponent_high=float(max(exponents)),
                   b_star_tokens_low=exp_or_none(min(log_b_stars)),
                   b_star_tokens_high=exp_or_none(max(log_b_stars)),
                   interval=f"range of {len(estimates)} per-unit estimates over {len(names)} "
                            f"{unit_name} ({few})")
        return out
    exponents, log_b_stars = resampled_lines(losses, b_tokens, sigma, members, resamples,
                                             seed)
    if len(exponents) < resamples // 2:
        out["interval"] = (f"none: fewer than half of {resamples} bootstrap draws over "
                           f"{len(names)} {unit_name} spread in loss")
        return out
    if len(names) < MIN_BOOTSTRAP_UNITS:
        out["interval"] += (f" (fewer than {MIN_BOOTSTRAP_UNITS} units: it covers less than "
                            f"{confidence:.0%})")
    lo, hi = percentile_band(exponents, confidence)
    b_lo, b_hi = percentile_band(log_b_stars, confidence)
    out.update(exponent_low=float(lo), exponent_high=float(hi),
               b_star_tokens_low=exp_or_none(b_lo), b_star_tokens_high=exp_or_none(b_hi),
               resamples=len(exponents))
    return out


def resampled_lines(losses: np.ndarray, b_tokens: np.ndarray, sigma: np.ndarray | None,
                    members: list[np.ndarray], resamples: int, seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(exponents, ln B*) of the weighted line ln B = c - k ln L refitted to `resamples`
    draws of the units (`members`: each unit's point indices) with replacement, all at once:
    a draw's points weigh 1/sigma^2 times how often their unit was drawn, and the line is
    the closed-form weighted least squares (`science.fits.fit_log_linear`'s). Draws whose
    losses do not spread are left out."""
    rng = np.random.default_rng(seed)
    unit_of = np.empty(len(losses), dtype=int)
    for u, idx in enumerate(members):
        unit_of[idx] = u
    drawn = rng.integers(0, len(members), (resamples, len(members)))
    counts = np.zeros((resamples, len(members)))
    np.add.at(counts, (np.repeat(np.arange(resamples), len(members)), drawn.ravel()), 1.0)
    x, y = np.log(losses), np.log(b_tokens)
    w = counts[:, unit_of] * (1.0 if sigma is None else 1.0 / sigma**2)
    sw, sx, sy = w.sum(axis=1), w @ x, w @ y
    sxx, sxy = w @ (x * x), w @ (x * y)
    spread = sw * sxx - sx**2
    # a draw of points at one loss only: its weighted spread in ln L is (numerically) zero
    ok = spread > 1e-12 * np.maximum(sw**2, 1e-300) * max(1.0, float(np.max(x * x)))
    slope = (sw[ok] * sxy[ok] - sx[ok] * sy[ok]) / spread[ok]
    intercept = (sy[ok] - slope * sx[ok]) / sw[ok]
    return -slope, intercept


def pareto_degeneracy(fit: dict, max_interval_factor: float = 100.0) -> str | None:
    """Why a Pareto fit (`fit_pareto`) cannot stand as a B_crit measurement, or None.

    Degenerate: S_min or E_min not positive (the points do not follow S = S_min + E_min / B),
    or a B_crit interval whose high end exceeds its low end by more than
    `max_interval_factor` (the data fix no scale). A fit without an interval (two batch
    sizes) is not called degenerate here; its lack of interval is reported by the caller.
    """
    if fit.get("s_min") is None or fit.get("e_min") is None:
        return "not fitted"
    if fit["s_min"] <= 0 or fit["e_min"] <= 0:
        return (f"S_min = {fit['s_min']:.3g} steps, E_min = {fit['e_min']:.3g} sequences: "
                "not both positive")
    low, high = fit.get("b_crit_low"), fit.get("b_crit_high")
    if fit.get("n_batch_sizes", 0) > 2 and (not low or not high
                                             or high / low > max_interval_factor):
        return (f"B_crit interval [{low:.3g}, {high:.3g}] spans more than a factor "
                f"{max_interval_factor:g}" if low and high else "B_crit interval unbounded")
    return None


def kaplan_prediction_tokens(loss: float, b_star_tokens: float | None,
                             exponent: float | None) -> float | None:
    """B_crit(L) = B* / L^exponent in tokens (L in nats/token), computed in logs; None when
    B* or the exponent is unknown or the value overflows a float (a wild fit on few points)."""
    if b_star_tokens is None or exponent is None or b_star_tokens <= 0 or loss <= 0:
        return None
    return exp_or_none(math.log(b_star_tokens) - exponent * math.log(loss))
