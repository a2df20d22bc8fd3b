"""Planted sweeps for the answer: table rows of a sweep in a known world (`science.recommend`'s
loss law across sizes with its B_crit law, and a known lr optimum), for tests and the
answer's coverage study (`analysis.recommend.coverage`). numpy only.

The world is like critbatch's cpu sweeps: losses of 4-6 nats/token at 0.2-1.5M tokens, B_crit
100-300 sequences, loss falling towards small batches at fixed tokens (no small-batch term),
so the answer is read through B_crit.
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.science.joint import Form
from critbatch.science.recommend import ScalingFit

SEQ_LEN = 64
SWEEP_SIZES = (24_640, 55_392, 98_432)  # non-embedding params of widths 32, 48, 64 at depth 2
LARGER = 393_472  # width 128 at depth 2
BATCHES = (8, 16, 32, 64, 128)
BUDGETS = (187_500, 375_000, 750_000, 1_500_000)
LR_CURVATURE = 0.1  # nats/token per (ln lr - ln lr*)^2
SIGMA = 0.01  # nats/token: one run's seed noise


def truth(b_small: float = 0.0, gamma: float = 4.8) -> ScalingFit:
    """The planted world (`b_small` > 0: small batches lose too, the loss is U-shaped in B)."""
    return ScalingFit(l0=2.0, a_size=0.5, size_exponent=0.3, c=1.5, b=0.3, b_star=3.2e5,
                      gamma=gamma, b_small=b_small, form=Form(small_batch=b_small > 0))


def planted_lr(batch, params):
    """The planted lr optimum: up as sqrt(B), down as N^-1/2."""
    return 3e-3 * (np.asarray(batch, float) / 32) ** 0.5 * (np.asarray(params, float)
                                                            / 1e5) ** -0.5


def planted_rows(world: ScalingFit, sizes, rng: np.random.Generator | None,
                 sigma: float = SIGMA, budgets=BUDGETS, batches=BATCHES) -> list[dict]:
    """Table rows of a sweep in `world`: every size x batch x budget at three lrs a factor 2
    apart around an off-centre guess of the optimum, the smallest batch at two seeds; the
    loss is the world's at the optimum plus LR_CURVATURE (ln lr/lr*)^2 plus seed noise
    (none without `rng`)."""
    rows = []
    for n in sizes:
        for b in batches:
            best = float(planted_lr(b, n))
            guess = best * (1.3 if rng is None else math.exp(rng.uniform(-0.35, 0.35)))
            for e in budgets:
                base = float(world.predict_loss(n, b, e)[0])
                for lr in (guess / 2, guess, guess * 2):
                    for seed in range(2 if b == batches[0] else 1):
                        noise = 0.0 if rng is None else rng.normal(0, sigma)
                        loss = base + LR_CURVATURE * math.log(lr / best) ** 2 + noise
                        rows.append({"group": f"N{n}", "optimizer": "adamw", "lr": lr,
                                     "seed": seed, "batch_size": b, "seq_len": SEQ_LEN,
                                     "tokens": e, "loss": loss, "params": n})
    return rows
