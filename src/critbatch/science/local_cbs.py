"""The local critical batch size by branched training, decided with error bars.

Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971, section 3.1): from a
checkpoint of a run at batch B, branches at k B (k = 1, 2, 4, ...) train the same window of
tokens with the lr scaled by the optimizer's rule; the local critical batch is k* B for the
largest k* whose loss is not worse than any smaller branch's by more than a tolerance. The
paper compares an EMA of the training loss against a bare epsilon = 0.01 nats
(`local_critical_batch_ema`, kept for comparison). Here every branch is evaluated on the same
fixed validation sequences and each step up in k is a paired comparison with a one-sided
confidence bound (`local_critical_batch`).

The noise model behind the bound. Branch b's mean loss on validation sequence j is

    L_bj = mu_j + delta_b + u_b + e_bj

mu_j: the sequence's difficulty, shared by every branch (it cancels in a paired difference);
delta_b: the branch's true excess, what the decision is about; u_b: the branch's offset from
training noise (seed, data order), shared by all its sequences, sd `branch_sd`; e_bj: what
is left, per sequence. The estimated excess of a candidate c over a reference r is the mean
over n sequences of d_j = L_cj - L_rj, and

    Var(excess) = Var(e_cj - e_rj) / n + 2 branch_sd^2 = se_paired^2 + 2 branch_sd^2.

The sequence scatter of d_j estimates only the first term (n - 1 degrees of freedom): a
test on it alone sees u_c - u_r as a real effect and, between two identically trained
branches, calls one of them worse far more often than its nominal level. The second term
comes from replicate pairs (`estimate_branch_noise`: the k = 1 branch trained twice with
different seeds, at several checkpoints). The two estimated variances have their own degrees
of freedom; their sum gets Welch-Satterthwaite degrees of freedom (Satterthwaite 1946;
Welch 1947), and the bound uses Student's t with them.

Assumptions and warnings: sequences are independent given the branch (contiguous windows of
one document are not: use one window per document, or accept a smaller effective n); u is
normal with the same sd for every k (a larger batch may scatter less; the seed replicates
are at k = 1, so a sd measured there is the conservative one when larger batches scatter
less); branches at one checkpoint share the starting weights and usually the data order,
which correlates their offsets and makes 2 branch_sd^2 an overestimate of the variance of
their difference (again conservative). Comparing against the best of several smaller
branches picks the reference with the luckiest offset, which biases the excess upwards
(conservative too).

Pooling the seed scatter over checkpoints (`pool_consistent`) assumes one variance for all of
them; Bartlett's test checks it first, and checkpoints that fail it are bound on their own.

The rule marks where a larger batch first loses measurably, not where it costs twice the
tokens, so it is not the per-run B_crit's currency. `tokens_equivalent` converts a branch's
excess over k = 1 into the tokens the k = 1 branch needed for the same loss, and the per-run
formula (docs/science.md, section 3) into a local B_crit comparable with the run-averaged ones.

Units: losses in nats/token (a sequence's mean token loss), batch sizes in sequences.
numpy/scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

CONFIDENCE = 0.95  # one-sided level of the bounds
TOLERANCE = 0.01  # nats/token: the paper's epsilon, the largest excess still "the same loss"
EMA_DECAY = 0.5  # the paper's EMA parameter alpha = 0.5 (both conventions agree at 0.5)


@dataclass(frozen=True)
class BranchNoise:
    """The training-noise scatter of one branch's mean validation loss."""

    sd: float  # nats/token: sd of a branch's mean loss across seeds, sequence scatter removed
    dof: float  # degrees of freedom of sd^2; math.inf = known exactly; 0 with sd 0 = unresolved
    pairs: int = 0  # replicate pairs it was estimated from (0 = given, not estimated)

    def __post_init__(self) -> None:
        if not (self.sd >= 0 and math.isfinite(self.sd)):
            raise ValueError(f"branch sd is {self.sd}: give a finite sd >= 0 in nats/token")
        if not (self.dof > 0 or (self.dof == 0 and self.sd == 0)):
            raise ValueError(f"branch dof is {self.dof}: give dof > 0 (math.inf if sd is "
                             "known exactly)")


