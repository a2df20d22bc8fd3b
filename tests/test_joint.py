"""The joint model (science.joint) against worlds planted from it: exact recovery without
noise, the loss-alone test in both directions, and the bootstrap interval's coverage."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from critbatch.science.joint import (
    SHARED_FRACTION,
    Form,
    JointData,
    above_baseline,
    log_tokens_at,
    log_tokens_model,
)
from critbatch.science.joint_fit import finite, fit_joint
from critbatch.science.joint_inference import (
    bootstrap_joint,
    extra_term_test,
    loss_alone_test,
    prediction_spread,
    select_form,
)
from critbatch.science.joint_planted import PlantedWorld, planted_world

# Two optimizers as the issue planted them: Kaplan's 4.8 and a flatter 3.5, each with
# B_crit = 40 sequences at 6.5 nats/token (the cpu sweep's high-loss cells)
WORLDS = {"adamw": PlantedWorld(gamma=4.8, b_star=40 * 6.5**4.8),
          "muon": PlantedWorld(gamma=3.5, b_star=40 * 6.5**3.5, l_inf=(0.9, 0.7, 0.5))}


@pytest.mark.parametrize("optimizer", sorted(WORLDS))
def test_noiseless_world_gives_the_planted_exponent(optimizer):
    world = WORLDS[optimizer]
    fit = fit_joint(planted_world(world))
    assert fit.success
    assert abs(fit.exponent - world.gamma) < 0.3
    assert fit.b_star[0] == pytest.approx(world.b_star, rel=0.05)
    assert fit.chi2_per_dof < 1e-6


def test_a_fit_on_the_exponents_bound_gets_no_interval():
    """gamma on its fitting bound is unresolved: no percentile interval (one cut by the bound
    would look like a measurement), no prediction spread; off the bound both exist."""
    from critbatch.science.joint import GAMMA_BOUNDS

    data = planted_world(WORLDS["muon"], rng=np.random.default_rng(3))
    fit = fit_joint(data)
    assert not fit.at_bound
    for edge in GAMMA_BOUNDS:
        stuck = replace(fit, gamma=np.array([edge]))
        assert stuck.at_bound
        boot = bootstrap_joint(data, stuck, resamples=50)
        assert boot.exponent_low is None and boot.resamples == 0
        assert boot.interval.startswith("none: 1/alpha_B sits on its bound")
        assert np.isnan(prediction_spread(data, stuck, 0, 64, 1e6)).all()
    assert bootstrap_joint(data, fit, resamples=12).exponent_low is not None


def test_predicted_loss_inverts_the_model():
    truth = WORLDS["adamw"].fit()
    width, batch = np.array([0, 1, 2, 0]), np.array([8.0, 32.0, 128.0, 64.0])
    loss = np.array([5.1, 4.6, 5.9, 4.4])
    tokens = np.exp(truth.log_tokens(loss, width, batch)[0])
    assert truth.predict_loss(width, batch, tokens) == pytest.approx(loss, abs=1e-9)
    # B_crit is the batch that costs twice E_min
    b = truth.b_crit(np.array([5.0]))
    assert np.exp(truth.log_tokens(np.array([5.0]), np.array([0]), b)[0]) == pytest.approx(
        2 * truth.e_min(np.array([5.0]), np.array([0])))


def test_loss_alone_holds_for_a_shared_law_and_fails_for_one_per_width():
    rng = np.random.default_rng(3)
    data = planted_world(WORLDS["adamw"], rng=rng)
    shared = loss_alone_test(fit_joint(data), fit_joint(data, per_width=True))
    assert shared["holds"] and shared["extra_parameters"] == 4

    # the widest model's cells from a world whose B_crit is 4x larger at the same loss
    other = planted_world(PlantedWorld(gamma=4.8, b_star=4 * 40 * 6.5**4.8), rng=rng)
    mixed = np.where(data.width == 2, other.loss, data.loss)
    split = data.with_loss(mixed)
    test = loss_alone_test(fit_joint(split), fit_joint(split, per_width=True))
    assert test["holds"] is False and test["p_value"] < 1e-3


def test_small_batch_term_is_kept_only_where_the_data_demand_it():
    """A world whose batch 8 costs (1 + 4/8) more tokens (B_s = 4 sequences) keeps the term
    and recovers B_s and the exponent; the plain world does not keep it."""
    rng = np.random.default_rng(7)
    plain = planted_world(WORLDS["adamw"], rng=rng)
    test = extra_term_test(fit_joint(plain), fit_joint(plain, form=Form(small_batch=True)))
    assert test["kept"] is False

    truth = WORLDS["adamw"].fit()
    truth.form, truth.b_small = Form(small_batch=True), 4.0
    data = planted_world(WORLDS["adamw"])
    lossy = truth.predict_loss(data.width, data.batch, data.tokens)
    noisy = data.with_loss(lossy + 0.0125 * rng.standard_normal(len(lossy)))
    richer = fit_joint(noisy, form=Form(small_batch=True))
    test = extra_term_test(fit_joint(noisy), richer)
    assert test["kept"] and test["chi2_per_dof_with"] < test["chi2_per_dof_without"]
    assert richer.b_small == pytest.approx(4.0, rel=0.5)
    assert abs(richer.exponent - 4.8) < 0.5


def test_the_small_batch_fit_recovers_a_term_its_plain_start_misses():
    """A small-batch term that bends the loss against batch (planted B_s 12 sequences with
    batches 4-128): `fit_richer` tries the plain fit's start and fresh ones and keeps the
    better; B_s stays within the batches' geometric middle (`b_small_max`)."""
    from critbatch.science.joint_fit import b_small_max
    from critbatch.science.joint_inference import fit_richer

    truth = WORLDS["muon"].fit()
    truth.form, truth.b_small = Form(small_batch=True), 12.0
    data = planted_world(WORLDS["muon"], batches=(4, 8, 16, 32, 64, 128))
    noisy = data.with_loss(truth.predict_loss(data.width, data.batch, data.tokens)
                           + 0.0125 * np.random.default_rng(5).standard_normal(len(data)))
    plain = fit_joint(noisy)
    richer = fit_richer(noisy, plain, Form(small_batch=True))
    assert richer.small_batch and richer.b_small == pytest.approx(12.0, rel=0.3)
    assert richer.chi2_per_dof < 2 and extra_term_test(plain, richer)["kept"]
    assert b_small_max(noisy) == pytest.approx((4 * 128) ** 0.5)
    assert fit_joint(noisy, form=Form(small_batch=True)).b_small <= b_small_max(noisy) + 1e-9


