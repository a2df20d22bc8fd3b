"""Step Law's dense grid (Li et al. 2025, "Predictable Scale: Part I") read and analysed.

The source file (`peers.sources.SOURCES["steplaw"]`, no license: read or downloaded, never
copied into this repository) holds one row per run: `N` (non-embedding parameters), `D`
(token budget), `bs` (sequences of SEQ_LEN tokens), `lr` (peak lr of a warmup + cosine
schedule to 1e-5) and `smooth loss` (the smoothed end of the training loss, nats/token on
StepFun's corpus and tokenizer: the number the paper fits). `analyse` turns it into
critbatch's answers (`science.grid_laws`): each cell's optima, the laws with their terms chosen
by held-out prediction, Step Law's exponents beside its own bootstrap (the
`steplaw_bootstrap` file), and `recommend`'s answer held out in turn (`grid_cells`, the
engine's view of the runs) beside Step Law's formula, both scored on the held-out runs.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from critbatch.results.errors import ResultsError
from critbatch.science.answer import BatchRuns, GridCell, Promise
from critbatch.science.grid_laws import (
    BOOTSTRAP,
    CellOptimum,
    GridModel,
    GridTooSmall,
    bootstrap_law,
    cell_ids,
    cell_optimum,
    fit_grid,
    fit_law,
    lr_points,
)
from critbatch.science.intervals import percentile_band

SEQ_LEN = 2048  # tokens per sequence in every Step Law run
LOSS_COLUMN = "smooth loss"
COLUMNS = ("N", "D", "bs", "lr", LOSS_COLUMN)
BOOTSTRAP_COLUMNS = ("lr_intercept", "lr_coefN", "lr_coefD", "bs_intercept", "bs_coefD")
TOLERANCE = 0.01  # nats/token: each cell's largest batch within this of its best (peers.json)


def read_csv(path: Path, columns: tuple[str, ...], what: str) -> list[dict]:
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise ResultsError(f"{path}: no column {', '.join(missing)}; this is not "
                                   f"{what} (pass the pinned file, see `critbatch-peers --help`)")
            return list(reader)
    except (OSError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} cannot be read ({err}); pass {what}") from None


def read_runs(path: str | Path) -> list[dict]:
    """The grid's runs as {params, tokens, batch_size, lr, loss} (loss NaN where the file
    has none: a diverged run); a malformed file stops with one line."""
    path = Path(path)
    runs = []
    for n, row in enumerate(read_csv(path, COLUMNS, "Step Law's dense_lr_bs_loss.csv"), 2):
        try:
            run = {"params": float(row["N"]), "tokens": float(row["D"]),
                   "batch_size": float(row["bs"]), "lr": float(row["lr"]),
                   "loss": float(row[LOSS_COLUMN] or "nan")}
        except ValueError:
            raise ResultsError(f"{path} row {n}: a cell of {', '.join(COLUMNS)} is not a "
                               "number; pass the pinned file unchanged") from None
        if not all(run[k] > 0 for k in ("params", "tokens", "batch_size", "lr")):
            raise ResultsError(f"{path} row {n}: N, D, bs and lr must be positive")
        runs.append(run)
    if not runs:
        raise ResultsError(f"{path}: no rows; pass the pinned file unchanged")
    return runs


def table_rows(runs: list[dict]) -> list[dict]:
    """The runs as critbatch table rows (`analysis.tables`): one group, a params column."""
    return [{"run": f"steplaw-{i}", "group": "steplaw", "optimizer": "adamw", "lr": r["lr"],
             "batch_size": int(r["batch_size"]), "seq_len": SEQ_LEN, "tokens": int(r["tokens"]),
             "loss": r["loss"], "params": int(r["params"]), "status": "completed"}
            for i, r in enumerate(runs) if math.isfinite(r["loss"])]


def fit(cells: list[CellOptimum], resamples: int = BOOTSTRAP) -> GridModel:
    """`science.grid_laws.fit_grid`, a grid too small for its laws stopping with one line."""
    try:
        return fit_grid(cells, resamples)
    except GridTooSmall as err:
        raise ResultsError(f"the grid cannot give its laws: {err}; give it more sizes, budgets, "
                           "batches or lrs around each optimum") from None


def grid_cells(runs: list[dict]) -> list[GridCell]:
    """The runs as the answer engine's cells (`science.answer.GridCell`): per (N, D), per
    batch, its lrs and losses; a run without a finite loss is a diverged lr of its batch."""
    groups: dict[tuple[float, float], dict[float, list[dict]]] = defaultdict(
        lambda: defaultdict(list))
    for r in runs:
        groups[(r["params"], r["tokens"])][r["batch_size"]].append(r)
    cells = []
    for (n, d), by_batch in sorted(groups.items()):
        batches = []
        for b, rows in sorted(by_batch.items()):
            done = [r for r in rows if math.isfinite(r["loss"])]
            if done:
                batches.append(BatchRuns(b, [r["lr"] for r in done], [r["loss"] for r in done],
                                         tuple(r["lr"] for r in rows
                                               if not math.isfinite(r["loss"]))))
        if len(batches) >= 2:
            cells.append(GridCell(n, d, batches))
    return cells


def cells_of(runs: list[dict]) -> list[CellOptimum]:
    """Each (N, D) cell's optima (`science.grid_laws.cell_optimum`)."""
    groups: dict[tuple[float, float], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["params"], r["tokens"])].append(r)
    cells = []
    for (n, d), rows in sorted(groups.items()):
        cell = cell_optimum(n, d, *([r[k] for r in rows] for k in ("batch_size", "lr", "loss")))
        if cell is not None:
            cells.append(cell)
    return cells


