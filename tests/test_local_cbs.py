"""The local critical batch decision against known answers: a world with a planted local
B_crit, the false-alarm rate between identical branches, exact bounds, bad input and the
paper's EMA rule; the equal-variance test before pooling checkpoints, and the excess in
effective tokens against a planted local B_crit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from critbatch.science.local_cbs import (
    BranchNoise,
    ema,
    estimate_branch_noise,
    excesses_over_first,
    local_critical_batch,
    local_critical_batch_ema,
    paired_excess,
)
from critbatch.science.local_cbs_seeds import (
    equal_variance_test,
    local_critical_batches_by_seed,
    pool_consistent,
    pool_seed_scatter,
    replicated_ladders,
    seed_excesses,
    seed_paired_excess,
)
from critbatch.science.local_cbs_tokens import tokens_equivalent

T_95_DOF1 = math.tan(0.45 * math.pi)  # Student's t with 1 dof is Cauchy: tan(pi (p - 1/2))
T_95_DOF2 = 0.9 / math.sqrt(2 * 0.95 * 0.05)  # with 2 dof: (2p - 1) / sqrt(2 p (1 - p))
Z_95 = 1.6448536269514722  # the normal quantile, t with infinite dof
SEQUENCE_ONLY = BranchNoise(sd=0.0, dof=math.inf)

BASE, KS = 32, (1, 2, 4, 8, 16, 32, 64)  # sequences; branches at k x BASE


def branch_maker(rng: np.random.Generator, sequences: int, sequence_sd: float,
                 branch_sd: float):
    """Per-sequence losses of branches at one checkpoint: L_bj = mu_j + excess + u_b + e_bj.

    mu_j (the sequences' difficulty, ~3.5 nats/token) is shared by every branch; u_b ~
    N(0, branch_sd) is one offset per branch; e_bj ~ N(0, sequence_sd) per sequence."""
    mu = rng.normal(3.5, 0.5, sequences)

    def branch(excess: float) -> np.ndarray:
        return mu + excess + rng.normal(0, branch_sd) + rng.normal(0, sequence_sd, sequences)

    return branch


def planted_world(planted: int, seed: int, sequences: int = 512, sequence_sd: float = 0.02,
                  branch_sd: float = 0.001, scale: float = 0.015, pairs: int = 8):
    """Branches at KS x BASE whose true excess is scale x max(0, k BASE / planted - 1) nats/token
    (zero up to the planted local B_crit, then linear in the batch), and `pairs` seed
    replicate pairs at zero excess. Returns (per-branch losses, estimated branch noise)."""
    branch = branch_maker(np.random.default_rng(seed), sequences, sequence_sd, branch_sd)
    replicates = [(branch(0.0), branch(0.0)) for _ in range(pairs)]
    losses = [branch(scale * max(0.0, k * BASE / planted - 1)) for k in KS]
    return losses, estimate_branch_noise(replicates)


def test_recovers_a_planted_local_bcrit_within_one_doubling():
    """60 worlds: planted B_crit 32 ... 1024 sequences, 10 seeds each, 512 sequences with
    0.02 nats/token of per-sequence noise, branch offsets of sd 0.001, the excess reaching
    0.015 nats/token (1.5x the tolerance) at twice the planted batch."""
    doublings_off = []
    for planted in (32, 64, 128, 256, 512, 1024):
        for seed in range(10):
            losses, noise = planted_world(planted, 1000 * planted + seed)
            result = local_critical_batch(BASE, KS, losses, noise)
            doublings_off.append(math.log2(result.b_crit / planted))
            assert not result.lower_bound_only  # the largest branch (2048) is always too big
    off = np.array(doublings_off)
    print(f"planted B_crit recovered exactly in {np.mean(off == 0):.0%} of {len(off)} worlds, "
          f"within one doubling in {np.mean(abs(off) <= 1):.0%}")
    assert np.all(np.abs(off) <= 1)
    assert np.mean(off == 0) >= 0.9


def test_noise_makes_the_estimate_smaller_never_larger():
    """Three times the noise above: acceptance needs proof, so the rule falls short of the
    planted B_crit more often, but it does not overshoot it."""
    results = [local_critical_batch(BASE, KS, *planted_world(
        planted, seed, sequence_sd=0.03, branch_sd=0.003)).b_crit / planted
        for planted in (64, 256, 1024) for seed in range(10)]
    print(f"noisy world: b_crit / planted = {sorted(results)}")
    assert max(results) <= 1
    assert min(results) < 1  # the test is not vacuous: this much noise does cost doublings


def test_a_largest_branch_within_tolerance_gives_only_a_lower_bound():
    losses, noise = planted_world(4096, seed=3)
    result = local_critical_batch(BASE, KS, losses, noise)
    assert result.b_crit == BASE * KS[-1]
    assert result.lower_bound_only
    assert result.margin == pytest.approx(result.tolerance - result.upper[-1])


@pytest.mark.slow
def test_false_alarm_rate_between_identical_branches_is_nominal_with_the_branch_term():
    """2000 simulated pairs of identically trained branches (same true mean, independent
    offsets of sd 0.005 nats/token, 128 sequences with per-sequence noise 0.02). For each,
    branch_sd is estimated from 8 other replicate pairs (other checkpoints).

    A false alarm is the test at tolerance 0 declaring the second replicate worse: the
    one-sided 95% lower confidence bound of its excess over the first is above zero. Its
    rate must be at most the nominal 5% plus three Monte Carlo standard errors (1.5%). The
    sequence-only paired t-test (no branch term) on the same pairs calls far more of them
    worse, which is why the branch term exists.
    """
    rng = np.random.default_rng(2025)
    trials, pairs, sequences = 2000, 8, 128
    alarms = {"with branch term": 0, "mean(d^2)/2, no subtraction": 0, "sequence only": 0}
    for _ in range(trials):
        branch = branch_maker(rng, sequences, sequence_sd=0.02, branch_sd=0.005)
        replicates = [(branch(0.0), branch(0.0)) for _ in range(pairs)]
        first, second = branch(0.0), branch(0.0)
        for name, noise in (
                ("with branch term", estimate_branch_noise(replicates)),
                ("mean(d^2)/2, no subtraction",
                 estimate_branch_noise(replicates, remove_sequence_noise=False)),
                ("sequence only", SEQUENCE_ONLY)):
            alarms[name] += paired_excess(second, first, noise).lower > 0
    rates = {name: count / trials for name, count in alarms.items()}
    print("false-alarm rates at nominal 5%: "
          + ", ".join(f"{name} {rate:.1%}" for name, rate in rates.items()))
    margin = 3 * math.sqrt(0.05 * 0.95 / trials)
    assert rates["with branch term"] <= 0.05 + margin
    assert rates["with branch term"] >= 0.05 - 2 * margin  # calibrated, not just conservative
    assert rates["mean(d^2)/2, no subtraction"] <= 0.05 + margin
    assert rates["sequence only"] > 0.2


def test_a_branch_just_above_tolerance_is_accepted_at_most_at_the_nominal_rate():
    """The acceptance side of the guarantee: a doubling whose true excess is 0.011 nats/token
    (above the 0.01 tolerance) passes at most 5% (+ Monte Carlo margin) of 1000 worlds; the
    bare epsilon on the same means passes it about a third of the time."""
    rng = np.random.default_rng(7)
    trials, ours, bare = 1000, 0, 0
    for _ in range(trials):
        branch = branch_maker(rng, 256, sequence_sd=0.02, branch_sd=0.001)
        noise = estimate_branch_noise([(branch(0.0), branch(0.0)) for _ in range(8)])
        losses = [branch(0.0), branch(0.011)]
        ours += local_critical_batch(BASE, (1, 2), losses, noise).b_crit == 2 * BASE
        bare += local_critical_batch_ema(BASE, (1, 2), [[x.mean()] for x in losses]) == 2 * BASE
    print(f"true excess 0.011: accepted by the bound in {ours / trials:.1%}, "
          f"by the bare epsilon in {bare / trials:.1%}")
    assert ours / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert bare / trials > 0.2


def test_branch_sd_estimate_is_unbiased_and_the_raw_one_counts_sequence_noise_too():
    """branch_sd^2 averaged over 400 sets of 8 replicate pairs: the default removes the
    replicates' sequence scatter (unbiased); mean(d^2)/2 exceeds it by se_paired^2 / 2."""
    rng = np.random.default_rng(11)
    branch_sd, sequence_sd, sequences = 0.003, 0.02, 128
    clean, raw = [], []
    for _ in range(400):
        branch = branch_maker(rng, sequences, sequence_sd, branch_sd)
        replicates = [(branch(0.0), branch(0.0)) for _ in range(8)]
        clean.append(estimate_branch_noise(replicates).sd ** 2)
        raw.append(estimate_branch_noise(replicates, remove_sequence_noise=False).sd ** 2)
    se_paired_sq = 2 * sequence_sd**2 / sequences
    assert np.mean(clean) == pytest.approx(branch_sd**2, rel=0.1)
    assert np.mean(raw) == pytest.approx(branch_sd**2 + se_paired_sq / 2, rel=0.1)


def test_branch_noise_dof_is_the_pair_count_without_subtraction():
    rng = np.random.default_rng(0)
    pairs = [(rng.normal(size=16), rng.normal(size=16)) for _ in range(5)]
    noise = estimate_branch_noise(pairs, remove_sequence_noise=False)
    diffs = [np.mean(a - b) for a, b in pairs]
    assert noise.dof == 5 and noise.pairs == 5
    assert noise.sd == pytest.approx(math.sqrt(np.mean(np.square(diffs)) / 2), rel=1e-12)


def test_replicates_that_differ_by_sequence_noise_alone_give_no_branch_term():
    same = np.linspace(3.0, 4.0, 50)
    flip = np.r_[0.01, -0.01] * np.ones((25, 2))
    pairs = [(same + flip.ravel(), same - flip.ravel()) for _ in range(3)]  # mean diff 0
    noise = estimate_branch_noise(pairs)
    assert noise.sd == 0.0 and noise.dof == 0.0 and noise.pairs == 3


def test_exact_bound_sequence_only_two_sequences():
    """Differences 0.1 and 0.3: mean 0.2, sd 0.1414, se 0.1 with 1 dof."""
    reference = np.array([2.0, 3.0])
    result = paired_excess(reference + [0.1, 0.3], reference, SEQUENCE_ONLY)
    assert result.excess == pytest.approx(0.2, rel=1e-12)
    assert result.se_paired == pytest.approx(0.1, rel=1e-12)
    assert result.dof == pytest.approx(1.0, rel=1e-12)
    assert result.upper == pytest.approx(0.2 + 0.1 * T_95_DOF1, rel=1e-9)
    assert result.lower == pytest.approx(0.2 - 0.1 * T_95_DOF1, rel=1e-9)


def test_exact_bound_with_branch_term_and_satterthwaite_dof():
    """se_paired^2 = 0.01 (1 dof) and 2 branch_sd^2 = 0.01 (1 dof): variance 0.02 with
    (0.02)^2 / (0.01^2 / 1 + 0.01^2 / 1) = 2 Welch-Satterthwaite degrees of freedom."""
    reference = np.array([2.0, 3.0])
    branch = BranchNoise(sd=math.sqrt(0.005), dof=1.0)
    result = paired_excess(reference + [0.1, 0.3], reference, branch)
    assert result.se == pytest.approx(math.sqrt(0.02), rel=1e-12)
    assert result.dof == pytest.approx(2.0, rel=1e-12)
    assert result.upper == pytest.approx(0.2 + math.sqrt(0.02) * T_95_DOF2, rel=1e-9)


def test_exact_bound_branch_term_known_exactly():
    """A constant shift has no sequence scatter: the bound is the branch term's alone, normal."""
    reference = np.linspace(3.0, 4.0, 10)
    result = paired_excess(reference + 0.004, reference, BranchNoise(sd=0.002, dof=math.inf))
    assert result.se_paired == pytest.approx(0.0, abs=1e-12)
    assert result.dof > 1e12  # the sequence term is rounding error: the normal quantile
    assert result.upper == pytest.approx(0.004 + Z_95 * 0.002 * math.sqrt(2), rel=1e-9)


def test_decision_walk_on_hand_computed_branches():
    """Constant shifts with branch sd 0.002 known exactly: every bound is excess + 0.004653.

    k=2 is 0.001 better than k=1 (upper 0.003653: accepted); k=4 is compared with k=2, the
    best smaller branch: excess 0.005, upper 0.009653 < 0.01 (accepted, margin 0.000347);
    k=8 is 0.02 worse (rejected). b_crit = 4 x 16 sequences."""
    x = np.linspace(3.0, 4.0, 20)
    branch = BranchNoise(sd=0.002, dof=math.inf)
    half_width = Z_95 * 0.002 * math.sqrt(2)
    result = local_critical_batch(16, (1, 2, 4, 8), [x, x - 0.001, x + 0.004, x + 0.02], branch)
    assert result.b_crit == 64 and not result.lower_bound_only
    assert result.references == (1, 2, 2)
    assert result.excess == pytest.approx((-0.001, 0.005, 0.021), abs=1e-12)
    assert result.upper == pytest.approx(tuple(e + half_width for e in result.excess), rel=1e-9)
    assert result.accepted == (True, True, False)
    assert result.margin == pytest.approx(0.01 - (0.005 + half_width), rel=1e-6)

    all_in = local_critical_batch(16, (1, 2, 4), [x, x - 0.001, x + 0.004], branch)
    assert all_in.b_crit == 64 and all_in.lower_bound_only
    assert all_in.margin == pytest.approx(result.margin, rel=1e-12)


def test_decision_stops_at_the_first_rejection():
    """k=2 fails; k=4 would pass against k=1, but the walk has stopped: b_crit is k=1's."""
    x = np.linspace(3.0, 4.0, 20)
    branch = BranchNoise(sd=0.002, dof=math.inf)
    result = local_critical_batch(16, (1, 2, 4), [x, x + 0.05, x + 0.001], branch)
    assert result.accepted == (False, True)
    assert result.b_crit == 16 and result.margin is None and not result.lower_bound_only


@pytest.mark.parametrize(("call", "message"), [
    (lambda: paired_excess(np.ones(5), np.ones(4), SEQUENCE_ONLY), "same validation sequences"),
    (lambda: paired_excess([3.0], [3.1], SEQUENCE_ONLY), "at least 2 validation sequences"),
    (lambda: paired_excess(np.ones((2, 3)), np.ones((2, 3)), SEQUENCE_ONLY), "1-D"),
    (lambda: paired_excess([1.0, np.nan], [1.0, 1.0], SEQUENCE_ONLY), "non-finite"),
    (lambda: paired_excess([1.0, 2.0], [1.0, 1.0], SEQUENCE_ONLY, confidence=95), "(0.5, 1)"),
    (lambda: local_critical_batch(16, (1, 4, 2), [np.ones(3)] * 3, SEQUENCE_ONLY),
     "not strictly ascending"),
    (lambda: local_critical_batch(16, (1, 2, 2), [np.ones(3)] * 3, SEQUENCE_ONLY),
     "not strictly ascending"),
    (lambda: local_critical_batch(16, (1, 2), [np.ones(3)] * 3, SEQUENCE_ONLY),
     "one k per branch"),
    (lambda: local_critical_batch(16, (1,), [np.ones(3)], SEQUENCE_ONLY), "two branches"),
    (lambda: local_critical_batch(16, (1, 2), [np.ones(3), np.ones(4)], SEQUENCE_ONLY),
     "same validation sequences"),
    (lambda: local_critical_batch(16, (1, 2), [np.ones(3)] * 2, SEQUENCE_ONLY, tolerance=-1),
     "tolerance"),
    (lambda: estimate_branch_noise([]), "train the k = 1 branch twice"),
    (lambda: BranchNoise(sd=-0.1, dof=3), "sd >= 0"),
    (lambda: BranchNoise(sd=0.1, dof=0), "dof > 0"),
    (lambda: local_critical_batch_ema(16, (2, 1), [[3.0], [3.0]]), "not strictly ascending"),
    (lambda: ema([]), "empty"),
])
def test_bad_input_is_a_one_line_value_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_ema_by_hand():
    assert ema([4.0, 2.0, 3.0]).tolist() == [4.0, 3.0, 3.0]  # decay 0.5
    assert ema([4.0, 2.0], decay=0.75).tolist() == [4.0, 3.5]


def test_paper_rule_by_hand():
    """Final EMAs (decay 0.5): k=1 2.5, k=2 2.505, k=4 2.52, k=8 2.505. k=4 is more than 0.01
    above k=1; k=8 is within 0.01 of every smaller branch, so the paper's rule (the largest
    such k, not a walk) gives 8 x 16, where a walk would stop at 2 x 16."""
    series = [[3.0, 2.0], [2.6, 2.41], [2.6, 2.44], [2.5, 2.51]]
    assert [ema(s)[-1] for s in series] == pytest.approx([2.5, 2.505, 2.52, 2.505], abs=1e-12)
    assert local_critical_batch_ema(16, (1, 2, 4, 8), series) == 128
    assert local_critical_batch_ema(16, (1, 2, 4), series[:3]) == 32
    assert local_critical_batch_ema(16, (1, 2, 4), series[:3], epsilon=0.03) == 64


# ---------------------------------------------------------------------------------------------
# Replicated ladders: every k trained again at each replicate seed


def ladder_world(rng: np.random.Generator, excess_of, checkpoints: int = 6, seeds: int = 2,
                 sequences: int = 256, order_sd: float = 0.02, branch_sd: float = 0.002,
                 sequence_sd: float = 0.02, ks=KS) -> list[list[np.ndarray]]:
    """Per checkpoint, per k: losses (seeds x sequences) with
    L_ksj = mu_j + excess(k) + w_s + u_ks + e_ksj: w_s (sd `order_sd`) is the data order of
    seed s, shared by every k trained on it; u_ks (sd `branch_sd`) and e_ksj per branch."""
    world = []
    for _ in range(checkpoints):
        mu = rng.normal(3.5, 0.5, sequences)
        order = rng.normal(0, order_sd, seeds)
        world.append([
            mu + excess_of(k) + order[:, None] + rng.normal(0, branch_sd, (seeds, 1))
            + rng.normal(0, sequence_sd, (seeds, sequences)) for k in ks])
    return world


@pytest.mark.slow
def test_replicated_ladders_recover_a_planted_local_bcrit_despite_data_order_noise():
    """60 base runs (planted B_crit 32 ... 1024, 10 each) of 6 checkpoints with two seeds:
    the data order moves every branch by sd 0.02 nats/token, twenty times the branch noise, as
    the cpu runs' k = 1 replicates scatter (branch noise 0.001 and 512 sequences as in the
    first test above). Pairing by seed cancels it: every checkpoint's
    decision is within one doubling, and most are exact. The k = 1 replicate design on the
    same losses (its branch sd from the seed pairs) cannot resolve the first step up."""
    off, k1_only = [], []
    for planted in (32, 64, 128, 256, 512, 1024):
        for seed in range(10):
            rng = np.random.default_rng(10_000 + 100 * planted + seed)
            world = ladder_world(rng, lambda k, p=planted: 0.015 * max(0.0, k * BASE / p - 1),
                                 sequences=512, branch_sd=0.001)
            for result in local_critical_batches_by_seed(BASE, KS, world):
                off.append(math.log2(result.b_crit / planted))
            k1 = estimate_branch_noise([(c[0][0], c[0][1]) for c in world])
            k1_only += [local_critical_batch(BASE, KS, [x[0] for x in c], k1).b_crit / planted
                        for c in world]
    off = np.array(off)
    print(f"replicated ladders: exact in {np.mean(off == 0):.0%} of {len(off)} checkpoints; "
          f"k = 1 replicates only: median b_crit / planted {np.median(k1_only):.3g}")
    assert np.all(np.abs(off) <= 1)
    assert np.mean(off == 0) >= 0.8
    assert np.median(k1_only) < 0.5


def test_false_alarm_rate_between_identical_branches_with_replicated_ladders():
    """2000 base runs whose k = 1 and k = 2 branches are trained identically (zero excess),
    6 checkpoints, two seeds, data-order sd 0.02. A false alarm is calling k = 2 worse at
    tolerance 0 (its one-sided 95% lower bound above zero) at the first checkpoint: at most
    the nominal 5% plus three Monte Carlo standard errors, and not far below it."""
    rng = np.random.default_rng(11)
    trials, alarms = 2000, 0
    for _ in range(trials):
        world = ladder_world(rng, lambda k: 0.0, ks=(1, 2), sequences=64)
        arrays = world[0]
        diffs = [seed_excesses(c[1], c[0])[0] for c in world]
        scatter = pool_seed_scatter(diffs)
        alarms += seed_paired_excess(arrays[1], arrays[0], scatter).lower > 0
    rate = alarms / trials
    margin = 3 * math.sqrt(0.05 * 0.95 / trials)
    print(f"replicated ladders: false-alarm rate {rate:.1%} at nominal 5%")
    assert 0.05 - 2 * margin <= rate <= 0.05 + margin


def test_seed_paired_bound_by_hand():
    """Two seeds whose excesses are 0.01 and 0.03 (constant shifts: no sequence scatter); a
    second comparison with excesses 0.0 and 0.02. Pooled variance ((0.01^2 + 0.01^2) * 2) / 2
    = 2e-4 with 2 dof; se = sqrt(2e-4 / 2) = 0.01; upper = 0.02 + t(2) x 0.01."""
    x = np.linspace(3.0, 4.0, 8)
    ref = np.stack([x, x + 0.5])  # the seeds' data orders differ by 0.5 nats: cancelled
    first, second = ref + np.array([[0.01], [0.03]]), ref + np.array([[0.0], [0.02]])
    scatter = pool_seed_scatter([seed_excesses(first, ref)[0], seed_excesses(second, ref)[0]])
    assert scatter.var == pytest.approx(2e-4, rel=1e-9) and scatter.dof == 2
    result = seed_paired_excess(first, ref, scatter)
    assert result.excess == pytest.approx(0.02, rel=1e-9)
    assert result.se == pytest.approx(0.01, rel=1e-9)
    assert result.se_paired == pytest.approx(0.0, abs=1e-12)
    assert result.upper == pytest.approx(0.02 + 0.01 * T_95_DOF2, rel=1e-9)


def test_replicated_walk_on_hand_computed_ladders():
    """Two checkpoints x two seeds of constant shifts; k = 2's excesses over k = 1 are
    (-0.002, 0.0) and (-0.004, -0.002): pooled var (2e-6 + 2e-6) / 2 dof, se 0.001, bound
    excess + t(2) x 0.001 = excess + 0.00292. k = 4 is 0.03 worse at the second
    checkpoint only. Checkpoint 0: every k accepted (a lower bound); checkpoint 1: b_crit 2 B,
    the walk stopped by k = 4."""
    x = np.linspace(3.0, 4.0, 8)
    base = np.stack([x, x + 0.3])

    def ladder(shifts):
        return [base + np.array(s)[:, None] for s in shifts]

    world = [ladder([(0, 0), (-0.002, 0.0), (-0.003, 0.001)]),
             ladder([(0, 0), (-0.004, -0.002), (0.027, 0.027)])]
    first, second = local_critical_batches_by_seed(16, (1, 2, 4), world)
    half = T_95_DOF2 * 0.001
    assert first.excess[0] == pytest.approx(-0.001, abs=1e-12)
    assert first.upper[0] == pytest.approx(-0.001 + half, rel=1e-9)
    assert first.b_crit == 64 and first.lower_bound_only
    assert second.references == (1, 2)
    assert second.excess == pytest.approx((-0.003, 0.030), abs=1e-12)
    assert second.b_crit == 32 and not second.lower_bound_only


@pytest.mark.parametrize(("call", "message"), [
    (lambda: pool_seed_scatter([[0.1], [0.2]]), "replicate_ladder"),
    (lambda: seed_excesses(np.ones((2, 3)), np.ones((3, 3))), "same seeds"),
    (lambda: seed_excesses(np.ones(3), np.ones(3)), "seeds x sequences"),
    (lambda: local_critical_batches_by_seed(16, (1, 2), [[np.ones((1, 3)), np.ones((1, 3))]]),
     "replicate_ladder"),
    (lambda: local_critical_batches_by_seed(16, (1, 2), [[np.ones((2, 3)), np.ones((1, 3))]]),
     "same seeds and validation sequences"),
])
def test_bad_ladders_are_one_line_value_errors(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# Equal variances before pooling over checkpoints


def spread(centre: float, sd: float) -> np.ndarray:
    """Three per-seed excesses of sample sd exactly `sd` about `centre`."""
    return centre + sd * np.array([-1.0, 0.0, 1.0])


def test_bartlett_by_hand():
    """Two groups of two, variances 2 and 0.02: s_p^2 = 1.01 with N - g = 2,
    T = (2 ln 1.01 - ln 2 - ln 0.02) / C, C = 1 + (1 + 1 - 1/2) / 3 = 1.5; chi-square, 1 dof."""
    from scipy.stats import chi2

    result = equal_variance_test([[0.0, 2.0], [0.0, 0.2]])
    statistic = (2 * math.log(1.01) - math.log(2) - math.log(0.02)) / 1.5
    assert result.statistic == pytest.approx(statistic, rel=1e-12)
    assert result.p_value == pytest.approx(chi2.sf(statistic, 1), rel=1e-9)
    assert result.groups == 2
    assert equal_variance_test([[1.0, 1.0], [2.0, 3.0]]).p_value == 0.0  # zero among varying
    assert equal_variance_test([[1.0, 1.0], [2.0, 2.0]]).p_value == 1.0  # all zero: equal


def test_equal_variances_are_pooled_over_every_checkpoint():
    """Six checkpoints whose seed excesses scatter by exactly the same sd: T = 0, p = 1, one
    pool of 12 dof for all, as `pool_seed_scatter` gives."""
    groups = [spread(0.001 * c, 0.002) for c in range(6)]
    pool = pool_consistent(groups)
    assert pool.test.p_value == pytest.approx(1.0) and pool.alone == ()
    assert pool.pooled == tuple(range(6)) and pool.kept == pool.test
    assert pool.main == pool_seed_scatter(groups) and pool.main.dof == 12
    assert all(s == pool.main for s in pool.scatters)


def test_an_odd_checkpoint_is_left_out_of_the_pool_and_bound_on_its_own():
    """Five checkpoints at sd 0.002 and one at sd 0.06 (a variance 900x): Bartlett rejects;
    the odd one is left out (not a quiet one, though the pooled variance leans towards it),
    the rest pass and are pooled, and the odd one's bound uses its own scatter (2 dof)."""
    groups = [spread(0.0, 0.002) for _ in range(5)]
    groups.insert(2, spread(0.0, 0.06))
    pool = pool_consistent(groups)
    assert pool.test.p_value < 0.05 and pool.kept.p_value >= 0.05
    assert pool.alone == (2,) and pool.pooled == (0, 1, 3, 4, 5)
    assert pool.scatters[2].var == pytest.approx(0.06**2) and pool.scatters[2].dof == 2
    assert pool.main.var == pytest.approx(0.002**2) and pool.main.dof == 10
    two = pool_consistent([spread(0.0, 0.002), spread(0.0, 0.06), None])
    assert two.pooled == () and two.alone == (0, 1) and two.main is None
    assert two.scatters[2] is None


@pytest.mark.study
def test_pooling_only_consistent_checkpoints_keeps_the_false_alarm_rate_near_nominal():
    """500 base runs, 6 checkpoints x 3 seeds, k = 1 and k = 2 trained identically; at the
    first checkpoint the branches scatter 30x more than at the others (sd 0.12 against 0.004
    nats/token). Pooled regardless, that checkpoint's bound borrows the quiet ones' scatter
    and calls k = 2 worse (lower bound above 0) in about a quarter of the runs; pooled only
    where Bartlett allows, near the nominal 5%. With equal variances something is left out
    about as often as the test's level says (5%)."""
    rng = np.random.default_rng(30)
    trials, naive, gated, left_out = 500, 0, 0, 0
    for _ in range(trials):
        for ratio in (30, 1):
            world = [[mu + rng.normal(0, 0.004 * (ratio if c == 0 else 1), (3, 1))
                      + rng.normal(0, 0.02, (3, 64)) for _ in (1, 2)]
                     for c, mu in enumerate(rng.normal(3.5, 0.5, (6, 64)))]
            diffs = [seed_excesses(two, one)[0] for one, two in world]
            pool = pool_consistent(diffs)
            if ratio == 1:
                left_out += bool(pool.alone)
                continue
            one, two = world[0]
            naive += seed_paired_excess(two, one, pool_seed_scatter(diffs)).lower > 0
            gated += seed_paired_excess(two, one, pool.scatters[0]).lower > 0
    margin = 3 * math.sqrt(0.05 * 0.95 / trials)
    print(f"false alarms at the noisy checkpoint: pooled regardless {naive / trials:.1%}, "
          f"pooled where consistent {gated / trials:.1%}; equal variances left something "
          f"out in {left_out / trials:.1%}")
    assert naive / trials > 0.15
    assert gated / trials <= 0.05 + margin
    assert left_out / trials <= 0.05 + margin


def test_replicated_ladders_report_their_pools_and_split_them_when_needed():
    """Constant shifts per seed: k = 2's excesses over k = 1 scatter by sd 0.001 at five
    checkpoints and 0.05 at the sixth. The decision's pool and the pool over k = 1 (the same
    comparison here) leave the sixth out; its bound is its own (2 dof), the others' pooled."""
    x = np.linspace(3.0, 4.0, 8)
    world = []
    for c in range(6):
        base = np.stack([x, x + 0.2, x - 0.1])
        world.append([base, base + spread(0.0, 0.05 if c == 5 else 0.001)[:, None]])
    result = replicated_ladders(16, (1, 2), world)
    for pool in (result.pools[2], result.pools_over_first[2]):
        assert pool.alone == (5,) and pool.pooled == (0, 1, 2, 3, 4)
    assert result.decisions[5].comparisons[0].dof == 2
    assert result.decisions[0].comparisons[0].dof == 10
    assert result.over_first[5][0].se == pytest.approx(0.05 / math.sqrt(3), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# The excess in effective tokens


FORK, WINDOW = 2**20, 2**18  # tokens


def power_loss(tokens):
    """A k = 1 branch's loss over the window (nats/token): convex in log tokens."""
    return 3.0 + 2.0 * (np.asarray(tokens, dtype=float) / 1e6) ** -0.4


def planted_excess(k: int, b_crit: float, loss=power_loss) -> float:
    """The excess over k = 1 after the window of a branch at k x BASE when the local B_crit is
    `b_crit` (sequences): r = (1 + k B / B_crit) / (1 + B / B_crit), so the branch reaches the
    k = 1 branch's loss after W / r tokens."""
    r = (1 + k * BASE / b_crit) / (1 + BASE / b_crit)
    return float(loss(FORK + WINDOW / r) - loss(FORK + WINDOW))


def test_tokens_equivalent_recovers_a_planted_local_bcrit():
    """The k = 1 curve at 9 points over the window; planted B_crit 48, 128 and 512 sequences
    at k = 2 ... 16: the per-run formula gives it back within 0.5% (PCHIP between points)."""
    tokens = np.geomspace(FORK, FORK + WINDOW, 9)
    for planted in (48.0, 128.0, 512.0):
        for k in (2, 4, 8, 16):
            result = tokens_equivalent(BASE, k, FORK, WINDOW, tokens, power_loss(tokens),
                                       planted_excess(k, planted))
            r = (1 + k * BASE / planted) / (1 + BASE / planted)
            assert result.ratio == pytest.approx(r, rel=2e-3), (planted, k)
            assert result.b_crit == pytest.approx(planted, rel=5e-3), (planted, k)
            assert result.effective_tokens == pytest.approx(WINDOW / r, rel=2e-3)
            assert result.note is None


def test_tokens_equivalent_is_exact_on_a_curve_straight_in_log_tokens():
    """L = 4 - 0.1 ln t, known at the fork and the end only: the chord is the curve, and a
    planted B_crit of 100 sequences at k = 4 comes back to rounding, with the interval from
    bounds of the excess +-0.002 holding it and ordered (B_crit falls as the excess rises)."""
    def line(t):
        return 4.0 - 0.1 * np.log(np.asarray(t, dtype=float))

    excess = planted_excess(4, 100.0, line)
    result = tokens_equivalent(BASE, 4, FORK, WINDOW, [FORK, FORK + WINDOW],
                               line([FORK, FORK + WINDOW]), excess,
                               bounds=(excess - 0.002, excess + 0.002))
    assert result.b_crit == pytest.approx(100.0, rel=1e-9)
    assert result.b_crit_low < 100.0 < result.b_crit_high
    high = tokens_equivalent(BASE, 4, FORK, WINDOW, [FORK, FORK + WINDOW],
                             line([FORK, FORK + WINDOW]), excess - 0.002)
    assert result.b_crit_high == pytest.approx(high.b_crit, rel=1e-12)


def test_no_measurable_cost_gives_only_a_lower_bound():
    """excess 0: r = 1, no B_crit; excess -0.01 (better than k = 1): below the curve, no r
    either. With an upper bound of +0.005 the lower end is that excess's B_crit; with an
    upper bound <= 0 there is none."""
    tokens = np.geomspace(FORK, FORK + WINDOW, 5)
    curve = (BASE, 8, FORK, WINDOW, tokens, power_loss(tokens))
    zero = tokens_equivalent(*curve, 0.0, bounds=(-0.003, 0.005))
    assert zero.ratio == 1.0 and zero.b_crit is None and zero.b_crit_high is None
    assert zero.b_crit_low == pytest.approx(tokens_equivalent(*curve, 0.005).b_crit)
    assert zero.note.startswith("no measurable cost (r <= 1); B_crit > ")
    better = tokens_equivalent(*curve, -0.01, bounds=(-0.02, -0.001))
    assert better.ratio is None and better.effective_tokens is None
    assert better.b_crit is None and better.b_crit_low is None and better.b_crit_high is None


def test_a_loss_outside_the_k1_curve_is_not_extrapolated():
    """The k = 1 branch fell by L(fork) - L(end) over the window; a branch whose excess is
    more than that ended above the loss at the fork: no r, no B_crit (B_crit may be 0: the
    interval's lower end). A branch no better than k = 1 after as many steps (r = 1.5 k)
    gives none either. A k = 1 curve whose end is not its lowest point gives nothing."""
    tokens = np.geomspace(FORK, FORK + WINDOW, 5)
    curve = (BASE, 4, FORK, WINDOW, tokens, power_loss(tokens))
    drop = float(power_loss(FORK) - power_loss(FORK + WINDOW))
    above = tokens_equivalent(*curve, drop + 0.01, bounds=(planted_excess(4, 100.0),
                                                           drop + 0.03))
    assert above.ratio is None and above.b_crit is None and above.b_crit_low == 0.0
    assert above.b_crit_high == pytest.approx(100.0, rel=1e-2)
    assert "above the k = 1 curve" in above.note
    slow = float(power_loss(FORK + WINDOW / 6) - power_loss(FORK + WINDOW))
    worse = tokens_equivalent(*curve, slow)
    assert worse.ratio == pytest.approx(6.0, rel=1e-2) and worse.b_crit is None
    assert "r = 6" in worse.note and ">= k" in worse.note
    bent = power_loss(tokens)
    bent[-1] = bent[-2] + 0.001
    flat = tokens_equivalent(BASE, 4, FORK, WINDOW, tokens, bent, 0.01)
    assert flat.ratio is None and flat.b_crit is None and "does not fall" in flat.note
    end_only = tokens_equivalent(BASE, 4, FORK, WINDOW, [FORK + WINDOW], [3.0], 0.01)
    assert end_only.b_crit is None and "fewer than two" in end_only.note


def test_excesses_over_first_pair_every_branch_with_k1():
    x = np.linspace(3.0, 4.0, 20)
    over = excesses_over_first([x, x + 0.004, x + 0.02], BranchNoise(sd=0.002, dof=math.inf))
    assert [c.excess for c in over] == pytest.approx([0.004, 0.02], abs=1e-12)
    assert over[1].upper == pytest.approx(0.02 + Z_95 * 0.002 * math.sqrt(2), rel=1e-9)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: tokens_equivalent(BASE, 1, FORK, WINDOW, [FORK, FORK + WINDOW], [3.0, 2.9], 0.01),
     "give k >= 2"),
    (lambda: equal_variance_test([[1.0, 2.0]]), "two groups or more"),
    (lambda: pool_consistent([[0.1], None]), "replicate_ladder"),
])
def test_bad_conversion_and_pooling_input_is_a_one_line_value_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)
