"""The answer for a run from a grid of end-of-run losses: batch and lr, and what they cost.

A grid is cells (N non-embedding parameters, D tokens), each trained at several batches B
(sequences) x lrs, every run a full schedule ending in one loss (nats/token). A user asks
"which batch and lr for (N, D)?" and can want two batches (docs/science.md, "The answer and
its promise"):

- the loss-optimal batch B_opt, where the loss at D tokens is lowest;
- the fastest batch within a promise: the largest batch whose loss at D tokens is what
  B_opt reaches with D / (1 + eps) tokens, eps the compute overhead the user accepts. Along
  B_opt the loss follows L*(N, D) = E + A (N/N_REF)^-alpha + C (D/D_REF)^-beta
  (`grid_laws.fit_loss_law`), so the loss given up is
  dL = L*(N, D / (1 + eps)) - L*(N, D) = C (D/D_REF)^-beta ((1 + eps)^beta - 1): the same eps
  is fewer nats where the loss curve is flatter. A promise can also be given in nats.

Per cell the profile (each batch's best loss over its lrs) is read as measured, never
through a parabola in ln B: the batches within dL of the cell's best form a window in ln B
(`GridCell.window`, linear between grid batches). Its top is the cell's fastest batch within
the promise; the centre of the OPTIMUM_WINDOW window is its loss-optimal batch (in a flat
valley a vertex through three noisy points scatters by about 0.3 e-folds between cells of
Step Law's grid, the window's centre by 0.09). Across cells each is a log-linear law in
ln N and ln D whose terms are chosen by held-out prediction (`grid_laws.select_terms`).

The lr: per batch, the optimum is the vertex of a weighted quadratic in ln lr over all finite
lrs (`lr_valley`; its variance from the fit), a diverged run bounding it from above only;
across cells ln lr* is linear in ln B (and ln N, ln D where the held-out test keeps them),
weighted by each optimum's variance plus the scatter between cells (`grid_laws.fit_law`).

Intervals (`bootstrap_answer`): the cells are resampled, every law refitted and its terms
chosen again, the choice redone at the target, and a new cell's scatter about each law drawn
(a prediction interval: a user's run is one new cell). The promise is one-sided (a batch above
the true top costs more than one as far below saves), so the answer is the batch whose
overhead, averaged over those draws, is the promise (`keep_promise`), a little below the
draws' median; and the promise covers the whole answer, the lr's expected miss included: the
valleys' curvature times the variance of ln lr* over the draws is taken from the batch's share
(`room_for_lr`). `score` reads what an answer costs on
a cell it never saw: the loss at its (batch, lr) off the cell's own grid, above the cell's
best. numpy/scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from critbatch.science.grid_laws import (
    D_REF,
    GridTooSmall,
    Law,
    LossLaw,
    fit_law,
    fit_loss_law,
    select_terms,
)
from critbatch.science.intervals import percentile_interval

DEFAULT_OVERHEAD = 0.1  # compute the fastest batch may cost beyond the loss-optimal one
# The loss-optimal batch is the centre (in ln B) of the batches within this much compute of
# the cell's best: wide enough to stand above grid noise (0.001-0.003 nats/token at 1B)
OPTIMUM_WINDOW = 0.1
# The lr valley's weights: a loss's variance is VALLEY_NOISE^2 + (VALLEY_FALLOFF dL)^2, dL its
# height above the grid's minimum: a parabola describes the valley near its floor only (it is
# steeper on the high-lr side), so points weigh less as they rise
VALLEY_NOISE = 0.002  # nats/token
VALLEY_FALLOFF = 4.0
LR_WINDOW = 4.0  # lr optima of batches within this factor of their cell's B_opt feed the lr law
INTERIOR_CELLS = 3  # a grid has an interior optimum with at least this many bracketed cells
RESAMPLES = 300  # cell resamples of an answer's bootstrap
# d ln eps / d ln B at the window's top where the grid cannot measure it: McCandlish's overhead
# at fixed tokens, eps ~ (x - 1)^2 / x for x = B / B_opt, has (x + 1) / (x - 1) = 3 at x = 2
STEEPNESS = 3.0


@dataclass(frozen=True)
class Promise:
    """What the fastest batch may cost: `overhead` eps, a fraction of compute (tokens) beyond
    the loss-optimal batch's, or `tolerance`, nats/token of loss at the same tokens."""

    overhead: float | None = DEFAULT_OVERHEAD
    tolerance: float | None = None

    def __post_init__(self):
        if (self.overhead is None) == (self.tolerance is None):
            raise ValueError("a promise is an overhead or a tolerance, exactly one")
        value = self.overhead if self.overhead is not None else self.tolerance
        if not 0 < value < math.inf:
            raise ValueError(f"a promise must be positive and finite, not {value}")

    def nats(self, loss: LossLaw | None, tokens: float) -> float:
        """The loss given up at D = `tokens` (nats/token): the tolerance, or what the overhead
        costs along the loss law, L*(D / (1 + eps)) - L*(D)."""
        if self.tolerance is not None:
            return self.tolerance
        if loss is None:
            raise GridTooSmall("a promise in compute needs the loss law L*(N, D); pass a "
                               "tolerance in nats/token instead")
        return loss_given_up(loss, tokens, self.overhead)

    def words(self) -> str:
        if self.tolerance is not None:
            return f"within {self.tolerance:g} nats/token of the best"
        return f"at most {self.overhead:.0%} more compute than the loss-optimal batch"


