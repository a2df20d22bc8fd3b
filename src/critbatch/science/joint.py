"""One model of every run of an optimizer: loss over batch, tokens and width, fitted at once.

docs/science.md, section 8. A cell is one (width, batch B, tokens E) at its best lr, with its
loss L (nats/token) and that loss's noise sigma (the group's measured seed scatter). The model:

    E = E_min(L; N) * (1 + (B / B_crit(L))^p) [* (1 + B_s / B)]   McCandlish et al. 2018: p = 1
    L = L_N + A_N * (E_min / E_REF)^(-alpha_N)     one example curve per width N
    B_crit(L) = B_star * L^(-gamma)                Kaplan et al. 2020: gamma = 1/alpha_B

B in sequences, E and E_min in tokens, B_star in sequences (x seq_len for tokens). The
B_crit law is shared by all widths (`per_width=False`, Kaplan: it depends on the loss
alone) or one per width (`per_width=True`), and the two are compared by a chi-square
difference test (`loss_alone_test`). Two optional terms widen the form (`Form`), each kept
only where a likelihood-ratio test says the data demand it (`select_form`):
- the bracketed factor (`small_batch`, one more parameter B_s in sequences) makes the
  smallest batches less token-efficient than the model without it allows, as small batches
  at a given lr rule often are (the cpu sweep: batch 16 beat batch 8 at 1.5M tokens for
  both optimizers);
- a free power p (`power`; 1 without it) makes the turn from perfect scaling to
  diminishing returns softer (p < 1) or sharper (p > 1). B_crit keeps its meaning, the batch
  that needs twice the minimal tokens. At cpu scale every AdamW sweep asks for p of
  0.53-0.63 (docs/results/cpu.md). p and gamma trade against each other over a short loss range:
  both stretch the batch axis of E/E_min, so with p free the exponent's interval widens.

The noise of a cell's loss is its sigma, a share (`JointData.shared`: measured from trunks
trained at several seeds where there are enough, else SHARED_FRACTION) of its variance drawn
once per trunk, since a run and its cooldown branches see the same data order (`draw_losses`),
scaled up by sqrt(chi2/dof) where the model misfits (`noise_scale`). Fitted in
science/joint_fit.py; which terms the data demand, the loss-alone test, the bootstrap and
the spread of predictions in science/joint_inference.py; worlds planted from known
parameters, for tests and coverage checks, in science/joint_planted.py. numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import expit

E_REF = 1e6  # tokens: E_min is measured in units of this inside the curve (conditioning)
# of a cell's loss variance drawn once per trunk (branches share data), where the seeds do not
# measure it (the cpu batch sweep's two draws measured 0.81 for AdamW, 0.53 for Muon)
SHARED_FRACTION = 0.5
NEWTON_STEPS_FIT = 3
BISECTION_STEPS = 56  # `JointFit.predict_loss`'s halvings of its bracket
L_N_FLOOR = -30.0  # nats/token: L_N is a curve parameter here, free to fall below 0 (see fit_joint)
MAX_NFEV_PER_PARAMETER = 400  # a fit's evaluation limit, per parameter
FIT_FTOL = 1e-8  # a fit stops where chi2 changes by less than this share of itself (scipy's)
# a refit from the fit's own parameters (bootstrap, simulated term test) stops at 1e-5 of its
# chi2: 0.003 at chi2 300, far below the refits' spread. On a 2,000-run planted table the law
# across sizes then converged in 100 of 100 refits in a median 6 evaluations (at 1e-8: 77 of
# 100 within the evaluation limit, a median 483) and the 95% interval moved by 0.002
REFIT_FTOL = 1e-5
GAMMA_BOUNDS = (-20.0, 30.0)  # the fit's range of gamma = 1/alpha_B; on a bound: unresolved
POWER_BOUNDS = (0.25, 4.0)  # the fit's range of the transition's power p
TERM_TEST_LEVEL = 0.05  # an optional term is kept where its likelihood-ratio test's p is below
TERM_TEST_DRAWS = 100  # simulated data sets per term test (smallest p: 1/101)


@dataclass(frozen=True)
class Form:
    """The model's optional terms, each one more parameter at the end of the parameter
    vector (in this order): `small_batch` the factor (1 + B_s / B), B_s in sequences;
    `power` the transition's power p in E / E_min = 1 + (B / B_crit)^p (p = 1 without it)."""

    small_batch: bool = False
    power: bool = False

    @property
    def extra(self) -> int:
        """Parameters the terms add."""
        return int(self.small_batch) + int(self.power)

    def terms(self, theta: np.ndarray) -> tuple[float, float]:
        """(B_s, p) from a parameter vector's tail: 0 and 1 for a term the form lacks."""
        n = len(theta)
        b_small = theta[n - self.extra] if self.small_batch else 0.0
        power = theta[n - 1] if self.power else 1.0
        return b_small, power

    def tail(self, b_small: float, power: float) -> list[float]:
        """The vector's tail for these term values."""
        return [b_small] * self.small_batch + [power] * self.power

    @property
    def formula(self) -> str:
        overhead = "(B/B_crit)^p" if self.power else "B/B_crit"
        return f"E_min (1 + {overhead})" + (" (1 + B_s/B)" if self.small_batch else "")


