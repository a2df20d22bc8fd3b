"""The learning-rate schedule: the peak lr's multiplier at each step (warmup, then cosine,
linear, constant or wsd's cooldown), where a wsd run's cooldown starts (what a branch forks
at) and where its constant phase is read. Pure functions of the step and the config, without
torch: the sweep's planner uses them in a process that trains nothing."""

from __future__ import annotations

import math

from critbatch.training.config import TrainConfig


def lr_factor(step: int, total_steps: int, train: TrainConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based), a pure function.

    Linear warmup over `warmup_steps` optimizer steps (counted in steps, never
    rescaled with the batch size), then:
      cosine   -- half cosine from 1 to min_lr_ratio at the last step;
      linear   -- straight line from 1 to min_lr_ratio;
      constant -- 1;
      wsd      -- 1 until `wsd_decay_start`, then a 1-sqrt cooldown to min_lr_ratio at the
                  last step (`cooldown`).
    """
    warmup = train.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if train.schedule == "wsd":
        start = wsd_decay_start(total_steps, train)
        if step < start:
            return 1.0
        return cooldown((step - start + 1) / max(1, total_steps - start), train.min_lr_ratio)
    span = max(1, total_steps - 1 - warmup)
    return _decay(min(1.0, (step - warmup) / span), train)


# where in the constant-lr phase the online noise tracker is read with a validation loss
# (`constant_lr_reading_steps`): a quarter of the way, half, three quarters and its end
READING_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def constant_lr_reading_steps(total_steps: int, train: TrainConfig) -> list[int]:
    """Step counts (steps taken) at which every step so far since the warmup ran at the peak
    lr: READING_FRACTIONS of the way from the warmup's end to the last peak-lr step (a wsd
    run's cooldown start, a constant run's end). Empty for schedules with no constant phase
    (cosine, linear). The online B_noise read there has not seen a decaying lr, which moves
    |G|^2 and so B_noise (docs/science.md, the noise scale checked)."""
    if train.schedule == "wsd":
        last = wsd_decay_start(total_steps, train)
    elif train.schedule == "constant":
        last = total_steps
    else:
        return []
    first = train.warmup_steps
    if last - first < 2 * len(READING_FRACTIONS):
        return []
    return sorted({first + round(f * (last - first)) for f in READING_FRACTIONS})


def wsd_decay_start(total_steps: int, train: TrainConfig) -> int:
    """The first step of a wsd run's cooldown: the last `cooldown_fraction` of the steps
    (never inside the warmup). Steps before it run at the peak lr whatever the budget, so
    a shorter run is a prefix of a longer one up to here (what a branch forks at), and
    it never decreases as the budget grows."""
    decay_steps = max(1, round(train.cooldown_fraction * total_steps))
    return max(train.warmup_steps, total_steps - decay_steps)


def cooldown(progress: float, floor: float) -> float:
    """The wsd cooldown's multiplier at `progress` in (0, 1]: 1 - sqrt, from 1 to `floor`.

    1-sqrt keeps the lr high for longer than a straight line and drops it fast at the end;
    Hagele et al. 2024 (arXiv 2405.18392) found it matches or beats a linear cooldown and
    a cosine run of the same length.
    """
    return floor + (1.0 - floor) * (1.0 - math.sqrt(min(1.0, progress)))


def lr_factor_by_tokens(step: int, tokens_after: int, budget: int, train: TrainConfig) -> float:
    """Multiplier of the peak lr for a scheduled batch, whose step count is not known ahead.

    Warmup is still linear over `warmup_steps` optimizer steps; after it the decay follows
    the share of the token budget trained by the end of this step, `tokens_after / budget`,
    in place of the share of the steps (so the last step reaches min_lr_ratio; wsd:
    constant until 1 - cooldown_fraction of it).
    """
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    progress = min(1.0, tokens_after / budget)
    if train.schedule == "wsd":
        start = 1.0 - train.cooldown_fraction
        if progress < start:
            return 1.0
        return cooldown((progress - start) / train.cooldown_fraction, train.min_lr_ratio)
    return _decay(progress, train)


def _decay(progress: float, train: TrainConfig) -> float:
    """cosine, linear or constant from 1 at progress 0 to min_lr_ratio at progress 1."""
    floor = train.min_lr_ratio
    if train.schedule == "constant":
        return 1.0
    if train.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