def loss_given_up(loss: LossLaw, tokens: float, overhead: float) -> float:
    """L*(N, D / (1 + eps)) - L*(N, D) in `LossLaw`'s form: C (D/D_REF)^-beta ((1+eps)^beta - 1)
    (the size term cancels)."""
    return float(loss.b * (tokens / D_REF) ** -loss.beta * ((1 + overhead) ** loss.beta - 1))


# ---------------------------------------------------------------------------------------------
# One batch's lr valley


@dataclass
class Valley:
    """The best lr of one batch: `lr`, the variance of ln lr, and `edge` ("low"/"high" when the
    grid's minimum is its first/last finite lr: the optimum lies beyond, `lr` only bounds it;
    None inside)."""

    lr: float
    var_log: float
    edge: str | None
    curvature: float = math.nan  # nats/token per (ln lr - ln lr*)^2 at the floor; NaN: unknown


def lr_valley(lrs, losses, diverged=(), noise: float = VALLEY_NOISE) -> Valley:
    """The vertex of a weighted quadratic in x = ln lr through every finite (lr, loss).

    The weights are a kernel, 1 / (noise^2 + (VALLEY_FALLOFF dL)^2) with dL a loss's height
    above the grid's minimum: the quadratic is asked to describe the valley's floor, not its
    walls. The vertex's variance is the delta method's through the estimator's sandwich
    covariance, each loss's own variance s^2 the larger of `noise`^2 and the kernel-weighted
    residuals' (so a valley the quadratic misfits gets a wider vertex). The vertex is kept
    inside the finite lrs, and below the smallest `diverged` lr above the first finite one: a
    diverged run bounds the optimum from above, it is no point of the valley."""
    lrs, losses = np.asarray(lrs, float), np.asarray(losses, float)
    ok = np.isfinite(losses)
    order = np.argsort(lrs[ok])
    x, y = np.log(lrs[ok][order]), losses[ok][order]
    if len(x) == 0:
        raise ValueError("no finite loss in this batch")
    i = int(np.argmin(y))
    if len(x) < 3 or i in (0, len(x) - 1):
        return Valley(float(math.exp(x[i])), math.inf, "single" if len(x) == 1 else
                      ("low" if i == 0 else "high"))
    # a diverged lr above the smallest finite one caps the optimum (one below every finite lr
    # contradicts the runs that did not diverge, and caps nothing)
    top = min([x[-1], *(math.log(d) for d in diverged if d > math.exp(x[0]))])

    def capped(x_star: float, var: float, curvature: float = math.nan) -> Valley:
        return Valley(float(math.exp(min(max(x_star, x[0]), top))), var, None, curvature)

    w = 1.0 / (noise**2 + (VALLEY_FALLOFF * (y - y[i])) ** 2)
    design = np.column_stack([np.ones_like(x), x - x[i], (x - x[i]) ** 2])
    normal = design.T @ (design * w[:, None])
    try:
        inverse = np.linalg.inv(normal)
    except np.linalg.LinAlgError:
        return capped(x[i], math.inf)
    coef = inverse @ (design.T @ (w * y))
    _, b, c = coef
    if c <= 0:  # no curvature: the grid's minimum, its spacing as the uncertainty
        step = float(np.median(np.diff(x)))
        return capped(x[i], step * step)
    resid = y - design @ coef
    dof = len(x) - 3
    s2 = noise**2
    if dof > 0:
        s2 = max(s2, float(w @ resid**2) / float(w.sum()) * len(x) / dof)
    sandwich = inverse @ (design.T @ (design * (w * w)[:, None])) @ inverse * s2
    grad = np.array([0.0, -1 / (2 * c), b / (2 * c * c)])
    return capped(x[i] - b / (2 * c), float(grad @ sandwich @ grad), float(c))


