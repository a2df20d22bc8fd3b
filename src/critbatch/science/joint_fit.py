"""Fitting the joint model (`science.joint`) to an optimizer's cells.

The fit is weighted least squares on the losses themselves: a cell's residual is the loss
the model predicts at its (N, B, E) minus the measured one, over sigma. The prediction is
the root in L of ln E_model(L) = ln E, reached by Newton steps started at the measured loss
(three during the fit, where the model is near the data; to convergence with a bisection
fall-back in `JointFit.predict_loss`). Nothing is extrapolated cell by cell: a large batch
at a small budget constrains B_crit at its own loss.

A cell whose best grid lr is on the grid's edge is an upper bound (a better lr lies outside
the grid, so its best-lr loss is at most the measured one): its residual is one-sided, zero
wherever the model predicts a loss at or below the bound (a censored point, as in a Tobit
fit). Fitted as a measurement, such a cell pulls the model up: at cpu scale AdamW's sqrt lr
rule puts batch 128's optimum below its grid at the longer budgets.

`fit_joint` starts from fixed exponents and from a grid (`grid_starts`); a fit that cannot be
made returns NaN parameters and says why (`failed_fit`). numpy/scipy only.
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.science.joint import (
    E_REF,
    FIT_FTOL,
    GAMMA_BOUNDS,
    L_N_FLOOR,
    MAX_NFEV_PER_PARAMETER,
    NEWTON_STEPS_FIT,
    PLAIN,
    POWER_BOUNDS,
    Form,
    JointData,
    JointFit,
    cell_terms,
    log_tokens_gradient,
    log_tokens_model,
)

RESIDUAL_CAP = 1e6  # a residual (seed sigmas) past this, or not finite, counts as this
_LARGEST = float(np.finfo(float).max)


_LAST_NEWTON: list = [None, None]  # newton_loss's last ((data, key), result): see there


def newton_loss(theta: np.ndarray, data: JointData, n_widths: int, per_width: bool,
                form: Form = PLAIN, steps: int = NEWTON_STEPS_FIT) -> np.ndarray:
    """The loss the model predicts at each cell: Newton steps on ln E_model(L) = ln E from
    the measured loss, held above l_inf (and above 0). The last result is remembered: the
    solver asks for the residuals and then their Jacobian at the same parameters, and both
    start from these steps (a third of a refit's time)."""
    # the data object itself is kept with the key (an id alone could be a freed object's)
    key = (theta.tobytes(), n_widths, per_width, form, steps)
    last = _LAST_NEWTON[0]
    if last is not None and last[0] is data and last[1] == key:
        return _LAST_NEWTON[1].copy()
    loss = newton_steps(theta, data, n_widths, per_width, form, steps)
    _LAST_NEWTON[0], _LAST_NEWTON[1] = (data, key), loss
    return loss.copy()


def finite(x: np.ndarray, nan: float, cap: float = _LARGEST) -> np.ndarray:
    """`x` (overwritten) with NaN set to `nan` and clipped to +-`cap`, infinities included:
    `np.clip(np.nan_to_num(x, nan=nan), -cap, cap)` at a fraction of its cost (the fits call
    it hundreds of thousands of times)."""
    x[np.isnan(x)] = nan
    return np.clip(x, -cap, cap, out=x)


def newton_steps(theta: np.ndarray, data: JointData, n_widths: int, per_width: bool,
                 form: Form, steps: int) -> np.ndarray:
    """`newton_loss`'s computation, from the measured losses."""
    target = np.log(data.tokens)
    loss = data.loss.copy()
    floor = np.maximum(theta[:n_widths][data.width], 0.0) + 1e-9
    cells = cell_terms(theta, n_widths, data.width, data.batch, per_width, form)
    with np.errstate(all="ignore"):
        for _ in range(steps):
            log_e, slope = log_tokens_model(theta, n_widths, loss, data.width, data.batch,
                                            per_width, form, cells)
            slope = np.minimum(slope, -1e-6)  # a non-monotone model is pushed back
            step = finite((log_e - target) / slope, 0.0)
            loss = np.maximum(loss - step, floor)
    return loss


def residuals(theta: np.ndarray, data: JointData, n_widths: int, per_width: bool,
              form: Form = PLAIN, steps: int = NEWTON_STEPS_FIT) -> np.ndarray:
    """(predicted loss - measured loss) / sigma for every cell (`newton_loss`). An
    upper-bound cell (`data.upper`) counts only where the model predicts more than its
    bound: a one-sided (censored) residual. Never NaN or inf: a parameter vector far from
    the data (a refit's trial step) gets large finite residuals (RESIDUAL_CAP), so the
    solver steps back instead of failing."""
    loss = newton_loss(theta, data, n_widths, per_width, form, steps)
    with np.errstate(all="ignore"):
        chi = (loss - data.loss) / data.sigma
    chi = np.where(data.upper, np.maximum(chi, 0.0), chi)
    return finite(chi, RESIDUAL_CAP, RESIDUAL_CAP)


def residual_jacobian(theta: np.ndarray, data: JointData, n_widths: int, per_width: bool,
                      form: Form = PLAIN, steps: int = NEWTON_STEPS_FIT) -> np.ndarray:
    """d residuals / d theta (cells x parameters), analytic: the predicted loss L* solves
    ln E_model(L*; theta) = ln E, so dL*/dtheta = -(d ln E/d theta) / (d ln E/dL) (the
    implicit function theorem) at the Newton iterate. Zero where the residual does not move:
    an upper bound the model stays below, a prediction held at its floor. One evaluation
    where finite differences took one per parameter (7 to 60 here)."""
    loss = newton_loss(theta, data, n_widths, per_width, form, steps)
    with np.errstate(all="ignore"):
        _, slope = log_tokens_model(theta, n_widths, loss, data.width, data.batch, per_width,
                                    form)
        grad = log_tokens_gradient(theta, n_widths, loss, data.width, data.batch, per_width,
                                   form)
        jac = -grad / (np.minimum(slope, -1e-6) * data.sigma)[:, None]
    floor = np.maximum(theta[:n_widths][data.width], 0.0) + 1e-9
    still = (loss <= floor) | (data.upper & (loss <= data.loss))
    jac[still] = 0.0
    return finite(jac, 0.0, 1e12)


def initial_guess(data: JointData, per_width: bool, gamma: float,
                  form: Form = PLAIN) -> np.ndarray:
    """Start: l_inf at 80% of each width's lowest loss, a from its highest, alpha 0.5,
    B_crit at the cells' middle loss equal to the geometric mean batch, B_s half the
    smallest batch and p 1."""
    n = len(data.widths)
    l_inf, log_a = np.zeros(n), np.zeros(n)
    for i in range(n):
        mine = data.loss[data.width == i]
        l_inf[i] = 0.8 * mine.min()
        log_a[i] = math.log(max(np.median(mine) - l_inf[i], 1e-3))
    mid_loss = float(np.median(data.loss))
    log_b_star = math.log(float(np.exp(np.mean(np.log(data.batch))))) + gamma * math.log(mid_loss)
    n_law = n if per_width else 1
    return np.concatenate([l_inf, log_a, np.full(n, math.log(0.5)), np.full(n_law, log_b_star),
                           np.full(n_law, gamma), form.tail(0.5 * float(data.batch.min()), 1.0)])


def curve_guess(data: JointData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(l_inf, ln a, ln alpha) per width: each width's example curve L = l_inf + a (E/E_REF)
    ^-alpha fitted to its smallest batch's cells (closest to E_min = E) by
    `science.fits.fit_power_law`, or `initial_guess`'s rough values where that batch has
    fewer than three budgets or the fit fails."""
    n = len(data.widths)
    rough = initial_guess(data, False, 0.0)
    l_inf, log_a, log_alpha = rough[:n].copy(), rough[n:2 * n].copy(), rough[2 * n:3 * n].copy()
    for i in range(n):
        mine = data.width == i
        base = mine & (data.batch == data.batch[mine].min())
        if len(set(data.tokens[base].tolist())) < 3:
            continue
        fitted = baseline_curve(data.tokens[base], data.loss[base])
        if fitted is None or not (fitted[1] > 0 and fitted[2] > 0):
            continue
        l_inf[i] = fitted[0]
        log_alpha[i] = math.log(fitted[2])
        log_a[i] = math.log(fitted[1]) - fitted[2] * math.log(E_REF)
    return l_inf, log_a, log_alpha


_CURVES: dict[bytes, tuple | None] = {}  # baseline_curve's memory, by its cells' bytes


def baseline_curve(tokens: np.ndarray, loss: np.ndarray) -> tuple | None:
    """`science.fits.fit_power_law` (L = l_inf + A E^-alpha) of one baseline's cells,
    remembered: every fit of the same cells (a selection's richer forms, the held-out and
    per-width refits, a coverage study's thousands of worlds) asks for it again."""
    from critbatch.science.fits import fit_power_law

    key = np.concatenate([tokens, loss]).tobytes()
    if key not in _CURVES:
        if len(_CURVES) > 256:
            _CURVES.clear()
        _CURVES[key] = fit_power_law(tokens, loss)
    return _CURVES[key]


GRID_GAMMAS = np.arange(0.0, 13.0)  # the exponents the start grid tries
GRID_STARTS = 2  # grid points (of distinct exponents) `fit_joint` starts from, besides its own


def grid_starts(data: JointData, per_width: bool, form: Form = PLAIN) -> list[np.ndarray]:
    """Starts for `fit_joint` from a grid: each width's curve from its smallest batch
    (`curve_guess`), then 1/alpha_B over GRID_GAMMAS x B_crit at the cells' middle loss from
    1/16 of the smallest batch to 16x the largest, the GRID_STARTS of lowest chi-square with
    distinct exponents. The fixed starts alone can end far from the truth: in a planted
    one-width world (1/alpha_B 4.8) the start at 1 stopped at 0.23 with chi2/dof 3590 and
    those at 4 and 8 where they began, their large batches' Newton steps thrown far out."""
    n = len(data.widths)
    n_law = n if per_width else 1
    curve = np.concatenate(curve_guess(data))
    mid = math.log(float(np.median(data.loss)))
    log_b = np.linspace(math.log(data.batch.min() / 16), math.log(data.batch.max() * 16), 17)
    scored = []
    for gamma in GRID_GAMMAS:
        for lb in log_b:
            theta = np.concatenate([curve, np.full(n_law, lb + gamma * mid),
                                    np.full(n_law, gamma), form.tail(0.0, 1.0)])
            cost = float(np.sum(residuals(theta, data, n, per_width, form) ** 2))
            scored.append((cost, gamma, theta))
    scored.sort(key=lambda s: s[0])
    starts, seen = [], set()
    for _, gamma, theta in scored:
        if gamma not in seen:
            seen.add(gamma)
            starts.append(theta)
        if len(starts) == GRID_STARTS:
            break
    return starts


def fit_joint(data: JointData, per_width: bool = False, start: np.ndarray | None = None,
              gammas=(1.0, 4.0, 8.0), form: Form = PLAIN, ftol: float = FIT_FTOL) -> JointFit:
    """Weighted least squares of the joint model on `data` (see the module docstring).

    Started from `start` (a parameter vector, e.g. the full fit for a bootstrap refit) or
    from `initial_guess` at each of `gammas` and from `grid_starts`, keeping the lowest
    chi-square. l_inf stays
    within [L_N_FLOOR, each width's lowest loss), alpha within [0.02, 5], gamma within
    [-20, 30], B_s (with `form.small_batch`) within [0, `b_small_max`] sequences and p (with
    `form.power`) within POWER_BOUNDS. l_inf may fall below zero: over a
    few doublings of tokens the cpu sweeps' AdamW baseline loses a near-constant 0.39-0.41
    nats/token per doubling, faster than any power law with l_inf >= 0 allows near its end
    (at l_inf = 0 the fit's chi2/dof was 27 against 18 free, today's 1/64-branch sweep), so
    l_inf is a curve parameter, not an irreducible loss.
    """
    from scipy.optimize import least_squares

    n = len(data.widths)
    n_law = n if per_width else 1
    lowest = np.array([data.loss[data.width == i].min() for i in range(n)])
    lower = np.concatenate([np.full(n, L_N_FLOOR), np.full(n, -20.0), np.full(n, math.log(0.02)),
                            np.full(n_law, -50.0), np.full(n_law, GAMMA_BOUNDS[0]),
                            form.tail(0.0, POWER_BOUNDS[0])])
    upper = np.concatenate([lowest - 1e-6, np.full(n, 20.0), np.full(n, math.log(5.0)),
                            np.full(n_law, 80.0), np.full(n_law, GAMMA_BOUNDS[1]),
                            form.tail(b_small_max(data), POWER_BOUNDS[1])])
    why = unfit_reason(data)
    if why:
        return failed_fit(data, per_width, form, why)
    starts = [start] if start is not None else [
        *(initial_guess(data, per_width, g, form) for g in gammas),
        *grid_starts(data, per_width, form)]
    best, failure = None, ""
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        try:
            res = least_squares(residuals, x0, jac=residual_jacobian, bounds=(lower, upper),
                                x_scale="jac", args=(data, n, per_width, form), ftol=ftol,
                                max_nfev=MAX_NFEV_PER_PARAMETER * len(x0))
        except (ValueError, np.linalg.LinAlgError) as err:  # a solver's numerical failure
            failure = f"the solver failed: {err}"
            continue
        if best is None or (np.isfinite(res.cost) and res.cost < best.cost):
            best = res
    if best is None:
        return failed_fit(data, per_width, form, failure)
    theta = best.x
    chi = residuals(theta, data, n, per_width, form, steps=8)
    b_small, power = form.terms(theta)
    return JointFit(
        l_inf=theta[:n].copy(), a=np.exp(theta[n:2 * n]), alpha=np.exp(theta[2 * n:3 * n]),
        b_star=np.exp(theta[3 * n:3 * n + n_law]),
        gamma=theta[3 * n + n_law:3 * n + 2 * n_law].copy(),
        chi2=float(np.sum(chi**2)), dof=len(data) - len(theta), n_cells=len(data),
        success=bool(best.success), widths=data.widths, message=str(best.message),
        residuals=chi, b_small=float(b_small), power=float(power), form=form)


def unfit_reason(data: JointData) -> str | None:
    """Why the model cannot be fitted to `data` at all (None where it can): a loss, sigma,
    batch or token count that is not a positive finite number (positive losses also leave
    l_inf room between L_N_FLOOR and each width's lowest loss)."""
    for name, values in (("loss", data.loss), ("sigma", data.sigma), ("batch", data.batch),
                         ("tokens", data.tokens)):
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            return f"{int(bad.sum())} cell(s) with a {name} that is not a positive number"
    return None


def failed_fit(data: JointData, per_width: bool, form: Form, why: str) -> JointFit:
    """A fit that could not be made: NaN parameters, `success` False and `message` why."""
    n = len(data.widths)
    n_law = n if per_width else 1
    nan = np.full(n, np.nan)
    return JointFit(nan, nan.copy(), nan.copy(), np.full(n_law, np.nan), np.full(n_law, np.nan),
                    chi2=math.nan, dof=len(data) - (3 * n + 2 * n_law + form.extra),
                    n_cells=len(data), success=False, widths=data.widths, message=why,
                    residuals=np.full(len(data), np.nan), form=form,
                    power=1.0, b_small=0.0)


def b_small_max(data: JointData) -> float:
    """The small-batch term's largest scale B_s, in sequences: the geometric middle of the
    batches measured. Above it the term no longer describes the small batches: it and
    B/B_crit trade places (the cpu sweep's Muon cells fit B_s 182 sequences, past every batch,
    with 1/alpha_B on its bound of 20)."""
    return float(np.sqrt(data.batch.min() * data.batch.max()))