# ---------------------------------------------------------------------------------------------
# Step Law's own fits


def published(path: str | Path) -> dict:
    """Step Law's laws from its bootstrap file: each coefficient's median and central 95%
    over the resamples, and the point formula (the resamples' mean, as the paper states it):
    lr = exp(c) N^a D^b, batch in tokens = exp(c') D^k."""
    rows = read_csv(Path(path), BOOTSTRAP_COLUMNS, "Step Law's fitted_lr_bs bootstrap file")
    table = np.array([[float(r[c]) for c in BOOTSTRAP_COLUMNS] for r in rows])

    def summary(k):
        (lo, hi), med = percentile_band(table[:, k]), np.median(table[:, k])
        return {"median": float(med), "interval": [float(lo), float(hi)],
                "mean": float(table[:, k].mean())}

    return {"resamples": len(rows), "lr_size_exponent": summary(1),
            "lr_budget_exponent": summary(2), "batch_budget_exponent": summary(4),
            "lr_intercept": summary(0), "batch_intercept": summary(3)}


NEAR_BEST = 0.0025  # Step Law's rule: the runs within this relative loss of their cell's best


def steplaw_rule(runs: list[dict], resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Step Law's own estimator on this file: every run within NEAR_BEST (relative) of its
    cell's lowest loss, pooled; ln lr on ln N and ln D and ln B (tokens) on ln D by least
    squares; intervals from resampling those runs (the paper's bootstrap). Whether the
    published exponents follow from the public file."""
    best: dict[tuple[float, float], float] = {}
    for r in runs:
        if math.isfinite(r["loss"]):
            key = (r["params"], r["tokens"])
            best[key] = min(best.get(key, math.inf), r["loss"])
    near = [r for r in runs if math.isfinite(r["loss"])
            and abs(r["loss"] / best[(r["params"], r["tokens"])] - 1) < NEAR_BEST]
    n, d, lr, b = (np.array([r[k] for r in near], float)
                   for k in ("params", "tokens", "lr", "batch_size"))
    lr_x = np.column_stack([np.ones(len(n)), np.log(n), np.log(d)])
    b_x = np.column_stack([np.ones(len(n)), np.log(d)])
    y_lr, y_b = np.log(lr), np.log(b * SEQ_LEN)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        i = rng.integers(0, len(near), len(near))
        draws.append([*np.linalg.lstsq(lr_x[i], y_lr[i], rcond=None)[0][1:],
                      np.linalg.lstsq(b_x[i], y_b[i], rcond=None)[0][1]])
    draws = np.array(draws)
    point = [*np.linalg.lstsq(lr_x, y_lr, rcond=None)[0][1:],
             np.linalg.lstsq(b_x, y_b, rcond=None)[0][1]]
    names = ("lr_size_exponent", "lr_budget_exponent", "batch_budget_exponent")
    return {"runs": len(near), "threshold": NEAR_BEST, **{
        name: {"value": float(point[k]),
               "interval": [float(x) for x in percentile_band(draws[:, k])]}
        for k, name in enumerate(names)}}


def formula(law: dict, params: float, tokens: float) -> dict:
    """Step Law's point formula at (N, D): lr, and the batch in sequences of SEQ_LEN."""
    lr = math.exp(law["lr_intercept"]["mean"] + law["lr_size_exponent"]["mean"] * math.log(
        params) + law["lr_budget_exponent"]["mean"] * math.log(tokens))
    batch = math.exp(law["batch_intercept"]["mean"] + law["batch_budget_exponent"]["mean"]
                     * math.log(tokens)) / SEQ_LEN
    return {"lr": lr, "batch_size": batch}


# ---------------------------------------------------------------------------------------------
# The whole analysis


def law_summary(law) -> dict:
    return {"name": law.name, "terms": law.held_out.get("chosen"),
            "exponents": {c: law.interval(c) for c in law.columns},
            "intercept": float(law.coef[0]), "residual_sd_log": law.residual_sd,
            "held_out_rms_log": {k: v for k, v in law.held_out.items() if k != "chosen"},
            "resamples": len(law.boot)}


def cell_rows(cells: list[CellOptimum]) -> list[dict]:
    return [{"params": c.params, "tokens": c.tokens, "b_opt": c.b_opt, "b_opt_edge": c.b_opt_edge,
             "loss_opt": c.loss_opt, "lr_opt": c.lr_opt, "lr_opt_points": c.lr_opt_points,
             "largest_within_0.01": c.largest_within(TOLERANCE),
             "batches": [{"batch_size": p.batch, "lr": p.lr, "loss": p.loss, "edge": p.edge}
                         for p in c.batches]} for c in cells]


def model_summary(model: GridModel) -> dict:
    loss = model.loss
    return {"b_opt": law_summary(model.b_opt), "lr_at_b_opt": law_summary(model.lr_at_b_opt),
            "lr": law_summary(model.lr),
            "loss": None if loss is None else {
                "form": "L* = E + A (N/1e8)^-alpha + B (D/1e10)^-beta", "e": loss.e, "a": loss.a,
                "alpha": loss.alpha, "b": loss.b, "beta": loss.beta,
                "residual_sd": loss.residual_sd}}


def steplaw_forms(cells: list[CellOptimum], resamples: int = BOOTSTRAP) -> dict:
    """critbatch's cell optima fitted in Step Law's own forms, whatever the held-out tests
    choose: lr(B_opt) in ln N and ln D, B_opt (tokens) in ln D alone; each with its cell
    bootstrap. Like with like: the exponents to set beside Step Law's. Also lr*(B) with every
    term, for the budget exponent at a fixed batch that the held-out test may drop."""
    inner = [c for c in cells if c.b_opt_edge is None]
    n, d = [c.params for c in inner], [c.tokens for c in inner]
    ids = cell_ids(n, d)
    lr = fit_law("lr(B_opt)", ("N", "D"), [c.lr_opt for c in inner], n, d)
    batch = fit_law("B_opt tokens", ("D",), [c.b_opt * SEQ_LEN for c in inner], n, d)
    pts = lr_points(inner)
    full = fit_law("lr*(B), B+N+D", ("B", "N", "D"), pts["lr"], pts["params"], pts["tokens"],
                   pts["batch"])
    full = bootstrap_law(full, pts["lr"], pts["params"], pts["tokens"],
                         cell_ids(pts["params"], pts["tokens"]), pts["batch"], resamples)
    return {"lr_with_budget": law_summary(full),
            "lr_at_b_opt": law_summary(bootstrap_law(lr, [c.lr_opt for c in inner], n, d, ids,
                                                     resamples=resamples)),
            "b_opt_tokens": law_summary(bootstrap_law(batch, [c.b_opt * SEQ_LEN for c in inner],
                                                      n, d, ids, resamples=resamples))}


def analyse(runs_path: str | Path, bootstrap_path: str | Path | None = None,
            resamples: int = BOOTSTRAP, tolerance: float = TOLERANCE,
            promise: Promise | None = None, progress=None,
            answer_resamples: int | None = None) -> dict:
    """Everything `make peers` reports on Step Law's grid, JSON-ready, and the fitted model
    (key `model`, removed before writing): the cells' optima, the laws beside Step Law's
    (`resamples` cell resamples each), and the answer held out in turn
    (`analysis.recommend.engine.validate`, the same engine as every door of `recommend`; its
    bootstrap `answer_resamples`, None: the engine's) beside Step Law's formula."""
    from critbatch.analysis.recommend import engine

    runs = read_runs(runs_path)
    cells = cells_of(runs)
    model = fit(cells, resamples)
    law = published(bootstrap_path) if bootstrap_path else None
    promise = promise or Promise()
    formula_of = None if law is None else (lambda n, d: formula(law, n, d))
    validation = engine.validate(grid_cells(runs), promise, SEQ_LEN, resamples=answer_resamples,
                                 formula=formula_of, progress=progress)
    return {"runs": len(runs), "cells": cell_rows(cells), "laws": model_summary(model),
            "steplaw_forms": steplaw_forms(cells, resamples),
            "steplaw_rule": steplaw_rule(runs, resamples),
            "published": law, "validation": validation,
            "validation_summary": engine.validation_summary(validation),
            "overhead": promise.overhead, "seq_len": SEQ_LEN, "tolerance": tolerance,
            "model": model}
