"""The science layer against known answers: weighted Kaplan fits, the run bootstrap, Pareto
degeneracy and nominal budgets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from critbatch.science import laws
from critbatch.science.fits import fit_log_linear, nominal_budgets
from critbatch.science.laws import bootstrap_kaplan, fit_kaplan, fit_pareto, pareto_degeneracy


def kaplan_world(exponent: float, b_star: float, n_runs: int, scatter: float, seed: int):
    """Points B_crit = B* / L^exponent x lognormal scatter, two points per run."""
    rng = np.random.default_rng(seed)
    losses = np.repeat(np.linspace(3.0, 5.5, n_runs), 2) + rng.normal(0, 0.02, 2 * n_runs)
    b_tokens = b_star / losses**exponent * np.exp(rng.normal(0, scatter, 2 * n_runs))
    units = [f"run{i // 2}" for i in range(2 * n_runs)]
    return losses, b_tokens, units


def test_weighted_fit_equals_ordinary_fit_with_equal_weights():
    x, y = [0.0, 1.0, 2.0, 3.5], [1.0, 2.9, 5.2, 8.0]
    plain, weighted = fit_log_linear(x, y), fit_log_linear(x, y, sigma=[0.3] * 4)
    for key in ("intercept", "slope", "intercept_sd", "slope_sd"):
        assert weighted[key] == pytest.approx(plain[key], rel=1e-12)


def test_weights_ignore_a_point_whose_uncertainty_is_huge():
    x, y = np.arange(6.0), 2.0 + 0.5 * np.arange(6.0)
    y[5] += 10.0  # an outlier ...
    sigma = np.ones(6)
    sigma[5] = 1e6  # ... that says it knows nothing
    fit = fit_log_linear(x, y, sigma)
    assert fit["slope"] == pytest.approx(0.5, abs=1e-6)
    assert fit["intercept"] == pytest.approx(2.0, abs=1e-6)


def test_kaplan_constant_bcrit_gives_exponent_zero_and_a_bootstrap_interval_around_it():
    losses, b_tokens, units = kaplan_world(0.0, 5e4, n_runs=12, scatter=0.1, seed=1)
    fit = fit_kaplan(losses, b_tokens)
    assert abs(fit["exponent"]) < 0.3
    boot = bootstrap_kaplan(losses, b_tokens, units, resamples=500)
    assert boot["exponent_low"] < 0 < boot["exponent_high"]
    assert boot["exponent_low"] < fit["exponent"] < boot["exponent_high"]
    assert boot["n_units"] == 12 and boot["resamples"] == 500
    assert "bootstrap over 12 runs" in boot["interval"]


def test_pooling_a_different_quantity_biases_the_exponent():
    """The reason noise points get their own fit: two B_noise points at 10x a constant B_crit,
    at the two lowest losses, pull a pooled fit far from the planted exponent 0."""
    losses, b_tokens, _ = kaplan_world(0.0, 5e4, n_runs=12, scatter=0.05, seed=2)
    pooled = fit_kaplan(np.r_[losses, 2.9, 3.0], np.r_[b_tokens, 5e5, 5e5])
    assert abs(fit_kaplan(losses, b_tokens)["exponent"]) < 0.3
    assert pooled["exponent"] > 1.0


def test_bootstrap_interval_covers_the_planted_exponent_in_most_worlds():
    covered = 0
    for seed in range(20):
        losses, b_tokens, units = kaplan_world(4.8, 2e8, n_runs=10, scatter=0.3, seed=seed)
        boot = bootstrap_kaplan(losses, b_tokens, units, resamples=400, seed=seed)
        covered += boot["exponent_low"] <= 4.8 <= boot["exponent_high"]
    assert covered >= 16  # nominal 95%: 19 of 20 expected; 16 allows for a few-unit bootstrap


def test_with_fewer_than_six_units_the_interval_is_the_range_of_per_unit_estimates():
    """Unit a halves B_crit from loss 3 to 4 (1/alpha_B = ln 2 / ln(4/3) = 2.41), unit b from
    5 to 6 (ln 2 / ln 1.2 = 3.80); unit c has one loss only and gives no estimate."""
    losses, b_tokens = [3.0, 4.0, 5.0, 6.0, 4.5], [1e5, 5e4, 2e4, 1e4, 3e4]
    units = ["a", "a", "b", "b", "c"]
    boot = bootstrap_kaplan(losses, b_tokens, units, unit_name="runs")
    assert laws.MIN_BOOTSTRAP_UNITS == 6 and boot["n_units"] == 3 and boot["resamples"] == 0
    assert boot["exponent_low"] == pytest.approx(math.log(2) / math.log(4 / 3))
    assert boot["exponent_high"] == pytest.approx(math.log(2) / math.log(1.2))
    a_star, b_star = 1e5 * 3.0 ** boot["exponent_low"], 2e4 * 5.0 ** boot["exponent_high"]
    assert boot["b_star_tokens_low"] == pytest.approx(min(a_star, b_star))
    assert boot["b_star_tokens_high"] == pytest.approx(max(a_star, b_star))
    assert boot["interval"] == ("range of 2 per-unit estimates over 3 runs (fewer than 6 "
                                "independent units: no percentile interval)")
    # one estimate is no range, and units of one loss each give none
    one = bootstrap_kaplan(losses[:2] + [5.0], b_tokens[:2] + [2e4], ["a", "a", "b"])
    assert one["exponent_low"] is None and "one per-unit estimate over 2 runs" in one["interval"]
    none = bootstrap_kaplan(losses, b_tokens, ["a", "b", "c", "d", "e"])
    assert none["exponent_low"] is None and none["interval"].startswith(
        "none: no unit of the 5 runs has points at two losses")


def test_a_bootstrap_over_few_single_point_units_says_it_undercovers():
    losses, b_tokens, units = kaplan_world(4.8, 2e8, n_runs=4, scatter=0.3, seed=0)
    single = [f"{u}#{i}" for i, u in enumerate(units)][:4]
    boot = bootstrap_kaplan(losses[:4], b_tokens[:4], single, resamples=200, min_units=3)
    assert boot["exponent_low"] is not None and boot["resamples"] > 100
    assert boot["interval"].endswith("(fewer than 6 units: it covers less than 95%)")
    losses, b_tokens, units = kaplan_world(4.8, 2e8, n_runs=6, scatter=0.3, seed=0)
    six = bootstrap_kaplan(losses, b_tokens, units, resamples=200)
    assert six["interval"] == "95% percentile bootstrap over 6 runs"


def test_pareto_degeneracy_names_what_is_wrong():
    batches = np.array([16, 32, 64, 128, 256])
    steps = 1000 + 64_000 / batches  # S_min = 1000 steps, E_min = 64k sequences
    good = fit_pareto(batches, steps * np.array([1.01, 0.99, 1.0, 1.01, 0.99]))
    assert good["b_crit"] == pytest.approx(64.0, rel=0.1)
    assert pareto_degeneracy(good) is None
    negative = fit_pareto(batches, 64_000 / batches - 50)  # steps fall faster than 1/B
    assert "not both positive" in pareto_degeneracy(negative)
    wide = dict(good, b_crit_low=1e-3, b_crit_high=1e9)
    assert "spans more than a factor 100" in pareto_degeneracy(wide)
    assert pareto_degeneracy(dict(good, b_crit_low=None, b_crit_high=None)) == (
        "B_crit interval unbounded")


def test_nominal_budgets_join_counts_within_one_percent():
    tokens = [1_499_648, 1_499_136, 1_499_136, 3_000_000, 2_999_000, 750_000]
    nominal = nominal_budgets(tokens)
    assert nominal[1_499_136] == nominal[1_499_648] == 1_499_648
    assert nominal[2_999_000] == nominal[3_000_000] == 3_000_000
    assert nominal[750_000] == 750_000
    assert len(set(nominal.values())) == 3


def test_kaplan_prediction_survives_a_wild_fit():
    """Few points at nearly one loss can give an exponent in the hundreds: the prediction is
    None where it overflows, 0 where it underflows, never a ZeroDivisionError."""
    from critbatch.science.laws import kaplan_prediction_tokens

    assert kaplan_prediction_tokens(3.0, 2e8, 4.8) == pytest.approx(2e8 / 3.0**4.8)
    assert kaplan_prediction_tokens(5.0, 1e-300, 800.0) == 0.0
    assert kaplan_prediction_tokens(0.5, 1e10, 2000.0) is None
    assert kaplan_prediction_tokens(3.0, None, 4.8) is None
    assert kaplan_prediction_tokens(3.0, 1e5, None) is None


@pytest.mark.slow
def test_noise_trend_recovers_a_planted_slope_and_pools_a_flat_noise():
    """Sample variances drawn from sd(E) = 0.05 (E / 5e5)^-0.8 (6 dof per budget, 5 budgets):
    the slope comes back within its scatter and is kept; from a flat sd of 0.02 the test
    keeps no slope in about 99% of draws (its level, NOISE_TREND_P) and the sd is the
    pooled one."""
    from critbatch.science.fits import fit_noise_trend

    rng = np.random.default_rng(0)
    tokens = np.array([187_500, 375_000, 750_000, 1_125_000, 1_500_000], dtype=float)
    truth = 0.05 * (tokens / 5e5) ** -0.8
    slopes, kept = [], 0
    for _ in range(200):
        v = truth**2 * rng.chisquare(6, size=5) / 6
        trend = fit_noise_trend(tokens, v, [6] * 5)
        kept += trend.slope != 0
        slopes.append(trend.slope)
    assert kept >= 190
    assert np.median(slopes) == pytest.approx(-0.8, abs=0.1)
    flat_kept = 0
    for _ in range(400):
        v = 0.02**2 * rng.chisquare(6, size=5) / 6
        trend = fit_noise_trend(tokens, v, [6] * 5)
        flat_kept += trend.slope != 0
    assert flat_kept <= 12  # nominal 1% of 400 = 4
    v = [4e-4, 1e-4]
    flat = fit_noise_trend([1e5, 4e5], v, [1, 1])  # 2 dof: too few to test a slope
    assert flat.slope == 0 and flat.p_value is None
    assert flat.sd(1e5) == pytest.approx(np.sqrt(np.mean(v)))


@pytest.mark.slow
def test_noise_split_keeps_per_batch_trends_only_where_the_batches_differ():
    """Three batches' sample variances (2 dof per budget, 5 budgets, as the cpu sweep's three
    seeds): one batch 10x noisier (AdamW at cpu scale: 0.006 against 0.125 at 1.5M tokens) is
    found in nearly every draw and each batch gets its own sd; equal batches stay pooled in
    about 95% of draws."""
    from critbatch.science.fits import fit_noise_split

    rng = np.random.default_rng(1)
    tokens = np.array([187_500, 375_000, 750_000, 1_125_000, 1_500_000], dtype=float)

    def draw(sds):
        return {b: (tokens, sd**2 * rng.chisquare(2, size=5) / 2, [2] * 5)
                for b, sd in sds.items()}

    split_found, ratios = 0, []
    for _ in range(100):
        split = fit_noise_split(draw({8: 0.01, 32: 0.1, 64: 0.01}))
        split_found += bool(split.by_key)
        if split.by_key:
            ratios.append(float(split.sd(32, 1e6) / split.sd(8, 1e6)))
    assert split_found >= 95
    assert np.median(ratios) == pytest.approx(10, rel=0.3)
    pooled = 0
    for _ in range(200):
        split = fit_noise_split(draw({8: 0.02, 32: 0.02, 64: 0.02}))
        pooled += not split.by_key
        assert split.sd(32, 1e6) == split.pooled.sd(1e6) or split.by_key
    assert pooled >= 180  # nominal 95% of 200 = 190
    one = fit_noise_split(draw({8: 0.02}))
    assert one.p_value is None and not one.by_key
    assert one.sd(128, 1e6) == one.pooled.sd(1e6)  # a batch without seeds: the pooled sd


def test_noise_trend_holds_its_end_values_outside_the_measured_budgets():
    from critbatch.science.fits import NoiseTrend

    trend = NoiseTrend(sd_ref=0.02, slope=-1.0, ref_tokens=4e5, low_tokens=2e5,
                       high_tokens=8e5, dof=10, p_value=0.01)
    assert trend.sd(4e5) == pytest.approx(0.02)
    assert trend.sd(1e5) == pytest.approx(0.04) == trend.sd(2e5)
    assert trend.sd(1.6e6) == pytest.approx(0.01)


def test_a_noise_estimates_effective_dof_counts_correlated_budgets_once_in_part():
    """k budgets of one run, sharing `shared` of its variance, count as k / (1 + (k - 1)
    shared^2) samples; a fitted slope costs one; a trend counts its budgets itself."""
    from critbatch.science.fits import NoiseTrend, fit_noise_trend

    def trend(budgets, slope=0.0):
        return NoiseTrend(sd_ref=0.02, slope=slope, ref_tokens=4e5, low_tokens=2e5,
                          high_tokens=8e5, dof=10, p_value=None, budgets=budgets)

    assert trend(5).effective_dof(0.5) == pytest.approx(5.0)  # 10 / (1 + 4 x 0.25)
    assert trend(5, slope=-0.5).effective_dof(0.5) == pytest.approx(4.0)
    assert trend(1).effective_dof(0.5) == trend(5).effective_dof(0.0) == pytest.approx(10.0)
    assert trend(40).effective_dof(1.0) == 1.0  # never below one
    # branches of one budget at slightly different tokens (whole steps per batch) are one
    fitted = fit_noise_trend([187392, 186368, 374784, 372736], [4e-4] * 4, [2] * 4)
    assert fitted.budgets == 2 and fitted.dof == 8