# ---------------------------------------------------------------------------------------------
# One cell of the grid


@dataclass
class BatchRuns:
    """One batch of one cell: its lrs and their end-of-run losses (nats/token; a mean over
    seeds where there are several), and the lrs that diverged."""

    batch: float  # sequences
    lrs: np.ndarray
    losses: np.ndarray
    diverged: tuple[float, ...] = ()
    _valley: Valley | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        order = np.argsort(np.asarray(self.lrs, float))
        self.lrs = np.asarray(self.lrs, float)[order]
        self.losses = np.asarray(self.losses, float)[order]
        if not np.isfinite(self.losses).any():
            raise ValueError(f"batch {self.batch:g}: no finite loss")

    @property
    def best(self) -> float:
        return float(np.nanmin(self.losses))

    def valley(self) -> Valley:
        """The batch's best lr (`lr_valley`), computed once."""
        if self._valley is None:
            self._valley = lr_valley(self.lrs, self.losses, self.diverged)
        return self._valley

    def loss_at(self, lr: float) -> float:
        """The loss at `lr` read off the grid: linear in ln lr between finite lrs (the end lr's
        loss beyond them)."""
        ok = np.isfinite(self.losses)
        return float(np.interp(math.log(lr), np.log(self.lrs[ok]), self.losses[ok]))


@dataclass
class GridCell:
    """One (N, D) of the grid: its batches, in increasing order."""

    params: float
    tokens: float
    batches: list[BatchRuns]

    def __post_init__(self):
        self.batches = sorted(self.batches, key=lambda b: b.batch)
        self._profile = (np.array([b.batch for b in self.batches], float),
                         np.array([b.best for b in self.batches], float))

    @property
    def key(self) -> tuple[float, float]:
        return (self.params, self.tokens)

    def profile(self) -> tuple[np.ndarray, np.ndarray]:
        """(batches, each batch's best loss over its lrs)."""
        return self._profile

    @property
    def best(self) -> float:
        """The cell's lowest loss, over every run."""
        return float(self._profile[1].min())

    @property
    def bracketed(self) -> bool:
        """Whether the lowest loss lies at an inner batch: the loss rises towards both the
        smallest and the largest batch tried."""
        _, loss = self.profile()
        return 0 < int(np.argmin(loss)) < len(loss) - 1

    def window(self, nats: float) -> tuple[float, float, bool, bool]:
        """(smallest, largest) batch whose best loss is within `nats` of the cell's best,
        linear in ln B between grid batches, and whether each end is censored (the grid's
        own end batch is still within: the true end lies beyond it)."""
        batch, loss = self.profile()
        level = self.best + nats
        inside = np.flatnonzero(loss <= level)
        lo, hi = int(inside[0]), int(inside[-1])

        def crossing(i: int, j: int) -> float:  # from batch i (within) towards j (beyond)
            share = (level - loss[i]) / (loss[j] - loss[i])
            return float(batch[i] * (batch[j] / batch[i]) ** share)

        low = float(batch[0]) if lo == 0 else crossing(lo, lo - 1)
        high = float(batch[-1]) if hi == len(batch) - 1 else crossing(hi, hi + 1)
        return low, high, lo == 0, hi == len(batch) - 1

    def largest_within(self, nats: float) -> float:
        """The largest batch within `nats` of the best (the window's top)."""
        return self.window(nats)[1]

    def loss_at(self, batch: float, lr: float) -> float:
        """The loss of a run at (`batch`, `lr`) read off the grid: linear in ln lr within each
        batch, then in ln B (the end batch's beyond the grid)."""
        b = np.log([r.batch for r in self.batches])
        return float(np.interp(math.log(batch), b, [r.loss_at(lr) for r in self.batches]))

    def lr_at(self, batch: float) -> float:
        """The best lr at `batch`: ln lr* linear in ln B between the two nearest batches whose
        valley is interior (the nearest batch's own optimum where fewer)."""
        inner = [(r.batch, r.valley()) for r in self.batches]
        inner = [(b, v.lr) for b, v in inner if v.edge is None]
        if len(inner) < 2:
            return min(((r.batch, r.valley().lr) for r in self.batches),
                       key=lambda p: abs(math.log(p[0] / batch)))[1]
        b, lr = (np.log(np.array(z)) for z in zip(*inner, strict=True))
        return float(math.exp(np.interp(math.log(batch), b, lr)))


