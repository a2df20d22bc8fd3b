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
simulation keeps that sharing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from critbatch.science.joint import (
    SHARED_FRACTION,
    Form,
    JointData,
    JointFit,
    draw_losses,
    fit_joint,
    model_center,
    plausible_sigma,
)

SIMULATIONS = 100  # data sets simulated with the model right, per check (smallest p: 1/101)
LEVEL = 0.05  # a statistic beyond its simulated 95th percentile counts


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
        """"sigmas too small", "model error" or "noise" (see the module docstring)."""
        if self.difference_p < LEVEL:
            return "sigmas too small"
        return "model error" if self.correlation_p < LEVEL else "noise"

    @property
    def sentence(self) -> str:
        """The verdict with its evidence, in words."""
        evidence = (f"the draws' difference: chi-square {self.difference_chi2:.1f} over "
                    f"{self.n_cells} cells, p = {self.difference_p:.2g}; their residuals' "
                    f"correlation r = {self.correlation:+.2f}, p = {self.correlation_p:.2g}; "
                    f"p simulated with the model right, {self.simulations} pairs")
        return {
            "sigmas too small": "the draws differ by more than their seed noise says: the "
                                "sigmas are too small, and the misfit may be noise",
            "model error": "the misfit is the model's own error: the draws agree within "
                           "their seed noise, yet each draw's residuals repeat in the other",
            "noise": "the misfit does not repeat across draws: it is noise, which more "
                     "seeds shrink",
        }[self.verdict] + f" ({evidence})"

    def as_dict(self) -> dict:
        return {"n_cells": self.n_cells, "difference_chi2": self.difference_chi2,
                "difference_dof": self.n_cells, "difference_p": self.difference_p,
                "residual_correlation": self.correlation,
                "residual_correlation_p": self.correlation_p,
                "chi2_per_dof": list(self.chi2_per_dof), "simulations": self.simulations,
                "verdict": self.verdict, "sentence": self.sentence}


def statistics(first: JointData, second: JointData, pairs: tuple[np.ndarray, np.ndarray],
               noise: tuple[np.ndarray, np.ndarray], fits: tuple[JointFit, JointFit]
               ) -> tuple[float, float]:
    """(difference chi-square, residual correlation) of two draws' shared cells `pairs`
    (indices into `first` and `second`), `noise` each draw's loss minus the truth (or minus
    the other's loss: only their difference counts), `fits` each draw's own fit."""
    i, j = pairs
    difference = float(np.sum((noise[0][i] - noise[1][j]) ** 2
                              / (first.sigma[i] ** 2 + second.sigma[j] ** 2)))
    a, b = fits[0].residuals[i], fits[1].residuals[j]
    if np.std(a) == 0 or np.std(b) == 0:
        return difference, 0.0
    return difference, float(np.corrcoef(a, b)[0, 1])


def check_draws(first: JointData, second: JointData, pairs: tuple[np.ndarray, np.ndarray],
                form: Form, simulations: int = SIMULATIONS, seed: int = 0,
                shared: float = SHARED_FRACTION) -> DrawCheck:
    """The two draws' check (module docstring): each fitted alone in `form`, then
    `simulations` pairs of draws simulated from those fits, refitted from them."""
    i, j = pairs
    if len(i) < 3:
        raise ValueError(f"two draws share {len(i)} cells; the check needs 3 or more")
    fits = (fit_joint(first, form=form), fit_joint(second, form=form))
    observed = statistics(first, second, pairs, (first.loss, second.loss), fits)
    rng = np.random.default_rng(seed)
    centers = (model_center(first, fits[0]), model_center(second, fits[1]))
    beyond, done = np.zeros(2), 0
    for _ in range(simulations):
        noise = tuple(draw_losses(rng, d, np.zeros(len(d)), 1.0, shared, plausible_sigma(rng, d))
                      for d in (first, second))
        again = tuple(fit_joint(d.with_loss(c + z), start=f.as_vector(), form=form)
                      for d, c, z, f in zip((first, second), centers, noise, fits, strict=True))
        if not all(f.success and np.isfinite(f.chi2) for f in again):
            continue
        done += 1
        beyond += np.array(statistics(first, second, pairs, noise, again)) >= np.array(observed)
    if done == 0:
        raise ValueError("no simulated pair of draws could be refitted")
    p_difference, p_correlation = (1 + beyond) / (1 + done)
    return DrawCheck(n_cells=len(i), difference_chi2=observed[0], difference_p=float(p_difference),
                     correlation=observed[1], correlation_p=float(p_correlation),
                     chi2_per_dof=(fits[0].chi2_per_dof, fits[1].chi2_per_dof),
                     simulations=done)