POWER_WORLD = PlantedWorld(gamma=4.8, b_star=40 * 6.5**4.8, power=0.7)


def test_a_term_value_without_its_term_is_refused():
    """p = 0.7 or B_s = 4 with a form that lacks the term would be silently ignored."""
    truth = WORLDS["adamw"].fit()
    with pytest.raises(ValueError, match="need a form with those terms"):
        replace(truth, power=0.7)
    with pytest.raises(ValueError, match="need a form with those terms"):
        replace(truth, b_small=4.0)
    assert replace(truth, power=0.7, form=Form(power=True)).power == 0.7


def test_noiseless_power_world_gives_the_planted_power_and_exponent():
    """E/E_min = 1 + (B/B_crit)^0.7: the fit with the power recovers p and 1/alpha_B; B_crit
    keeps its meaning (twice the minimal tokens) whatever p is."""
    data = planted_world(POWER_WORLD)
    fit = fit_joint(data, form=Form(power=True))
    assert fit.success and fit.chi2_per_dof < 1e-6
    assert fit.power == pytest.approx(0.7, abs=0.02)
    assert abs(fit.exponent - 4.8) < 0.3
    truth = POWER_WORLD.fit()
    b = truth.b_crit(np.array([5.0]))
    assert np.exp(truth.log_tokens(np.array([5.0]), np.array([0]), b)[0]) == pytest.approx(
        2 * truth.e_min(np.array([5.0]), np.array([0])))


