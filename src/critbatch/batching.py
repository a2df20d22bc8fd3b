"""Batch-size schedules: which batch each optimizer step trains (`train.batch_schedule`).

Why grow the batch: the gradient noise scale B_noise -- the batch beyond which a larger
batch stops buying fewer steps (science.md sections 1-2) -- rises as the loss falls
(Kaplan et al. 2020: B_crit ~ L^-4.8). A batch that starts small and grows with it takes
fewer optimizer steps for the same tokens than a constant small batch, and wastes fewer
tokens early than a constant large one. GPT-3 ramped its batch linearly over the first
4-12B tokens; McCandlish et al. 2018 prescribe training near B_noise throughout; Merrill
et al. 2025 report 43% fewer steps with a batch warmup.

- `constant`: `train.batch_size` every step.
- `ramp`: from `train.batch_size_start` to `train.batch_size`, the target growing linearly
  in tokens over the first `train.ramp_fraction` of the budget and rounded *down* to a
  power of two times the micro-batch (so each doubling starts once the line reaches it).
- `adaptive`: `noise_factor x B_noise` from the online tracker, clipped to
  [batch_size_start, batch_size], rounded to the nearest power of two times the
  micro-batch, decided every `interval_steps` optimizer steps (so changed at most that often).

Every batch is a whole number of micro-batches (gradient accumulation), so memory stays
flat while the batch grows. The trainer rescales the lr at every change by
`optim.lr_scaling` (critbatch/optim.py) and keeps the token accounting exact: a scheduled
run ends on the token budget, its last steps shrinking (still by powers of two) to fill
it when the budget is a multiple of micro-batch x seq_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from critbatch.config import Config, micro_batch_size, token_budget


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


class BatchPlan:
    """The batch of every step of a run, and when the token budget is spent.

    `next(step, tokens_done, b_noise)` returns the batch (sequences) of the step that starts
    after `tokens_done` tokens, or 0 when the budget has no room for another step.
    Constant: `train.batch_size` while a whole step fits (the budget is steps x batch).
    Scheduled: the schedule's batch, shrunk by halvings to what the budget has left.
    """

    def __init__(self, cfg: Config) -> None:
        t = cfg.train
        self.kind = t.batch_schedule
        self.seq_len = cfg.model.seq_len
        self.budget = token_budget(cfg)
        self.micro = micro_batch_size(cfg)
        self.end = t.batch_size
        self.start = t.batch_size if self.kind == "constant" else t.batch_size_start
        self.fraction = t.ramp_fraction
        self.controller = AdaptiveBatch(self.start, self.end, self.micro,
                                        t.adaptive.interval_steps, t.adaptive.noise_factor)

    @property
    def smallest_step(self) -> int:
        """Sequences of the smallest step the plan can take."""
        return self.end if self.kind == "constant" else self.micro

    def next(self, step: int, tokens_done: int, b_noise: float | None = None) -> int:
        left = (self.budget - tokens_done) // self.seq_len  # whole sequences left
        if left < self.smallest_step:
            return 0
        if self.kind == "constant":
            return self.end
        if self.kind == "ramp":
            wanted = ramp_batch_size(tokens_done, self.budget, self.start, self.end,
                                     self.fraction, self.micro)
        else:
            wanted = self.controller.update(step, b_noise)
        return wanted if wanted <= left else pow2_floor(left, self.micro)

    def decides(self, step: int) -> bool:
        """True when the batch of the step after `step` steps may follow a new B_noise (the
        trainer brings the estimate up to date first)."""
        return self.kind == "adaptive" and self.controller.decides(step)

    def is_last(self, tokens_done: int) -> bool:
        """True when no step fits after `tokens_done` tokens."""
        return (self.budget - tokens_done) // self.seq_len < self.smallest_step

    def state(self) -> dict:
        """What a checkpoint needs to resume the adaptive controller."""
        return {"batch": self.controller.batch, "last_change": self.controller.last_change}

    def restore(self, state: dict | None) -> None:
        if state:
            self.controller.batch = state["batch"]
            self.controller.last_change = state["last_change"]
