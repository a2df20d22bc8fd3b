"""A sweep's runs as what `recommend` answers from (science.recommend).

Per optimizer, the sweep's best-lr cells of one corpus, vocabulary and seq_len, at every model
size, become one `SizedSweep`: the cells with their loss noise and trunk, and the size
(non-embedding parameters) of each. `fit_model` fits the joint model (one curve per size,
with the small-batch term when the data demand it), then the loss law across sizes started
from it and its refits on resampled trunks: what the answer reads where loss keeps falling
towards small batches. The answer itself is `engine.py`'s, for every door; the report (printing,
JSON, plot, W&B) is `report.py` beside it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from critbatch.analysis.bcrit.best_lr import (
    BUDGET_TOLERANCE,
    best_lr_cells,
    group_key,
    seed_blocks,
    seed_scatter,
    split_runs,
)
from critbatch.analysis.joint.joint import (
    MIN_CELLS,
    NOMINAL_SIGMA,
    seed_noise,
    sharing_of,
    upper_bound,
)
from critbatch.results.errors import ResultsError
from critbatch.science.fits import nominal_budgets
from critbatch.science.joint import SHARED_FRACTION, JointData
from critbatch.science.joint_inference import select_form
from critbatch.science.model_size import param_count
from critbatch.science.recommend import (
    ScalingFit,
    fit_scaling,
    resample_units,
    starts_from,
)
from critbatch.science.rules import beta2_for_half_life, decay_half_life_tokens

RESAMPLES = 100  # bootstrap refits (the joint model's number)


@dataclass
class SizedSweep:
    """One optimizer's cells over model sizes: parallel lists, one entry per cell."""

    optimizer: str
    seq_len: int
    cells: list  # best_lr.Cell
    sigma: list[float]  # nats/token
    params: list[float]  # non-embedding parameters of the cell's model
    depth: int | None  # the sweep's depth (for --width), when one
    notes: list[str] = field(default_factory=list)
    beta2_rule: dict | None = None  # `beta2_rule` of its runs
    # the share of a cell's noise its trunk shares, measured from the seeds where they can
    # (`analysis.joint.joint.sharing_of`), else science.joint.SHARED_FRACTION
    shared: float = SHARED_FRACTION
    noise_unknown: bool = False  # no run repeated at another seed: every cell weighs the same
    # (params, batch size) -> the lrs at which a run diverged (they bound the best lr from above)
    diverged: dict = field(default_factory=dict)

    @property
    def sizes(self) -> list[float]:
        return sorted(set(self.params))

    def data(self, keep: np.ndarray | None = None) -> tuple[JointData, np.ndarray]:
        """(JointData with width index = size rank, sizes) of the cells in `keep`."""
        keep = np.ones(len(self.cells), bool) if keep is None else keep
        picked = [i for i in range(len(self.cells)) if keep[i]]
        sizes = sorted({self.params[i] for i in picked})
        data = JointData.build([self.params[i] for i in picked],
                               [self.cells[i].batch_size for i in picked],
                               [self.cells[i].tokens for i in picked],
                               [self.cells[i].loss for i in picked],
                               [self.sigma[i] for i in picked],
                               [self.cells[i].trunk for i in picked], widths=tuple(sizes),
                               upper=[upper_bound(self.cells[i]) for i in picked],
                               shared=self.shared)
        return data, np.array(sizes, float)


def run_params(run: dict) -> float | None:
    """Non-embedding parameters of a run: its summary's (or table's) count, else the closed
    form of its width and depth."""
    if run.get("params_nonembedding"):
        return float(run["params_nonembedding"])
    if run.get("width") and run.get("depth"):
        return float(param_count(run["width"], run["depth"], run["seq_len"] or 0,
                                 run.get("vocab_size") or 0)[1])
    return None


def beta2_rule(runs: list[dict]) -> dict | None:
    """How the runs set AdamW's beta2 (summary.json `beta2`, `beta2_scaling`): {"scaling":
    "tokens", "half_life_tokens": H} when every run kept one half-life in tokens, {"scaling":
    "none", "beta2": b} when every run trained at one beta2; None when the runs do not
    record it (folders from before it was recorded, tables without it) or disagree."""
    seen = set()
    for r in runs:
        if r.get("beta2") is None or not r.get("seq_len"):
            return None
        if r.get("beta2_scaling") == "tokens":
            half = decay_half_life_tokens(r["beta2"], r["batch_size"], r["seq_len"])
            seen.add(("tokens", float(f"{half:.6g}")))
        else:
            seen.add(("none", float(r["beta2"])))
    if len(seen) != 1:
        return None
    scaling, value = seen.pop()
    return ({"scaling": "tokens", "half_life_tokens": value} if scaling == "tokens"
            else {"scaling": "none", "beta2": value})


def beta2_of(rule: dict | None, batch_size: int | None, seq_len: int) -> float | None:
    """The beta2 the sweep's rule gives at `batch_size` (None without a rule or a batch)."""
    if rule is None or batch_size is None:
        return None
    if rule["scaling"] == "tokens":
        return beta2_for_half_life(rule["half_life_tokens"], batch_size, seq_len)
    return rule["beta2"]