def test_select_form_keeps_the_power_only_where_the_data_demand_it():
    """cpu-like noise (0.0125 nats/token, known): the power world keeps p (near 0.7) and not
    the small-batch factor; the plain world keeps neither. With known sigmas the simulated
    test does not run."""
    rng = np.random.default_rng(11)
    fit, tests = select_form(planted_world(POWER_WORLD, rng=rng))
    assert fit.form == Form(power=True) and tests["power"]["kept"]
    assert tests["power"]["p_value_simulated"] is None
    assert not tests["small_batch"]["kept"]
    assert fit.power == pytest.approx(0.7, abs=0.1)
    assert tests["power"]["chi2_per_dof_without"] > 2 > tests["power"]["chi2_per_dof_with"]
    fit, tests = select_form(planted_world(WORLDS["adamw"], rng=rng))
    assert fit.form == Form() and not any(t["kept"] for t in tests.values())


def test_build_indexes_widths_and_trunks():
    data = JointData.build([64, 32, 64], [8, 8, 16], [1e5, 1e5, 1e5], [5.0, 5.2, 5.1],
                           [0.01] * 3, ["runA", "runB", "runA"])
    assert data.widths == (32, 64)
    assert data.width.tolist() == [1, 0, 1] and data.unit.tolist() == [0, 1, 0]


@pytest.mark.parametrize("planted", [0.0, 0.3, 0.7])
def test_trunk_sharing_recovers_the_planted_share_whatever_each_lr_s_scatter(planted):
    """40 sweeps of 10 (batch, lr) trunks at 3 seeds and 5 budgets, each trunk's noise
    planted as sqrt(s) u_trunk + sqrt(1 - s) e_cell, its scale drawn over 40x (a stable lr
    and an unstable one) and falling with the budget: the estimate's mean lies within 0.08 of
    the planted share (a scale from the whole block, not its unshared part, gave 0.38 for 0.5;
    no scaling leaves the unstable trunks to decide, at twice the spread)."""
    from critbatch.science.fits import trunk_sharing

    rng = np.random.default_rng(7)
    by_budget = np.array([2.0, 1.4, 1.1, 1.0, 1.0])
    estimates = []
    for _ in range(40):
        blocks = []
        for _ in range(10):
            scale = math.exp(rng.uniform(math.log(0.005), math.log(0.2)))
            z = (math.sqrt(planted) * rng.standard_normal((3, 1))
                 + math.sqrt(1 - planted) * rng.standard_normal((3, 5)))
            blocks.append(((1, 2, 3, 4, 5), 4.0 + scale * by_budget * z))
        sharing = trunk_sharing(blocks)
        assert sharing.dof == 20 and sharing.trunks == 10 and sharing.pairs == 10
        estimates.append(sharing.fraction)
    assert abs(np.mean(estimates) - planted) < 0.08, np.mean(estimates)


def test_trunk_sharing_needs_enough_seeds_and_stops_short_of_one():
    from critbatch.science.fits import MAX_SHARING, MIN_SHARING_DOF, trunk_sharing

    same = np.array([[4.0, 3.0], [4.1, 3.1], [3.9, 2.9]])  # seeds differ by one offset
    assert trunk_sharing([((1, 2), same)]) is None  # 2 dof < MIN_SHARING_DOF
    full = trunk_sharing([((1, 2), same)] * MIN_SHARING_DOF)
    assert full.fraction == MAX_SHARING and full.dof == 2 * MIN_SHARING_DOF
    one_budget = [((1,), np.array([[4.0], [4.1]]))] * 10
    assert trunk_sharing(one_budget) is None


def test_above_baseline_is_per_width_against_its_smallest_batch():
    """Width 32's baseline (batch 8) reaches 5.2 at most, width 64's (batch 16, its smallest)
    5.0: a cell counts as above only against its own width's baseline."""
    data = JointData.build([32, 32, 32, 64, 64, 64], [8, 8, 64, 16, 16, 64],
                           [1e5, 2e5, 1e5, 1e5, 2e5, 2e5], [5.2, 4.9, 5.3, 5.0, 4.7, 5.1],
                           [0.01] * 6, ["a", "a", "b", "c", "c", "d"])
    assert above_baseline(data).tolist() == [False, False, True, False, False, True]
    assert not above_baseline(data.with_loss([5.2, 4.9, 5.2, 5.0, 4.7, 4.99])).any()