PLAIN = Form()


def check_terms(form: Form, b_small: float, power: float) -> None:
    """A term's value without the term in `form` would be silently ignored: refuse it."""
    if (b_small != 0.0 and not form.small_batch) or (power != 1.0 and not form.power):
        raise ValueError(f"B_s = {b_small:g} and p = {power:g} need a form with those terms "
                         f"(got {form}): pass form=Form(small_batch=..., power=...)")


@dataclass(frozen=True)
class JointData:
    """The cells of one optimizer: arrays of one length, one entry per cell."""

    width: np.ndarray  # int: index into `widths` (which example curve the cell follows)
    batch: np.ndarray  # sequences per optimizer step
    tokens: np.ndarray  # training tokens seen
    loss: np.ndarray  # nats/token, at the cell's best lr
    sigma: np.ndarray  # nats/token: standard deviation of that loss (seed noise)
    unit: np.ndarray  # int: the trunk (a run and its cooldown branches share one)
    widths: tuple = ()  # a label per width index (its width or parameter count)
    # bool: the loss is an upper bound on the best-lr loss (the best grid lr on the grid's
    # edge, so a better lr lies outside it); None: no cell is
    upper: np.ndarray | None = None
    # where sigma is itself estimated (from a few seeds): per cell the estimate it comes from
    # (an int; cells of one estimate share it) and that estimate's degrees of freedom (inf:
    # known). None: every sigma is taken as known
    noise_group: np.ndarray | None = None
    noise_dof: np.ndarray | None = None
    # the share of a cell's loss variance drawn once per trunk (`draw_losses`): measured from
    # trunks trained at several seeds (`science.fits.trunk_sharing`), else SHARED_FRACTION
    shared: float = SHARED_FRACTION

    def __post_init__(self):
        if self.upper is None:
            object.__setattr__(self, "upper", np.zeros(len(self.loss), dtype=bool))

    @staticmethod
    def build(width, batch, tokens, loss, sigma, unit, widths=None, upper=None,
              noise_group=None, noise_dof=None, shared: float = SHARED_FRACTION) -> JointData:
        width = np.asarray(width)
        labels = tuple(widths) if widths is not None else tuple(sorted(set(width.tolist())))
        index = {w: i for i, w in enumerate(labels)}
        units = {u: i for i, u in enumerate(dict.fromkeys(np.asarray(unit).tolist()))}
        return JointData(
            width=np.array([index[w] for w in width.tolist()], dtype=int),
            batch=np.asarray(batch, float), tokens=np.asarray(tokens, float),
            loss=np.asarray(loss, float), sigma=np.asarray(sigma, float),
            unit=np.array([units[u] for u in np.asarray(unit).tolist()], dtype=int),
            widths=labels, upper=None if upper is None else np.asarray(upper, dtype=bool),
            noise_group=None if noise_group is None else np.asarray(noise_group, dtype=int),
            noise_dof=None if noise_dof is None else np.asarray(noise_dof, dtype=float),
            shared=float(shared))

    def __len__(self) -> int:
        return len(self.loss)

    @property
    def noise_estimated(self) -> bool:
        """Some sigma is an estimate with finite degrees of freedom (`noise_dof`)."""
        return self.noise_dof is not None and bool(np.isfinite(self.noise_dof).any())

    def subset(self, keep: np.ndarray) -> JointData:
        def pick(x):
            return None if x is None else x[keep]

        return JointData(self.width[keep], self.batch[keep], self.tokens[keep], self.loss[keep],
                         self.sigma[keep], self.unit[keep], self.widths, self.upper[keep],
                         pick(self.noise_group), pick(self.noise_dof), self.shared)

    def with_loss(self, loss: np.ndarray) -> JointData:
        return replace(self, loss=np.asarray(loss, float))


