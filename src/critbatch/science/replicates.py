"""Is the joint model's misfit noise or the model's own error? Two independent draws tell.

docs/science.md, section 8 ("Noise or the model's error"). Where the joint model misfits its
cells (chi2/dof > 1) two readings predict different things (`science.precision`): excess
noise shrinks with more seeds, a shape the cells have and the model lacks does not. A sweep
trained again at another seed (`grid.seed`) measures every cell a second time,
independently, and separates the two:
- **difference**: the two draws' losses cell by cell, sum (L_1 - L_2)^2 / (sigma_1^2 +
  sigma_2^2) over the cells both measured. About one per cell if the seed sigmas are right;
  far more says the sigmas are too small (and then the misfit may be noise after all).
- **repeat**: the Pearson correlation of each cell's residual about its own draw's fit.
  Noise does not repeat across independent draws: with the model right the correlation is
  near 0; a form the cells do not follow leaves the same residuals in both.
Each statistic's p-value comes from data simulated with the model right: each draw's losses
redrawn around its fit's prediction with its seed noise (a trunk and its cooldown branches
sharing part of it, each noise estimate redrawn from its degrees of freedom, as in the
bootstrap), each draw refitted, both statistics recomputed. Within a draw the cells of one
trunk share noise, so a textbook p-value for r (independent pairs) would be too small; the
simulation keeps that sharing. A cell that is an upper bound in either draw (its best lr on
the grid's edge: a bound, not a measurement, and its residual one-sided) is left out of both
statistics. Two tests at LEVEL each: with the model right some verdict other than "noise"
comes out in about twice LEVEL of sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from critbatch.science.joint import (
    PLAIN,
    Form,
    JointData,
    JointFit,
    draw_losses,
)
from critbatch.science.joint_fit import fit_joint
from critbatch.science.joint_inference import fit_richer, model_center, plausible_sigma

SIMULATIONS = 100  # data sets simulated with the model right, per check (smallest p: 1/101)
LEVEL = 0.05  # a statistic beyond its simulated 95th percentile counts
MODEL_ERROR, SIGMAS_TOO_SMALL, NOISE = "model error", "sigmas too small", "noise"


@dataclass(frozen=True)
class DrawCheck:
    """The two statistics on the cells two draws share, with their simulated p-values."""

    n_cells: int
    difference_chi2: float  # sum over the shared cells of (L_1 - L_2)^2 / (s_1^2 + s_2^2)
    difference_p: float  # share of simulated draws differing at least as much
    correlation: float  # Pearson r of the cells' residuals about their own draw's fit
    correlation_p: float  # share of simulated pairs whose residuals correlate at least as much
    chi2_per_dof: tuple[float, float]  # each draw's own fit
    simulations: int  # simulated pairs whose refits converged

    @property
    def verdict(self) -> str:
        """MODEL_ERROR where the residuals repeat (r does not depend on the sigmas' scale, so
        this holds even where they are too small), else SIGMAS_TOO_SMALL where the draws
        differ by more than their sigmas say, else NOISE."""
        if self.correlation_p < LEVEL:
            return MODEL_ERROR
        return SIGMAS_TOO_SMALL if self.difference_p < LEVEL else NOISE

    @property
    def sentence(self) -> str:
        """The verdict with its evidence, in words."""
        evidence = (f"the draws' difference: chi-square {self.difference_chi2:.1f} over "
                    f"{self.n_cells} cells, p = {self.difference_p:.2g}; their residuals' "
                    f"correlation r = {self.correlation:+.2f}, p = {self.correlation_p:.2g}; "
                    f"p simulated with the model right, {self.simulations} pairs")
        differ = self.difference_p < LEVEL
        said = {
            MODEL_ERROR: "the misfit is the model's own error: each draw's residuals repeat "
                         "in the other" + ("; the draws also differ by more than their seed "
                                           "noise says (the sigmas are too small)" if differ
                                           else ", and the draws agree within their seed noise"),
            SIGMAS_TOO_SMALL: "the draws differ by more than their seed noise says: the "
                              "sigmas are too small, and a misfit may be noise",
            NOISE: "the residuals do not repeat across draws: a misfit is noise, which more "
                   "seeds shrink",
        }[self.verdict]
        return f"{said} ({evidence})"

    def as_dict(self) -> dict:
        return {"n_cells": self.n_cells, "difference_chi2": self.difference_chi2,
                "difference_dof": self.n_cells, "difference_p": self.difference_p,
                "residual_correlation": self.correlation,
                "residual_correlation_p": self.correlation_p,
                "chi2_per_dof": list(self.chi2_per_dof), "simulations": self.simulations,
                "verdict": self.verdict, "sentence": self.sentence}


def difference(first: JointData, second: JointData, pairs: tuple[np.ndarray, np.ndarray],
               deviations: tuple[np.ndarray, np.ndarray]) -> float:
    """sum (d_1 - d_2)^2 / (s_1^2 + s_2^2) over `pairs` (indices into `first` and
    `second`). `deviations`: the measured losses (both draws share one truth per cell, which
    cancels), or in a simulation the drawn noise alone (each draw's center is its own fit's
    prediction, and the two fits differ)."""
    i, j = pairs
    return float(np.sum((deviations[0][i] - deviations[1][j]) ** 2
                        / (first.sigma[i] ** 2 + second.sigma[j] ** 2)))


def correlation(fits: tuple[JointFit, JointFit], pairs: tuple[np.ndarray, np.ndarray]) -> float:
    """Pearson r of the paired cells' residuals, each about its own draw's fit (0 where one
    side has no spread)."""
    a, b = fits[0].residuals[pairs[0]], fits[1].residuals[pairs[1]]
    if np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def fit_in_form(data: JointData, form: Form, start: np.ndarray | None = None) -> JointFit:
    """One draw's fit with `form`'s terms: from `start` where given (a simulated draw, from
    its fit), else as `select_form` reaches that form (the plain fit, then `fit_richer`)."""
    if start is not None:
        return fit_joint(data, start=start, form=form)
    plain = fit_joint(data)
    return plain if form == PLAIN else fit_richer(data, plain, form)


def usable(fit: JointFit) -> bool:
    return bool(fit.success and np.isfinite(fit.chi2) and fit.dof > 0)


def check_draws(first: JointData, second: JointData, pairs: tuple[np.ndarray, np.ndarray],
                form: Form, simulations: int = SIMULATIONS, seed: int = 0,
                shared: float | None = None) -> DrawCheck:
    """The two draws' check (module docstring): each fitted alone in `form`, then
    `simulations` pairs of draws simulated from those fits, refitted from them. Raises
    ValueError where it cannot be made: under 3 shared cells measured (not bounds) in both,
    a draw whose fit fails or has no degrees of freedom left, no simulated pair refitted."""
    i, j = pairs
    measured = ~first.upper[i] & ~second.upper[j]
    pairs = (i[measured], j[measured])
    if measured.sum() < 3:
        raise ValueError(f"two draws share {int(measured.sum())} measured cells; the check "
                         "needs 3 or more")
    fits = (fit_in_form(first, form), fit_in_form(second, form))
    if not all(map(usable, fits)):
        raise ValueError("a draw's own fit failed or has no degrees of freedom left")
    observed = np.array([difference(first, second, pairs, (first.loss, second.loss)),
                         correlation(fits, pairs)])
    rng = np.random.default_rng(seed)
    centers = (model_center(first, fits[0]), model_center(second, fits[1]))
    beyond, done = np.zeros(2), np.zeros(2)
    for _ in range(simulations):
        noise = tuple(draw_losses(rng, d, np.zeros(len(d)), 1.0, shared, plausible_sigma(rng, d))
                      for d in (first, second))
        beyond[0] += difference(first, second, pairs, noise) >= observed[0]
        done[0] += 1
        again = tuple(fit_in_form(d.with_loss(c + z), form, start=f.as_vector())
                      for d, c, z, f in zip((first, second), centers, noise, fits, strict=True))
        if all(map(usable, again)):
            beyond[1] += correlation(again, pairs) >= observed[1]
            done[1] += 1
    if done[1] == 0:
        raise ValueError("no simulated pair of draws could be refitted")
    p_difference, p_correlation = (1 + beyond) / (1 + done)
    return DrawCheck(n_cells=len(pairs[0]), difference_chi2=float(observed[0]),
                     difference_p=float(p_difference), correlation=float(observed[1]),
                     correlation_p=float(p_correlation),
                     chi2_per_dof=(fits[0].chi2_per_dof, fits[1].chi2_per_dof),
                     simulations=int(done[1]))
