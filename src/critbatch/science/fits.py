"""Curve fits: the best lr of a grid, loss versus tokens (power law and monotone inverse),
log-linear least squares, the lr-scaling power law and the seed noise against tokens.
numpy/scipy only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from warnings import catch_warnings, simplefilter

import numpy as np

from critbatch.science.intervals import CONFIDENCE

LOG_LINEAR_END_POINTS = 3  # points nearest an end that set the log-linear extrapolation's slope


def refine_best_lr(lrs: list[float], losses: list[float]) -> tuple[float, float, str | None]:
    """The best learning rate of a grid, refined by a parabola in log(lr).

    Takes the grid minimum and fits the parabola through it and its two neighbours in
    x = log(lr) (exact through three points, any spacing); its vertex is the refined optimum
    (lr*, L*). Assumes the loss is smooth in log(lr) near the optimum. Returns
    (lr*, L*, edge): `edge` is None, or "low"/"high" when the minimum is the first/last grid
    point, in which case (lr*, L*) is that grid point: the true optimum lies outside the
    grid. A single-point grid returns it with edge "single".

    The vertex may lie below the grid minimum by at most the larger rise to a neighbour: on
    an evenly spaced grid it lies at most 1/8 of that below, and with one side 2x wider than
    the other at most 1/3; past the cap the parabola extrapolates into a gap the grid never
    measured (two nearly equal lrs, 1e-3 and 1.0001e-3, once put L* at -247 nats/token).
    """
    order = np.argsort(lrs)
    grid = np.asarray(lrs, dtype=float)[order]
    x = np.log(grid)
    y = np.asarray(losses, dtype=float)[order]
    i = int(np.argmin(y))
    if len(x) == 1:
        return float(grid[0]), float(y[0]), "single"
    if i == 0 or i == len(x) - 1:
        return float(grid[i]), float(y[i]), "low" if i == 0 else "high"
    (x0, x1, x2), (y0, y1, y2) = x[i - 1 : i + 2], y[i - 1 : i + 2]
    # Newton divided differences: y = y1 + d1 (x - x1) + c (x - x0)(x - x1) ... written at x1.
    s01, s12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c = (s12 - s01) / (x2 - x0)
    if c <= 0:  # flat: no curvature to refine with
        return float(grid[i]), float(y1), None
    slope_at_x1 = s01 + c * (x1 - x0)
    x_star = x1 - slope_at_x1 / (2 * c)
    y_star = max(y1 - slope_at_x1**2 / (4 * c), y1 - (max(y0, y2) - y1))
    return float(np.exp(x_star)), float(y_star), None


def fit_power_law(tokens: np.ndarray, losses: np.ndarray) -> tuple[float, float, float] | None:
    """Least-squares fit of L(E) = L_inf + A * E^-alpha (E in tokens, L in nats/token).

    The saturating power law of Kaplan et al. 2020 (their L(D)); unweighted least squares in
    L with L_inf in [0, min L), A > 0, 0 < alpha <= 5, tokens scaled by their maximum for
    conditioning. Needs three points or more; returns (L_inf, A, alpha) or None when the fit
    fails or has too few points.
    """
    from scipy.optimize import OptimizeWarning, curve_fit

    if len(tokens) < 3:
        return None
    scale = float(np.max(tokens))
    u = np.asarray(tokens, dtype=float) / scale
    y = np.asarray(losses, dtype=float)
    lo = float(np.min(y))

    def model(u, l_inf, a, alpha):
        return l_inf + a * u ** (-alpha)

    p0 = (0.8 * lo, max(1e-6, float(np.max(y)) - 0.8 * lo) / 2, 0.5)
    try:
        with catch_warnings():  # 3 points, 3 parameters: no covariance, by design
            simplefilter("ignore", OptimizeWarning)
            (l_inf, a, alpha), _ = curve_fit(model, u, y, p0=p0, maxfev=20000, bounds=(
                [0.0, 0.0, 1e-3], [lo * (1 - 1e-9), np.inf, 5]))
    except (RuntimeError, ValueError):
        return None
    return float(l_inf), float(a * scale**alpha), float(alpha)


class LossCurve:
    """Final loss versus tokens of one batch size (loss decreasing in tokens), and its inverse.

    Inside the measured range: PCHIP (monotone piecewise-cubic Hermite, Fritsch-Carlson) in
    log tokens, which never invents a minimum between points. Outside: the saturating power
    law L = L_inf + A E^-alpha fitted to all points (`fit_power_law`), re-anchored so that it
    passes through the end point it continues (L_inf and alpha from the fit, amplitude from
    the end point), and every value found there is flagged as extrapolated. Points whose loss
    is not below every smaller budget's are dropped (a monotone inverse needs a decreasing
    curve) and listed in `dropped`.

    A second form for the same extrapolation, to say how much it depends on the form
    (`tokens_for_log_linear`): L = a + b ln E, whose slope b is fitted to the
    LOG_LINEAR_END_POINTS points nearest the end it continues and which passes through that
    end point. It is straight in ln E, so on a curve that bends up in ln E (convex, as the
    power law is) it lies below the power law beyond either end and credits a loss there with
    fewer tokens.
    """

    def __init__(self, tokens, losses, extrapolate: bool = True):
        from scipy.interpolate import PchipInterpolator

        order = np.argsort(tokens)
        e, y = np.asarray(tokens, float)[order], np.asarray(losses, float)[order]
        keep = [0]
        for i in range(1, len(e)):
            if y[i] < y[keep[-1]] and e[i] > e[keep[-1]]:
                keep.append(i)
        self.dropped = [float(e[i]) for i in range(len(e)) if i not in keep]
        self.tokens, self.losses = e[keep], y[keep]
        self.x = np.log(self.tokens)
        self.pchip = PchipInterpolator(self.x, self.losses) if len(keep) >= 2 else None
        self.power_law = fit_power_law(self.tokens, self.losses) if extrapolate else None

    @property
    def loss_range(self) -> tuple[float, float]:
        return float(self.losses[-1]), float(self.losses[0])

    def loss_at(self, tokens: float) -> tuple[float, bool]:
        """(L(E) in nats/token, extrapolated?)."""
        x = math.log(tokens)
        if self.pchip is not None and self.x[0] <= x <= self.x[-1]:
            return float(self.pchip(x)), False
        if self.power_law is None:
            return float("nan"), True
        l_inf, _, alpha = self.power_law
        end = 0 if x < self.x[0] else -1
        return l_inf + (self.losses[end] - l_inf) * (tokens / self.tokens[end]) ** -alpha, True

    def log_linear_slope(self, end: int) -> float | None:
        """b (nats/token per e-fold of tokens) of L = a + b ln E, least squares over the
        LOG_LINEAR_END_POINTS points nearest `end` (0: the smallest budget, -1: the largest);
        None with fewer than two points or a slope that is not negative."""
        n = min(LOG_LINEAR_END_POINTS, len(self.x))
        if n < 2:
            return None
        pick = slice(0, n) if end == 0 else slice(len(self.x) - n, None)
        slope = float(np.polyfit(self.x[pick], self.losses[pick], 1)[0])
        return slope if slope < 0 else None

    def tokens_for_log_linear(self, loss: float) -> tuple[float, bool]:
        """(E such that L(E) = loss, extrapolated?) like `tokens_for`, but outside the measured
        range along L = L_end + b ln(E / E_end) (`log_linear_slope` of that end): E = E_end
        exp((loss - L_end) / b). Inside the range both forms are the same PCHIP inverse."""
        lo, hi = self.loss_range
        if self.pchip is not None and lo <= loss <= hi:
            return self.tokens_for(loss)
        end = -1 if loss < lo else 0
        slope = self.log_linear_slope(end)
        if slope is None:
            return float("nan"), True
        return float(self.tokens[end] * math.exp((loss - self.losses[end]) / slope)), True

    def tokens_for(self, loss: float) -> tuple[float, bool]:
        """(E such that L(E) = loss, in tokens; extrapolated?). inf beyond the asymptote."""
        from scipy.optimize import brentq

        lo, hi = self.loss_range
        if self.pchip is not None and lo <= loss <= hi:
            j = int(np.searchsorted(-self.losses, -loss))  # first point with loss <= target
            j = min(max(j, 1), len(self.x) - 1)
            a, b = self.x[j - 1], self.x[j]
            fa, fb = float(self.pchip(a)) - loss, float(self.pchip(b)) - loss
            if fa * fb >= 0:  # the target sits on a node (up to rounding)
                return float(np.exp(a if abs(fa) <= abs(fb) else b)), False
            return float(np.exp(brentq(lambda x: float(self.pchip(x)) - loss, a, b))), False
        if self.power_law is None:
            return float("nan"), True
        l_inf, _, alpha = self.power_law
        if loss <= l_inf:
            return float("inf"), True
        end = -1 if loss < lo else 0
        ratio = (loss - l_inf) / (self.losses[end] - l_inf)
        return float(self.tokens[end] * ratio ** (-1 / alpha)), True


def least_squares(design: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int,
                                                                float]:
    """(coef, covariance, dof, residual sd) of ordinary least squares y ~ design.

    The covariance comes from the SVD of the design itself (inverting design' design squares
    its condition number; on a numerically singular design pinv gave sds of 1e-15): NaN where
    the design is singular or there is no dof, as the residual sd is without dof."""
    design, y = np.asarray(design, float), np.asarray(y, float)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    dof = len(y) - design.shape[1]
    cov = np.full((design.shape[1],) * 2, math.nan)
    if dof <= 0:
        return coef, cov, dof, math.nan
    resid = y - design @ coef
    s2 = float(resid @ resid) / dof
    _, singular, vt = np.linalg.svd(design, full_matrices=False)
    if singular[-1] > 1e-12 * singular[0]:
        cov = s2 * (vt.T / singular**2) @ vt
    return coef, cov, dof, math.sqrt(s2)


def fit_log_linear(x, y, sigma=None) -> dict | None:
    """Least squares y = c + k x with 95% Student-t intervals (None with < 2 points).

    `sigma`: each point's standard deviation in y (relative weights 1/sigma^2; the covariance
    is scaled by the weighted residuals, as scipy's curve_fit does with absolute_sigma=False);
    None weighs every point equally. Intervals are None with exactly two points (exact fit)
    and where the weighted design is numerically singular (`least_squares`).
    """
    from critbatch.science.distributions import t_quantile

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 2 or np.ptp(x) < 1e-12:
        return None
    w = np.ones(n) if sigma is None else 1.0 / np.asarray(sigma, float)  # sqrt of the weights
    a = np.stack([np.ones_like(x), x], axis=1)
    (c, k), cov, _, sd = least_squares(a * w[:, None], y * w)
    out = {"intercept": float(c), "slope": float(k), "n": n, "intercept_sd": None,
           "slope_sd": None, "t": None, "residual_sd": None}
    if n > 2 and np.isfinite(cov).all():
        out.update(intercept_sd=math.sqrt(cov[0, 0]), slope_sd=math.sqrt(cov[1, 1]),
                   t=float(t_quantile(0.5 + CONFIDENCE / 2, n - 2)), residual_sd=sd)
    return out


def nominal_budgets(tokens, rel_tol: float = 0.01) -> dict[int, int]:
    """Map each token count to its nominal budget: counts within `rel_tol` of the smallest
    count of their cluster are one budget, named by that cluster's largest count.

    Runs of one planned budget see slightly different token counts at different batch sizes
    (whole steps of B x seq_len tokens: 1,499,648 at batch 8 but 1,499,136 at 32), so cells
    must not be keyed by exact tokens.
    """
    values = sorted({int(t) for t in tokens})
    clusters: list[list[int]] = []
    for t in values:
        if clusters and t <= clusters[-1][0] * (1 + rel_tol):
            clusters[-1].append(t)
        else:
            clusters.append([t])
    return {t: cluster[-1] for cluster in clusters for t in cluster}


def fit_lr_scaling(batch_sizes, lrs) -> dict | None:
    """Best lr versus batch size as a power law, lr* = c B^k (science.md, section 5).

    Least squares of log lr* on log B over the batch sizes below the largest (above B_crit
    the optimum stops growing, so the largest is left out when there are three or more).
    Adam is expected between k = 0.5 and 1, SGD near 1. None with fewer than two points.
    """
    order = np.argsort(batch_sizes)
    b, lr = np.asarray(batch_sizes, float)[order], np.asarray(lrs, float)[order]
    if len(b) >= 3:
        b, lr = b[:-1], lr[:-1]
    fit = fit_log_linear(np.log(b), np.log(lr))
    if fit is None:
        return None
    out = {"exponent": fit["slope"], "exponent_low": None, "exponent_high": None,
           "n_points": fit["n"], "batch_sizes": b.tolist(), "lrs": lr.tolist(),
           "lr_at_1": math.exp(fit["intercept"])}
    if fit["t"] is not None:
        out.update(exponent_low=fit["slope"] - fit["t"] * fit["slope_sd"],
                   exponent_high=fit["slope"] + fit["t"] * fit["slope_sd"])
    return out


# a trend in the seed noise is kept when its likelihood ratio gives p below this. A chance slope
# makes one end's sigma several times too small and its cells dominate the joint fit: at 0.05
# one in 20 planted own-form worlds of four widths kept one at p 0.006 (chi2/dof 12.2, 1.2
# without it). Budgets that share a run's noise (cooldown branches) make the test more
# conservative, not less: their variances move together, level more than slope
NOISE_TREND_P = 0.01


@dataclass(frozen=True)
class NoiseTrend:
    """One run's loss sd (nats/token) against its tokens: sd(E) = sd_ref (E / ref_tokens)^slope
    inside the measured budgets, the end value outside them; `slope` 0 is one pooled sd."""

    sd_ref: float
    slope: float
    ref_tokens: float
    low_tokens: float
    high_tokens: float
    dof: int
    p_value: float | None  # the likelihood-ratio test of slope 0; None: not testable
    budgets: int = 1  # distinct budgets among its samples (`nominal_budgets`)

    def sd(self, tokens) -> np.ndarray:
        e = np.clip(np.asarray(tokens, dtype=float), self.low_tokens, self.high_tokens)
        return self.sd_ref * (e / self.ref_tokens) ** self.slope

    def effective_dof(self, shared: float) -> float:
        """The degrees of freedom of sd_ref as an estimate, where a run's `budgets` cooldown
        branches share `shared` of its loss variance: the budgets' sample variances then
        correlate by shared^2, so k of them count as k / (1 + (k - 1) shared^2) (2.5 of 5 at
        0.5), less one for a fitted slope; at least 1."""
        k = max(1, self.budgets)
        return max(1.0, self.dof / (1 + (k - 1) * shared**2) - (self.slope != 0))

    def as_dict(self) -> dict:
        return {"sd_ref": self.sd_ref, "slope": self.slope, "ref_tokens": self.ref_tokens,
                "low_tokens": self.low_tokens, "high_tokens": self.high_tokens,
                "dof": self.dof, "p_value": self.p_value}


def usable_samples(tokens, variances, dofs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (tokens, variances, dofs) samples a noise trend can use: a positive, finite
    variance with a positive dof at positive tokens."""
    e, v, n = (np.asarray(x, dtype=float) for x in (tokens, variances, dofs))
    ok = (n > 0) & np.isfinite(v) & (v > 0) & (e > 0)
    return e[ok], v[ok], n[ok]