def width_params(width: int, depth: int) -> float:
    """Non-embedding parameters of a width at `depth` (`science.model_size.param_count`)."""
    return float(param_count(width, depth, 0, 0)[1])


def sized_sweeps(runs: list[dict], warnings: list[str]) -> dict[str, SizedSweep]:
    """Per optimizer, its groups of runs (one per model) of the corpus, vocabulary and seq_len
    with the most runs, as one SizedSweep. Groups without a size are left out with a warning;
    cells of too few steps for their warmup too."""
    groups, left_out, more = split_runs(runs)
    warnings += more
    if left_out:
        counts = Counter(d["reason"] for d in left_out)
        warnings.append("left out: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    by_opt: dict[str, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for key, members in groups.items():
        data_name, vocab, seq_len, _width, _depth, optimizer, _label, _params = key
        by_opt[optimizer][(data_name, vocab, seq_len)].append(members)
    out = {}
    for optimizer, corpora in sorted(by_opt.items()):
        corpus = max(corpora, key=lambda c: sum(len(m) for m in corpora[c]))
        sweep = SizedSweep(optimizer, int(corpus[2]), [], [], [], None)
        depths, blocks = set(), []
        for members in corpora[corpus]:
            size = run_params(members[0])
            if size is None:
                warnings.append(f"{optimizer}: {len(members)} runs without a model size left "
                                "out; give the table a params column (non-embedding "
                                "parameters)")
                continue
            depths.add(members[0].get("depth"))
            key = group_key(members[0])
            for r in runs:  # a run that diverged bounds its batch's lr from above
                if r["status"] == "diverged" and group_key(r) == key and r.get("lr"):
                    sweep.diverged.setdefault((size, r["batch_size"]), set()).add(
                        float(r["lr"]))
            budgets = nominal_budgets([r["tokens"] for r in members], BUDGET_TOLERANCE)
            blocks += seed_blocks(members, budgets)
            scatter = seed_scatter(members, budgets)
            cells = best_lr_cells(members, None, scatter[0] if scatter else None)
            noise = seed_noise({"cells": cells})  # the joint model's: per batch and tokens
            for c in cells:
                if c.few_steps:
                    sweep.notes.append("fewer steps than 3x the warmup")
                    continue
                if noise:
                    sigma = float(noise.sd(c.batch_size, c.tokens)) / math.sqrt(c.n_seeds)
                else:  # seeds only at lrs that are no cell's best: their pooled scatter
                    sigma = (scatter[0] / math.sqrt(c.n_seeds) if scatter and scatter[0] > 0
                             else math.nan)
                sweep.cells.append(c)
                sweep.sigma.append(sigma)
                sweep.params.append(size)
        if not sweep.cells:
            continue
        sweep.beta2_rule = beta2_rule([r for m in corpora[corpus] for r in m])
        sweep.shared = sharing_of([{"seed_blocks": blocks}])[1]
        sweep.noise_unknown = not any(math.isfinite(s) for s in sweep.sigma)
        sweep.sigma = [s if math.isfinite(s) else NOMINAL_SIGMA for s in sweep.sigma]
        sweep.depth = depths.pop() if len(depths) == 1 else None
        out[optimizer] = sweep
    return out


@dataclass
class Model:
    """What a recommendation needs from a sweep."""

    fit: ScalingFit
    refits: list[ScalingFit]
    term_tests: dict  # per optional term (`joint_inference.TERMS`) its tests (`select_form`)
    sizes: np.ndarray
    smallest_batch: int
    min_loss: float
    resamples: int = RESAMPLES  # bootstrap refits tried (`refits` holds those that converged)


def fit_model(sweep: SizedSweep, keep: np.ndarray | None = None, resamples: int = RESAMPLES,
              seed: int = 0) -> Model:
    """The loss law across sizes (with the joint model's optional terms where
    `science.joint_inference.select_form`'s tests keep them) and its bootstrap refits, on the
    cells in `keep`."""
    keep = np.ones(len(sweep.cells), bool) if keep is None else keep
    data, sizes = sweep.data(keep)
    if len(data) < MIN_CELLS:
        raise ResultsError(f"{sweep.optimizer}: {len(data)} usable cells, the model needs "
                           f"{MIN_CELLS}; train more batch sizes or budgets")
    joint, terms = select_form(data)
    if not joint.usable:
        raise ResultsError(f"{sweep.optimizer}: the joint model cannot be fitted to its "
                           f"{len(data)} cells ({joint.message})")
    fit = fit_scaling(data, sizes, starts_from(joint, sizes, data), form=joint.form)
    if not math.isfinite(fit.chi2):
        raise ResultsError(f"{sweep.optimizer}: the loss law across sizes could not be fitted "
                           f"to its {len(data)} cells; check the table's losses")
    refits = resample_units(data, sizes, fit, resamples, seed=seed)
    return Model(fit, refits, terms, sizes, int(data.batch.min()), float(data.loss.min()),
                 resamples)