@pytest.mark.study
def test_bootstrap_interval_covers_the_planted_exponent():
    """40 planted worlds (3 widths, branched, baseline at 2 seeds, seed noise 0.0125
    nats/token with half its variance shared by a run and its branches, as at cpu scale):
    the nominal 95% interval covers the planted exponent in at least 90% of them."""
    covered, worlds = 0, 40
    for i in range(worlds):
        world = WORLDS["adamw" if i % 2 == 0 else "muon"]
        data = planted_world(world, rng=np.random.default_rng(1000 + i))
        fit = fit_joint(data)
        boot = bootstrap_joint(data, fit, resamples=100, seed=i)
        assert boot.exponent_low is not None
        covered += boot.exponent_low <= world.gamma <= boot.exponent_high
    assert covered >= 0.9 * worlds, covered


CPU_SEEDED = (8, 16, 32, 64)  # the cpu sweep's batches trained at 3 seeds (seed 0 plus 2)
CPU_SEEDS = 3


def noisy_cpu_world(world: PlantedWorld, i: int) -> tuple[JointData, dict]:
    """Planted world i like the cpu sweep: batches 8-128, budgets 1/8-1 of 1.5M tokens, the
    CPU_SEEDED batches at CPU_SEEDS seeds, one run's noise 0.01-0.02 nats/token and five
    times that at batch 32; the known-sigma cells and each width's seed samples."""
    sigma = (0.01, 0.015, 0.02)[i % 3]
    return planted_world(world, fractions=(0.125, 0.25, 0.5, 0.75, 1.0),
                         baseline_seeds=CPU_SEEDS, seeded_batches=CPU_SEEDED, sigma=sigma,
                         batch_sigma={32: 5 * sigma}, rng=np.random.default_rng(3000 + i),
                         with_seed_samples=True)


def seed_estimated_sigma(data: JointData, samples: dict, seeded: tuple = CPU_SEEDED,
                         seeds: int = CPU_SEEDS) -> JointData:
    """`data` with each cell's sigma as `analysis.joint.cells_of` estimates it: its width's
    seed noise (`fit_noise_split`, per batch where the batches differ) at its batch and
    tokens over sqrt(its seeds); and, as `analysis.joint.noise_sources` marks them, the
    estimate each sigma comes from and its effective degrees of freedom."""
    from critbatch.science.fits import fit_noise_split

    splits = {w: fit_noise_split(s) for w, s in samples.items()}
    seeds = np.where(np.isin(data.batch, seeded), seeds, 1)
    trends = [splits[w].trend(int(b)) for w, b in zip(data.width.tolist(), data.batch,
                                                      strict=True)]
    sd = np.array([float(t.sd(e)) for t, e in zip(trends, data.tokens, strict=True)])
    ids = {id(t): i for i, t in enumerate(dict.fromkeys(trends))}
    return replace(data, sigma=sd / np.sqrt(seeds),
                   noise_group=np.array([ids[id(t)] for t in trends]),
                   noise_dof=np.array([t.effective_dof(SHARED_FRACTION) for t in trends]))


@pytest.mark.study
def test_bootstrap_interval_covers_the_planted_exponent_with_seed_estimated_noise():
    """40 cpu-like planted worlds (`noisy_cpu_world`: batch 32 five times noisier) fitted with
    the sigmas estimated from the seeds as the analysis does (`seed_estimated_sigma`), not
    the true ones: the nominal 95% interval covers the planted exponent in at least 90%.
    Each bootstrap draw takes the sigmas as the truth behind their estimates might be
    (`plausible_sigma`); drawing with the estimates alone it covered in 33 of 40 (106 of
    120 worlds), with the true sigmas 37 of 40 (114 of 120)."""
    covered = covered_worlds(WORLDS, fit_joint)
    assert covered >= 0.9 * 40, covered