def score(cell: GridCell, batch: float, lr: float, promised: float | None = None) -> dict:
    """What an answer costs on a measured cell: `loss_given_up`, the loss at (batch, lr) read
    off the cell's grid above the cell's best (nats/token), and with a `promised` loss given
    up the measured largest batch within it."""
    out = {"batch_size": batch, "lr": lr,
           "loss_given_up": cell.loss_at(batch, lr) - cell.best,
           "measured_lr": cell.lr_at(batch)}
    if promised is not None:
        low, high, _, censored = cell.window(promised)
        out.update({"measured_largest_within": high, "measured_largest_censored": censored})
    return out


def has_interior_optimum(cells: list[GridCell]) -> bool:
    """Whether the grid has a loss optimum inside its batches at fixed tokens: at least
    INTERIOR_CELLS cells, and at least half of those with three batches or more, whose lowest
    loss lies at an inner batch. Where loss keeps falling towards the smallest batch (critbatch's
    cpu sweeps) it has not, and B_opt says only "the smallest tried"."""
    wide = [c for c in cells if len(c.batches) >= 3]
    inner = sum(c.bracketed for c in wide)
    return inner >= INTERIOR_CELLS and 2 * inner >= len(wide)


# ---------------------------------------------------------------------------------------------
# The laws across cells


@dataclass
class GridFit:
    """The laws an answer is read from (see the module docstring)."""

    promise: Promise
    loss: LossLaw | None
    b_opt: Law  # ln B_opt (sequences) in ln N, ln D: the OPTIMUM_WINDOW window's centre
    b_top: Law  # ln of the promise's window top
    lr: Law  # ln lr* in ln B (and ln N, ln D)
    cells: int  # cells the grid has
    top_cells: int  # cells whose window top lies inside their batches (the b_top law's)
    optimum_cells: int  # cells whose OPTIMUM_WINDOW window lies inside (the b_opt law's)
    lr_points: int

    def answer(self, params: float, tokens: float) -> dict:
        batch = self.b_top.predict(params, tokens)
        b_opt = self.b_opt.predict(params, tokens)
        nats = self.promise.nats(self.loss, tokens)
        best = None if self.loss is None else float(self.loss.predict(params, tokens))
        return {"batch_size": batch, "lr": self.lr.predict(params, tokens, batch),
                "loss_optimal_batch": b_opt,
                "loss_optimal_lr": self.lr.predict(params, tokens, b_opt),
                "loss_given_up": nats, "predicted_best_loss": best,
                "predicted_loss": None if best is None else best + nats}


def windows(cells: list[GridCell], promise: Promise, loss: LossLaw | None
            ) -> list[tuple[GridCell, tuple, tuple]]:
    """Per cell, (cell, the promise's window, the OPTIMUM_WINDOW window)."""
    optimum = Promise(overhead=OPTIMUM_WINDOW)
    return [(c, c.window(promise.nats(loss, c.tokens)), c.window(optimum.nats(loss, c.tokens)))
            for c in cells]


