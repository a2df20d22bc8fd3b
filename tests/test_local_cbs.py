"""The local critical batch decision against known answers: a world with a planted local
B_crit, the false-alarm rate between identical branches, exact bounds, bad input and the
paper's EMA rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from critbatch.science.local_cbs import (
    BranchNoise,
    ema,
    estimate_branch_noise,
    local_critical_batch,
    local_critical_batch_ema,
    local_critical_batches_by_seed,
    paired_excess,
    pool_seed_scatter,
    seed_excesses,
    seed_paired_excess,
)

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
