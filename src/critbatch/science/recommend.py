"""The loss law across sizes and its B_crit(L), for answers where loss keeps falling towards
small batches (docs/science.md, section 9).

The joint model (`science.joint`) gives every width its own example curve. To predict a
model size the sweep did not train, the curves become one loss law across sizes:

    L = L_0 + A (N / N_REF)^(-a) + C (E_min / E_REF)^(-b)       (Hoffmann et al. 2022's form)
    E = E_min(L; N) (1 + (B / B_crit(L))^p) [(1 + B_s / B)],  B_crit(L) = B_star L^(-gamma)

N is non-embedding parameters, E tokens, B sequences. The law is the joint model with each
width's curve tied to its size: l_inf(N) = L_0 + A (N / N_REF)^(-a), a common amplitude C and
exponent b, with the joint model's optional terms (B_s, p: `science.joint.Form`). With one
size the N term cannot be measured: A is 0 and every size gets the sweep's curve (the
caller warns); with two, the size exponent a is fixed at FIXED_SIZE_EXPONENT (two floors
cannot pin three parameters) and A is fitted. The fit is
`science.joint_fit.residuals`' weighted least squares on the losses; its intervals refits on
the cells' trunks drawn with replacement (`resample_units`).

`fastest_within` turns the law into the answer for (N, D): the largest batch whose loss at D
tokens costs at most a given compute overhead (or loss) beyond the loss-optimal batch's;
`to_target_loss` the steps and tokens of each batch to reach a loss. numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from critbatch.science.joint import (
    E_REF,
    FIT_FTOL,
    L_N_FLOOR,
    PLAIN,
    POWER_BOUNDS,
    REFIT_FTOL,
    Form,
    JointData,
    JointFit,
    check_terms,
)
from critbatch.science.joint_fit import residual_jacobian, residuals

N_REF = 1e6  # non-embedding parameters: the size term is measured in units of this
# the size exponent a where two sizes cannot measure it (three parameters, two floors):
# Hoffmann et al. 2022's fitted alpha for parameters (approach 3)
FIXED_SIZE_EXPONENT = 0.34
MAX_DOUBLINGS = 24  # the batch profile: at most this many doublings above the smallest batch


@dataclass
class ScalingFit:
    """The loss law across sizes with the B_crit law (see the module docstring)."""

    l0: float  # nats/token
    a_size: float  # A, nats/token at N = N_REF (0: one size, no size term)
    size_exponent: float  # a
    c: float  # nats/token above l_inf(N) at E_min = E_REF
    b: float  # the tokens exponent
    b_star: float  # sequences at L = 1 nat/token
    gamma: float  # 1/alpha_B
    b_small: float = 0.0  # B_s, sequences (0: no small-batch term)
    power: float = 1.0  # p, the transition's power (1: no such term)
    form: Form = PLAIN  # the optional terms the law has
    size_terms: int = 2  # fitted size parameters: 0 one size, 1 A (a fixed), 2 A and a
    chi2: float = math.nan
    dof: int = 0
    success: bool = False
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def chi2_per_dof(self) -> float:
        return self.chi2 / self.dof if self.dof > 0 else math.nan

    def __post_init__(self):
        check_terms(self.form, self.b_small, self.power)

    @property
    def small_batch(self) -> bool:
        return self.form.small_batch

    @property
    def one_size(self) -> bool:
        return self.size_terms == 0

    def l_inf(self, params) -> np.ndarray:
        """The size's curve floor l_inf(N), nats/token."""
        n = np.asarray(params, float)
        return self.l0 + self.a_size * (n / N_REF) ** -self.size_exponent

    def curve(self, params) -> JointFit:
        """The joint model of one width of `params` non-embedding parameters (width index 0)."""
        return JointFit(
            l_inf=np.atleast_1d(self.l_inf(params)).astype(float), a=np.array([self.c]),
            alpha=np.array([self.b]), b_star=np.array([self.b_star]),
            gamma=np.array([self.gamma]), b_small=self.b_small, power=self.power, form=self.form)

    def predict_loss(self, params: float, batch, tokens) -> np.ndarray:
        """Loss (nats/token) of a model of `params` at `batch` sequences after `tokens`."""
        batch, tokens = np.broadcast_arrays(np.asarray(batch, float), np.asarray(tokens, float))
        return self.curve(params).predict_loss(np.zeros(batch.shape, int), batch, tokens)

    def b_crit(self, loss) -> np.ndarray:
        return self.b_star * np.asarray(loss, float) ** -self.gamma

    def e_min(self, loss, params: float) -> np.ndarray:
        return self.curve(params).e_min(np.asarray(loss, float), 0)

    def tokens_to(self, loss, params: float, batch) -> np.ndarray:
        """Tokens a batch needs to reach `loss`: E_min (1 + (B/B_crit)^p) (1 + B_s/B)."""
        loss, batch = np.broadcast_arrays(np.asarray(loss, float), np.asarray(batch, float))
        return self.e_min(loss, params) * self.overhead_factor(loss, batch)

    def overhead_factor(self, loss, batch) -> np.ndarray:
        """E / E_min at (loss, batch): 1 + the token overhead."""
        batch = np.asarray(batch, float)
        return (1 + (batch / self.b_crit(loss)) ** self.power) * (1 + self.b_small / batch)

    def as_vector(self) -> np.ndarray:
        size = [math.log(max(self.a_size, 1e-300)), math.log(self.size_exponent)][
            :self.size_terms]
        return np.array([self.l0, *size, math.log(self.c), math.log(self.b),
                         math.log(self.b_star), self.gamma,
                         *self.form.tail(self.b_small, self.power)])