def covered_worlds(worlds: dict, fit_of, n: int = 40) -> int:
    """In how many of `n` cpu-like planted worlds (`noisy_cpu_world` from `worlds`' AdamW and
    Muon in turn, sigmas estimated from the seeds) the 95% bootstrap interval of the fit
    `fit_of(data)` (100 refits) covers the planted exponent."""
    covered = 0
    for i in range(n):
        world = worlds["adamw" if i % 2 == 0 else "muon"]
        data = seed_estimated_sigma(*noisy_cpu_world(world, i))
        boot = bootstrap_joint(data, fit_of(data), resamples=100, seed=i)
        assert boot.exponent_low is not None
        covered += boot.exponent_low <= world.gamma <= boot.exponent_high
    return covered


@pytest.mark.slow
def test_the_simulated_term_test_drops_a_term_two_seeds_cannot_support():
    """A world of the cpu widths sweep's design (three widths at 750k tokens, only batch 8 at
    two seeds: each width's noise estimate has about 2.3 degrees of freedom) with neither
    term: the chi-square test keeps the power (p = 0.009), the simulation, which redraws
    the noise estimates too, does not (0.15 with 40 draws). In 60 such worlds the
    chi-square test kept a term in 20, the two tests together (40 draws) in 5."""
    def two_seed_world(world: PlantedWorld) -> JointData:
        data, samples = planted_world(world, budget=7.5e5, fractions=(0.25, 0.5, 0.75, 1.0),
                                      baseline_seeds=2, seeded_batches=(8,), sigma=0.02,
                                      rng=np.random.default_rng(5002), with_seed_samples=True)
        return seed_estimated_sigma(data, samples, seeded=(8,), seeds=2)

    fit, tests = select_form(two_seed_world(WORLDS["adamw"]))
    assert tests["power"]["p_value"] < 0.05 < tests["power"]["p_value_simulated"]
    assert fit.form == Form() and not tests["power"]["kept"]
    # the same design with a planted power: both tests keep it
    fit, tests = select_form(two_seed_world(POWER_WORLD))
    assert fit.form.power and tests["power"]["p_value_simulated"] < 0.05


@pytest.mark.study
def test_bootstrap_interval_covers_the_planted_exponent_with_a_fitted_power():
    """40 cpu-like planted worlds (`noisy_cpu_world`, seed-estimated sigmas) whose transition
    has the power p = 0.7, fitted with the power as `select_form` fits it (`fit_richer`
    from the plain fit): the nominal 95% interval covers the planted exponent in at least
    90%. Fitted by `select_form` with its chi-square test alone (before the simulated one),
    the power was kept in 120 of 120 such worlds and the interval covered in 117; in worlds
    with p = 1 it covered in 110 of 120."""
    from critbatch.science.joint_inference import fit_richer

    worlds = {name: replace(world, power=0.7) for name, world in WORLDS.items()}
    covered = covered_worlds(
        worlds, lambda data: fit_richer(data, fit_joint(data), Form(power=True)))
    assert covered >= 0.9 * 40, covered


@pytest.mark.study
def test_the_predictive_sigma_covers_held_out_cells_with_seed_estimated_noise():
    """The held-out check as the analysis runs it on a cpu-like sweep: sigmas estimated from
    the seeds (`seed_estimated_sigma`), the refit's spread from draws that redraw them. In
    15 planted worlds the refit without the largest budget predicts its 225 cells within 2
    predictive sigmas about as often as 2 sigmas should (measured 2026-12-02: 218 of 225)."""
    z = np.concatenate([held_out_predictive_z(seed_estimated_sigma(*noisy_cpu_world(
        WORLDS["adamw" if k % 2 == 0 else "muon"], 200 + k)), k) for k in range(15)])
    inside, total = int(np.sum(np.abs(z) <= 2)), len(z)
    assert total == 225 and inside >= 0.9 * total, inside