@dataclass
class JointFit:
    """The fitted parameters, per width where they are per width (arrays of n_widths)."""

    l_inf: np.ndarray  # nats/token
    a: np.ndarray  # nats/token at E_min = E_REF, above l_inf
    alpha: np.ndarray  # the example curve's exponent
    b_star: np.ndarray  # sequences at L = 1 nat/token; one entry, or one per width
    gamma: np.ndarray  # 1/alpha_B; one entry, or one per width
    chi2: float = math.nan
    dof: int = 0
    n_cells: int = 0
    success: bool = False
    widths: tuple = ()
    message: str = ""
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (pred - L) / sigma
    b_small: float = 0.0  # B_s, sequences: the small-batch term's scale (0: no such term)
    power: float = 1.0  # p, the transition's power (1: no such term)
    form: Form = PLAIN  # the optional terms the model has

    def __post_init__(self):
        check_terms(self.form, self.b_small, self.power)

    @property
    def small_batch(self) -> bool:
        return self.form.small_batch

    @property
    def usable(self) -> bool:
        """A fit whose parameters and chi-square are numbers (`success` may still be False
        where the solver stopped at its evaluation limit); a failed fit's `message` says why."""
        return bool(np.isfinite(self.chi2) and np.isfinite(self.as_vector()).all())

    @property
    def per_width(self) -> bool:
        return len(self.gamma) > 1

    @property
    def exponent(self) -> float:
        """gamma of the shared law (the first width's for a per-width fit)."""
        return float(self.gamma[0])

    @property
    def at_bound(self) -> bool:
        """gamma sits on its GAMMA_BOUNDS edge: the cells do not pin the law (at smoke scale,
        or wherever B_crit is nowhere near the batches measured)."""
        return any(abs(float(g) - edge) < 1e-3 for g in self.gamma for edge in GAMMA_BOUNDS)

    @property
    def power_at_bound(self) -> bool:
        """The fitted power p sits on its POWER_BOUNDS edge: gamma's interval is then
        conditional on that edge (p and gamma trade against each other)."""
        return self.form.power and any(abs(self.power - e) < 1e-3 for e in POWER_BOUNDS)

    @property
    def chi2_per_dof(self) -> float:
        return self.chi2 / self.dof if self.dof > 0 else math.nan

    def law(self, width) -> tuple[np.ndarray, np.ndarray]:
        """(B_star, gamma) for each width index in `width`."""
        pick = np.asarray(width) if self.per_width else np.zeros_like(np.asarray(width))
        return self.b_star[pick], self.gamma[pick]

    def b_crit(self, loss, width=0) -> np.ndarray:
        """B_crit(L) in sequences."""
        b_star, gamma = self.law(np.broadcast_to(width, np.shape(loss)))
        return b_star * np.asarray(loss, float) ** -gamma

    def e_min(self, loss, width) -> np.ndarray:
        """E_min(L; N) in tokens (NaN at or below the width's l_inf)."""
        w = np.asarray(width)
        gap = np.asarray(loss, float) - self.l_inf[w]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(gap > 0, E_REF * (self.a[w] / gap) ** (1 / self.alpha[w]), np.nan)

    def log_tokens(self, loss, width, batch) -> tuple[np.ndarray, np.ndarray]:
        """ln E_model(L) and its derivative d ln E / dL (< 0 where the model is sane)."""
        return log_tokens_model(self.as_vector(), len(self.l_inf), np.asarray(loss, float),
                                np.asarray(width), np.asarray(batch, float), self.per_width,
                                self.form)

    def as_vector(self) -> np.ndarray:
        return np.concatenate([self.l_inf, np.log(self.a), np.log(self.alpha),
                               np.log(self.b_star), self.gamma,
                               self.form.tail(self.b_small, self.power)])

    def without_terms(self) -> np.ndarray:
        """`as_vector` without the optional terms' tail: the plain model's parameters."""
        vector = self.as_vector()
        return vector[:len(vector) - self.form.extra]

    def predict_loss(self, width, batch, tokens) -> np.ndarray:
        """The loss reached at (width index, batch, tokens): the root in L of
        ln E_model(L) = ln tokens on the model's falling branch (from l_inf up to where
        ln E stops falling), by bisection; NaN where that branch never needs so few tokens."""
        width, batch, tokens = (np.atleast_1d(x) for x in np.broadcast_arrays(
            np.asarray(width), np.asarray(batch, float), np.asarray(tokens, float)))
        target = np.log(tokens)
        lo = np.maximum(self.l_inf[width], 0.0) + 1e-9  # a loss is positive, l_inf may not be
        # the falling branch of ln E(L) runs from l_inf up to its minimum on a log grid of gaps
        gaps = self.a[width] * np.geomspace(1e-4, 50.0, 96)[:, None]
        grid = self.log_tokens(lo + gaps, width, batch)[0]
        hi = lo + gaps[np.argmin(grid, axis=0), np.arange(len(target))]
        ok = grid.min(axis=0) < target
        # the bracket is at most 50 a wide (a < 2e9): 2^-56 of it is below 3e-8 nats/token at
        # the very worst and near machine precision where a is a few nats
        log_e = log_tokens_at(self.as_vector(), len(self.l_inf), width, batch, self.per_width,
                              self.form)
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            above = log_e(mid) > target  # too many tokens: L up
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return np.where(ok, 0.5 * (lo + hi), np.nan)