def size_terms(n_sizes: int) -> int:
    """Size parameters the law fits with `n_sizes` sizes: none, A (a fixed), or A and a."""
    return min(max(n_sizes - 1, 0), 2)


def unpack(theta: np.ndarray, terms: int, form: Form) -> dict:
    """The named parameters of a vector [L_0, (ln A), (ln a), ln C, ln b, ln B_star, gamma,
    (B_s), (p)] with `terms` size parameters and `form`'s optional terms."""
    i = 1 + terms
    out = {"l0": float(theta[0]), "a_size": float(np.exp(theta[1])) if terms else 0.0,
           "size_exponent": float(np.exp(theta[2])) if terms == 2 else FIXED_SIZE_EXPONENT,
           "c": float(np.exp(theta[i])), "b": float(np.exp(theta[i + 1])),
           "b_star": float(np.exp(theta[i + 2])), "gamma": float(theta[i + 3])}
    b_small, power = form.terms(theta)
    return {**out, "b_small": float(b_small), "power": float(power), "form": form}


def joint_vector(theta: np.ndarray, sizes: np.ndarray, terms: int,
                 form: Form) -> np.ndarray:
    """The joint model's parameter vector (one curve per width) of a scaling vector."""
    p = unpack(theta, terms, form)
    n = len(sizes)
    l_inf = p["l0"] + p["a_size"] * (sizes / N_REF) ** -p["size_exponent"]
    return np.concatenate([l_inf, np.full(n, math.log(p["c"])), np.full(n, math.log(p["b"])),
                           [math.log(p["b_star"]), p["gamma"]],
                           form.tail(p["b_small"], p["power"])])


def scaling_residuals(theta: np.ndarray, data: JointData, sizes: np.ndarray, terms: int,
                      form: Form, steps: int = 3) -> np.ndarray:
    return residuals(joint_vector(theta, sizes, terms, form), data, len(sizes),
                     False, form, steps=steps)


def scaling_jacobian(theta: np.ndarray, data: JointData, sizes: np.ndarray, terms: int,
                     form: Form, steps: int = 3) -> np.ndarray:
    """d `scaling_residuals` / d theta by the chain rule: the joint model's analytic Jacobian
    (`science.joint_fit.residual_jacobian`) at the per-width vector times that vector's
    derivative in the law's parameters (`joint_vector_derivative`)."""
    inner = joint_vector(theta, sizes, terms, form)
    return (residual_jacobian(inner, data, len(sizes), False, form, steps)
            @ joint_vector_derivative(theta, sizes, terms, form))


def joint_vector_derivative(theta: np.ndarray, sizes: np.ndarray, terms: int,
                            form: Form) -> np.ndarray:
    """d `joint_vector` / d theta (per-width vector x law parameters), analytic: each width's
    l_inf = L_0 + A x^-a (x = N / N_REF, A = e^theta[1], a = e^theta[2]) moves with L_0, ln A
    (by A x^-a) and ln a (by -A x^-a a ln x); every other entry is one of theta's own. The
    fits ask for it at every Jacobian, where central differences took 2 x (7 to 9) more
    `joint_vector`s."""
    n, i = len(sizes), 1 + terms
    outer = np.zeros((3 * n + 2 + form.extra, len(theta)))
    outer[:n, 0] = 1.0
    if terms:
        x = np.asarray(sizes, float) / N_REF
        p = unpack(theta, terms, form)
        power = p["a_size"] * x ** -p["size_exponent"]
        outer[:n, 1] = power
        if terms == 2:
            outer[:n, 2] = -power * p["size_exponent"] * np.log(x)
    outer[n:2 * n, i] = outer[2 * n:3 * n, i + 1] = 1.0
    outer[3 * n, i + 2] = outer[3 * n + 1, i + 3] = 1.0
    for j in range(form.extra):
        outer[3 * n + 2 + j, i + 4 + j] = 1.0
    return outer