def test_an_edge_lr_cell_counts_as_an_upper_bound():
    """Cells whose best lr sits on the grid's edge report a loss above their best-lr loss.
    Fitted as measurements they drag the exponent (planted 4.8) far off; as upper bounds
    (one-sided residuals) the fit recovers it, and a bound the model stays under costs
    nothing."""
    world = WORLDS["adamw"]
    exact = planted_world(world)
    edge = (exact.batch == 128) & (exact.tokens >= 0.5 * exact.tokens.max())
    biased = exact.loss + np.where(edge, 0.15, 0.0)  # nats/token: a too-high lr grid's cost
    as_measured = fit_joint(exact.with_loss(biased))
    bounded = JointData(exact.width, exact.batch, exact.tokens, biased, exact.sigma,
                        exact.unit, exact.widths, upper=edge)
    fit = fit_joint(bounded)
    assert abs(as_measured.exponent - world.gamma) > 1.0
    assert abs(fit.exponent - world.gamma) < 0.3
    assert fit.chi2_per_dof < 1e-4
    assert np.all(fit.residuals[edge] == 0.0)
    # a subset and a redraw keep the flags
    assert bounded.subset(edge).upper.all() and bounded.with_loss(biased).upper.sum() == 6


def test_a_held_out_bound_agrees_unless_it_lies_below_the_prediction():
    from critbatch.analysis.joint.joint import agrees

    assert agrees({"residual_sigmas": 5.0, "upper_bound": True})
    assert not agrees({"residual_sigmas": -2.5, "upper_bound": True})
    assert not agrees({"residual_sigmas": 5.0, "upper_bound": False})
    assert agrees({"residual_sigmas": -1.5})
    assert not agrees({"residual_sigmas": None})


@pytest.mark.study
def test_bootstrap_interval_covers_the_planted_exponent_with_upper_bounds():
    """Noisy planted worlds whose largest batch at the two largest budgets sits on the lr
    grid's edge (loss 0.1 nats/token above its best-lr loss, entered as an upper bound): the
    nominal 95% interval still covers the planted exponent in at least 8 of 10."""
    covered, worlds = 0, 10
    for i in range(worlds):
        world = WORLDS["adamw" if i % 2 == 0 else "muon"]
        data = planted_world(world, rng=np.random.default_rng(2000 + i))
        edge = (data.batch == data.batch.max()) & (data.tokens >= 0.5 * data.tokens.max())
        bounded = JointData(data.width, data.batch, data.tokens,
                            data.loss + np.where(edge, 0.1, 0.0), data.sigma, data.unit,
                            data.widths, upper=edge)
        fit = fit_joint(bounded)
        boot = bootstrap_joint(bounded, fit, resamples=50, seed=i)
        assert boot.exponent_low is not None
        covered += boot.exponent_low <= world.gamma <= boot.exponent_high
    assert covered >= 8, covered  # measured: 10 of 10 (2026-12-01)


def test_the_prediction_spreads_more_where_it_extrapolates():
    """A refit's bootstrap spread at cells beyond its data (a 4x larger budget) exceeds its
    spread at cells it was fitted to, and the latter is about the seed noise or below."""
    from critbatch.science.joint_inference import prediction_spread

    world = PlantedWorld(l_inf=(1.0,), a=(3.3,), alpha=(0.16,))
    data = planted_world(world, sigma=0.0125, rng=np.random.default_rng(3))
    fit = fit_joint(data)
    inside = prediction_spread(data, fit, data.width, data.batch, data.tokens, resamples=30)
    beyond = prediction_spread(data, fit, data.width, data.batch, 4 * data.tokens,
                               resamples=30)
    assert np.all(np.isfinite(inside)) and np.all(np.isfinite(beyond))
    assert np.median(inside) < 0.0125
    assert np.median(beyond) > np.median(inside)


@pytest.mark.study
def test_the_predictive_sigma_covers_held_out_cells_of_a_correct_law():
    """15 planted worlds (one width, branched, seed noise 0.0125): the refit without the
    largest budget predicts those 75 cells within 2 predictive sigmas (seed sigma and the
    refit's spread in quadrature) about as often as 2 sigmas should (95%). Measured
    (2026-12-02): 74 of 75; within 2 seed sigmas alone only 60 of 75, the issue's 80%
    threshold, though the law is exactly right: the seed test alone undercovers."""
    world = PlantedWorld(l_inf=(1.0,), a=(3.3,), alpha=(0.16,))
    z = np.concatenate([held_out_predictive_z(
        planted_world(world, sigma=0.0125, rng=np.random.default_rng(100 + k)), k)
        for k in range(15)])
    inside, total = int(np.sum(np.abs(z) <= 2)), len(z)
    assert total == 75 and inside >= 68, inside  # >= 90%


