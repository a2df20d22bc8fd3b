"""The local critical batch from replicated ladders: every k trained again at each seed.

Where `science.local_cbs` bounds an excess with the k = 1 replicates' branch noise, here the
whole ladder of k is trained again at each replicate seed, every k of a seed on the same data
order, so each seed gives its own paired excess of a candidate over a reference and their
scatter across seeds is measured rather than assumed (`seed_paired_excess`). That scatter is
pooled over the checkpoints, per k (`replicated_ladders`).

Pooling the seed scatter over checkpoints (`pool_consistent`) assumes one variance for all of
them; Bartlett's test checks it first (`equal_variance_test`), and checkpoints that fail it
are bound on their own.

Units: losses in nats/token (a sequence's mean token loss), batch sizes in sequences.
numpy/scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from critbatch.science.local_cbs import (
    CONFIDENCE,
    TOLERANCE,
    LocalCriticalBatch,
    PairedExcess,
    best_smaller,
    check_confidence,
    check_multipliers,
    check_rule,
    per_sequence,
    walk,
)


@dataclass(frozen=True)
class SeedScatter:
    """How much one comparison's excess moves with the data order.

    Estimated from comparisons repeated at several seeds (the whole ladder of k trained again
    at each replicate seed, each seed a data order every k of it shares): `var` is the
    variance of one seed's excess about the mean over its seeds, pooled over comparisons."""

    var: float  # (nats/token)^2: variance of a single seed's excess
    dof: float  # sum over the pooled comparisons of (seeds - 1)
    comparisons: int  # comparisons pooled

    @property
    def sd(self) -> float:
        """nats/token: the scatter of a single seed's excess."""
        return math.sqrt(self.var)


def per_seed(losses: ArrayLike, name: str) -> np.ndarray:
    """`losses` as a 2-D float array: one row per seed, one per-sequence loss per column."""
    x = np.asarray(losses, dtype=float)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{name} has shape {x.shape}: give one row of per-sequence losses per "
                         "seed (seeds x sequences)")
    for row in x:
        per_sequence(row, name)
    return x


