"""How much would a bigger sweep pin the joint law's exponent?

A sweep whose 1/alpha_B interval is too wide leaves a user with a question the interval does
not answer: would longer runs, larger batches or more seeds fix it? This module answers it
from the fit itself. The linearised (Gauss-Newton) standard deviation of 1/alpha_B is
computed for the cells as measured and for the same design moved (`Plan`): every run k times
longer with batches at most k times larger (each cell keeps at least its steps, so none falls
under the 3x-warmup rule), or every cell at m times the seeds. Each moved cell's loss is the
fitted model's prediction there and its sigma the measured cell's (divided by sqrt(m)): the
projection assumes the fitted law and form hold where the design moves to, and it does not
follow the seed noise's trend in tokens (at this scale one run's noise falls with tokens, so
longer plans are projected on the wide side) or extrapolate it to batches never measured.

The linearised sd leaves out the fit's nonlinearity and the noise estimates' own uncertainty,
which the parametric bootstrap includes; so a plan's projected width is the bootstrap's width
now times the ratio of the linearised sds (plan over the design as measured, both at the
model's losses). The bootstrap also widens the noise by sqrt(chi2/dof) = s where the model
misfits. If that excess scatter is noise it shrinks with the seed noise (`width_95`); if it
is the model's own error it does not, and the width has a floor (`width_95_misfit_kept`:
the share 1 - 1/s^2 of today's variance stays). The two agree where s = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from critbatch.science.joint import JointData, JointFit, noise_scale
from critbatch.science.joint_fit import residual_jacobian

# (tokens x, batches x, seeds x): the same sweep longer with its batch grid moved up alike,
# and the same sweep at more seeds. Batches move with the tokens: with the batches fixed,
# longer runs move B_crit past the largest batch and the law loses its overhead cells. No
# plan goes past 4x the tokens: the example curve's extrapolation is the projection's
# weakest part.
PLANS = ((2, 2, 1), (4, 4, 1), (1, 1, 4))
NEWTON_STEPS = 12  # as many as the fit's final residuals (8) and more: the Jacobian's accuracy
RANK_TOLERANCE = 1e-9  # singular values below this share of the largest count as zero


@dataclass(frozen=True)
class Plan:
    """A design moved from the one measured: every run `tokens` times longer at `batches`
    times the batch (at most `tokens`: no cell trains fewer steps), every cell at `seeds`
    times the seeds."""

    tokens: float = 1.0
    batches: float = 1.0
    seeds: float = 1.0

    def __post_init__(self):
        if not (self.tokens >= 1 and 1 <= self.batches <= self.tokens and self.seeds >= 1):
            raise ValueError(f"a plan moves the design up: tokens >= batches >= 1 and "
                             f"seeds >= 1 (got {self})")

    @property
    def label(self) -> str:
        parts = [f"x{self.tokens:g} tokens" if self.tokens != 1 else "",
                 f"x{self.batches:g} batches" if self.batches != 1 else "",
                 f"x{self.seeds:g} seeds" if self.seeds != 1 else ""]
        return ", ".join(p for p in parts if p) or "as measured"


def exponent_index(fit: JointFit) -> int:
    """The position of 1/alpha_B (the shared law's, the first width's for a per-width fit)
    in `JointFit.as_vector`: after l_inf, ln a, ln alpha (one per width) and ln B* (one per
    law); the optional terms come after it."""
    return 3 * len(fit.l_inf) + len(fit.gamma)


def exponent_sd(data: JointData, fit: JointFit) -> float:
    """The linearised standard deviation of 1/alpha_B on `data` at `fit`'s parameters: the
    exponent's entry of (J^T J)^-1, J the Jacobian of the weighted residuals (analytic,
    `science.joint_fit.residual_jacobian`), from J's singular values. No misfit scaling: the sd
    the seed noise alone allows. inf where the cells do not pin the exponent: fewer cells
    than parameters, a non-finite Jacobian, or the exponent moving along a direction the
    cells do not see."""
    theta = fit.as_vector()
    if len(data) < len(theta) or not np.isfinite(theta).all():
        return math.inf
    jac = residual_jacobian(theta, data, len(fit.l_inf), fit.per_width, fit.form,
                            steps=NEWTON_STEPS)
    if not np.isfinite(jac).all() or not np.abs(jac).max() > 0:
        return math.inf
    _, singular, vt = np.linalg.svd(jac, full_matrices=False)
    seen = singular > RANK_TOLERANCE * singular[0]
    column = vt[:, exponent_index(fit)]  # the exponent's share of each singular direction
    if np.any(np.abs(column[~seen]) > 1e-6):
        return math.inf
    return float(math.sqrt(np.sum((column[seen] / singular[seen]) ** 2)))


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


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def misfit_kept(width: float, ratio: float, scale: float) -> float:
    """A plan's width if the excess scatter (s = `scale` > 1) is the model's error: today's
    variance is 1/s^2 noise, which the plan scales by ratio^2, and 1 - 1/s^2 that stays."""
    return width * math.sqrt(ratio**2 / scale**2 + 1 - 1 / scale**2)


def seeds_for(width: float, target: float, scale: float) -> tuple[float, float | None]:
    """The seeds factor that brings `width` to `target`, if the excess scatter shrinks with
    the seeds, and if it stays (None: no number of seeds reaches the target). A width of 0
    (every refit alike) needs no more seeds either way."""
    if width <= 0:
        return 0.0, 0.0
    noise = (width / target) ** 2
    share = (target / width) ** 2 - (1 - 1 / scale**2)  # noise variance the target leaves
    return noise, (1 / scale**2) / share if share > 0 else None


def projected_widths(data: JointData, fit: JointFit, width_now: float,
                     plans: tuple[tuple[float, float, float], ...] = PLANS,
                     target: float | None = None) -> dict:
    """Each plan's projected 95% width of 1/alpha_B: `width_now` (the bootstrap's) times the
    plan's linearised sd over the measured design's (both at the model's losses), and the
    same with the misfit kept (`misfit_kept`). With `target`, also the seeds factors that
    would bring today's design to that width (`seeds_for`). Widths are None where the
    design as measured does not pin the exponent (its linearised sd is infinite)."""
    scale = noise_scale(fit)
    reference = exponent_sd(moved_design(data, fit), fit)
    doc = {"method": "linearised sd, scaled to the bootstrap's width", "width_now": width_now,
           "noise_scale": scale, "plans": []}
    if not math.isfinite(reference):
        doc["note"] = "the design as measured does not pin the exponent (linearised sd infinite)"
        return doc
    for plan in (Plan(*p) for p in plans):
        moved = moved_design(data, fit, plan)
        ratio = exponent_sd(moved, fit) / reference
        doc["plans"].append({
            "plan": plan.label, "tokens_factor": plan.tokens, "batch_factor": plan.batches,
            "seeds_factor": plan.seeds, "n_cells": len(moved),
            "log_loss_span": float(np.ptp(np.log(moved.loss))) if len(moved) else None,
            "sd_ratio": finite_or_none(ratio), "width_95": finite_or_none(width_now * ratio),
            "width_95_misfit_kept": finite_or_none(misfit_kept(width_now, ratio, scale))})
    if target is not None:
        noise, kept = seeds_for(width_now, target, scale)
        doc.update(target_width=target, seeds_for_target=noise,
                   seeds_for_target_misfit_kept=kept)
    return doc
