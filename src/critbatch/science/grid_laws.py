"""Laws of a dense (model size, token budget, batch, lr) grid of end-of-schedule losses.

A public grid such as Step Law's trains every (N, D) cell, N non-embedding parameters and D
tokens, at about ten batch sizes B (sequences) times a dozen peak lrs, each run a full
schedule. From it, per cell:

- per batch, the best lr and its loss: the vertex of the parabola in ln lr through the grid
  minimum and its neighbours (`science.fits.refine_best_lr`); a minimum on the lr grid's edge
  only bounds the optimum and is flagged;
- the loss-optimal batch B_opt and its loss L*: the same vertex, in ln B, of the per-batch
  best losses;
- the lr at B_opt (Step Law's definition of the optimal lr): a line in ln B through the
  per-batch optima of the LR_AT_BOPT_NEIGHBOURS grid batches nearest B_opt, read at B_opt.

Across cells, log-linear laws (`fit_law`): ln B_opt, ln lr(B_opt) and, per batch, ln lr*(B)
(`lr_points`) in ln N and ln D. Which of the N and D terms a law keeps is decided by held-out
prediction (`select_terms`), never by default: every subset is fitted with a fold held out
(each size's largest budget; the largest size) and the subset with the smallest held-out
root-mean-square error of the logged quantity (the mean of the held-out budgets' and the
held-out size's, so that both questions weigh the same) wins, each term having to lower it by
TERM_GAIN or more. Laws' intervals are a bootstrap over the
cells (`bootstrap_law`), the resampling unit of the points they are fitted to, beside the OLS
t interval. The loss at B_opt follows Hoffmann et al. 2022's form
L*(N, D) = E + A (N / N_REF)^-alpha + B (D / D_REF)^-beta (`fit_loss_law`).

`GridModel` holds them: the laws set beside Step Law's own (`peers.steplaw`). The answer a user
gets for (N, D) is `science.answer`'s, which reads the measured profiles rather than a vertex
in ln B. numpy/scipy only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from critbatch.science.fits import least_squares, refine_best_lr
from critbatch.science.intervals import CONFIDENCE, percentile_band

N_REF = 1e8  # parameters: the unit of the loss law's size term
D_REF = 1e10  # tokens: the unit of the loss law's budget term
LR_AT_BOPT_NEIGHBOURS = 5  # grid batches nearest B_opt whose lr optima give the lr at B_opt
LR_WINDOW = 4.0  # per-batch lr optima within this factor of their cell's B_opt feed lr*(B)
BOOTSTRAP = 2000  # cell resamples of a law's bootstrap
TERMS = ("N", "D")  # the optional terms of a law in ln N and ln D
# A term is kept only when it lowers the held-out error by this fraction or more: with no
# true term, 7% of planted sweeps keep one (26% at no margin); a planted lr ~ D^0.1 at 5%
# scatter is kept in all (measured over 300 planted lr laws each, 3 sizes x 3 budgets x 4
# batches)
TERM_GAIN = 0.05
REFIT_EVALUATIONS = 40  # a loss law's refit from a known law: at most this many evaluations


class GridTooSmall(ValueError):
    """The grid cannot give a law: too few cells with an interior optimum."""


# ---------------------------------------------------------------------------------------------
# One cell


@dataclass
class BatchOptimum:
    """The best lr of one batch of one cell."""

    batch: float  # sequences
    lr: float
    loss: float  # nats/token, the parabola's vertex (or the grid point on an edge)
    edge: str | None  # None inside the lr grid; "low"/"high"/"single" as refine_best_lr


@dataclass
class CellOptimum:
    """One (N, D) cell: its per-batch optima and its loss-optimal batch."""

    params: float
    tokens: float
    batches: list[BatchOptimum]
    b_opt: float  # sequences
    loss_opt: float  # nats/token
    b_opt_edge: str | None  # the best batch on the batch grid's edge
    lr_opt: float  # the lr at B_opt
    lr_opt_points: int  # interior per-batch optima the lr at B_opt was read from

    def largest_within(self, tolerance: float) -> float:
        """The largest grid batch whose best loss is within `tolerance` of the cell's best."""
        best = min(b.loss for b in self.batches)
        return max(b.batch for b in self.batches if b.loss <= best + tolerance)