@dataclass(frozen=True)
class PairedExcess:
    """A candidate branch's loss excess over a reference branch, on the same sequences."""

    excess: float  # nats/token: mean over sequences of candidate - reference
    se_paired: float  # nats/token: its standard error from the sequence scatter alone
    se: float  # nats/token: sqrt(se_paired^2 + 2 branch_sd^2)
    dof: float  # Welch-Satterthwaite degrees of freedom of se^2
    upper: float  # nats/token: excess + t se, the one-sided upper confidence bound
    lower: float  # nats/token: excess - t se, the one-sided lower confidence bound
    confidence: float  # one-sided level of `upper` and of `lower`, each
    sequences: int  # n


@dataclass(frozen=True)
class LocalCriticalBatch:
    """The decision at one checkpoint (`local_critical_batch`).

    `comparisons[i]` is branch `multipliers[i + 1]` against the best smaller branch, whose
    multiplier is `references[i]`. Comparisons after the first rejection are computed and
    kept for the record; they do not change `b_crit`. `margin` is tolerance minus the upper
    bound of the last accepted k beyond the first (> 0: the room the accepted b_crit had);
    None when the first comparison was already rejected.
    """

    b_crit: int  # sequences: base batch x the largest k accepted before the first rejection
    lower_bound_only: bool  # every k was accepted: the local B_crit is b_crit or more
    margin: float | None  # nats/token: tolerance - upper of the last accepted k (docstring)
    base_batch_size: int  # sequences: B, the batch of the run the branches start from
    multipliers: tuple[int, ...]  # k, ascending; the first is accepted without a comparison
    references: tuple[int, ...]  # per k after the first: multiplier of the best smaller one
    comparisons: tuple[PairedExcess, ...]  # per k after the first
    tolerance: float  # nats/token
    confidence: float  # one-sided

    @property
    def excess(self) -> tuple[float, ...]:
        """Per k after the first: excess over the best smaller branch, nats/token."""
        return tuple(c.excess for c in self.comparisons)

    @property
    def upper(self) -> tuple[float, ...]:
        """Per k after the first: the upper confidence bound of that excess, nats/token."""
        return tuple(c.upper for c in self.comparisons)

    @property
    def accepted(self) -> tuple[bool, ...]:
        """Per k after the first: upper bound below the tolerance (ignoring the walk)."""
        return tuple(c.upper < self.tolerance for c in self.comparisons)


def per_sequence(losses: ArrayLike, name: str) -> np.ndarray:
    """`losses` as a 1-D float array of at least two finite per-sequence losses."""
    x = np.asarray(losses, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{name} has shape {x.shape}: give one mean loss per validation "
                         "sequence, a 1-D array")
    if len(x) < 2:
        raise ValueError(f"{name} has {len(x)} per-sequence loss(es): evaluate on at least 2 "
                         "validation sequences (a standard error needs two)")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds non-finite losses: a diverged branch cannot be "
                         "compared; drop it or rerun it")
    return x


def check_confidence(confidence: float) -> None:
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence is {confidence}: give a one-sided level in (0.5, 1), "
                         "e.g. 0.95")


def paired_difference(candidate: ArrayLike, reference: ArrayLike) -> tuple[float, float, int]:
    """(mean, standard error, n) of candidate - reference over the same n sequences.

    Both arrays hold one mean loss (nats/token) per validation sequence, in the same order.
    The standard error is sd(d) / sqrt(n) with n - 1 degrees of freedom: the sequence
    scatter only, without any branch-level noise.
    """
    c, r = per_sequence(candidate, "candidate"), per_sequence(reference, "reference")
    if len(c) != len(r):
        raise ValueError(f"candidate has {len(c)} per-sequence losses and reference {len(r)}: "
                         "evaluate both branches on the same validation sequences, same order")
    d = c - r
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), len(d)