def cell_terms(theta: np.ndarray, n_widths: int, width: np.ndarray, batch: np.ndarray,
               per_width: bool, form: Form) -> dict:
    """The pieces of ln E(L) at each cell that do not depend on L: the curve's parameters at
    the cell's width, its law's ln B_star and gamma, ln B, the small-batch term's ln(1 + B_s
    / B) (None without it), B_s and p."""
    w = n_widths
    law = width if per_width else np.zeros_like(width)
    n_law = w if per_width else 1
    b_small, power = form.terms(theta)
    if per_width:
        gamma = theta[3 * w + n_law:3 * w + 2 * n_law][law]
        log_b_star = theta[3 * w:3 * w + n_law][law]
    else:  # one law: scalars broadcast (no per-cell indexing)
        gamma, log_b_star = theta[3 * w + 1], theta[3 * w]
    return {"l_inf": theta[:w][width], "log_a": theta[w:2 * w][width],
            "alpha": np.exp(theta[2 * w:3 * w][width]), "gamma": gamma,
            "log_b_star": log_b_star, "law": law, "n_law": n_law, "log_batch": np.log(batch),
            "small": np.log1p(b_small / batch) if form.small_batch else None,
            "b_small": b_small, "power": power}


def law_terms(theta: np.ndarray, n_widths: int, loss: np.ndarray, width: np.ndarray,
              batch: np.ndarray, per_width: bool, form: Form, cells: dict | None = None) -> dict:
    """The pieces of ln E(L) at each cell, shared by the model and its gradient: `cell_terms`
    (given as `cells` where they were computed once for these cells), gap = L - l_inf,
    v = ln(B / B_crit(L)) and the overhead's log p v (its logistic weight s = u / (1 + u),
    u = (B / B_crit)^p, is `expit(pv)`: no overflow where a refit far from the data puts u
    past 1e308)."""
    c = cell_terms(theta, n_widths, width, batch, per_width, form) if cells is None else cells
    log_loss = np.log(np.maximum(loss, 1e-9))
    v = c["log_batch"] + c["gamma"] * log_loss - c["log_b_star"]
    return {**c, "gap": np.maximum(loss - c["l_inf"], 1e-12), "loss": np.maximum(loss, 1e-9),
            "log_loss": log_loss, "v": v, "pv": c["power"] * v}


def log_e_of(t: dict) -> np.ndarray:
    """ln E(L) from `law_terms`: ln E_min(L; N) + ln(1 + (B / B_crit(L))^p) [+ ln(1 + B_s /
    B)]."""
    log_e = (math.log(E_REF) + (t["log_a"] - np.log(t["gap"])) / t["alpha"]
             + np.logaddexp(0.0, t["pv"]))
    return log_e if t["small"] is None else log_e + t["small"]