def lr_at(batches: list[BatchOptimum], batch: float) -> tuple[float, int]:
    """The best lr at `batch` read from the grid: a line in ln B through the interior lr optima
    among the LR_AT_BOPT_NEIGHBOURS grid batches nearest it (neighbouring batches' optima
    scatter by about a grid step), and the points it used; with fewer than two, the nearest
    batch's optimum."""
    nearest = sorted(batches, key=lambda p: abs(math.log(p.batch / batch)))
    near = [p for p in nearest[:LR_AT_BOPT_NEIGHBOURS] if p.edge is None]
    if len(near) < 2:
        return nearest[0].lr, 0
    slope, icept = np.polyfit(np.log([p.batch for p in near]), np.log([p.lr for p in near]), 1)
    return float(math.exp(icept + slope * math.log(batch))), len(near)


def cell_optimum(params: float, tokens: float, batch, lr, loss) -> CellOptimum | None:
    """The optima of one cell's runs (parallel arrays; non-finite losses, diverged runs, are
    left out); None without two batches of finite loss."""
    batch, lr, loss = (np.asarray(x, float) for x in (batch, lr, loss))
    ok = np.isfinite(loss)
    per = []
    for b in sorted(set(batch[ok].tolist())):
        mine = ok & (batch == b)
        best_lr, best_loss, edge = refine_best_lr(lr[mine].tolist(), loss[mine].tolist())
        per.append(BatchOptimum(b, best_lr, best_loss, edge))
    if len(per) < 2:
        return None
    b_opt, loss_opt, b_edge = refine_best_lr([p.batch for p in per], [p.loss for p in per])
    lr_opt, points = lr_at(per, b_opt)
    return CellOptimum(params, tokens, per, b_opt, loss_opt, b_edge, lr_opt, points)


# ---------------------------------------------------------------------------------------------
# Log-linear laws in ln N and ln D


