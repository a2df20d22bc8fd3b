"""Each checkpoint's local critical batch decision from its branches (`decide_base`).

Replicated ladders (every checkpoint has every k at one replicate seed or more,
`BaseRun.ladder`): `science.local_cbs_seeds.replicated_ladders` on the ladders stacked by seed,
the scatter of each seed-paired excess pooled over the checkpoints per k (`scatter_rows`: how
it was pooled; `pool_warnings`: where checkpoints were left out of the pool). Otherwise
`science.local_cbs.local_critical_batch` with the branch noise of the k = 1 replicates
(`estimate_branch_noise`, pooled over the checkpoints; disjoint pairs: k = 1 with the first
replicate, then the next replicates two by two), which is also reported for the replicated
design. A diverged branch (status "diverged", no val_sequences.json) at any seed is a
rejection: the walk stops below it. `decision_fields` turns a decision into fits.json fields.

Units: batch sizes in sequences; losses in nats/token.
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.analysis.local_cbs.reading import BaseRun, Branch, Checkpoint
from critbatch.results.errors import ResultsError
from critbatch.science.local_cbs import (
    BranchNoise,
    LocalCriticalBatch,
    excesses_over_first,
    local_critical_batch,
)
from critbatch.science.local_cbs_seeds import ReplicatedLadders, ScatterPool, replicated_ladders


def replicate_pairs(checkpoint: Checkpoint) -> list[tuple[np.ndarray, np.ndarray]]:
    """Disjoint pairs of identically trained k = 1 branches (module docstring)."""
    same = [b for b in (*checkpoint.branches, *checkpoint.replicates)
            if b.multiplier == 1 and b.losses is not None]
    return [(same[i].losses, same[i + 1].losses) for i in range(0, len(same) - 1, 2)]


def ladders_of(base: BaseRun, checkpoint: Checkpoint) -> list[list[Branch]]:
    """The ladders a checkpoint's decision uses: the base seed's, then (replicated design)
    each replicate seed's, every one ascending in k."""
    seeds = checkpoint.ladder_seeds() if base.ladder else []
    return [checkpoint.at_seed(None), *(checkpoint.at_seed(s) for s in seeds)]


def usable(ladders: list[list[Branch]], where: str) -> tuple[int, list[int]]:
    """How many k, from the smallest, every ladder trained without diverging, and the
    multipliers that diverged in any ladder (a diverged branch is a rejection)."""
    if any(ladder[0].losses is None for ladder in ladders):
        raise ResultsError(f"{where}: a k={ladders[0][0].multiplier} branch diverged, so there "
                           "is nothing to compare the larger batches with; retrain it, or "
                           "remove the checkpoint's folder")
    ks = [b.multiplier for b in ladders[0]]
    broken = [i for i in range(len(ks)) if any(ladder[i].losses is None for ladder in ladders)]
    return (broken[0] if broken else len(ks)), [ks[i] for i in broken]


def decision_fields(d: LocalCriticalBatch | None, ks: list[int], kept: int,
                    diverged: list[int], batch: int, tolerance: float) -> dict:
    """A checkpoint's decision as row fields: b_crit, margin, lower_bound_only,
    first_step_rejected (the first step up was rejected: no lower end), noise_limited (the
    rejecting comparison's excess was within tolerance, only its bound was not), excess,
    upper and reference per k after the first (infinity and null at and above a diverged
    k), diverged (its multipliers). `d` is None when the first step up diverged."""
    rejected = [str(k) for k in ks[kept:]]
    inf = dict.fromkeys(rejected, math.inf)
    if d is None:
        return {"b_crit": batch * ks[0], "margin": None, "noise_limited": False,
                "lower_bound_only": False, "first_step_rejected": True, "excess": inf,
                "upper": inf, "reference": dict.fromkeys(rejected), "diverged": diverged}
    pairs = list(zip(ks[1:kept], d.comparisons, d.references, strict=True))
    stop = next((c for c in d.comparisons if c.upper >= tolerance), None)
    return {"b_crit": d.b_crit, "margin": d.margin,
            "noise_limited": stop is not None and stop.excess < tolerance,
            "lower_bound_only": d.lower_bound_only and not diverged,
            "first_step_rejected": d.margin is None,
            "excess": {**{str(k): c.excess for k, c, _ in pairs}, **inf},
            "upper": {**{str(k): c.upper for k, c, _ in pairs}, **inf},
            "reference": {**{str(k): r for k, _, r in pairs}, **dict.fromkeys(rejected)},
            "diverged": diverged}