def curve_points(joint: JointFit, tokens: np.ndarray, width: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(width index, E_min, L) along each width's fitted example curve, over the tokens its
    cells span: what the law across sizes must pass through."""
    rows = []
    for i in range(len(joint.l_inf)):
        mine = tokens[width == i]
        for e in np.geomspace(mine.min(), mine.max(), 8):
            loss = joint.l_inf[i] + joint.a[i] * (e / E_REF) ** -joint.alpha[i]
            rows.append((i, e, loss))
    w, e, loss = (np.array(x) for x in zip(*rows, strict=True))
    return w.astype(int), e, loss


def starts_from(joint: JointFit, sizes: np.ndarray,
                data: JointData | None = None) -> list[np.ndarray]:
    """Starting vectors from a joint fit (one curve per width): the law across sizes fitted
    by least squares to points along the widths' curves (`curve_points`, from several
    starting exponents; needs the cells' `data`), or without `data` C and b the curves'
    medians and l_inf(N) through their floors. The B_crit law and the optional terms (B_s,
    p) are the joint fit's."""
    from scipy.optimize import least_squares

    terms = size_terms(len(sizes))
    c, b = float(np.median(joint.a)), float(np.median(joint.alpha))
    law = [math.log(joint.b_star[0]), float(joint.gamma[0])]
    extra = joint.form.tail(joint.b_small, joint.power)
    if terms == 0:
        return [np.array([joint.l_inf[0], math.log(c), math.log(b), *law, *extra])]
    starts = []
    for exponent in (0.1, 0.35, 1.0) if terms == 2 else (FIXED_SIZE_EXPONENT,):
        x = (sizes / N_REF) ** -exponent
        design = np.column_stack([np.ones_like(x), x])
        (l0, amp), *_ = np.linalg.lstsq(design, joint.l_inf, rcond=None)
        amp = max(float(amp), 1e-3)
        l0 = float(np.min(joint.l_inf - amp * x))
        size = [math.log(amp), math.log(exponent)][:terms]
        starts.append(np.array([l0, *size, math.log(c), math.log(b), *law, *extra]))
    if data is None:
        return starts
    w, e, loss = curve_points(joint, data.tokens, data.width)

    def miss(theta):  # the law's loss at the curve points minus the curves'
        p = unpack(np.concatenate([theta, law, extra]), terms, joint.form)
        floor = p["l0"] + p["a_size"] * (sizes[w] / N_REF) ** -p["size_exponent"]
        with np.errstate(all="ignore"):
            r = floor + p["c"] * (e / E_REF) ** -p["b"] - loss
        return np.where(np.isfinite(r), r, 1e6)  # an overflowing step is pushed back

    lower = [L_N_FLOOR, -20.0, math.log(0.01)][:1 + terms] + [-20.0, math.log(0.02)]
    upper = [float(loss.min()), 20.0, math.log(3.0)][:1 + terms] + [20.0, math.log(5.0)]
    fitted = []
    for b0 in (0.03, 0.1, 0.3):
        for s0 in starts:
            x0 = np.clip(np.concatenate([s0[:1 + terms], [s0[1 + terms], math.log(b0)]]),
                         np.array(lower) + 1e-9, np.array(upper) - 1e-9)
            res = least_squares(miss, x0, bounds=(lower, upper), max_nfev=500)
            fitted.append((res.cost, np.concatenate([res.x, law, extra])))
    fitted.sort(key=lambda f: f[0])
    return starts + [x for _, x in fitted[:3]]  # the three closest to the curves


def fit_scaling(data: JointData, sizes, start: np.ndarray | list[np.ndarray],
                form: Form = PLAIN, ftol: float = FIT_FTOL) -> ScalingFit:
    """Weighted least squares of the law across sizes on the cells of `data` (width index i
    has `sizes[i]` non-embedding parameters), from `start` (a vector, or several: the best
    is kept; `starts_from` makes them from a joint fit). Cells no law can take (a loss at or
    below 0, as a bootstrap draw at a large misfit can make) or a solver's numerical failure
    give a fit with `success` False and chi2 NaN, not an exception: a refit that failed."""
    from scipy.optimize import least_squares

    sizes = np.asarray(sizes, float)
    terms = size_terms(len(sizes))
    starts = [start] if isinstance(start, np.ndarray) else list(start)
    failed = ScalingFit(**unpack(starts[0], terms, form), size_terms=terms, chi2=math.nan,
                        dof=len(data) - len(starts[0]), success=False)
    if not (np.isfinite(data.loss).all() and data.loss.min() > 0):
        return failed
    size = [(-20.0, 20.0), (math.log(0.01), math.log(3.0))][:terms]
    bounds = [(L_N_FLOOR, float(data.loss.min()) - 1e-6), *size, (-20.0, 20.0),
              (math.log(0.02), math.log(5.0)), (-50.0, 80.0), (-20.0, 30.0)]
    bounds += [(0.0, 1e4)] * form.small_batch + [POWER_BOUNDS] * form.power
    lower, upper = (np.array(x) for x in zip(*bounds, strict=True))
    best = None
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        try:
            with np.errstate(all="ignore"):
                res = least_squares(scaling_residuals, x0, jac=scaling_jacobian,
                                    bounds=(lower, upper), x_scale="jac",
                                    args=(data, sizes, terms, form), ftol=ftol,
                                    max_nfev=200 * len(x0))
        except (ValueError, np.linalg.LinAlgError):
            continue
        if best is None or (np.isfinite(res.cost) and res.cost < best.cost):
            best = res
    if best is None:
        return failed
    chi = scaling_residuals(best.x, data, sizes, terms, form, steps=8)
    return ScalingFit(**unpack(best.x, terms, form),
                      size_terms=terms, chi2=float(np.sum(chi**2)), dof=len(data) - len(best.x),
                      success=bool(best.success), residuals=chi)


def noise_scale(fit: ScalingFit) -> float:
    """sqrt(chi2/dof) when the law misfits the seed noise, else 1."""
    return max(1.0, math.sqrt(fit.chi2_per_dof)) if fit.dof > 0 else 1.0


def resample_units(data: JointData, sizes, fit: ScalingFit, resamples: int = 100,
                   seed: int = 0) -> list[ScalingFit]:
    """Refits of the law on the cells' units drawn with replacement (a trunk and its cooldown
    branches are one unit: they share their noise), each started from `fit`; the converged
    ones. Unlike `bootstrap_scaling` it asks nothing of the noise model or of the law's form:
    a misfit the law cannot see, or seed noise measured from a few runs, widens it."""
    sizes = np.asarray(sizes, float)
    rng = np.random.default_rng(seed)
    units = np.unique(data.unit)
    members = [np.flatnonzero(data.unit == u) for u in units]
    start = fit.as_vector()
    refits = []
    for _ in range(resamples):
        pick = np.concatenate([members[i] for i in rng.integers(0, len(units), len(units))])
        again = fit_scaling(data.subset(pick), sizes, start, form=fit.form, ftol=REFIT_FTOL)
        if again.success and np.isfinite(again.chi2):
            refits.append(again)
    return refits


def to_target_loss(fit: ScalingFit, params: float, target: float, batches: list[int],
                   seq_len: int, tolerance: float) -> dict:
    """For each batch the tokens and steps to reach `target` (the predicted Pareto frontier),
    and the batch that needs the fewest steps among those within the tolerance on tokens:
    at most the tokens the most token-efficient batch needs to reach `target - tolerance`."""
    batches_a = np.asarray(batches, float)
    tokens = fit.tokens_to(np.full(len(batches), target), params, batches_a)
    rows = [{"batch_size": b, "tokens": float(e) if np.isfinite(e) else None,
             "steps": int(math.ceil(e / (b * seq_len))) if np.isfinite(e) else None}
            for b, e in zip(batches, tokens.tolist(), strict=True)]
    reachable = [i for i, r in enumerate(rows) if r["tokens"] is not None]
    if not reachable:
        return {"target_loss": target, "rows": rows, "batch_size": None,
                "allowed_tokens": None}
    efficient = min(reachable, key=lambda i: rows[i]["tokens"])
    allowed = float(fit.tokens_to(target - tolerance, params, batches[efficient]))
    if not math.isfinite(allowed):  # target - T lies below the curve: the same batch alone
        allowed = rows[efficient]["tokens"]
    within = [i for i in reachable if rows[i]["tokens"] <= allowed * (1 + 1e-9)]
    pick = min(within, key=lambda i: rows[i]["steps"])
    return {"target_loss": target, "rows": rows, "batch_size": rows[pick]["batch_size"],
            "steps": rows[pick]["steps"], "tokens": rows[pick]["tokens"],
            "allowed_tokens": allowed}


# ---------------------------------------------------------------------------------------------
# The fastest batch within a promise, where loss keeps falling towards small batches

PROFILE_STEPS_PER_DOUBLING = 8  # the batch profile's grid: 2^(1/8) apart


def batch_profile(fit: ScalingFit, params: float, tokens: float, smallest: float,
                  seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(batches, predicted loss at `tokens` tokens) on a geometric grid from `smallest` up to
    MAX_DOUBLINGS doublings or the batch that leaves one step; NaN where the law has no loss."""
    top = min(smallest * 2.0**MAX_DOUBLINGS, tokens / seq_len)
    if top < smallest:
        return np.zeros(0), np.zeros(0)
    count = int(math.log2(top / smallest) * PROFILE_STEPS_PER_DOUBLING) + 1
    batches = smallest * 2.0 ** (np.arange(count) / PROFILE_STEPS_PER_DOUBLING)
    return batches, fit.predict_loss(params, batches, np.full(count, tokens))


def fastest_within(fit: ScalingFit, params: float, tokens: float, smallest: float,
                   seq_len: int, overhead: float | None = None,
                   tolerance: float | None = None) -> dict | None:
    """The largest batch whose loss at `tokens` costs at most `overhead` more compute than the
    loss-optimal batch (or lies within `tolerance` nats/token of its loss).

    The loss-optimal batch B_ref minimises the predicted loss at `tokens` over batches from
    `smallest`, the smallest the sweep trained (below it the law is not measured: where loss
    keeps falling towards small batches B_ref is that batch). A batch B reaching L(B) costs
    D / E(B_ref, L(B)) - 1 more compute, E(B_ref, L) the tokens B_ref needs to reach L
    (`ScalingFit.tokens_to`); the overhead grows with B above B_ref, so the answer is its
    crossing of the promise (bisection in ln B between the profile's grid points). Returns
    None where the law has no loss at `tokens`; else the batch and what it costs: the loss
    given up L(B) - L(B_ref), E/E_min and S/S_min at L(B) (McCandlish: S/S_min =
    (E/E_min) B_crit / B)."""
    batches, losses = batch_profile(fit, params, tokens, smallest, seq_len)
    ok = np.isfinite(losses)
    if not ok.any():
        return None
    batches, losses = batches[ok], losses[ok]
    i_ref = int(np.argmin(losses))
    ref, best = float(batches[i_ref]), float(losses[i_ref])

    def cost(batch: np.ndarray) -> np.ndarray:  # the promise's share used: 1 at the answer
        loss = fit.predict_loss(params, batch, np.full(len(batch), tokens))
        if tolerance is not None:
            return (loss - best) / tolerance
        with np.errstate(invalid="ignore"):
            return (tokens / fit.tokens_to(loss, params, ref) - 1) / overhead

    over = np.flatnonzero(~(cost(batches[i_ref:]) <= 1.0))
    if len(over) == 0:
        batch = float(batches[-1])
    else:  # between the two grid points: a finer grid, then linear in ln B
        k = i_ref + int(over[0])
        fine = np.geomspace(batches[k - 1], batches[k], 33)
        c = cost(fine)
        j = int(np.flatnonzero(~(c <= 1.0))[0])
        if j == 0 or not np.isfinite(c[j]):
            batch = float(fine[max(j - 1, 0)])
        else:
            t = (1.0 - c[j - 1]) / (c[j] - c[j - 1])
            batch = float(math.exp(math.log(fine[j - 1]) + t * math.log(fine[j] / fine[j - 1])))
    loss = float(fit.predict_loss(params, batch, tokens)[0])
    factor = float(fit.overhead_factor(loss, batch))
    b_crit = float(fit.b_crit(loss))
    return {"batch_size": batch, "loss_optimal_batch": ref,
            "loss_optimal_is_smallest": i_ref == 0, "predicted_loss": loss,
            "predicted_best_loss": best, "loss_given_up": loss - best,
            "b_crit": b_crit, "tokens_over_min": factor,
            "steps_over_min": factor * b_crit / batch,
            "capped": len(over) == 0}


def cost_steepness(fit: ScalingFit, params: float, tokens: float, batch: float,
                   reference: float, overhead: float | None) -> float:
    """d ln(cost) / d ln B at `batch`: the cost the overhead (or, without one, the loss given
    up) above the loss-optimal `reference`; central differences over +-5% in B."""
    def cost(b: float) -> float:
        loss = float(fit.predict_loss(params, b, tokens)[0])
        if overhead is None:
            return loss - float(fit.predict_loss(params, reference, tokens)[0])
        return tokens / float(fit.tokens_to(loss, params, reference)) - 1

    up, down = cost(batch * 1.05), cost(batch / 1.05)
    if not (up > 0 and down > 0):
        return math.nan
    return math.log(up / down) / (2 * math.log(1.05))