@dataclass
class Law:
    """ln y = coef . [1, (ln B), (ln N), (ln D)]: the columns in `columns`."""

    name: str
    columns: tuple[str, ...]  # a subset of ("B", "N", "D"), in that order
    coef: np.ndarray
    cov: np.ndarray  # OLS covariance of coef
    dof: int
    residual_sd: float  # of ln y
    boot: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # cell-bootstrap coefs
    held_out: dict = field(default_factory=dict)  # select_terms' scores, when selected

    def row(self, batch: float | None, params: float, tokens: float) -> np.ndarray:
        values = {"B": batch, "N": params, "D": tokens}
        return np.array([1.0, *(math.log(values[c]) for c in self.columns)])

    def predict(self, params: float, tokens: float, batch: float | None = None) -> float:
        return float(math.exp(self.row(batch, params, tokens) @ self.coef))

    def exponent(self, column: str) -> float | None:
        return float(self.coef[1 + self.columns.index(column)]) if column in self.columns \
            else None

    def interval(self, column: str, confidence: float = CONFIDENCE) -> dict | None:
        """An exponent's intervals: the cell bootstrap's percentiles and the OLS t interval."""
        from critbatch.science.distributions import t_quantile

        if column not in self.columns:
            return None
        k = 1 + self.columns.index(column)
        out = {"value": float(self.coef[k]), "confidence": confidence}
        if len(self.boot) >= 10:
            lo, hi = percentile_band(self.boot[:, k], confidence)
            out["bootstrap"] = [float(lo), float(hi)]
        if self.dof > 0:
            half = float(t_quantile(0.5 + confidence / 2, self.dof)) * math.sqrt(self.cov[k, k])
            out["t"] = [float(self.coef[k] - half), float(self.coef[k] + half)]
        return out

    def predict_interval(self, params: float, tokens: float, batch: float | None = None,
                         confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
        """A prediction interval for one new cell's value: the cell bootstrap's predictions of
        the law, each with a draw of the law's residual scatter (a new cell scatters about
        the law as the fitted ones do; Student's t with the fit's dof, the scatter being
        estimated). None without a bootstrap."""
        if len(self.boot) < 10:
            return None, None
        values = self.boot @ self.row(batch, params, tokens)
        if math.isfinite(self.residual_sd):
            draws = np.random.default_rng(0).standard_t(max(self.dof, 1), size=len(values))
            values = values + self.residual_sd * draws
        lo, hi = percentile_band(values, confidence)
        return float(math.exp(lo)), float(math.exp(hi))


def design(columns: tuple[str, ...], batch, params, tokens) -> np.ndarray:
    values = {"B": batch, "N": params, "D": tokens}
    n = len(np.atleast_1d(params))
    return np.column_stack([np.ones(n), *(np.log(np.asarray(values[c], float))
                                          for c in columns)])


def between_variance(x: np.ndarray, y: np.ndarray, var: np.ndarray) -> float:
    """The scatter tau^2 of the points about the law beyond their own variances `var`
    (Paule and Mandel 1982): the tau^2 >= 0 at which the weighted residuals' sum of squares,
    weights 1 / (var + tau^2), equals its degrees of freedom."""
    from scipy.optimize import brentq

    dof = len(y) - x.shape[1]
    if dof <= 0:
        return 0.0

    def excess(tau2: float) -> float:
        w = 1.0 / (var + tau2)
        coef = np.linalg.lstsq(x * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
        return float(w @ (y - x @ coef) ** 2) - dof

    if excess(0.0) <= 0:
        return 0.0
    low, high = 0.0, max(float(np.var(y)), 1e-12)
    while excess(high) > 0:
        low, high = high, high * 4
    # the excess falls as tau^2 grows: Brent's root to 1e-9 of itself (far below any law's
    # own uncertainty) in about ten refits, where halving the bracket took thirty. The
    # absolute tolerance is set by the smallest variance, not the bracket: a root of 1e-10
    # beside variances of 1e-8 and a bracket of 1 would otherwise come back as 0
    smallest = float(var[var > 0].min()) if (var > 0).any() else high
    return float(brentq(excess, low, high, xtol=1e-9 * min(high, smallest), rtol=1e-9))


def weighted_least_squares(x: np.ndarray, y: np.ndarray, var
                           ) -> tuple[np.ndarray, np.ndarray, int, float]:
    """(coef, covariance, dof, scatter sd) of y ~ x: ordinary least squares
    (`fits.least_squares`) without `var`; with it, weights 1 / (var + tau^2), tau^2 the
    scatter between points beyond their variances (`between_variance`), and the scatter sd
    is tau (a new point's deviation from the law, its own measurement error aside)."""
    if var is None:
        return least_squares(x, y)
    var = np.asarray(var, float)
    tau2 = between_variance(x, y, var)
    w = np.sqrt(1.0 / (var + tau2))
    coef, _, dof, _ = least_squares(x * w[:, None], y * w)
    cov = np.full((x.shape[1],) * 2, math.nan)
    if dof > 0:
        normal = (x * (w * w)[:, None]).T @ x
        if np.linalg.matrix_rank(normal) == x.shape[1]:
            cov = np.linalg.inv(normal)
    return coef, cov, dof, math.sqrt(tau2) if dof > 0 else math.nan


def fit_law(name: str, columns: tuple[str, ...], y, params, tokens, batch=None,
            var=None) -> Law:
    """The law of ln y on `columns` by least squares: ordinary, or weighted by each point's
    variance of ln y `var` plus the scatter between points (`weighted_least_squares`)."""
    coef, cov, dof, sd = weighted_least_squares(design(columns, batch, params, tokens),
                                                np.log(np.asarray(y, float)), var)
    return Law(name, columns, coef, cov, dof, sd)


def cell_ids(params, tokens) -> list[str]:
    """One name per (N, D) cell: the unit of a law's bootstrap."""
    return [f"{n:.6g}|{d:.6g}" for n, d in zip(np.atleast_1d(params), np.atleast_1d(tokens),
                                                strict=True)]


def bootstrap_law(law: Law, y, params, tokens, cell, batch=None, resamples: int = BOOTSTRAP,
                  seed: int = 0, var=None) -> Law:
    """`law` with `boot`: refits on the points of `resamples` cell resamples (every point of a
    drawn cell, a cell drawn as often as it is drawn; weighted as `law` was, by `var`); draws
    whose design is singular (too few distinct sizes or budgets drawn) are left out."""
    rng = np.random.default_rng(seed)
    x = design(law.columns, batch, params, tokens)
    y = np.log(np.asarray(y, float))
    weight = (np.ones(len(y)) if var is None else
              1.0 / np.sqrt(np.asarray(var, float) + law.residual_sd ** 2))
    cell = np.asarray(cell)
    ids = np.unique(cell)
    members = [np.flatnonzero(cell == c) for c in ids]
    coefs = []
    for _ in range(resamples):
        pick = np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))])
        w = weight[pick][:, None]
        coef, _, rank, _ = np.linalg.lstsq(x[pick] * w, y[pick] * w[:, 0], rcond=None)
        if rank == x.shape[1]:
            coefs.append(coef)
    law.boot = np.array(coefs).reshape(len(coefs), x.shape[1])
    return law


