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

Replicated ladders (every k trained again at each replicate seed, the excess paired by seed)
are decided in `science.local_cbs_seeds`; the excess in effective tokens, the per-run B_crit's
currency, is `science.local_cbs_tokens`.

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
    from critbatch.science.distributions import t_quantile

    check_confidence(confidence)
    excess, se_paired, n = paired_difference(candidate, reference)
    terms = [(se_paired**2, n - 1), (2 * branch.sd**2, branch.dof)]
    se = math.sqrt(sum(v for v, _ in terms))
    dof = satterthwaite(terms)
    t = float(t_quantile(confidence, dof)) if se > 0 else 0.0
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


def excesses_over_first(losses: Sequence[ArrayLike], branch: BranchNoise,
                        confidence: float = CONFIDENCE) -> tuple[PairedExcess, ...]:
    """Without replicated ladders: every branch after the first against the first
    (`paired_excess`, with the branch-noise term); `losses[i]` per-sequence, as in
    `local_critical_batch`."""
    return tuple(paired_excess(x, losses[0], branch, confidence) for x in losses[1:])


# ---------------------------------------------------------------------------------------------
# The paper's rule, for comparison


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