def fit_noise_trend(tokens, variances, dofs, p_keep: float = NOISE_TREND_P) -> NoiseTrend:
    """The seed noise as a power of the tokens, from per-budget sample variances.

    `variances[j]` is a sample variance of one run's loss at `tokens[j]` with `dofs[j]`
    degrees of freedom (seeds - 1), so v_j dof_j / sd(E_j)^2 is chi-square with dof_j. The
    slope is the maximum-likelihood one; it is kept only where the likelihood ratio against
    a single pooled sd (slope 0, one degree of freedom) gives p < `p_keep`, else the pooled
    sd stands. ref_tokens is the dof-weighted geometric mean of the budgets."""
    from scipy.optimize import minimize

    from critbatch.science.distributions import chi2_sf

    e, v, n = usable_samples(tokens, variances, dofs)
    if not len(e):
        raise ValueError("fit_noise_trend needs a budget with a positive variance and dof")
    ref = float(np.exp(np.sum(n * np.log(e)) / n.sum()))
    pooled = float(np.sum(n * v) / n.sum())
    flat = NoiseTrend(math.sqrt(pooled), 0.0, ref, float(e.min()), float(e.max()),
                      int(n.sum()), None, len(set(nominal_budgets(e).values())))
    x = np.log(e / ref)
    if np.ptp(x) == 0 or n.sum() < 3:
        return flat

    def nll(theta):  # -2 log L up to a constant: sum n (log s2 + v / s2)
        log_s2 = theta[0] + 2 * theta[1] * x
        return float(np.sum(n * (log_s2 + v * np.exp(-log_s2))))

    best = minimize(nll, [math.log(pooled), 0.0], method="Nelder-Mead",
                    options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
    p = float(chi2_sf(max(nll([math.log(pooled), 0.0]) - best.fun, 0.0), 1))
    if p >= p_keep:
        return NoiseTrend(**{**flat.__dict__, "p_value": p})
    return NoiseTrend(float(math.exp(best.x[0] / 2)), float(best.x[1]), ref, float(e.min()),
                      float(e.max()), int(n.sum()), p, flat.budgets)


def noise_log_likelihood(trend: NoiseTrend, tokens, variances, dofs) -> float:
    """-2 log-likelihood (up to a constant) of per-budget sample variances under `trend`:
    sum dof (log sd(E)^2 + v / sd(E)^2), over the samples `fit_noise_trend` would use."""
    e, v, n = usable_samples(tokens, variances, dofs)
    s2 = trend.sd(e) ** 2
    return float(np.sum(n * (np.log(s2) + v / s2)))


@dataclass(frozen=True)
class NoiseSplit:
    """The seed noise pooled over some keys (batch sizes, say) and, where the keys' own trends
    fit the samples better than the pooled one by a likelihood ratio at p < p_keep, per key
    (`by_key`; empty when the pooled trend stands or there is one key)."""

    pooled: NoiseTrend
    by_key: dict
    p_value: float | None  # the test of one pooled trend; None: one key, nothing to test

    def sd(self, key, tokens) -> np.ndarray:
        return self.trend(key).sd(tokens)

    def trend(self, key) -> NoiseTrend:
        """The trend a key's noise comes from: its own where the keys differ, else pooled."""
        return self.by_key.get(key) or self.pooled


def fit_noise_split(samples: dict, p_keep: float = NOISE_TREND_P) -> NoiseSplit:
    """`fit_noise_trend` pooled over `samples` ({key: (tokens, variances, dofs)}) and per key,
    and the likelihood-ratio test between them (degrees of freedom: the per-key trends'
    parameters, a slope counting where kept, minus the pooled trend's)."""
    from critbatch.science.distributions import chi2_sf

    samples = {k: s for k, s in samples.items() if len(usable_samples(*s)[0])}
    if not samples:
        raise ValueError("fit_noise_split needs a key with a positive variance and dof")
    columns = [np.concatenate([np.asarray(s[i], dtype=float) for s in samples.values()])
               for i in range(3)]
    pooled = fit_noise_trend(*columns, p_keep=p_keep)
    if len(samples) < 2:
        return NoiseSplit(pooled, {}, None)
    # each key's own slope is one test of many: Bonferroni over the keys
    own = {k: fit_noise_trend(*s, p_keep=p_keep / len(samples)) for k, s in samples.items()}

    def n_params(t: NoiseTrend) -> int:
        return 1 + (t.slope != 0)

    gain = noise_log_likelihood(pooled, *columns) - sum(
        noise_log_likelihood(own[k], *s) for k, s in samples.items())
    df = sum(n_params(t) for t in own.values()) - n_params(pooled)
    p = float(chi2_sf(max(gain, 0.0), df)) if df > 0 else 1.0
    return NoiseSplit(pooled, own if p < p_keep else {}, p)


# A trunk's shared share of the seed noise (`trunk_sharing`): estimated only from this many
# seed degrees of freedom up, else the joint model assumes SHARED_FRACTION (science.joint);
# never above MAX_SHARING (a fully shared noise would leave a trunk one measurement)
MIN_SHARING_DOF = 6
MAX_SHARING = 0.95


@dataclass(frozen=True)
class Sharing:
    """How much of one run's loss noise its cooldown branches share: the correlation of a
    seed's loss deviations between two budgets of one trunk, averaged over the budget pairs."""

    fraction: float  # in [0, MAX_SHARING]
    dof: int  # seed degrees of freedom pooled (seeds - 1, summed over the seeded trunks)
    trunks: int  # (batch, lr) trunks trained at several seeds
    pairs: int  # budget pairs averaged

    def as_dict(self) -> dict:
        return {"fraction": self.fraction, "dof": self.dof, "trunks": self.trunks,
                "pairs": self.pairs}


def trunk_sharing(blocks: list[tuple[tuple, np.ndarray]]) -> Sharing | None:
    """The shared fraction of the seed noise along a trunk (a run and its cooldown branches),
    from trunks trained at several seeds: `blocks` holds per (batch, lr) its budgets and a
    seeds x budgets array of final losses (nats/token), one row per seed (the run and its
    branches). Each block's deviations from its seeds' mean are scaled by the block's own
    unshared sd, so an unstable lr's large scatter does not outweigh the rest; then per
    budget pair (budgets named by their share of the block's largest) the pooled correlation,
    and their mean. With the noise
    z = sqrt(s) u_trunk + sqrt(1 - s) e_cell (`science.joint.draw_losses`) every pair's
    correlation is s. None below
    MIN_SHARING_DOF degrees of freedom or without a budget pair."""
    products: dict[tuple, float] = {}
    squares: dict[tuple, list[float]] = {}
    dof = trunks = 0
    for budgets, losses in blocks:
        m = np.asarray(losses, dtype=float)
        if m.ndim != 2 or m.shape[0] < 2 or m.shape[1] < 2 or not np.isfinite(m).all():
            continue
        d = m - m.mean(axis=0)
        # the block's scale from what its trunks do not share (each seed's deviations about
        # their own mean over the budgets): a scale from all of it would shrink the blocks
        # whose seeds drew a large shared part, and with it the estimate (to 0.38 for 0.5);
        # where they share all of it, the whole sd
        within = d - d.mean(axis=1, keepdims=True)
        scale = (math.sqrt(float(np.sum(within**2)) / ((m.shape[0] - 1) * (m.shape[1] - 1)))
                 or math.sqrt(float(np.sum(d**2)) / ((m.shape[0] - 1) * m.shape[1])))
        if scale == 0:
            continue
        d /= scale
        dof, trunks = dof + m.shape[0] - 1, trunks + 1
        # a budget is named by its share of the block's largest: one batch's 1/8 of the
        # budget is another's (their tokens differ by the step's rounding)
        share = [round(b / max(budgets), 2) for b in budgets]
        for i in range(len(budgets)):
            for j in range(i + 1, len(budgets)):
                key = (share[i], share[j])
                products[key] = products.get(key, 0.0) + float(d[:, i] @ d[:, j])
                sq = squares.setdefault(key, [0.0, 0.0])
                sq[0] += float(d[:, i] @ d[:, i])
                sq[1] += float(d[:, j] @ d[:, j])
    r = [products[k] / math.sqrt(a * b) for k, (a, b) in squares.items() if a > 0 and b > 0]
    if dof < MIN_SHARING_DOF or not r:
        return None
    return Sharing(fraction=float(np.clip(np.mean(r), 0.0, MAX_SHARING)), dof=dof,
                   trunks=trunks, pairs=len(r))


def binomial_interval(hits: int, n: int, confidence: float = CONFIDENCE) -> list[float] | None:
    """The Clopper-Pearson interval of a rate of `hits` in `n` trials (None without trials):
    the coverage studies' error bar on an empirical coverage."""
    from critbatch.science.distributions import beta_quantile

    if n == 0:
        return None
    tail = (1 - confidence) / 2
    low = 0.0 if hits == 0 else float(beta_quantile(tail, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta_quantile(1 - tail, hits + 1, n - hits))
    return [low, high]
