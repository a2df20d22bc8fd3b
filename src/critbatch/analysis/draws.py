"""Replicate draws in the B_crit study: is the joint model's misfit noise or its own error?

A sweep trained again at another seed (`make sweep-batch ARGS="grid.seed=10
grid.baseline_seeds='\\"11,12\\"'"`, docs/studies.md) and analysed together with the first
(`python analysis/fit_bcrit.py <first> <second>`) measures every cell twice. The joint
model is fitted to all of them (`analysis.joint`); here the runs are split again by their
draw (the `grid.seed` override; 0 without one), each draw's cells are built and fitted alone
in the form the joint fit kept, and `science.replicates.check_draws` compares the first
two draws: fits.json `joint.<optimizer>.draws` (None with one draw).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from critbatch.analysis import bcrit
from critbatch.analysis.joint import (
    MIN_CELLS,
    build_data,
    cells_of,
    comparable_groups,
    noise_sources,
    seed_noise,
    width_label,
)
from critbatch.science.fits import nominal_budgets
from critbatch.science.joint import Form
from critbatch.science.replicates import check_draws

DRAW_KEY = "grid.seed="


def draw_of(run: dict) -> int:
    """The run's draw: its `grid.seed` override, 0 without one (a sweep's default draw)."""
    for item in run.get("overrides") or []:
        if str(item).startswith(DRAW_KEY):
            try:
                return int(str(item)[len(DRAW_KEY):])
            except ValueError:
                return 0
    return 0


def draw_groups(runs: list[dict]) -> dict[int, list[dict]]:
    """Per draw (two or more, else {}), its groups as the joint model reads them: each a
    {"key", "cells"} of the draw's runs of one model and optimizer at their best lr."""
    by_draw: dict[int, list[dict]] = defaultdict(list)
    for run in runs:
        by_draw[draw_of(run)].append(run)
    if len(by_draw) < 2:
        return {}
    out = {}
    for draw, mine in sorted(by_draw.items()):
        groups, _, _ = bcrit.split_runs(mine)
        out[draw] = []
        for key, members in groups.items():
            budgets = nominal_budgets([r["tokens"] for r in members], bcrit.BUDGET_TOLERANCE)
            scatter = bcrit.seed_scatter(members, budgets)
            cells = bcrit.best_lr_cells(members, scatter=scatter[0] if scatter else None)
            out[draw].append({"key": dict(zip(bcrit.GROUP_KEYS, key, strict=True)),
                              "cells": cells})
    return out


def draw_data(groups: list[dict], optimizer: str):
    """(JointData, the cells' keys (width, batch, budget)) of one draw's optimizer, or None
    with fewer than MIN_CELLS usable cells."""
    mine = comparable_groups(groups).get(optimizer)
    if not mine:
        return None
    trends = [seed_noise(g) for g in mine]
    used, _ = cells_of(mine, trends)
    if len(used) < MIN_CELLS:
        return None
    keys = [(width_label(g["key"]), c.batch_size, c.budget) for g, c, _ in used]
    return build_data(used, noise_sources(used, mine, trends)), keys


def draws_document(draws: dict[int, list[dict]], optimizer: str, form: Form) -> dict | None:
    """fits.json `joint.<optimizer>.draws`: the first two draws with enough cells compared
    (`check_draws`), or None where fewer than two have them or they share under 3 cells."""
    found = [(d, got) for d, groups in draws.items()
             if (got := draw_data(groups, optimizer)) is not None]
    if len(found) < 2:
        return None
    (d1, (first, keys1)), (d2, (second, keys2)) = found[:2]
    index2 = {k: n for n, k in enumerate(keys2)}
    shared = [(n, index2[k]) for n, k in enumerate(keys1) if k in index2]
    if len(shared) < 3:
        return None
    pairs = (np.array([a for a, _ in shared]), np.array([b for _, b in shared]))
    check = check_draws(first, second, pairs, form, seed=d1 + d2)
    return {"draws": [d1, d2], "n_draws": len(draws), **check.as_dict()}


def add_draw_checks(runs: list[dict], joint: dict, warnings: list[str]) -> None:
    """Set `draws` in every optimizer's joint document (None without two draws); a warning
    names a misfit the draws show to be the model's own error."""
    draws = draw_groups(runs)
    for optimizer, doc in joint.items():
        doc["draws"] = None
        if not draws:
            continue
        print(f"  joint model ({optimizer}): the draws' check ...", flush=True)
        form = Form(small_batch=doc.get("b_small") is not None,
                    power=doc.get("transition_power") is not None)
        doc["draws"] = draws_document(draws, optimizer, form)
        if doc["draws"] and doc["draws"]["verdict"] != "noise":
            warnings.append(f"joint model ({optimizer}), two draws: {doc['draws']['sentence']}")
