"""How much would a bigger sweep pin the joint law's exponent?

A sweep whose 1/alpha_B interval is too wide leaves a user with a question the interval does
not answer: would twice the tokens, larger batches or more seeds fix it? This module answers
it from the fit itself. The linearised (Gauss-Newton) standard deviation of 1/alpha_B is
computed for the cells as measured and for the same design moved: every run k times longer
with batches j times larger (the same steps per run or more, so no cell falls under the
3x-warmup rule), or every cell at m times the seeds. Each cell's loss is the fitted model's
prediction there, its seed noise the measured one (divided by sqrt(m)): the projection
assumes the fitted law and form hold where the design moves to, and that the noise of one run
does not fall with more tokens (it does, a little, at this scale: the projection is on the
safe side there).

The linearised sd ignores the fit's nonlinearity, the misfit and the noise estimates' own
uncertainty, all of which the parametric bootstrap includes; so a plan's projected width is
the bootstrap's width now scaled by the ratio of the linearised sds (plan over the design as
measured, both at the model's losses). On the cpu sweeps (2026-12-02) the linearised width
times sqrt(chi2/dof) came within 15% of the bootstrap's width (AdamW 15.5 and 17.0 against
14.2 and 15.8; Muon 2.2 against 2.5), so the ratio carries the bootstrap's scale over to a
plan without the bootstrap's cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from critbatch.science.joint import JointData, JointFit, residuals

# (tokens x, batches x, seeds x): the same sweep longer with its batch grid moved up, and the
# same sweep at more seeds. Batches move with the tokens: with the batches fixed, the longer
# runs' B_crit moves past the largest batch and the law loses its overhead cells (Muon's cpu
# cells: 4x the tokens alone made the linearised sd 4.1x larger). No plan goes past 4x the
# tokens: the example curve's extrapolation is the projection's weakest part.
PLANS = ((2, 2, 1), (4, 4, 1), (1, 1, 4))
FD_STEP = 1e-5  # relative finite-difference step of the Jacobian


@dataclass(frozen=True)
class Plan:
    """A design moved from the one measured: every run `tokens` times longer at `batches`
    times the batch, every cell at `seeds` times the seeds."""

    tokens: float = 1.0
    batches: float = 1.0
    seeds: float = 1.0

    @property
    def label(self) -> str:
        parts = [f"x{self.tokens:g} tokens" if self.tokens != 1 else "",
                 f"x{self.batches:g} batches" if self.batches != 1 else "",
                 f"x{self.seeds:g} seeds" if self.seeds != 1 else ""]
        return ", ".join(p for p in parts if p) or "as measured"


def exponent_index(fit: JointFit) -> int:
    """The position of 1/alpha_B (the shared law's, the first width's for a per-width fit)
    in `JointFit.as_vector`."""
    n_widths, n_law = len(fit.l_inf), len(fit.gamma)
    return 3 * n_widths + n_law


def exponent_sd(data: JointData, fit: JointFit) -> float:
    """The linearised standard deviation of 1/alpha_B on `data` at `fit`'s parameters:
    sqrt of the exponent's entry of (J^T J)^-1, J the Jacobian of the weighted residuals
    (forward differences). No misfit scaling: the sd the seed noise alone allows. inf where
    the cells do not constrain the exponent at all."""
    theta = fit.as_vector()
    n_widths = len(fit.l_inf)

    def chi(t: np.ndarray) -> np.ndarray:
        return residuals(t, data, n_widths, fit.per_width, fit.form, steps=12)

    base = chi(theta)
    jac = np.empty((len(data), len(theta)))
    for k in range(len(theta)):
        step = FD_STEP * max(1.0, abs(theta[k]))
        moved = theta.copy()
        moved[k] += step
        jac[:, k] = (chi(moved) - base) / step
    cov = np.linalg.pinv(jac.T @ jac)
    var = float(cov[exponent_index(fit), exponent_index(fit)])
    return math.sqrt(var) if var > 0 and np.isfinite(var) else math.inf


def moved_design(data: JointData, fit: JointFit, plan: Plan = Plan()) -> JointData:
    """`data`'s cells moved by `plan`, each at the loss `fit` predicts there (no noise), its
    sigma divided by sqrt(plan.seeds), none an upper bound (a planned grid brackets its lrs).
    Cells whose predicted loss does not exist (the model never needs so few tokens) are
    dropped."""
    batch = data.batch * plan.batches
    tokens = data.tokens * plan.tokens
    loss = fit.predict_loss(data.width, batch, tokens)
    moved = replace(data, batch=batch, tokens=tokens, loss=loss,
                    sigma=data.sigma / math.sqrt(plan.seeds),
                    upper=np.zeros(len(data), dtype=bool))
    return moved.subset(np.isfinite(loss))


def projected_widths(data: JointData, fit: JointFit, width_now: float,
                     plans=PLANS, target: float | None = None) -> dict:
    """Each plan's projected 95% width of 1/alpha_B: `width_now` (the bootstrap's) times the
    plan's linearised sd over the measured design's (both at the model's losses). With
    `target`, also the seeds factor that would bring today's design to that width (sd falls
    as 1/sqrt(seeds))."""
    reference = exponent_sd(moved_design(data, fit), fit)
    rows = []
    for plan in (Plan(*p) for p in plans):
        moved = moved_design(data, fit, plan)
        ratio = exponent_sd(moved, fit) / reference if math.isfinite(reference) else math.nan
        rows.append({"plan": plan.label, "tokens_factor": plan.tokens,
                     "batch_factor": plan.batches, "seeds_factor": plan.seeds,
                     "n_cells": len(moved),
                     "log_loss_span": float(np.ptp(np.log(moved.loss))) if len(moved) else None,
                     "sd_ratio": ratio, "width_95": width_now * ratio})
    doc = {"method": "linearised sd, scaled to the bootstrap's width", "width_now": width_now,
           "plans": rows}
    if target:
        doc.update(target_width=target, seeds_for_target=(width_now / target) ** 2)
    return doc