def decide_base(base: BaseRun, noise: BranchNoise | None, tolerance: float,
                confidence: float) -> tuple[list[dict], list[dict], list[tuple]]:
    """Every checkpoint's decision fields (`decision_fields`); (replicated design) per k after
    the first the seed scatter its bounds used and how it was pooled (`scatter_rows`); and
    per checkpoint the excess of each k over k = 1 (empty where the first step up diverged).
    Replicated design (`BaseRun.ladder`): `replicated_ladders` on the ladders stacked by
    seed, the seed scatter pooled over the checkpoints per k where Bartlett's test allows;
    else `local_critical_batch` and `excesses_over_first` with the k = 1 branch noise."""
    batch = int(base.summary["batch_size"])
    where = [f"{base.run_dir.name} at {c.tokens:,} tokens" for c in base.checkpoints]
    ladders = [ladders_of(base, c) for c in base.checkpoints]
    cut = [usable(lad, w) for lad, w in zip(ladders, where, strict=True)]
    ks = [b.multiplier for b in base.checkpoints[0].branches]
    decided: list[LocalCriticalBatch | None] = [None] * len(ladders)
    over_first: list[tuple] = [()] * len(ladders)
    todo = [i for i, (kept, _) in enumerate(cut) if kept >= 2]
    per_k: list[dict] = []
    try:
        if base.ladder and todo:
            stacked = [[np.stack([lad[j].losses for lad in ladders[i]])
                        for j in range(cut[i][0])] for i in todo]
            result = replicated_ladders(batch, ks, stacked, tolerance=tolerance,
                                        confidence=confidence)
            for i, d, o in zip(todo, result.decisions, result.over_first, strict=True):
                decided[i], over_first[i] = d, o
            per_k = scatter_rows(result, [base.checkpoints[i].tokens for i in todo],
                                 [len(ladders[i]) for i in todo])
        else:
            for i in todo:
                losses = [b.losses for b in ladders[i][0][:cut[i][0]]]
                decided[i] = local_critical_batch(batch, ks[:cut[i][0]], losses, noise,
                                                  tolerance=tolerance, confidence=confidence)
                over_first[i] = excesses_over_first(losses, noise, confidence)
    except ValueError as err:
        raise ResultsError(f"{base.run_dir.name}: {err}") from None
    fields = [decision_fields(d, ks, kept, diverged, batch, tolerance)
              for d, (kept, diverged) in zip(decided, cut, strict=True)]
    return fields, per_k, over_first


def scatter_rows(result: ReplicatedLadders, tokens: list[int], seeds: list[int]) -> list[dict]:
    """Replicated design, per k after the first: the pooled sd of one seed's excess that the
    bounds used and its degrees of freedom (null when every checkpoint stands alone), the
    seeds, and how the pool was made (`pool_fields`) for the decision's comparisons
    (`equal_variance`) and for the excess over k = 1 (`equal_variance_vs_k1`); `tokens[i]`
    and `seeds[i]`: checkpoint i's."""
    rows = []
    for k, pool in result.pools.items():
        first = next(c for c, x in enumerate(pool.scatters) if x is not None)
        rows.append({"multiplier": k, "sd": pool.main.sd if pool.main else None,
                     "dof": pool.main.dof if pool.main else None, "seeds": seeds[first],
                     "equal_variance": pool_fields(pool, tokens),
                     "equal_variance_vs_k1": pool_fields(result.pools_over_first[k], tokens)})
    return rows


def pool_fields(pool: ScatterPool, tokens: list[int]) -> dict:
    """Bartlett's test over the checkpoints (statistic, p; `p_value_pooled`: over those pooled
    at the end) and the checkpoints (tokens) pooled and left alone."""
    return {"test": "Bartlett", "level": pool.level,
            "statistic": pool.test.statistic if pool.test else None,
            "p_value": pool.test.p_value if pool.test else None,
            "p_value_pooled": pool.kept.p_value if pool.kept else None,
            "pooled_tokens": [tokens[i] for i in pool.pooled],
            "alone_tokens": [tokens[i] for i in pool.alone]}


def pool_warnings(name: str, per_k: list[dict]) -> list[str]:
    """One line per k and comparison whose checkpoints were not all pooled."""
    out = []
    for row in per_k:
        for key, what in (("equal_variance", "excess over the best smaller branch"),
                          ("equal_variance_vs_k1", "excess over k = 1")):
            v = row[key]
            if v["alone_tokens"]:
                out.append(f"{name}: the seed scatter of k = {row['multiplier']}'s {what} differs "
                           f"between checkpoints (Bartlett p = {v['p_value']:.2g} < "
                           f"{v['level']:g}); pooled over {len(v['pooled_tokens'])} checkpoint(s),"
                           " each of the rest bound on its own seeds (wider): "
                           + ", ".join(f"{t:,}" for t in v["alone_tokens"]) + " tokens")
    return out