def lr_law_points(cells: list[GridCell], centres: dict) -> dict[str, np.ndarray]:
    """The interior per-batch lr optima of batches within LR_WINDOW of their cell's B_opt
    (`centres`: cell key -> B_opt; every batch where the cell has none), with their variance."""
    rows = []
    for c in cells:
        centre = centres.get(c.key)
        for r in c.batches:
            if centre is not None and abs(math.log(r.batch / centre)) > math.log(LR_WINDOW):
                continue
            v = r.valley()
            if v.edge is None and math.isfinite(v.var_log):
                rows.append((r.batch, c.params, c.tokens, v.lr, v.var_log))
    if len(rows) < 4:
        raise GridTooSmall(f"{len(rows)} interior lr optima; the lr law needs 4 (train three "
                           "lrs or more per batch, with the best inside them)")
    b, n, d, lr, var = (np.array(z, float) for z in zip(*rows, strict=True))
    return {"batch": b, "params": n, "tokens": d, "lr": lr, "var": var}


def fit_lr(cells: list[GridCell], centres: dict, terms: str | None = None,
           resamples: int = 0) -> tuple[Law, int]:
    """(the lr law, its points): ln lr* in ln B, with ln N and ln D where held-out prediction
    keeps them (or the `terms` given, "B+N" say)."""
    pts = lr_law_points(cells, centres)
    args = (pts["lr"], pts["params"], pts["tokens"], pts["batch"])
    if terms is not None:
        return fit_law("lr*(B)", tuple(terms.split("+")), *args, var=pts["var"]), len(pts["lr"])
    return select_terms("lr*(B)", *args, always=("B",), resamples=resamples,
                        var=pts["var"]), len(pts["lr"])


def fit_batch_law(name: str, values: list[float], cells: list[GridCell],
                  terms: str | None, resamples: int) -> Law:
    n = [c.params for c in cells]
    d = [c.tokens for c in cells]
    if len(values) < 2:
        raise GridTooSmall(f"{len(values)} cells measure {name}; the law needs 2 or more")
    if terms is not None:
        columns = () if terms == "constant" else tuple(terms.split("+"))
        return fit_law(name, columns, values, n, d)
    return select_terms(name, values, n, d, resamples=resamples, min_points=2)


def fit_answer(cells: list[GridCell], promise: Promise, terms: dict | None = None,
               resamples: int = 0, loss_start: LossLaw | None = None) -> GridFit:
    """Every law of the answer on `cells` (terms chosen by held-out prediction, or `terms`:
    {"b_opt": "D", "b_top": "N+D", "lr": "B+N"} as a bootstrap replicate reuses them)."""
    terms = terms or {}
    loss = fit_loss_law([c.params for c in cells], [c.tokens for c in cells],
                        [c.best for c in cells], start=loss_start)
    if loss is None and promise.tolerance is None:
        raise GridTooSmall(f"the loss law L*(N, D) cannot be fitted to {len(cells)} cells (it "
                           "needs 6 with distinct sizes or budgets); pass a tolerance in "
                           "nats/token instead of an overhead")
    rows = windows(cells, promise, loss)
    top = [(c, w[1]) for c, w, _ in rows if not w[3]]
    optimum = [(c, math.sqrt(o[0] * o[1])) for c, _, o in rows if not (o[2] or o[3])]
    b_top = fit_batch_law("B within the promise", [v for _, v in top], [c for c, _ in top],
                          terms.get("b_top"), resamples)
    b_opt = fit_batch_law("B_opt", [v for _, v in optimum], [c for c, _ in optimum],
                          terms.get("b_opt"), resamples)
    lr, points = fit_lr(cells, {c.key: v for c, v in optimum}, terms.get("lr"), resamples)
    return GridFit(promise, loss, b_opt, b_top, lr, len(cells), len(top), len(optimum), points)


def chosen_terms(fit: GridFit) -> dict[str, str]:
    return {"b_opt": "+".join(fit.b_opt.columns) or "constant",
            "b_top": "+".join(fit.b_top.columns) or "constant",
            "lr": "+".join(fit.lr.columns)}


# ---------------------------------------------------------------------------------------------
# Intervals: the whole choice redone on resampled cells, and a promise kept in expectation


def keep_promise(log_tops, steepness: float) -> float:
    """The batch whose overhead, averaged over what the fit does not know, is the promise.

    Near the top B_top of a cell's window the overhead grows as eps (B / B_top)^g (g the
    profile's `steepness`, d ln eps / d ln B there), so an answer above the true top costs
    more than one as far below it saves: over draws z_j of ln B_top (the bootstrap's, a new
    cell's scatter included), the mean overhead at B is eps mean_j exp(g (ln B - z_j)), equal
    to eps at ln B = -ln(mean_j exp(-g z_j)) / g: the draws' median less about g s^2 / 2 for
    a spread s. Returns B (sequences)."""
    z = np.asarray(log_tops, float)
    z = z[np.isfinite(z)]
    shift = float(z.min())  # for the exponentials' range
    return float(math.exp(shift - math.log(np.mean(np.exp(-steepness * (z - shift))))
                          / steepness))


