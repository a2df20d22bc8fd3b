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
- `measured`: from `train.batch_size_start`, doubled while the local critical batch measured
  by branched training (a local-CBS report, `train.measured.fits`) at the tokens trained
  exceeds `train.measured.factor` x the batch, up to `train.batch_size`; checked before every
  step, never shrinking. The curve is read once at the start (training/measured.py) and is
  part of the plan's checkpointed state, so a resumed run follows the curve it started with.
- `switch`: `train.batch_size_start` until `train.switch_at_tokens`, then `train.batch_size`
  (a local-CBS branch: the base run's prefix, then k x its batch; training/local_cbs.py).
  Its optimizers are built for the first batch, so the lr before the switch is the base run's
  bit for bit; its last steps shrink to whole multiples of the micro-batch and data chunk.

Every batch is a whole number of micro-batches (gradient accumulation), so memory stays
flat while the batch grows. The trainer rescales the lr at every change by
`optim.lr_scaling` (training/optim.py) and keeps the token accounting exact: a scheduled
run ends on the token budget, its last steps shrinking (still by powers of two) to fill
it when the budget is a multiple of micro-batch x seq_len.
"""

from __future__ import annotations

import math

from critbatch.science.rules import (
    AdaptiveBatch,
    log_interp,
    measured_batch_size,
    pow2_floor,
    ramp_batch_size,
)
from critbatch.training.config import Config, micro_batch_size, token_budget
from critbatch.training.measured import read_curve


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
        self.switch_at = t.switch_at_tokens
        self.quantum = math.lcm(self.micro, t.data_chunk or 1)  # sequences: a switch's last steps
        self.controller = AdaptiveBatch(self.start, self.end, self.micro,
                                        t.adaptive.interval_steps, t.adaptive.noise_factor)
        self.factor = t.measured.factor
        self.measured = self.start  # measured: the batch so far (the last steps' shrink aside)
        # measured: [[tokens, B_crit (sequences)], ...], read from the report at the start and
        # replaced by the checkpoint's copy on resume (`restore`)
        self.curve = (read_curve(t.measured.fits, cfg.optim.name, cfg.optim.lr_scaling,
                                 cfg.scale) if self.kind == "measured" else [])

    @property
    def smallest_step(self) -> int:
        """Sequences of the smallest step the plan can take."""
        if self.kind == "switch":
            return self.quantum
        return self.end if self.kind == "constant" else self.micro

    def next(self, step: int, tokens_done: int, b_noise: float | None = None) -> int:
        left = (self.budget - tokens_done) // self.seq_len  # whole sequences left
        if left < self.smallest_step:
            return 0
        if self.kind == "constant":
            return self.end
        if self.kind == "switch":
            wanted = self.start if tokens_done < self.switch_at else self.end
            return wanted if wanted <= left else left // self.quantum * self.quantum
        if self.kind == "ramp":
            wanted = ramp_batch_size(tokens_done, self.budget, self.start, self.end,
                                     self.fraction, self.micro)
        elif self.kind == "measured":
            self.measured = measured_batch_size(self.b_crit(tokens_done), self.measured,
                                                self.end, self.factor)
            wanted = self.measured
        else:
            wanted = self.controller.update(step, b_noise)
        return wanted if wanted <= left else pow2_floor(left, self.micro)

    def b_crit(self, tokens_done: int) -> float:
        """The measured local critical batch (sequences) after `tokens_done` tokens: log B_crit
        linear in log tokens between the report's checkpoints, constant beyond its ends."""
        return log_interp(max(tokens_done, 1), [(t, b) for t, b in self.curve])

    def decides(self, step: int) -> bool:
        """True when the batch of the step after `step` steps may follow a new B_noise (the
        trainer brings the estimate up to date first)."""
        return self.kind == "adaptive" and self.controller.decides(step)

    def is_last(self, tokens_done: int) -> bool:
        """True when no step fits after `tokens_done` tokens."""
        return (self.budget - tokens_done) // self.seq_len < self.smallest_step

    def state(self) -> dict:
        """What a checkpoint needs to resume the adaptive controller, or the measured batch and
        the curve it follows."""
        if self.kind == "measured":
            return {"batch": self.measured, "curve": self.curve}
        return {"batch": self.controller.batch, "last_change": self.controller.last_change}

    def restore(self, state: dict | None) -> None:
        if not state:
            return
        if self.kind == "measured":
            self.measured, self.curve = state["batch"], state["curve"]
            return
        self.controller.batch = state["batch"]
        self.controller.last_change = state["last_change"]

    def summary_fields(self, fits: str | None) -> dict:
        """What summary.json records of the plan: a measured run's curve and its source."""
        if self.kind != "measured":
            return {}
        return {"measured_curve": {"fits": fits, "factor": self.factor,
                                   "tokens": [t for t, _ in self.curve],
                                   "b_crit": [b for _, b in self.curve]}}
