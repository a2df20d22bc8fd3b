"""critbatch.science.distributions against scipy.stats, which the analysis no longer imports
(its import took about half a second of every analysis process's start-up)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from critbatch.science import distributions as dist

PROBABILITIES = st.floats(1e-6, 1 - 1e-6)
DOFS = st.one_of(st.integers(1, 400).map(float), st.floats(0.05, 1e6))


def same(a, b) -> bool:
    """Equal to 1e-10 relative, or both NaN."""
    a, b = float(a), float(b)
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-10, abs=1e-300)


@settings(max_examples=300, deadline=None)
@given(q=PROBABILITIES, dof=DOFS)
def test_t_quantile_is_scipy_stats(q, dof):
    assert same(dist.t_quantile(q, dof), stats.t.ppf(q, dof))


@settings(max_examples=300, deadline=None)
@given(x=st.floats(-5, 1e4), dof=DOFS)
def test_chi2_tail_is_scipy_stats(x, dof):
    assert same(dist.chi2_sf(x, dof), stats.chi2.sf(x, dof))


@settings(max_examples=300, deadline=None)
@given(q=PROBABILITIES, dof=DOFS)
def test_chi2_quantile_is_scipy_stats(q, dof):
    assert same(dist.chi2_quantile(q, dof), stats.chi2.ppf(q, dof))


@settings(max_examples=300, deadline=None)
@given(q=PROBABILITIES, a=st.floats(0.05, 500), b=st.floats(0.05, 500))
def test_beta_quantile_is_scipy_stats(q, a, b):
    assert same(dist.beta_quantile(q, a, b), stats.beta.ppf(q, a, b))


def test_known_values_and_where_scipy_stats_gives_nan():
    """t's 97.5% point at infinite dof is the normal's 1.959964; chi-square with 1 dof puts
    5% above 3.841459; Clopper-Pearson's 0 of 10 reaches 0.308497 (1 - 0.025 ** 0.1)."""
    assert dist.t_quantile(0.975, math.inf) == pytest.approx(1.959963985, rel=1e-9)
    assert dist.chi2_quantile(0.95, 1) == pytest.approx(3.841458821, rel=1e-9)
    assert dist.chi2_sf(3.841458821, 1) == pytest.approx(0.05, rel=1e-8)
    assert dist.chi2_sf(-1.0, 2) == 1.0 and dist.chi2_sf(math.inf, 2) == 0.0
    assert dist.beta_quantile(0.975, 1, 10) == pytest.approx(1 - 0.025 ** 0.1, rel=1e-9)
    for dof in (0.0, -1.0, math.nan):  # scipy.stats: NaN
        assert math.isnan(dist.chi2_sf(2.0, dof)) and math.isnan(dist.t_quantile(0.9, dof))
        assert math.isnan(dist.chi2_quantile(0.5, dof))
        assert math.isnan(dist.beta_quantile(0.5, dof, 1))
    arrays = dist.chi2_quantile(0.025, np.array([1.0, 4.0, 30.0]))
    assert np.allclose(arrays, stats.chi2.ppf(0.025, [1.0, 4.0, 30.0]), rtol=1e-12, atol=0)
