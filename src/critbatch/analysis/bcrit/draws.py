"""Replicate draws in the B_crit study: is the joint model's misfit noise or its own error?

A sweep trained again at another seed (`make sweep-batch ARGS="grid.seed=10
grid.baseline_seeds='\\"11,12\\"'"`, docs/studies.md) and analysed together with the first
(`python analysis/fit_bcrit.py <first> <second>`) measures every cell twice. The joint
model is fitted to all of them (`analysis.joint`); here the analysed runs (those
`best_lr.split_runs` keeps, of the groups the joint model used) are split again by their draw
(the `grid.seed` override; 0 without one, as in tables and W&B runs, which do not keep the
overrides), each draw's cells are built and fitted alone in the form the joint fit kept, and
`science.replicates.check_draws` compares the first two draws: fits.json
`joint.<optimizer>.draws` (None with one draw). Draws that share a run (the same batch, lr,
tokens and seed: training is deterministic, so the same losses) are not independent and are
not compared.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from critbatch.analysis.bcrit import best_lr
from critbatch.analysis.joint.joint import comparable_groups, decide, model_data, width_label
from critbatch.science.fits import nominal_budgets
from critbatch.science.joint import Form, JointData
from critbatch.science.replicates import NOISE, check_draws

DRAW_KEY = "grid.seed"


def draw_of(run: dict) -> int:
    """The run's draw: its `grid.seed` override (`grid.seed=10`, `++grid.seed='10'`), 0
    without one (a sweep's default draw)."""
    for item in run.get("overrides") or []:
        key, _, value = str(item).lstrip("+~").partition("=")
        if key == DRAW_KEY:
            try:
                return int(value.strip("'\""))
            except ValueError:
                return 0  # grid.seed is an int in the schema: no run trains with another
    return 0


def shared_runs(members: list[dict]) -> int:
    """How many runs of one group another draw trained identically (same batch, lr, tokens
    and seed: the same losses, so not an independent measurement)."""
    draws: dict[tuple, set] = defaultdict(set)
    for r in members:
        draws[(r["batch_size"], float(r["lr"]), r["tokens"], r.get("seed"))].add(draw_of(r))
    return sum(len(d) > 1 for d in draws.values())


def draw_groups(runs: list[dict], keys: list[dict]
                ) -> tuple[dict[int, list[dict]], dict[str, int]]:
    """(per draw, its groups as the joint model reads them: each a {"key", "cells"} of the
    draw's runs of one group at their best lr; per optimizer, the runs two draws share).
    `keys`: the groups the joint model used; only those with two draws or more count.
    Budgets are named over all draws at once, so that one cell has one name in every draw."""
    groups, _, _ = best_lr.split_runs(runs)
    by_draw: dict[int, list[dict]] = defaultdict(list)
    shared: dict[str, int] = defaultdict(int)
    for key, members in groups.items():
        group_key = dict(zip(best_lr.GROUP_KEYS, key, strict=True))
        drawn: dict[int, list[dict]] = defaultdict(list)
        for r in members:
            drawn[draw_of(r)].append(r)
        if group_key not in keys or len(drawn) < 2:
            continue
        shared[group_key["optimizer"]] += shared_runs(members)
        budgets = nominal_budgets([r["tokens"] for r in members], best_lr.BUDGET_TOLERANCE)
        for draw, mine in sorted(drawn.items()):
            scatter = best_lr.seed_scatter(mine, budgets)
            cells = best_lr.best_lr_cells(mine, scatter=scatter[0] if scatter else None,
                                        budgets=budgets)
            by_draw[draw].append({"key": group_key, "cells": cells})
    return dict(by_draw), dict(shared)


def draw_data(groups: list[dict], shared: float | None = None
              ) -> tuple[JointData, list[tuple]] | None:
    """(JointData, the cells' keys (width, batch, budget)) of one draw's groups, or None
    with fewer than MIN_CELLS usable cells (`analysis.joint.model_data`; `shared` as there)."""
    used, _, _, data = model_data(groups, shared)
    if data is None:
        return None
    return data, [(width_label(g["key"]), c.batch_size, c.budget) for g, c, _ in used]


def draws_document(draws: dict[int, list[dict]], optimizer: str, form: Form,
                   shared: float | None = None) -> dict | None:
    """fits.json `joint.<optimizer>.draws`: the first two draws with enough cells compared
    (`check_draws`), or None where fewer than two have them; `shared`: the share of the
    noise a trunk shares, as the joint model of all draws measured it. Raises ValueError
    where the check cannot be made (`check_draws`)."""
    found = [(d, got) for d, groups in draws.items()
             if (got := draw_data([g for g in groups if g["key"]["optimizer"] == optimizer],
                                  shared))]
    if len(found) < 2:
        return None
    (d1, (first, keys1)), (d2, (second, keys2)) = found[:2]
    index2 = {k: n for n, k in enumerate(keys2)}
    shared = [(n, index2[k]) for n, k in enumerate(keys1) if k in index2]
    pairs = (np.array([a for a, _ in shared], dtype=int),
             np.array([b for _, b in shared], dtype=int))
    check = check_draws(first, second, pairs, form, seed=sum(map(ord, optimizer)))
    return {"draws": [d1, d2], "n_draws": len(found), **check.as_dict()}


def add_draw_checks(runs: list[dict], result: dict) -> None:
    """Set `draws` in every optimizer's joint document of `bcrit.analyse`'s `result` (None
    without two independent draws); a warning names a verdict other than noise, or why the
    check could not be made."""
    joint, warnings = result["fits"]["joint"], result["warnings"]
    used = [g["key"] for mine in comparable_groups(result["groups"]).values() for g in mine]
    draws, shared = draw_groups(runs, used)
    for optimizer, doc in joint.items():
        doc["draws"] = None
        if not any(g["key"]["optimizer"] == optimizer for groups in draws.values()
                   for g in groups):
            continue
        if shared.get(optimizer):
            warnings.append(f"joint model ({optimizer}): the draws share {shared[optimizer]} "
                            "runs (the same batch, lr, tokens and seed, so the same losses): "
                            "not compared; train a new draw at other `grid.baseline_seeds` too")
            continue
        print(f"  joint model ({optimizer}): the draws' check ...", flush=True)
        form = Form(small_batch=doc.get("b_small") is not None,
                    power=doc.get("transition_power") is not None)
        try:
            doc["draws"] = draws_document(draws, optimizer, form,
                                          (doc.get("trunk_sharing") or {}).get("fraction"))
        except ValueError as e:
            warnings.append(f"joint model ({optimizer}), two draws: not compared: {e}")
            continue
        if doc["draws"] and doc["draws"]["verdict"] != NOISE:
            warnings.append(f"joint model ({optimizer}), two draws: {doc['draws']['sentence']}")
        doc.update(decide(doc))  # the verdict counts the draws' check too