def log_tokens_model(theta: np.ndarray, n_widths: int, loss: np.ndarray, width: np.ndarray,
                     batch: np.ndarray, per_width: bool, form: Form = PLAIN,
                     cells: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ln E(L) = ln E_min(L; N) + ln(1 + (B / B_crit(L))^p) [+ ln(1 + B_s / B)] and
    d ln E / dL, from the parameter vector [l_inf (W), ln a (W), ln alpha (W),
    ln B_star (1 or W), gamma (1 or W), (B_s), (p)] (`cells`: see `law_terms`)."""
    t = law_terms(theta, n_widths, loss, width, batch, per_width, form, cells)
    slope = (-1 / (t["alpha"] * t["gap"])
             + expit(t["pv"]) * t["power"] * t["gamma"] / t["loss"])
    return log_e_of(t), slope


def log_tokens_at(theta: np.ndarray, n_widths: int, width: np.ndarray, batch: np.ndarray,
                  per_width: bool, form: Form = PLAIN):
    """ln E(L) at fixed cells as a function of L alone (`log_tokens_model`'s first value),
    each cell's parameters looked up once: `JointFit.predict_loss` asks for it at 56 losses
    per cell, where the lookups were most of its time."""
    cells = cell_terms(theta, n_widths, width, batch, per_width, form)
    return lambda loss: log_e_of(law_terms(theta, n_widths, loss, width, batch, per_width, form,
                                           cells))


def log_tokens_gradient(theta: np.ndarray, n_widths: int, loss: np.ndarray, width: np.ndarray,
                        batch: np.ndarray, per_width: bool, form: Form = PLAIN) -> np.ndarray:
    """d ln E(L) / d theta at fixed L, one row per cell (cells x parameters), in
    `log_tokens_model`'s parameter order: the analytic partial derivatives of its terms."""
    t = law_terms(theta, n_widths, loss, width, batch, per_width, form)
    s = expit(t["pv"])
    w, n_law, rows = n_widths, t["n_law"], np.arange(len(loss))
    grad = np.zeros((len(loss), len(theta)))
    grad[rows, width] = 1 / (t["alpha"] * t["gap"])  # l_inf
    grad[rows, w + width] = 1 / t["alpha"]  # ln a
    grad[rows, 2 * w + width] = -(t["log_a"] - np.log(t["gap"])) / t["alpha"]  # ln alpha
    grad[rows, 3 * w + t["law"]] = -t["power"] * s  # ln B_star
    grad[rows, 3 * w + n_law + t["law"]] = t["power"] * s * t["log_loss"]  # gamma
    column = 3 * w + 2 * n_law
    if form.small_batch:
        grad[:, column] = 1 / (batch + t["b_small"])
        column += 1
    if form.power:
        grad[:, column] = s * t["v"]
    return grad


def above_baseline(data: JointData) -> np.ndarray:
    """Cells whose loss lies above the highest loss the smallest batch of their width
    measured (bool per cell). The baseline's cells are the data closest to E_min(L), so
    above them the tokens E_min needs come from the example curve's form, fitted to lower
    losses: at cpu scale the baseline's loss falls slowly over its first doublings and then
    faster (docs/results/cpu.md), which a power law does not follow."""
    out = np.zeros(len(data), dtype=bool)
    for w in range(len(data.widths)):
        mine = data.width == w
        if mine.any():
            baseline = mine & (data.batch == data.batch[mine].min())
            out |= mine & (data.loss > data.loss[baseline].max())
    return out


def noise_scale(fit: JointFit) -> float:
    """How much to widen the stated loss noise: sqrt(chi2/dof) when the model misfits it,
    else 1 (a model that fits better than the noise does not narrow the intervals)."""
    return max(1.0, math.sqrt(fit.chi2_per_dof)) if fit.dof > 0 else 1.0


def draw_losses(rng: np.random.Generator, data: JointData, center: np.ndarray,
                scale: float = 1.0, shared: float | None = None,
                sigma: np.ndarray | None = None) -> np.ndarray:
    """`center` plus each cell's noise (`sigma`, default `data.sigma`): a draw per trunk
    (`shared` of the variance, default `data.shared`, the same for a run and its branches)
    and one per cell (the rest)."""
    shared = data.shared if shared is None else shared
    per_unit = rng.standard_normal(int(data.unit.max()) + 1)[data.unit]
    own = rng.standard_normal(len(data))
    z = math.sqrt(shared) * per_unit + math.sqrt(1 - shared) * own
    return center + scale * (data.sigma if sigma is None else sigma) * z