def held_out_predictive_z(data: JointData, seed: int) -> np.ndarray:
    """Refit `data` without its largest budget and return those cells' residuals (measured
    - predicted) in predictive sigmas: seed sigma and the refit's spread in quadrature."""
    largest = data.tokens == data.tokens.max()
    kept = data.subset(~largest)
    fit = fit_joint(kept)
    where = (data.width[largest], data.batch[largest], data.tokens[largest])
    spread = prediction_spread(kept, fit, *where, resamples=40, seed=seed)
    return (data.loss[largest] - fit.predict_loss(*where)) / np.hypot(data.sigma[largest],
                                                                      spread)


def test_a_fit_that_cannot_be_made_says_why_and_a_failed_refit_is_counted():
    """Cells no model can take (a loss of 0 or below) give a failed fit with its reason, not
    an exception; the bootstrap of a fit that failed has no interval and says so."""
    data = planted_world(PlantedWorld(), rng=np.random.default_rng(0))
    broken = data.with_loss(np.where(np.arange(len(data)) == 3, 0.0, data.loss))
    fit = fit_joint(broken)
    assert not fit.usable and not fit.success and "loss" in fit.message
    boot = bootstrap_joint(broken, fit, resamples=10)
    assert boot.exponent_low is None and "the fit failed" in boot.interval
    negative = data.with_loss(np.where(data.width == 0, -40.0, data.loss))  # below L_N_FLOOR
    assert "20 cell(s) with a loss" in fit_joint(negative).message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.integers(1, 4), st.integers(1, 5),
    st.lists(st.floats(0.0, 10.0), min_size=20, max_size=20),
    st.sampled_from([None, None, None, math.inf, math.nan])), max_size=12))
def test_trunk_sharing_answers_a_share_or_none_for_any_blocks(shapes):
    """Any seeds x budgets blocks (one seed, one budget, equal losses, an inf or nan loss): a
    share in [0, MAX_SHARING] from at least MIN_SHARING_DOF seed dof, or None; never a
    traceback."""
    from critbatch.science.fits import MAX_SHARING, MIN_SHARING_DOF, trunk_sharing

    blocks = []
    for seeds, budgets, values, poison in shapes:
        losses = np.array(values[:seeds * budgets]).reshape(seeds, budgets)
        if poison is not None:
            losses[0, 0] = poison
        blocks.append((tuple(1000 * (j + 1) for j in range(budgets)), losses))
    sharing = trunk_sharing(blocks)
    if sharing is not None:
        assert 0.0 <= sharing.fraction <= MAX_SHARING and sharing.dof >= MIN_SHARING_DOF


def test_loss_alone_p_is_chi_square_s_with_known_sigmas_and_larger_with_estimated_ones():
    """The loss-alone test's simulated p against an analytic answer: with known, independent
    sigmas the drop is chi-square with k = 2(W - 1) degrees of freedom and the per-width
    fit's chi2 independent chi-square with its dof, so the statistic, the drop over
    max(1, chi2/dof), exceeds a value q with probability P(X / max(1, Y / dof) >= q), X and
    Y those chi-squares; with each width's sigma from two seeds' worth of degrees of freedom
    and noise shared within trunks, the same statistic is far less surprising (the planted
    worlds where chi-square's p rejected true loss-alone laws)."""
    from dataclasses import replace

    from scipy.stats import chi2

    rng = np.random.default_rng(11)
    known = planted_world(WORLDS["adamw"], rng=rng, shared=0.0)
    known = replace(known, shared=0.0)
    shared_fit = fit_joint(known)
    per_width = fit_joint(known, per_width=True, start=None)
    extra = 2 * (len(known.widths) - 1)
    target = chi2.ppf(0.9, extra) * max(1.0, per_width.chi2_per_dof)
    at_90 = replace(shared_fit, chi2=per_width.chi2 + target)
    test = loss_alone_test(at_90, per_width, known, draws=20_000, seed=1)
    assert test["p_value_chi2"] == pytest.approx(0.1, rel=1e-6)
    draws = np.random.default_rng(0)
    x, y = draws.chisquare(extra, 400_000), draws.chisquare(per_width.dof, 400_000)
    expected = float(np.mean(x / np.maximum(1.0, y / per_width.dof) >= chi2.ppf(0.9, extra)))
    # 0.077 against 0.083 (sd 0.002 from the draws; the rest the fits' nonlinearity); the
    # statistic without its per-draw misfit gave 0.093, 0.9 of the shared fit's share 0.123
    assert test["p_value"] == pytest.approx(expected, abs=0.008)
    estimated = replace(known, shared=0.8, noise_group=known.width.copy(),
                        noise_dof=np.full(len(known), 2.0))
    loose = loss_alone_test(at_90, per_width, estimated, seed=1)
    assert loose["p_value"] > 0.2 and loose["p_value_chi2"] == test["p_value_chi2"]