def steepness(cells: list[GridCell], promise: Promise, loss: LossLaw | None) -> float:
    """d ln eps / d ln B at the top of the promise's window: per cell ln 2 over ln of the
    ratio of the tops of the windows of twice the promise and of the promise (both inside
    the batches tried), the median over cells; STEEPNESS where fewer than three cells have
    both."""
    double = (Promise(overhead=2 * promise.overhead) if promise.overhead is not None
              else Promise(overhead=None, tolerance=2 * promise.tolerance))
    ratios = []
    for c in cells:
        one, two = c.window(promise.nats(loss, c.tokens)), c.window(double.nats(loss, c.tokens))
        if not (one[3] or two[3]) and two[1] > one[1] * (1 + 1e-9):
            ratios.append(math.log(2) / math.log(two[1] / one[1]))
    return float(np.median(ratios)) if len(ratios) >= 3 else STEEPNESS


def valley_curvature(cells: list[GridCell]) -> float:
    """The median curvature of the cells' interior lr valleys (nats/token per e-fold of lr,
    squared); NaN with none."""
    values = [v.curvature for c in cells for r in c.batches
              if (v := r.valley()).edge is None and math.isfinite(v.curvature)]
    return float(np.median(values)) if values else math.nan


def lr_miss_cost(cells: list[GridCell], log_lrs) -> float:
    """The loss a run at the answer's lr gives up on average against its own best lr: the
    valleys' curvature times the variance of ln lr* over the answer's draws (the lr law's
    uncertainty and a new cell's scatter), nats/token; 0 where either is unknown."""
    values = np.asarray(log_lrs, float)
    values = values[np.isfinite(values)]
    curvature = valley_curvature(cells)
    if len(values) < 20 or not math.isfinite(curvature):
        return 0.0
    return float(curvature * np.var(values))


def room_for_lr(nats: float, lr_cost: float, steepness: float) -> float:
    """The factor on the batch that leaves the promise room for the lr's expected miss: near
    the window's top the batch's cost grows as (B / B_top)^g, so the batch that costs
    `nats` - `lr_cost` is (1 - lr_cost / nats)^(1/g) times the one that costs `nats` (at
    least a quarter of the promise is left to the batch)."""
    share = max(1.0 - lr_cost / nats, 0.25) if nats > 0 else 1.0
    return share ** (1.0 / steepness)


@dataclass
class Replicates:
    """Bootstrap refits of a GridFit on resampled cells, each with a new cell's scatter drawn
    about its batch laws (ln units): what the intervals and the kept promise read."""

    fits: list[GridFit]
    top_scatter: np.ndarray
    optimum_scatter: np.ndarray
    lr_scatter: np.ndarray
    failed: int

    def log_tops(self, params: float, tokens: float) -> np.ndarray:
        return np.array([math.log(f.b_top.predict(params, tokens)) for f in self.fits]) \
            + self.top_scatter

    def log_optima(self, params: float, tokens: float) -> np.ndarray:
        return np.array([math.log(f.b_opt.predict(params, tokens)) for f in self.fits]) \
            + self.optimum_scatter

    def log_lrs(self, params: float, tokens: float, batch: float) -> np.ndarray:
        """ln lr* at `batch` per replicate, with a new cell's scatter about the lr law."""
        return np.array([math.log(f.lr.predict(params, tokens, batch)) for f in self.fits]) \
            + self.lr_scatter


def scatter(law: Law, rng: np.random.Generator) -> float:
    """One draw of a new cell's deviation from `law` (ln units): Student's t with the law's
    dof times its residual sd (0 where it has no dof)."""
    if not math.isfinite(law.residual_sd) or law.dof <= 0:
        return 0.0
    return float(law.residual_sd * rng.standard_t(law.dof))