def satterthwaite(terms: Sequence[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of independent variance estimates (v_i, dof_i).

    (sum v_i)^2 / sum(v_i^2 / dof_i) (Satterthwaite 1946). Terms with v_i = 0 add nothing;
    a sum that is zero has infinite degrees of freedom (there is nothing to be unsure of).
    """
    total = sum(v for v, _ in terms)
    spread = sum(v * v / dof for v, dof in terms if v > 0 and math.isfinite(dof))
    return math.inf if total == 0 or spread == 0 else total * total / spread


def paired_excess(candidate: ArrayLike, reference: ArrayLike, branch: BranchNoise,
                  confidence: float = CONFIDENCE) -> PairedExcess:
    """The excess loss of `candidate` over `reference` with one-sided confidence bounds.

    Inputs are per-sequence mean losses (nats/token) of two branches on the same validation
    sequences. excess = mean(candidate - reference); its variance is
    se_paired^2 + 2 branch.sd^2 (module docstring): se_paired^2 has n - 1 degrees of
    freedom, branch.sd^2 has branch.dof, the sum gets Welch-Satterthwaite degrees of freedom
    nu, and upper/lower = excess +/- t_{confidence, nu} se. `BranchNoise(0.0, math.inf)` gives
    the sequence-only paired t-test, which is overconfident whenever branches scatter.
    """
    from scipy.stats import t as student_t

    check_confidence(confidence)
    excess, se_paired, n = paired_difference(candidate, reference)
    terms = [(se_paired**2, n - 1), (2 * branch.sd**2, branch.dof)]
    se = math.sqrt(sum(v for v, _ in terms))
    dof = satterthwaite(terms)
    t = float(student_t.ppf(confidence, dof)) if se > 0 else 0.0
    return PairedExcess(excess=excess, se_paired=se_paired, se=se, dof=dof,
                        upper=excess + t * se, lower=excess - t * se, confidence=confidence,
                        sequences=n)


def estimate_branch_noise(replicates: Sequence[tuple[ArrayLike, ArrayLike]],
                          remove_sequence_noise: bool = True) -> BranchNoise:
    """branch_sd from replicate pairs: one branch trained twice with different seeds.

    Each pair (one per checkpoint, m in all) holds the two replicates' per-sequence losses
    (nats/token) on the same validation sequences; D_i is the mean of their difference and
    se_i its sequence-only standard error (`paired_difference`). With the module's noise
    model E[D_i^2] = 2 branch_sd^2 + E[se_i^2], so

    - `remove_sequence_noise=False`: branch_sd^2 = mean(D_i^2) / 2 with m degrees of
      freedom. It also counts the replicates' sequence scatter, which `paired_excess` adds
      again from the comparison itself: conservative by about se^2 / 2.
    - `remove_sequence_noise=True` (default): branch_sd^2 = (mean(D_i^2) - mean(se_i^2)) / 2,
      unbiased, so each comparison's own sequence scatter is the only one counted.
      Degrees of freedom by Satterthwaite for a difference of mean squares: A = mean(D_i^2)
      has m, B = mean(se_i^2) has Satterthwaite's over the se_i^2 (n_i - 1 each), and
      V = A - B has V^2 / (A^2 / m + B^2 / dof_B). A negative V (sequence scatter explains
      all of the replicate scatter) gives sd 0 with dof 0: no branch term.

    Assumes each D_i is normal with mean 0 (the replicates differ by the seed alone) and
    that branch_sd is the same at every checkpoint used.
    """
    if len(replicates) < 1:
        raise ValueError("no replicate pairs: train the k = 1 branch twice (two seeds) at one "
                         "checkpoint or more")
    stats = [paired_difference(a, b) for a, b in replicates]
    m = len(stats)
    a = sum(d * d for d, _, _ in stats) / m
    if not remove_sequence_noise:
        return BranchNoise(sd=math.sqrt(a / 2), dof=float(m), pairs=m)
    b = sum(se * se for _, se, _ in stats) / m
    dof_b = satterthwaite([(se * se, n - 1) for _, se, n in stats])
    v = a - b
    if v <= 0:
        return BranchNoise(sd=0.0, dof=0.0, pairs=m)
    spread = a * a / m + (b * b / dof_b if math.isfinite(dof_b) else 0.0)
    return BranchNoise(sd=math.sqrt(v / 2), dof=v * v / spread, pairs=m)


def check_multipliers(multipliers: Sequence[int], branches: int) -> tuple[int, ...]:
    ks = tuple(int(k) for k in multipliers)
    if len(ks) != branches:
        raise ValueError(f"{len(ks)} multipliers for {branches} branches: give one k per "
                         "branch, in the same order")
    if len(ks) < 2:
        raise ValueError(f"{len(ks)} branch(es): the decision compares k = k_0 with larger "
                         "k, give two branches or more")
    ascending = all(b > a for a, b in zip(ks, ks[1:], strict=False))
    if ks != tuple(multipliers) or ks[0] < 1 or not ascending:
        raise ValueError(f"multipliers {list(multipliers)} are not strictly ascending positive "
                         "integers: sort the branches by k (e.g. 1, 2, 4, 8)")
    return ks


def local_critical_batch(base_batch_size: int, multipliers: Sequence[int],
                         losses: Sequence[ArrayLike], branch: BranchNoise,
                         tolerance: float = TOLERANCE,
                         confidence: float = CONFIDENCE) -> LocalCriticalBatch:
    """The local critical batch at one checkpoint: largest k B within tolerance, with error bars.

    `losses[i]`: per-sequence mean validation losses (nats/token) of the branch at batch
    `multipliers[i]` x `base_batch_size` (sequences), all on the same sequences in the same
    order; `branch`: the training-noise scatter of a branch's mean (`estimate_branch_noise`).

    Walks k upwards from the second branch. Each branch is compared (`paired_excess`) with
    the smaller branch of lowest mean loss, the one the paper's "not worse than every smaller
    branch" binds on; it is within tolerance when the one-sided upper confidence bound of
    its excess is below `tolerance` (nats/token). The burden of proof is on the larger
    batch: a comparison too noisy to show the excess is small is a rejection, so noise makes
    b_crit smaller, not larger. b_crit = base batch x the last k accepted before the first
    rejection (the first k needs no comparison). When no k is rejected, b_crit is only a
    lower bound (`lower_bound_only`): add larger branches to find the limit.

    Resolution: a branch with zero true excess is accepted with probability about
    Phi(tolerance / se - t), so se must be well under the tolerance: at se = tolerance / 4
    (t ~ 1.8) that is ~98% per comparison, at tolerance / 2 only ~60%, and a walk over
    several k then stops early. branch_sd does not shrink with more sequences; averaging
    several seeds per branch does.

    `margin` = tolerance - upper bound of the last accepted k (beyond the first): how much
    room the accepted b_crit had; None when the first comparison was rejected. The margins of
    the other k, the rejected one included, are tolerance - `upper` of their comparisons.
    """
    check_rule(base_batch_size, tolerance)
    ks = check_multipliers(multipliers, len(losses))
    arrays = [per_sequence(x, f"branch k={k}") for k, x in zip(ks, losses, strict=True)]
    best = best_smaller([float(x.mean()) for x in arrays])
    comparisons = [paired_excess(arrays[i], arrays[b], branch, confidence)
                   for i, b in enumerate(best, start=1)]
    return walk(base_batch_size, ks, [ks[b] for b in best], comparisons, tolerance, confidence)


def check_rule(base_batch_size: int, tolerance: float) -> None:
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance is {tolerance}: give a loss excess >= 0 in nats/token, "
                         f"e.g. {TOLERANCE}")
    if base_batch_size < 1:
        raise ValueError(f"base batch size is {base_batch_size}: give the base run's batch in "
                         "sequences (>= 1)")


def best_smaller(means: Sequence[float]) -> list[int]:
    """Per branch after the first: the index of the smaller branch of lowest mean loss."""
    return [int(np.argmin(means[:i])) for i in range(1, len(means))]


def walk(base_batch_size: int, ks: tuple[int, ...], references: Sequence[int],
         comparisons: Sequence[PairedExcess], tolerance: float,
         confidence: float) -> LocalCriticalBatch:
    """The decision from the comparisons of each k after the first with its reference:
    b_crit = B x the last k accepted (upper bound below the tolerance) before the first
    rejection."""
    accepted = [c.upper < tolerance for c in comparisons]
    rejected = accepted.index(False) if False in accepted else len(accepted)
    margin = tolerance - comparisons[rejected - 1].upper if rejected > 0 else None
    return LocalCriticalBatch(
        b_crit=base_batch_size * ks[rejected], lower_bound_only=rejected == len(accepted),
        margin=margin, base_batch_size=base_batch_size, multipliers=ks,
        references=tuple(references), comparisons=tuple(comparisons), tolerance=tolerance,
        confidence=confidence)


# ---------------------------------------------------------------------------------------------
# Replicated ladders: every k trained again at each replicate seed


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
    from scipy.stats import t as student_t

    check_confidence(confidence)
    d, se_seq = seed_excesses(candidate, reference)
    m = len(d)
    excess, se = float(d.mean()), math.sqrt(scatter.var / m)
    t = float(student_t.ppf(confidence, scatter.dof)) if se > 0 else 0.0
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


def excesses_over_first(losses: Sequence[ArrayLike], branch: BranchNoise,
                        confidence: float = CONFIDENCE) -> tuple[PairedExcess, ...]:
    """Without replicated ladders: every branch after the first against the first
    (`paired_excess`, with the branch-noise term); `losses[i]` per-sequence, as in
    `local_critical_batch`."""
    return tuple(paired_excess(x, losses[0], branch, confidence) for x in losses[1:])


# ---------------------------------------------------------------------------------------------
# The same currency as the per-run B_crit: the excess in effective tokens


@dataclass(frozen=True)
class TokensEquivalent:
    """A branch's excess over k = 1 in effective tokens, and the local B_crit it implies
    (`tokens_equivalent`). An end of the interval that is unbounded, or not given, is None."""

    multiplier: int  # k
    excess: float  # nats/token: the k branch's final loss minus the k = 1 branch's
    effective_tokens: float | None  # tokens after the fork the k = 1 branch needed for it
    ratio: float | None  # r = window tokens / effective_tokens
    b_crit: float | None  # sequences: (k B - B r) / (r - 1), for 1 < r < k only
    b_crit_low: float | None  # sequences: from the excess's upper bound (0: B_crit may be 0)
    b_crit_high: float | None  # sequences: from the excess's lower bound
    note: str | None  # why b_crit is None, or what the interval leaves open


def tokens_equivalent(base_batch_size: int, multiplier: int, fork_tokens: float,
                      window_tokens: float, curve_tokens: ArrayLike, curve_losses: ArrayLike,
                      excess: float,
                      bounds: tuple[float, float] | None = None) -> TokensEquivalent:
    """The local B_crit of branch k in the currency of the per-run B_crit (section 3).

    The tolerance rule says where a larger batch first loses measurably; this says what the
    loss costs. The k = 1 branch's validation loss L_1(t) over the window, at cumulative
    tokens t from the fork t_0 to its end t_0 + W (`curve_tokens`, `curve_losses`: its eval
    points, the first usually the loss at the fork), is interpolated monotonically in log t
    (`science.fits.LossCurve`: PCHIP, points not below every earlier one dropped) and never
    extrapolated. The k branch's final loss L_1(t_0 + W) + `excess` (its excess over k = 1 on
    the same validation sequences, seed-paired where the design allows) is worth

        E_eff = L_1^{-1}(L_1(t_0 + W) + excess) - t_0

    tokens of the k = 1 branch. With r = W / E_eff, E = E_min (1 + k B / B_crit) and
    E_eff = E_min (1 + B / B_crit) give the per-run formula with the baseline b = B
    (`science.laws.bcrit_corrected`): B_crit = (k B - B r) / (r - 1), in sequences.

    - excess <= 0 (r <= 1): no measurable cost; b_crit None, b_crit_low from the upper bound;
    - a loss above the curve's highest (usually the fork's: the branch lost ground): None;
    - r >= k (no better than k = 1 after as many steps): None, worse than the model allows.

    `bounds` = (lower, upper) of the excess give the interval: b_crit_high from the lower,
    b_crit_low from the upper (B_crit falls as the excess rises). Assumptions: B_crit is
    constant over the window (an instantaneous value); the k = 1 curve is exact (its own seed
    scatter is not in the interval). Bias: between eval points the curve is a chord in log
    tokens, above a convex loss curve, so E_eff comes out long, r short and B_crit high; so
    too when the window ends with a cooldown (the curve's inner points are not annealed).
    """
    from critbatch.science.fits import LossCurve
    from critbatch.science.laws import bcrit_corrected

    k, b = int(multiplier), float(base_batch_size)
    if k < 2 or base_batch_size < 1 or not window_tokens > 0:
        raise ValueError(f"k = {multiplier}, B = {base_batch_size}, window {window_tokens}: "
                         "give k >= 2, a base batch >= 1 sequence and a window > 0 tokens")
    few = len(np.atleast_1d(curve_tokens)) < 2
    curve = None if few else LossCurve(curve_tokens, curve_losses, extrapolate=False)
    end = fork_tokens + window_tokens
    if (curve is None or curve.pchip is None
            or not math.isclose(curve.tokens[-1], end, rel_tol=1e-9)):
        return TokensEquivalent(k, excess, None, None, None, None, None, note=(
            "the k = 1 curve over the window does not fall to its end (fewer than two "
            "decreasing points, or the end not the lowest): no effective tokens"))
    low_loss, high_loss = curve.loss_range

    def read(x: float) -> tuple[float | None, float]:
        """(r, B_crit on the extended line: inf for r <= 1, 0 above the curve or r >= k)."""
        if x <= 0:
            return (1.0 if x == 0 else None), math.inf
        if low_loss + x > high_loss:
            return None, 0.0
        e_eff = curve.tokens_for(low_loss + x)[0] - fork_tokens
        if e_eff <= 0:  # the loss at the fork itself: no progress at all
            return None, 0.0
        r = window_tokens / e_eff
        return r, max(0.0, bcrit_corrected(k * b, b, r))

    r, value = read(excess)
    low = read(bounds[1])[1] if bounds else math.inf
    high = read(bounds[0])[1] if bounds else math.inf
    note = None
    if value == math.inf:
        note = "no measurable cost (r <= 1)" + (f"; B_crit > {low:.3g}" if low < math.inf
                                                else "")
    elif r is None:
        note = "the branch ended above the k = 1 curve (above the loss at the fork)"
    elif value == 0:
        note = f"r = {r:.3g} >= k: no better than k = 1 after as many steps"
    elif bounds and high == math.inf:
        note = "interval unbounded above: the excess is within its noise of 0"
    return TokensEquivalent(
        multiplier=k, excess=excess, effective_tokens=None if r is None else window_tokens / r,
        ratio=r, b_crit=value if 0 < value < math.inf else None,
        b_crit_low=low if bounds and low < math.inf else None,
        b_crit_high=high if bounds and high < math.inf else None, note=note)


def ema(series: ArrayLike, decay: float = EMA_DECAY) -> np.ndarray:
    """Exponential moving average: s_0 = x_0, s_t = decay s_{t-1} + (1 - decay) x_t.

    Same units as `series` (a training loss per optimizer step, nats/token). At the paper's
    0.5 the two conventions for its alpha (weight of the past or of the new value) agree.
    """
    x = np.asarray(series, dtype=float)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError("the loss series is empty or not 1-D: give one loss per optimizer "
                         "step of the branch")
    if not 0 <= decay < 1:
        raise ValueError(f"EMA decay is {decay}: give a value in [0, 1), e.g. {EMA_DECAY}")
    out = np.empty_like(x)
    out[0] = x[0]
    for t in range(1, len(x)):
        out[t] = decay * out[t - 1] + (1 - decay) * x[t]
    return out


def local_critical_batch_ema(base_batch_size: int, multipliers: Sequence[int],
                             train_losses: Sequence[ArrayLike], epsilon: float = TOLERANCE,
                             decay: float = EMA_DECAY) -> int:
    """The paper's rule (Merrill et al. 2025, section 3.1), in sequences, for comparison.

    `train_losses[i]`: the training loss per optimizer step (nats/token) of the branch at
    `multipliers[i]` x `base_batch_size` over the window (branches at larger k take fewer
    steps). Each series is smoothed (`ema`); L_k is its last value. The local critical batch
    is k* x B for the largest k* with L_k* <= L_j + epsilon for every smaller j: one-sided
    (a larger batch may do better) and not a walk (k* may lie above a k that failed). No
    error bar: epsilon absorbs all noise, so a noisy branch passes or fails by luck.
    """
    ks = check_multipliers(multipliers, len(train_losses))
    finals = [float(ema(x, decay)[-1]) for x in train_losses]
    within = [all(finals[i] <= finals[j] + epsilon for j in range(i)) for i in range(len(ks))]
    return base_batch_size * max(k for k, ok in zip(ks, within, strict=True) if ok)
