"""Quantiles and tail probabilities of Student's t, the chi-square and the beta distribution,
from scipy.special: the functions scipy.stats evaluates them with, equal to its answers
(tests/test_distributions.py), without importing scipy.stats, which took about half a second
of every analysis process's start-up (fit_bcrit, recommend, a sweep's report). Each takes
numbers or arrays, and gives NaN where scipy.stats does (a dof that is not positive)."""

from __future__ import annotations

import numpy as np
from scipy import special


def t_quantile(q, dof):
    """`scipy.stats.t.ppf(q, dof)`: the q-quantile of Student's t with `dof` degrees of
    freedom (infinite dof: the normal's)."""
    return special.stdtrit(dof, q)


def chi2_sf(x, dof):
    """`scipy.stats.chi2.sf(x, dof)`: P(X > x) for a chi-square X with `dof` degrees of
    freedom (1 for any x <= 0)."""
    dof = np.asarray(dof, float)
    p = special.chdtrc(dof, np.maximum(x, 0.0))
    return np.where(dof > 0, p, np.nan)[()]


def chi2_quantile(q, dof):
    """`scipy.stats.chi2.ppf(q, dof)`: the q-quantile of a chi-square with `dof` degrees of
    freedom."""
    return 2.0 * special.gammaincinv(np.asarray(dof, float) / 2.0, q)


def beta_quantile(q, a, b):
    """`scipy.stats.beta.ppf(q, a, b)`: the q-quantile of the beta distribution."""
    return special.betaincinv(a, b, q)
