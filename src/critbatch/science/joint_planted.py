"""Planted worlds: the cells of a branched sweep generated from known joint-model parameters
(`science.joint`), exact or with seed noise, for tests and coverage checks. numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from critbatch.science.joint import SHARED_FRACTION, Form, JointData, JointFit, draw_losses


@dataclass(frozen=True)
class PlantedWorld:
    """Known parameters to generate cells from: a curve per width, one B_crit law."""

    l_inf: tuple = (1.0, 0.8, 0.6)  # nats/token, per width
    a: tuple = (3.3, 3.3, 3.3)  # nats/token above l_inf at E_min = E_REF
    alpha: tuple = (0.16, 0.16, 0.16)  # alpha x gamma <= 1: S_min(L) falls at every loss
    b_star: float = 3.2e5  # sequences at L = 1: B_crit 40 at 6.5 nats/token, 330 at 4.2
    gamma: float = 4.8
    power: float = 1.0  # the transition's power p (1: McCandlish et al.'s form)

    def fit(self) -> JointFit:
        n = len(self.l_inf)
        return JointFit(np.array(self.l_inf, float), np.array(self.a, float),
                        np.array(self.alpha, float), np.array([self.b_star]),
                        np.array([self.gamma]), widths=tuple(range(n)), power=self.power,
                        form=Form(power=self.power != 1.0))


def planted_world(world: PlantedWorld, batches=(8, 16, 32, 64, 128), budget: float = 1.5e6,
                  fractions=(0.125, 0.25, 0.5, 1.0), baseline_seeds: int = 2,
                  sigma: float = 0.0125, shared: float = SHARED_FRACTION,
                  rng: np.random.Generator | None = None,
                  batch_sigma: dict[int, float] | None = None,
                  seeded_batches: tuple[int, ...] | None = None,
                  with_seed_samples: bool = False) -> JointData | tuple[JointData, dict]:
    """The branched sweep's cells drawn from `world`: per width and batch a trunk at `budget`
    tokens with branches at `fractions` of it, the `seeded_batches` (default: the smallest)
    at `baseline_seeds` seeds (averaged per cell, as the analysis does), and each run's loss
    noisy by `sigma` (nats/token; `batch_sigma` overrides it per batch), shared `shared` of
    its variance with its branches (all 0 or no `rng`: exact). `with_seed_samples`: also
    return per width index the seeded cells' samples in `analysis.joint.seed_samples`'s form,
    {batch: (tokens, one run's sample variance, dof)}."""
    truth = world.fit()
    sd = {b: (batch_sigma or {}).get(b, sigma) for b in batches}  # one run's noise per batch
    seeded = set(batches[:1] if seeded_batches is None else seeded_batches)
    rows = []  # (width, batch, tokens, unit)
    unit = 0
    for w in range(len(world.l_inf)):
        for b in batches:
            for _ in range(baseline_seeds if b in seeded else 1):
                rows += [(w, b, budget * f, unit) for f in fractions]
                unit += 1
    width, batch, tokens, units = (np.array(col) for col in zip(*rows, strict=True))
    exact = truth.predict_loss(width, batch, tokens)
    run_sigma = np.array([max(sd[b], 1e-4) for b in batch.tolist()])
    runs = JointData.build(width, batch, tokens, exact, run_sigma, units,
                           widths=tuple(range(len(world.l_inf))))
    noiseless = rng is None or not any(sd.values())
    noisy = exact if noiseless else draw_losses(rng, runs, exact, 1.0, shared)
    # average the seeds of a cell: its loss noise shrinks by sqrt(seeds)
    cells: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(width.tolist(), batch.tolist(), tokens.tolist(), strict=True)):
        cells.setdefault(key, []).append(i)
    order = list(cells.values())
    data = JointData.build(
        [width[i[0]] for i in order], [batch[i[0]] for i in order],
        [tokens[i[0]] for i in order], [float(np.mean(noisy[i])) for i in order],
        [run_sigma[i[0]] / math.sqrt(len(i)) for i in order],
        [units[i[0]] for i in order], widths=tuple(range(len(world.l_inf))), shared=shared)
    if not with_seed_samples:
        return data
    samples: dict[int, dict[int, tuple[list, list, list]]] = {}
    for (w, b, e), i in cells.items():
        if len(i) > 1:
            per_batch = samples.setdefault(w, {}).setdefault(b, ([], [], []))
            for column, value in zip(per_batch, (e, float(np.var(noisy[i], ddof=1)),
                                                 len(i) - 1), strict=True):
                column.append(value)
    return data, samples
