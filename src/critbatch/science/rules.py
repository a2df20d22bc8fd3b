"""Batch-size and learning-rate rules: batches as powers of two of the micro-batch, the
linear ramp, the noise-adaptive controller, the batch that follows a measured critical-batch
curve, and the lr scaling rules. Pure Python."""

from __future__ import annotations

import math
from dataclasses import dataclass


def pow2_floor(sequences: float, unit: int) -> int:
    """The largest unit x 2^k <= `sequences` (k >= 0); `unit` when `sequences` < 2 x unit."""
    if sequences < 2 * unit:
        return unit
    return unit * 2 ** int(math.floor(math.log2(sequences / unit) + 1e-12))


def pow2_nearest(sequences: float, unit: int) -> int:
    """unit x 2^k nearest to `sequences` in log scale (k >= 0)."""
    if sequences <= unit:
        return unit
    return unit * 2 ** int(round(math.log2(sequences / unit)))


def ramp_batch_size(tokens_done: int, budget: int, start: int, end: int, fraction: float,
                    unit: int) -> int:
    """Batch (sequences) of the step that begins after `tokens_done` tokens of the ramp.

    Linear in tokens from `start` at 0 to `end` at `fraction x budget`, rounded down to
    unit x 2^k, never below `start` nor above `end`.
    """
    ramp_tokens = fraction * budget
    if tokens_done >= ramp_tokens:
        return end
    target = start + (end - start) * tokens_done / ramp_tokens
    return min(end, max(start, pow2_floor(target, unit)))


@dataclass
class AdaptiveBatch:
    """The noise-adaptive controller: the batch follows `factor x B_noise`.

    `update(step, b_noise)` is called before each optimizer step (`step` = steps taken)
    with the online estimate (sequences, None while unresolved). It decides only after
    every `interval` steps (never at step 0: the estimate needs that long to settle), and
    the batch changes when the rounded target differs from it.

    Deciding on a fixed cadence keeps the choices a function of the training alone: the
    trainer folds the steps' gradient norms into the estimate when it flushes its metrics
    (one host sync, not one per step), and it flushes at every decision step
    (`BatchPlan.decides`), so the estimate the controller reads there is the same whatever
    `train.log_every` or the checkpoint timing; a resumed run makes the same choices.
    """

    low: int  # sequences; the first batch and the floor
    high: int  # sequences; the cap
    unit: int  # the micro-batch; batches are unit x 2^k
    interval: int  # optimizer steps between changes, at least
    factor: float = 1.0  # target = factor x B_noise
    batch: int = 0  # the current batch (0 = not started: low)
    last_change: int = 0  # the optimizer step of the last change

    def __post_init__(self) -> None:
        self.batch = self.batch or self.low

    def target(self, b_noise: float) -> int:
        """The batch the estimate asks for: clipped, then rounded to unit x 2^k."""
        clipped = min(self.high, max(self.low, self.factor * b_noise))
        return min(self.high, max(self.low, pow2_nearest(clipped, self.unit)))

    def decides(self, step: int) -> bool:
        """True at the steps where the controller may change the batch."""
        return step > 0 and step % self.interval == 0

    def update(self, step: int, b_noise: float | None) -> int:
        if not self.decides(step) or b_noise is None or not math.isfinite(b_noise):
            return self.batch
        wanted = self.target(b_noise)
        if wanted != self.batch:
            self.batch, self.last_change = wanted, step
        return self.batch


def log_interp(x: float, points: list[tuple[float, float]]) -> float:
    """The piecewise power law through `points` [(x, y)] (x ascending, all positive) at `x`:
    log y linear in log x between neighbouring points, constant beyond the first and last."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            frac = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(y0) + frac * (math.log(y1) - math.log(y0)))
    return points[-1][1]


def measured_batch_size(b_crit: float, batch: int, cap: int, factor: float) -> int:
    """The batch after doubling `batch` while `b_crit > factor x batch`, never above `cap`.

    `b_crit` is the measured local critical batch at this point of training (sequences;
    Merrill et al. 2025's branched estimate, analysis/local_cbs.py). Doubling only once it
    exceeds factor x the batch keeps the batch below B_crit / factor x 2 (factor 2: at most
    B_crit), where a larger batch still costs few extra tokens; it never shrinks.
    """
    while b_crit > factor * batch and 2 * batch <= cap:
        batch *= 2
    return batch


def lr_multiplier(rule: str, batch_size: int, base_batch_size: int) -> float:
    """f(B / B_base) of `optim.lr_scaling`: 1, sqrt(B / B_base) or B / B_base."""
    ratio = batch_size / base_batch_size
    return {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[rule]


def decay_at(decay: float, rule: str, batch_size: int, base_batch_size: int) -> float:
    """A per-step decay (Adam's beta2, Muon's momentum) at `batch_size` by its scaling rule
    (`optim.beta2_scaling`, `optim.momentum_scaling`): as given (none), or decay^(B / B_base)
    (tokens), whose half-life ln 0.5 / ln decay steps of B sequences is the same number of
    tokens at every B (Marek et al. 2025 for beta2)."""
    return decay ** (batch_size / base_batch_size) if rule == "tokens" else decay


def decay_half_life_tokens(decay: float, batch_size: int, seq_len: int) -> float:
    """Tokens over which a per-step decay's average (Adam's second moment, Muon's momentum)
    halves its weight on a gradient (inf at 0 or 1): ln 0.5 / ln decay steps of
    batch_size x seq_len tokens."""
    return math.log(0.5) / math.log(decay) * batch_size * seq_len if 0 < decay < 1 else math.inf


def beta2_for_half_life(half_life_tokens: float, batch_size: int, seq_len: int) -> float:
    """The beta2 whose second-moment half-life is `half_life_tokens` at batch_size x seq_len
    tokens a step (the inverse of `decay_half_life_tokens`)."""
    return 0.5 ** (batch_size * seq_len / half_life_tokens)