def seed_excesses(candidate: ArrayLike, reference: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: the candidate's mean excess over the reference trained at the same seed
    (rows in the same seed order, columns the same sequences), and its sequence-only standard
    error."""
    c, r = per_seed(candidate, "candidate"), per_seed(reference, "reference")
    if c.shape != r.shape:
        raise ValueError(f"candidate has shape {c.shape} and reference {r.shape}: give both at "
                         "the same seeds (rows) and validation sequences (columns)")
    d = c - r
    return d.mean(axis=1), d.std(axis=1, ddof=1) / math.sqrt(d.shape[1])


def pool_seed_scatter(excesses: Sequence[ArrayLike]) -> SeedScatter:
    """The pooled within-comparison variance of per-seed excesses: each item holds one
    comparison's excesses at its seeds (`seed_excesses`); items with one seed add nothing."""
    groups = [np.asarray(d, dtype=float) for d in excesses]
    used = [d for d in groups if len(d) >= 2]
    dof = sum(len(d) - 1 for d in used)
    if dof == 0:
        raise ValueError("no comparison was trained at two seeds or more: train every k again "
                         "at a replicate seed (train.local_cbs.replicate_ladder)")
    sum_sq = sum(float(((d - d.mean()) ** 2).sum()) for d in used)
    return SeedScatter(var=sum_sq / dof, dof=float(dof), comparisons=len(used))


def seed_paired_excess(candidate: ArrayLike, reference: ArrayLike, scatter: SeedScatter,
                       confidence: float = CONFIDENCE) -> PairedExcess:
    """The excess of `candidate` over `reference`, both trained at the same m seeds: the mean
    over seeds of the per-seed paired excess, se = sqrt(scatter.var / m) with scatter.dof
    degrees of freedom. The scatter of a seed's excess holds both the branches' training
    noise and their sequence scatter, so nothing else is added; se_paired reports the
    sequence part alone."""
    from critbatch.science.distributions import t_quantile

    check_confidence(confidence)
    d, se_seq = seed_excesses(candidate, reference)
    m = len(d)
    excess, se = float(d.mean()), math.sqrt(scatter.var / m)
    t = float(t_quantile(confidence, scatter.dof)) if se > 0 else 0.0
    return PairedExcess(excess=excess, se_paired=math.sqrt(float((se_seq**2).mean()) / m),
                        se=se, dof=scatter.dof, upper=excess + t * se, lower=excess - t * se,
                        confidence=confidence, sequences=int(np.asarray(candidate).shape[1]))


# ---------------------------------------------------------------------------------------------
# Equal variances before pooling over checkpoints

EQUAL_VARIANCE_LEVEL = 0.05  # Bartlett's test: p below it rejects one variance for all


@dataclass(frozen=True)
class VarianceTest:
    """Bartlett's test of equal variances across groups (`equal_variance_test`)."""

    statistic: float  # Bartlett's T: chi-square with groups - 1 dof if the variances are equal
    p_value: float
    groups: int  # groups tested (two values or more each)


@dataclass(frozen=True)
class ScatterPool:
    """How one comparison's per-seed excesses were pooled over checkpoints (`pool_consistent`).

    `scatters[c]` is the scatter checkpoint c's bound uses: the pool's for the checkpoints in
    `pooled` (and for those of one seed, which add nothing), its own for those in `alone`;
    None where checkpoint c has no such comparison."""

    scatters: tuple[SeedScatter | None, ...]
    pooled: tuple[int, ...]  # checkpoints pooled together: their variances pass the test
    alone: tuple[int, ...]  # checkpoints left out of the pool, each bound on its own scatter
    test: VarianceTest | None  # over every checkpoint of two seeds or more; None: < 2 of them
    kept: VarianceTest | None  # over `pooled` at the end (= `test` when nothing was left out)
    level: float  # the test's level

    @property
    def main(self) -> SeedScatter | None:
        """The pooled scatter (None when every checkpoint stands alone)."""
        return next((self.scatters[i] for i in self.pooled), None)


def equal_variance_test(groups: Sequence[ArrayLike]) -> VarianceTest:
    """Bartlett's test (Bartlett 1937; `scipy.stats.bartlett`) that normal groups share one
    variance.

    With g groups of n_i values, variances s_i^2, N = sum n_i and the pooled variance s_p^2,

        T = [(N - g) ln s_p^2 - sum (n_i - 1) ln s_i^2] / C,
        C = 1 + (sum 1/(n_i - 1) - 1/(N - g)) / (3 (g - 1)),

    chi-square with g - 1 degrees of freedom when the variances are equal. It is the
    likelihood-ratio test under normality, the assumption the pooled t bound makes anyway;
    heavy tails read as unequal variances, which here means pooling less (conservative).
    A group of zero variance among groups that vary is unequal outright (T = inf, p = 0);
    all zero is equal (T = 0, p = 1). Power is low at the designs we run: with 3 seeds at 6
    checkpoints (2 dof per variance), one checkpoint whose variance is 10x the others' is
    caught about a third of the time, 100x about 90% (simulated); passing is not proof.
    """
    from scipy.stats import bartlett, chi2

    arrays = [np.asarray(g, dtype=float) for g in groups]
    if len(arrays) < 2 or any(len(a) < 2 for a in arrays):
        raise ValueError(f"{len(arrays)} group(s) of sizes {[len(a) for a in arrays]}: the "
                         "equal-variance test needs two groups or more of two values or more")
    variances = [float(a.var(ddof=1)) for a in arrays]
    if min(variances) == 0:
        statistic, p = (math.inf, 0.0) if max(variances) > 0 else (0.0, 1.0)
    else:  # p from T itself: scipy gives NaN for a T of exactly 0 (rounding may go below)
        statistic = max(0.0, float(bartlett(*arrays).statistic))
        p = float(chi2.sf(statistic, len(arrays) - 1))
    return VarianceTest(statistic=statistic, p_value=p, groups=len(arrays))


def odd_one(groups: Sequence[np.ndarray], members: Sequence[int]) -> int:
    """The member whose leaving out makes the rest agree best (the largest p of Bartlett's
    test on the others): the pooled variance itself leans towards a large outlier, so the
    distance from it would point at the wrong member."""
    p = [equal_variance_test([groups[j] for j in members if j != i]).p_value for i in members]
    return members[int(np.argmax(p))]


def pool_consistent(excesses: Sequence[ArrayLike | None],
                    level: float = EQUAL_VARIANCE_LEVEL) -> ScatterPool:
    """`pool_seed_scatter` over the checkpoints whose variances agree.

    `excesses[c]`: one comparison's per-seed excesses at checkpoint c (`seed_excesses`), None
    where c has no such comparison. Pooling assumes one variance for every checkpoint;
    `equal_variance_test` (Bartlett) checks it over those of two seeds or more. When it
    rejects (p < `level`), the checkpoint whose leaving out makes the rest agree best
    (`odd_one`) is left out and the test repeated on the rest, until they pass; two that still
    disagree are both left out. A checkpoint left out is bound on its own scatter (seeds - 1
    dof), valid whatever the others' variances: a wider bound, not a borrowed one. Left
    out by a test, the rest are only "not shown unequal" (the test's power is low).
    """
    groups = [None if d is None else np.asarray(d, dtype=float) for d in excesses]
    testable = [i for i, d in enumerate(groups) if d is not None and len(d) >= 2]
    pool_seed_scatter([groups[i] for i in testable])  # raises when no checkpoint has 2 seeds
    pooled = list(testable)
    test = equal_variance_test([groups[i] for i in pooled]) if len(pooled) >= 2 else None
    kept = test
    while kept is not None and kept.p_value < level:
        if len(pooled) == 2:
            pooled, kept = [], None
            break
        pooled.remove(odd_one(groups, pooled))
        kept = equal_variance_test([groups[i] for i in pooled])
    # a checkpoint of one seed adds nothing and takes the pool's scatter (all of them when
    # every testable one stands alone)
    main = pool_seed_scatter([groups[i] for i in pooled or testable])
    scatters = tuple(None if d is None else pool_seed_scatter([d]) if i in testable
                     and i not in pooled else main for i, d in enumerate(groups))
    return ScatterPool(scatters=scatters, pooled=tuple(pooled),
                       alone=tuple(i for i in testable if i not in pooled), test=test,
                       kept=kept, level=level)


@dataclass(frozen=True)
class ReplicatedLadders:
    """The decisions at every checkpoint of one base run from replicated ladders, and the
    seed-paired excess of every k over k = 1 (`replicated_ladders`)."""

    decisions: tuple[LocalCriticalBatch, ...]  # per checkpoint
    pools: dict[int, ScatterPool]  # per k after the first: the decision's comparisons
    over_first: tuple[tuple[PairedExcess, ...], ...]  # per checkpoint, per k after the first
    pools_over_first: dict[int, ScatterPool]  # per k after the first: those over k = 1


def pooled_comparisons(ladders: Sequence[Sequence[np.ndarray]],
                       references: Sequence[Sequence[int]], confidence: float,
                       level: float) -> tuple[list[list[PairedExcess]], dict[int, ScatterPool]]:
    """Per checkpoint, branch i (>= 1) against branch references[c][i - 1] seed-paired, the
    scatter pooled per i over the checkpoints (`pool_consistent`); and the pools, by i."""
    pools = {}
    for i in range(1, max(len(a) for a in ladders)):
        pools[i] = pool_consistent(
            [seed_excesses(a[i], a[refs[i - 1]])[0] if len(a) > i else None
             for a, refs in zip(ladders, references, strict=True)], level)
    return [[seed_paired_excess(a[i], a[r], pools[i].scatters[c], confidence)
             for i, r in enumerate(refs, start=1)]
            for c, (a, refs) in enumerate(zip(ladders, references, strict=True))], pools


def replicated_ladders(base_batch_size: int, multipliers: Sequence[int],
                       checkpoints: Sequence[Sequence[ArrayLike]],
                       tolerance: float = TOLERANCE, confidence: float = CONFIDENCE,
                       level: float = EQUAL_VARIANCE_LEVEL) -> ReplicatedLadders:
    """The local critical batch at every checkpoint of one base run, from replicated ladders.

    `checkpoints[c][i]`: the per-sequence losses (nats/token) of branch `multipliers[i]` x
    `base_batch_size` at checkpoint c, one row per seed (the base's seed first, then each
    replicate seed; the same seeds in the same order for every k of the checkpoint). A
    checkpoint may hold fewer branches than `multipliers` (those below a diverged one).

    The design pairs twice: every branch is evaluated on the same sequences, and at each
    seed every k trains on the same data order, so a seed's excess d_s = mean_j(L_cj - L_rj)
    of a candidate c over a reference r cancels what the data order does to both. Its
    scatter across seeds is measured, not assumed: pooled over the checkpoints separately for
    each k (a larger k may scatter differently) where their variances pass Bartlett's test,
    else over fewer (`pool_consistent`). The excess is the mean of d_s over the m seeds, its
    variance var / m with the pool's degrees of freedom, and the walk is
    `local_critical_batch`'s: each k against the smaller branch of lowest mean loss
    (averaged over seeds), accepted when the one-sided upper bound is below `tolerance`.
    `over_first` holds each k's seed-paired excess over k = 1, pooled the same way (for
    `tokens_equivalent`). Assumes d_s is normal with one variance over the pooled
    checkpoints for a given k.
    """
    check_rule(base_batch_size, tolerance)
    ks = check_multipliers(multipliers, len(multipliers))
    ladders, best = [], []
    for c, branches in enumerate(checkpoints):
        arrays = [per_seed(x, f"checkpoint {c}, branch k={k}")
                  for k, x in zip(ks, branches, strict=False)]
        if len(arrays) < 2:
            raise ValueError(f"checkpoint {c} has {len(arrays)} branch(es): give two or more")
        if len({a.shape for a in arrays}) != 1:
            raise ValueError(f"checkpoint {c}: branches have shapes {[a.shape for a in arrays]};"
                             " every k needs the same seeds and validation sequences")
        ladders.append(arrays)
        best.append(best_smaller([float(a.mean()) for a in arrays]))
    compared, pools = pooled_comparisons(ladders, best, confidence, level)
    over_first, first_pools = pooled_comparisons(
        ladders, [[0] * (len(a) - 1) for a in ladders], confidence, level)
    decisions = [walk(base_batch_size, ks[:len(a)], [ks[b] for b in refs], comps, tolerance,
                      confidence) for a, refs, comps in zip(ladders, best, compared, strict=True)]
    return ReplicatedLadders(
        decisions=tuple(decisions), pools={ks[i]: p for i, p in pools.items()},
        over_first=tuple(tuple(c) for c in over_first),
        pools_over_first={ks[i]: p for i, p in first_pools.items()})


def local_critical_batches_by_seed(base_batch_size: int, multipliers: Sequence[int],
                                   checkpoints: Sequence[Sequence[ArrayLike]],
                                   tolerance: float = TOLERANCE,
                                   confidence: float = CONFIDENCE) -> list[LocalCriticalBatch]:
    """The decisions of `replicated_ladders` alone, one per checkpoint."""
    return list(replicated_ladders(base_batch_size, multipliers, checkpoints, tolerance,
                                   confidence).decisions)