def held_out_folds(params, tokens) -> list[tuple[str, np.ndarray]]:
    """(name, held-out mask) of each fold: every size's largest budget where the size has two
    budgets or more, and the largest size (all its budgets) where two sizes or more remain."""
    params, tokens = np.asarray(params, float), np.asarray(tokens, float)
    folds = []
    for n in sorted(set(params.tolist())):
        mine = params == n
        if len(set(tokens[mine].tolist())) >= 2:
            folds.append((f"budget {tokens[mine].max():.3g} of {n:.3g}",
                          mine & (tokens == tokens[mine].max())))
    if len(set(params.tolist())) >= 3:
        folds.append((f"size {params.max():.3g}", params == params.max()))
    return folds


def held_out_rms(columns: tuple[str, ...], y, params, tokens, batch=None, var=None) -> dict:
    """Root-mean-square error of ln y on the held-out points of every fold (each fitted on
    the rest, weighted by `var` as `fit_law` weighs): over the held-out budgets, over the
    held-out size, and their mean (each question, a new budget and a new size, weighs the
    same however many points it has)."""
    x = design(columns, batch, params, tokens)
    ly = np.log(np.asarray(y, float))
    # with variances, each fold is weighted with the scatter between points of the whole set
    w = (np.ones(len(ly)) if var is None else
         1.0 / np.sqrt(np.asarray(var, float) + between_variance(x, ly, np.asarray(var, float))))
    errors: dict[str, list[float]] = {"budget": [], "size": []}
    unfit = {"budget": math.inf, "size": math.inf, "mean": math.inf}
    for name, held in held_out_folds(params, tokens):
        if (~held).sum() <= x.shape[1]:
            return unfit
        coef, _, rank, _ = np.linalg.lstsq(x[~held] * w[~held, None], ly[~held] * w[~held],
                                           rcond=None)
        if rank < x.shape[1]:
            return unfit
        errors["size" if name.startswith("size") else "budget"] += (x[held] @ coef
                                                                    - ly[held]).tolist()

    def rms(e):
        return float(math.sqrt(np.mean(np.square(e)))) if e else math.nan

    kinds = [rms(e) for e in errors.values() if e]
    return {"budget": rms(errors["budget"]), "size": rms(errors["size"]),
            "mean": float(np.mean(kinds)) if kinds else math.nan}


def penalised(error: float, terms: int) -> float:
    """A held-out error raised by 1/(1 - TERM_GAIN) per optional term: a law with one more
    term wins only when its error is TERM_GAIN lower."""
    return round(error / (1 - TERM_GAIN) ** terms, 12) if math.isfinite(error) else math.inf


def select_terms(name: str, y, params, tokens, batch=None, always: tuple[str, ...] = (),
                 resamples: int = BOOTSTRAP, seed: int = 0, var=None,
                 min_points: int = 0) -> Law:
    """The law of ln y whose optional terms (ln N, ln D: every subset, beside the `always`
    columns) predict held-out folds best (`held_out_rms`, the mean of the budget and size
    errors), each term having to lower the error by TERM_GAIN (`penalised`); a subset with
    fewer than `min_points` points per coefficient beyond the first is not tried. Weighted by
    `var` where given (`fit_law`). Returns it with its cell bootstrap and every subset's
    scores in `held_out`."""
    scores = {}
    for k in range(len(TERMS) + 1):
        for terms in itertools.combinations(TERMS, k):
            columns = (*always, *terms)
            if len(np.atleast_1d(params)) < 1 + min_points * len(columns):
                continue
            scores[columns] = held_out_rms(columns, y, params, tokens, batch, var)
    best = min(scores, key=lambda c: (penalised(scores[c]["mean"], len(c) - len(always)),
                                      len(c)))
    law = fit_law(name, best, y, params, tokens, batch, var)
    cell = cell_ids(params, tokens)
    law = bootstrap_law(law, y, params, tokens, cell, batch, resamples, seed, var)
    law.held_out = {"+".join(c) or "constant": s for c, s in scores.items()}
    law.held_out["chosen"] = "+".join(best) or "constant"
    return law


# ---------------------------------------------------------------------------------------------
# The loss at B_opt


@dataclass
class LossLaw:
    """L*(N, D) = E + A (N / N_REF)^-alpha + B (D / D_REF)^-beta, nats/token."""

    e: float
    a: float
    alpha: float
    b: float
    beta: float
    residual_sd: float

    def predict(self, params, tokens):
        return (self.e + self.a * (np.asarray(params, float) / N_REF) ** -self.alpha
                + self.b * (np.asarray(tokens, float) / D_REF) ** -self.beta)