def bootstrap_answer(cells: list[GridCell], fit: GridFit, resamples: int = RESAMPLES,
                     seed: int = 0, map_: Callable = map) -> Replicates:
    """`resamples` replicates: the cells drawn with replacement and every law refitted with its
    terms chosen again (`fit_answer`), so the intervals include the choice of terms. Replicates
    that cannot give a law (too few distinct sizes or budgets drawn) count as `failed`.

    Each replicate draws from its own stream (`SeedSequence(seed).spawn`), so `map_` may run
    them anywhere, in any order (a process pool's map spreads them over the cores) and the
    replicates are the same."""
    streams = np.random.SeedSequence(seed).spawn(resamples)
    done = list(map_(partial(one_replicate, cells, fit.promise, fit.loss), streams))
    kept = [r for r in done if r is not None]
    draws = [r[1] for r in kept]
    top, optimum, lr = (np.array(x, float) for x in (zip(*draws, strict=True) if draws
                                                     else ([], [], [])))
    return Replicates([r[0] for r in kept], top, optimum, lr, len(done) - len(kept))


def one_replicate(cells: list[GridCell], promise: Promise, loss: float,
                  stream: np.random.SeedSequence
                  ) -> tuple[GridFit, tuple[float, float, float]] | None:
    """One bootstrap replicate of `bootstrap_answer`: the refit on cells drawn with
    replacement and a new cell's scatter about its batch and lr laws; None when the drawn
    cells cannot give a law."""
    rng = np.random.default_rng(stream)
    pick = [cells[i] for i in rng.integers(0, len(cells), len(cells))]
    try:
        again = fit_answer(pick, promise, loss_start=loss)
    except (GridTooSmall, np.linalg.LinAlgError, ValueError):
        return None
    return again, (scatter(again.b_top, rng), scatter(again.b_opt, rng), scatter(again.lr, rng))


def grid_answer(fit: GridFit, replicates: Replicates, params: float, tokens: float,
                cells: list[GridCell]) -> dict:
    """The answer at (params, tokens) with 95% prediction intervals: the fastest batch within
    the promise kept in expectation (`keep_promise`) and the lr at it, the loss-optimal batch
    and its lr, the loss given up and the predicted losses (nats/token)."""
    point = fit.answer(params, tokens)
    tops = replicates.log_tops(params, tokens)
    optima = replicates.log_optima(params, tokens)
    g = steepness(cells, fit.promise, fit.loss)
    batch = keep_promise(tops, g) if len(tops) >= 20 else point["batch_size"]
    lr_cost = lr_miss_cost(cells, replicates.log_lrs(params, tokens, batch))
    batch *= room_for_lr(point["loss_given_up"], lr_cost, g)
    b_opt = point["loss_optimal_batch"]
    lr = fit.lr.predict(params, tokens, batch)
    lr_opt = fit.lr.predict(params, tokens, b_opt)
    low, high = percentile_interval(tops)
    opt_low, opt_high = percentile_interval(optima)
    lr_low, lr_high = percentile_interval(replicates.log_lrs(params, tokens, batch))
    opt_lr_low, opt_lr_high = percentile_interval(replicates.log_lrs(params, tokens, b_opt))
    return {**point, "batch_size": batch, "batch_low": low, "batch_high": high,
            "batch_top": point["batch_size"], "steepness": g, "lr_miss_cost": lr_cost,
            "lr": lr, "lr_low": lr_low, "lr_high": lr_high,
            "loss_optimal_batch_low": opt_low, "loss_optimal_batch_high": opt_high,
            "loss_optimal_lr": lr_opt, "loss_optimal_lr_low": opt_lr_low,
            "loss_optimal_lr_high": opt_lr_high,
            "resamples": len(replicates.fits), "failed_resamples": replicates.failed}


def bootstrap_lr(cells: list[GridCell], centres: dict, resamples: int = RESAMPLES,
                 seed: int = 0) -> list[tuple[Law, float]]:
    """The lr law alone refitted on resampled cells (terms chosen again), each with a new
    cell's scatter drawn: (law, ln deviation) per replicate that could be fitted."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(resamples):
        pick = [cells[i] for i in rng.integers(0, len(cells), len(cells))]
        try:
            law, _ = fit_lr(pick, centres)
        except (GridTooSmall, np.linalg.LinAlgError, ValueError):
            continue
        out.append((law, scatter(law, rng)))
    return out
