"""The gradient noise scale B_noise = tr(Sigma) / |G|^2 (McCandlish et al. 2018, App. A).

G is the true gradient and Sigma the per-example gradient covariance; only batch gradients
are observed. The gradient g_B of B i.i.d. examples has E |g_B|^2 = |G|^2 + tr(Sigma) / B,
so squared norms at two batch sizes b < B give unbiased estimates

    |G|^2     ~ (B |g_B|^2 - b |g_b|^2) / (B - b)          (`g2_estimate`)
    tr(Sigma) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B)         (`trace_estimate`)

Each is unbiased, their ratio is not: average numerator and denominator separately (over
micro-batches offline, with `NoiseEMA` during training) and divide last. A non-positive
|G|^2 estimate means "not resolved, increase K", reported as None, never as a negative or
infinite B_noise. Offline, `estimate` adds a delete-a-group jackknife error bar.

Units: B_noise in examples (sequences, when an example is one sequence and the loss its mean
token loss). numpy only; the gradients themselves come from critbatch/training/gns.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

JACKKNIFE_GROUPS = 16  # micro-batches are dealt into this many groups for the error bar


def g2_estimate(g2_small, g2_big, b: int, big: int):
    """Unbiased |G|^2 from the mean squared norm at batch b and the squared norm at batch big."""
    return (big * g2_big - b * g2_small) / (big - b)


def trace_estimate(g2_small, g2_big, b: int, big: int):
    """Unbiased tr(Sigma) (per example) from the same two squared norms."""
    return (g2_small - g2_big) / (1 / b - 1 / big)


def noise_scale(trace: float, g2: float) -> float | None:
    """B_noise = tr(Sigma) / |G|^2 in examples; None when either estimate is not positive."""
    if not (g2 > 0 and trace > 0 and math.isfinite(g2) and math.isfinite(trace)):
        return None
    return trace / g2


@dataclass
class NoiseEMA:
    """Bias-corrected moving averages of |G|^2, tr(Sigma) and the loss; B_noise from their ratio.

    Per optimizer step the accumulation gives |g_b|^2 (b = micro-batch size) and |g_B|^2
    (B = batch size); each step's two unbiased estimates are averaged separately and the
    ratio is taken of the averages (a per-step ratio is biased and often undefined, its
    |G|^2 being negative). Bias correction as in Adam (Kingma & Ba 2015): each EMA is divided
    by 1 - decay^n, so early values are not pulled towards the zero the EMAs start from.

    Warning: a ratio of averages weights each step by its gradient scale. One gradient spike
    (|g_B|^2 ~1000x normal, seen in early training on the smoke preset) would dominate both
    averages for hundreds of steps, so a step whose |g_B|^2 exceeds `spike_factor` x the
    average |g_B|^2 so far is left out (counted in `skipped`), as are non-finite steps.
    """

    decay: float  # per optimizer step
    b: int  # small batch, sequences
    big: int  # big batch, sequences
    g2_sum: float = 0.0
    trace_sum: float = 0.0
    loss_sum: float = 0.0
    spike_factor: float = 100.0  # skip steps with |g_B|^2 above this x its average (norm 10x)
    big_sum: float = 0.0  # EMA of |g_B|^2
    weight: float = 0.0  # 1 - decay^n after n updates
    steps: int = 0  # updates taken
    skipped: int = 0  # spikes and non-finite steps left out

    def update(self, g2_small: float, g2_big: float, loss: float, big: int | None = None) -> dict:
        """Fold in one step; return that step's raw estimates and the averaged values.

        `big`: this step's batch when it differs from `self.big` (a scheduled batch).
        """
        big = big or self.big
        g2 = g2_estimate(g2_small, g2_big, self.b, big)
        trace = trace_estimate(g2_small, g2_big, self.b, big)
        spike = self.weight > 0 and g2_big > self.spike_factor * self.big_sum / self.weight
        if all(math.isfinite(v) for v in (g2, trace, loss)) and not spike:
            d = self.decay
            self.g2_sum = d * self.g2_sum + (1 - d) * g2
            self.trace_sum = d * self.trace_sum + (1 - d) * trace
            self.loss_sum = d * self.loss_sum + (1 - d) * loss
            self.big_sum = d * self.big_sum + (1 - d) * g2_big
            self.weight = d * self.weight + (1 - d)
            self.steps += 1
        else:
            self.skipped += 1
        return {"gns_g2": self.g2, "gns_trace": self.trace, "b_noise": self.b_noise,
                "gns_g2_step": g2, "gns_trace_step": trace}

    @property
    def g2(self) -> float | None:
        return self.g2_sum / self.weight if self.weight else None

    @property
    def trace(self) -> float | None:
        return self.trace_sum / self.weight if self.weight else None

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.weight if self.weight else None

    @property
    def b_noise(self) -> float | None:
        return noise_scale(self.trace, self.g2) if self.weight else None


def ema_interval(g2_steps, trace_steps, decay: float) -> tuple[float, float, float] | None:
    """(B_noise, low, high) of the bias-corrected EMAs of per-step |G|^2 and tr(Sigma)
    estimates (`NoiseEMA`, the last step last), with a 68% interval: the EMAs' variances
    sum w_i^2 s^2 from the steps' weighted scatter about them (steps taken as independent:
    each draws new data), carried to log B_noise by the delta method with the two
    estimates' covariance. None when |G|^2 or tr(Sigma) is not positive."""
    g = np.asarray(g2_steps, float)
    t = np.asarray(trace_steps, float)
    n = len(g)
    w = (1 - decay) * decay ** np.arange(n - 1, -1, -1)
    w /= w.sum()
    g2, trace = float(w @ g), float(w @ t)
    if not (g2 > 0 and trace > 0) or n < 3:
        return None
    w2 = float(w @ w)
    scale = w2 / (1 - w2)  # sum w^2 x the weighted variance, made unbiased
    var_g, var_t = scale * float(w @ (g - g2) ** 2), scale * float(w @ (t - trace) ** 2)
    cov = scale * float(w @ ((g - g2) * (t - trace)))
    se = math.sqrt(max(0.0, var_t / trace**2 + var_g / g2**2 - 2 * cov / (trace * g2)))
    b = trace / g2
    return b, b * math.exp(-se), b * math.exp(se)


