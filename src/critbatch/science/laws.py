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

import numpy as np

from critbatch.science.fits import CONFIDENCE, fit_log_linear

KAPLAN_B_STAR_TOKENS = 2e8  # Kaplan et al. 2020, GPT-2 tokenizer on WebText2
KAPLAN_EXPONENT = 4.8  # 1/alpha_B, alpha_B ~ 0.21


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
    fit is exact and the intervals are None). Assumes the model holds at this loss.
    """
    from scipy.optimize import curve_fit
    from scipy.stats import t as student_t

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
        (s_min, e_min), cov = curve_fit(lambda x, s0, e0: s0 + e0 * x, x, s,
                                        p0=(s_min, e_min), sigma=s, absolute_sigma=False)
    out.update(s_min=float(s_min), e_min=float(e_min))
    if s_min <= 0 or e_min <= 0:
        return out
    out["b_crit"] = float(e_min / s_min)
    if n > 2 and np.all(np.isfinite(cov)):
        tq = float(student_t.ppf(0.5 + CONFIDENCE / 2, n - 2))
        sd_s, sd_e = math.sqrt(max(cov[0, 0], 0)), math.sqrt(max(cov[1, 1], 0))
        var_log = cov[1, 1] / e_min**2 + cov[0, 0] / s_min**2 - 2 * cov[0, 1] / (e_min * s_min)
        sd_log = math.sqrt(max(var_log, 0.0))
        out.update(b_crit_low=out["b_crit"] * math.exp(-tq * sd_log),
                   b_crit_high=out["b_crit"] * math.exp(tq * sd_log),
                   s_min_low=s_min - tq * sd_s, s_min_high=s_min + tq * sd_s,
                   e_min_low=e_min - tq * sd_e, e_min_high=e_min + tq * sd_e)
    return out


def exp_or_none(x: float) -> float | None:
    """exp(x), or None where it overflows a float (an interval too wide to state)."""
    return math.exp(x) if x < 700 else None


def fit_kaplan(losses, b_crit_tokens) -> dict:
    """Fit Kaplan et al. 2020's B_crit(L) = B* / L^(1/alpha_B) (their eq. 5.3).

    Ordinary least squares of log B_crit = log B* - (1/alpha_B) log L, L in nats/token,
    B_crit in tokens, every point weighted equally (each estimate's own uncertainty is not
    used: the scatter between methods dominates). Returns B* (tokens) and the exponent
    1/alpha_B with 95% intervals (None with fewer than three points), next to Kaplan's
    2e8 tokens and 4.8; the constants depend on corpus and tokenizer, the exponent less so.
    """
    out = {"b_star_tokens": None, "b_star_tokens_low": None, "b_star_tokens_high": None,
           "exponent": None, "exponent_low": None, "exponent_high": None,
           "n_points": len(losses), "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS,
           "kaplan_exponent": KAPLAN_EXPONENT}
    fit = fit_log_linear(np.log(losses), np.log(b_crit_tokens)) if len(losses) else None
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


def kaplan_prediction_tokens(loss: float, b_star_tokens: float, exponent: float) -> float:
    """B_crit(L) = B* / L^exponent in tokens (L in nats/token)."""
    return b_star_tokens / loss**exponent