def fit_loss_law(params, tokens, loss, start: LossLaw | None = None) -> LossLaw | None:
    """Least squares of L* in `LossLaw`'s form (five parameters: needs six cells), from a few
    starting exponents (or from `start` alone, a refit near a known law); None when too few
    cells or no fit."""
    from scipy.optimize import least_squares

    n, d, y = (np.asarray(x, float) for x in (params, tokens, loss))
    if len(y) < 6:
        return None
    u, v = np.log(n / N_REF), np.log(d / D_REF)

    def resid(theta):
        e, la, alpha, lb, beta = theta
        return e + np.exp(la - alpha * u) + np.exp(lb - beta * v) - y

    def jac(theta):
        _, la, alpha, lb, beta = theta
        size, budget = np.exp(la - alpha * u), np.exp(lb - beta * v)
        return np.column_stack([np.ones_like(u), size, -u * size, budget, -v * budget])

    best = None
    starts = [[0.8 * y.min(), math.log(0.2), alpha0, math.log(0.2), beta0]
              for alpha0, beta0 in itertools.product((0.2, 0.5), (0.2, 0.5))]
    if start is not None:
        starts = [[min(start.e, 0.999 * y.min()), math.log(start.a), start.alpha,
                   math.log(start.b), start.beta]]
    lower, upper = np.array([0, -20, 0.01, -20, 0.01]), np.array([y.min(), 20, 3, 20, 3])
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        # a refit from a known law stops after REFIT_EVALUATIONS: E trades against A and alpha
        # along a flat valley the solver crawls through, while C and beta, what a promise in
        # compute reads, settle within a few steps
        res = least_squares(resid, x0, jac=jac, bounds=(lower, upper),
                            max_nfev=REFIT_EVALUATIONS if start is not None else None)
        if best is None or res.cost < best.cost:
            best = res
    if best is None or not (best.success or (start is not None and best.status == 0)):
        return None
    e, la, alpha, lb, beta = best.x
    sd = math.sqrt(2 * best.cost / max(len(y) - 5, 1))
    return LossLaw(float(e), math.exp(la), float(alpha), math.exp(lb), float(beta), sd)


# ---------------------------------------------------------------------------------------------
# Everything together


def lr_points(cells: list[CellOptimum]) -> dict[str, np.ndarray]:
    """The per-batch lr optima inside their lr grid and within LR_WINDOW of their cell's
    B_opt: the points of the lr law in (B, N, D)."""
    rows = [(p.batch, c.params, c.tokens, p.lr) for c in cells for p in c.batches
            if p.edge is None and abs(math.log(p.batch / c.b_opt)) <= math.log(LR_WINDOW)]
    if len(rows) < 4:
        raise GridTooSmall(f"{len(rows)} interior lr optima near their cell's best batch; the "
                           "lr law needs 4")
    b, n, d, lr = (np.array(x, float) for x in zip(*rows, strict=True))
    return {"batch": b, "params": n, "tokens": d, "lr": lr}


@dataclass
class GridModel:
    """The laws of one grid (see the module docstring)."""

    b_opt: Law  # ln B_opt (sequences) in ln N, ln D
    lr_at_b_opt: Law  # ln lr(B_opt) in ln N, ln D: Step Law's definition
    lr: Law  # ln lr*(B) in ln B and ln N, ln D: the lr at any batch
    loss: LossLaw | None


def fit_grid(cells: list[CellOptimum], resamples: int = BOOTSTRAP, seed: int = 0) -> GridModel:
    """Every law of `cells`, terms chosen by held-out prediction (`select_terms`)."""
    inner = [c for c in cells if c.b_opt_edge is None]
    if len(inner) < 3:
        raise GridTooSmall(f"{len(inner)} of {len(cells)} cells have their best batch inside "
                           "the batch grid; the laws need 3")
    n = np.array([c.params for c in inner])
    d = np.array([c.tokens for c in inner])
    b_opt = select_terms("B_opt", [c.b_opt for c in inner], n, d, resamples=resamples,
                         seed=seed)
    lr_at = select_terms("lr(B_opt)", [c.lr_opt for c in inner], n, d, resamples=resamples,
                         seed=seed)
    pts = lr_points(inner)
    lr = select_terms("lr*(B)", pts["lr"], pts["params"], pts["tokens"], pts["batch"],
                      always=("B",), resamples=resamples, seed=seed)
    loss = fit_loss_law(n, d, [c.loss_opt for c in inner])
    return GridModel(b_opt, lr_at, lr, loss)