def test_chi2_range_is_chi_square_s_with_known_sigmas_and_a_planted_outlier_fails_it():
    """The verdict's misfit checks against their analytic answer: with known, independent
    sigmas the residuals left after the (linearised) fit are chi-square with the fit's dof,
    so chi2/dof averages 1 and its 97.5% point is chi-square's; one cell moved 8 sigmas
    fails the largest-residual check, which the unmoved world passes."""
    from dataclasses import replace

    from scipy.stats import chi2

    from critbatch.science.joint_inference import chi2_range

    rng = np.random.default_rng(5)
    data = replace(planted_world(WORLDS["adamw"], rng=rng, shared=0.0), shared=0.0)
    fit = fit_joint(data)
    window = chi2_range(data, fit, seed=2)
    assert window["mean"] == pytest.approx(1.0, abs=0.02)  # sd of the mean of 4,000: 0.003
    assert window["high"] == pytest.approx(chi2.ppf(0.975, fit.dof) / fit.dof, rel=0.03)
    assert window["largest_residual_holds"]
    moved = data.loss.copy()
    moved[len(moved) // 2] += 8 * data.sigma[len(moved) // 2]
    out = data.with_loss(moved)
    assert not chi2_range(out, fit_joint(out), seed=2)["largest_residual_holds"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1,
                max_size=20),
       st.floats(-1e7, 1e7), st.floats(1.0, 1e300))
def test_finite_is_nan_to_num_then_clip(values, nan, cap):
    """The fits' in-place cleaning gives numpy's two-step answer for any values, NaN and
    infinities included (the fault guarded: an infinity or NaN left through, or the cap's
    sign lost)."""
    x = np.array(values, float)
    want = np.clip(np.nan_to_num(x, nan=nan), -cap, cap)
    assert np.array_equal(finite(x.copy(), nan, cap), want)


@pytest.mark.parametrize("per_width", [False, True])
@pytest.mark.parametrize("form", [Form(), Form(power=True), Form(small_batch=True),
                                  Form(small_batch=True, power=True)])
def test_the_bisection_s_log_tokens_are_the_model_s_bit_for_bit(per_width, form):
    """`log_tokens_at` (the cells' parameters looked up once, for `predict_loss`'s 56
    bisection steps) equals `log_tokens_model`'s ln E exactly, losses below l_inf and below 0
    included: the fault guarded is a lookup of the wrong cells' parameters (a width, a
    per-width law, the small-batch term), which would move every predicted loss."""
    rng = np.random.default_rng(7)
    widths = 3
    n_law = widths if per_width else 1
    for _ in range(20):
        theta = np.concatenate([rng.uniform(0, 2, widths), rng.normal(0, 1, widths),
                                np.log(rng.uniform(0.05, 1, widths)), rng.normal(8, 2, n_law),
                                rng.uniform(0, 8, n_law), rng.uniform(0.5, 2, form.extra)])
        width, batch = rng.integers(0, widths, 40), np.exp(rng.uniform(0, 8, 40))
        loss = rng.uniform(-1, 6, 40)
        model = log_tokens_model(theta, widths, loss, width, batch, per_width, form)[0]
        at = log_tokens_at(theta, widths, width, batch, per_width, form)(loss)
        assert np.array_equal(model, at, equal_nan=True)