@dataclass
class GroupSums:
    """What the estimate and its jackknife need from K micro-batch gradients g_i.

    The micro-batches are dealt round-robin into m groups; T_k is the sum of the gradients
    in group k. The full-batch norm is |sum_k T_k|^2 / K^2 = gram.sum() / K^2, and the same
    with any groups left out, so every jackknife replicate comes from this m x m matrix.
    """

    gram: np.ndarray  # (m, m) float64: <T_k, T_l>
    sq_sums: np.ndarray  # (m,) sum over group k of |g_i|^2
    counts: np.ndarray  # (m,) micro-batches in group k
    loss_sums: np.ndarray  # (m,) sum over group k of the micro-batch losses (nats/token)


@dataclass
class NoiseEstimate:
    micro_batches: int  # K
    micro_batch_size: int  # b, sequences
    loss: float  # mean train loss over the K b sequences, nats/token
    g2: float  # |G|^2
    trace: float  # tr(Sigma), per sequence
    g2_stderr: float | None
    trace_stderr: float | None
    b_noise: float | None  # sequences; None = not resolved
    b_noise_low: float | None  # 68% interval (1 sigma in log B_noise); None = unbounded
    b_noise_high: float | None
    groups: int  # jackknife groups


def estimate_from_groups(s: GroupSums, b: int, keep: np.ndarray | None = None) -> tuple:
    """(|G|^2, tr(Sigma)) from the groups in `keep` (a boolean mask; all by default)."""
    keep = np.ones(len(s.counts), bool) if keep is None else keep
    k = int(s.counts[keep].sum())
    g2_small = s.sq_sums[keep].sum() / k
    g2_big = s.gram[np.ix_(keep, keep)].sum() / k**2
    return float(g2_estimate(g2_small, g2_big, b, k * b)), float(
        trace_estimate(g2_small, g2_big, b, k * b))


def estimate(s: GroupSums, b: int) -> NoiseEstimate:
    """Point estimates and delete-a-group jackknife errors (Quenouille 1956; Tukey 1958).

    Why the jackknife and not the bootstrap: every delete-a-group subset is itself a valid
    sample of K' < K micro-batches, so each replicate is the same unbiased estimator. A
    bootstrap resample repeats micro-batches, and a repeated gradient's inner product with
    itself enters |g_B|^2 as if it were a cross term, inflating |G|^2 in every replicate.
    With m groups, SE^2 = (m-1)/m sum_k (theta_{-k} - mean)^2. B_noise's interval is
    taken in log B_noise (a ratio is skewed; the interval stays positive) at 1 sigma:
    B exp(-SE), B exp(+SE). If a replicate is not resolved, the interval is unbounded (None).
    The error bar has m - 1 degrees of freedom: itself uncertain by about 1/sqrt(2(m-1)).
    """
    g2, trace = estimate_from_groups(s, b)
    m, big_k = len(s.counts), int(s.counts.sum())
    b_noise = noise_scale(trace, g2)
    g2_se = trace_se = low = high = None
    if m >= 2 and big_k - s.counts.max() >= 2:
        reps = np.array([estimate_from_groups(s, b, np.arange(m) != k) for k in range(m)])
        g2_se, trace_se = (float(math.sqrt((m - 1) / m * ((reps[:, j] - reps[:, j].mean()) ** 2)
                                           .sum())) for j in (0, 1))
        ratios = [noise_scale(tr, g) for g, tr in reps]
        if b_noise is not None and all(r is not None for r in ratios):
            logs = np.log(ratios)
            se = math.sqrt((m - 1) / m * ((logs - logs.mean()) ** 2).sum())
            low, high = b_noise * math.exp(-se), b_noise * math.exp(se)
    return NoiseEstimate(
        micro_batches=big_k, micro_batch_size=b, loss=float(s.loss_sums.sum() / big_k),
        g2=g2, trace=trace, g2_stderr=g2_se, trace_stderr=trace_se, b_noise=b_noise,
        b_noise_low=low, b_noise_high=high, groups=m,
    )
