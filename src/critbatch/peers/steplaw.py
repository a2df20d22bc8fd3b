"""Step Law's dense grid (Li et al. 2025, "Predictable Scale: Part I") read and analysed.

The source file (`peers.sources.SOURCES["steplaw"]`, no license: read or downloaded, never
copied into this repository) holds one row per run: `N` (non-embedding parameters), `D`
(token budget), `bs` (sequences of SEQ_LEN tokens), `lr` (peak lr of a warmup + cosine
schedule to 1e-5) and `smooth loss` (the smoothed end of the training loss, nats/token on
StepFun's corpus and tokenizer: the number the paper fits). `analyse` turns it into
critbatch's answers (`science.grid_laws`): each cell's optima, the laws with their terms chosen
by held-out prediction, Step Law's exponents beside its own bootstrap (the
`steplaw_bootstrap` file), and held-out recommendations beside the measured grid and Step
Law's formula.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from critbatch.results.errors import ResultsError
from critbatch.science.answer import BatchRuns, GridCell
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

SEQ_LEN = 2048  # tokens per sequence in every Step Law run
LOSS_COLUMN = "smooth loss"
COLUMNS = ("N", "D", "bs", "lr", LOSS_COLUMN)
BOOTSTRAP_COLUMNS = ("lr_intercept", "lr_coefN", "lr_coefD", "bs_intercept", "bs_coefD")
BATCH_MATCH = 2.0  # a recommended batch within this factor of the measured one matches
LR_MATCH = 1.5  # an lr within this factor of the measured optimum at that batch matches
LOSS_MATCH = 0.03  # nats/token: a predicted loss this close to the measured one matches
TOLERANCE = 0.01  # nats/token a recommended batch may lose against the best


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
        lo, med, hi = np.percentile(table[:, k], [2.5, 50, 97.5])
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
               "interval": [float(x) for x in np.percentile(draws[:, k], [2.5, 97.5])]}
        for k, name in enumerate(names)}}


def formula(law: dict, params: float, tokens: float) -> dict:
    """Step Law's point formula at (N, D): lr, and the batch in sequences of SEQ_LEN."""
    lr = math.exp(law["lr_intercept"]["mean"] + law["lr_size_exponent"]["mean"] * math.log(
        params) + law["lr_budget_exponent"]["mean"] * math.log(tokens))
    batch = math.exp(law["batch_intercept"]["mean"] + law["batch_budget_exponent"]["mean"]
                     * math.log(tokens)) / SEQ_LEN
    return {"lr": lr, "batch_size": batch}


# ---------------------------------------------------------------------------------------------
# Held-out checks


def held_out_cases(cells: list[CellOptimum]) -> list[tuple[str, list[bool], CellOptimum]]:
    """(name, held-out mask, target cell): the largest model (all its budgets) predicted at
    its smallest budget, where two sizes or more are left, and each size's largest budget.
    A name says how far a held-out budget lies beyond the size's next one, and how many of
    the target's batches only bound their best lr (on the lr grid's edge)."""
    sizes = sorted({c.params for c in cells})
    cases = []

    def edges(cell):
        n = cell.edge_batches()
        return f"; {n} of {len(cell.batches)} batches' best lr on the lr grid's edge" if n else ""

    if len(sizes) >= 3:
        largest = [c for c in cells if c.params == sizes[-1]]
        target = min(largest, key=lambda c: c.tokens)
        cases.append((f"the {sizes[-1] / 1e9:.2f}B model at {target.tokens / 1e9:.0f}B tokens "
                      f"(the whole model held out{edges(target)})",
                      [c.params == sizes[-1] for c in cells], target))
    for n in sizes:
        mine = sorted((c for c in cells if c.params == n), key=lambda c: c.tokens)
        if len(mine) < 2:
            continue
        top = mine[-1]
        cases.append((f"{n / 1e6:.0f}M at its largest budget, {top.tokens / 1e9:.0f}B tokens "
                       f"({top.tokens / mine[-2].tokens:.1f}x its next{edges(top)})",
                       [c is top for c in cells], top))
    return cases


def compare(cell: CellOptimum, batch: float, lr: float, loss: float | None,
            tolerance: float) -> dict:
    """How a (batch, lr, loss) answer lands on a measured cell: the batch against the largest
    within `tolerance` of the best, and the loss the grid measured there above its best
    (`loss_given_up`, interpolated in ln B); the lr against the grid's best lr at that batch
    (`CellOptimum.lr_at`: a line through the optima of the nearest grid batches, whose own
    optima scatter by about a grid step; the nearest batch's own optimum is reported beside);
    the loss against the nearest grid batch's."""
    measured_batch = cell.largest_within(tolerance)
    at = cell.nearest(batch)
    measured_lr = cell.lr_at(batch)
    best = min(p.loss for p in cell.batches)
    out = {"batch_size": batch, "lr": lr, "predicted_loss": loss,
           "measured_batch_size": measured_batch, "measured_b_opt": cell.b_opt,
           "loss_given_up": cell.measured_loss_at(batch) - best, "grid_batch": at.batch,
           "measured_lr": measured_lr, "grid_batch_lr": at.lr, "grid_batch_lr_edge": at.edge,
           "measured_loss": at.loss, "batch_ratio": batch / measured_batch,
           "lr_ratio": lr / measured_lr,
           "loss_error": None if loss is None else loss - at.loss}
    out["checks"] = {
        "batch_within_a_doubling": bool(1 / BATCH_MATCH <= out["batch_ratio"] <= BATCH_MATCH),
        "lr_within_1.5x": bool(1 / LR_MATCH <= out["lr_ratio"] <= LR_MATCH),
        "loss_within_0.03": None if loss is None else bool(abs(out["loss_error"]) <= LOSS_MATCH)}
    return out


def validate(cells: list[CellOptimum], law: dict | None, tolerance: float = TOLERANCE,
             resamples: int = BOOTSTRAP) -> list[dict]:
    """Each held-out case: critbatch's answer fitted without it, and Step Law's formula
    (fitted on every cell, these included), against the measured cell."""
    rows = []
    for name, held, cell in held_out_cases(cells):
        model = fit([c for c, h in zip(cells, held, strict=True) if not h], resamples)
        answer = model.answer(cell.params, cell.tokens, tolerance)
        ours = compare(cell, answer["batch_size"], answer["lr"],
                       model.loss_at(cell.params, cell.tokens, cell.nearest(
                           answer["batch_size"]).batch), tolerance)
        ours.update({k: answer[k] for k in ("batch_size_low", "batch_size_high", "lr_low",
                                             "lr_high", "b_opt")})
        row = {"case": name, "params": cell.params, "tokens": cell.tokens, "critbatch": ours,
               "terms": {"b_opt": model.b_opt.held_out["chosen"],
                         "lr": model.lr.held_out["chosen"]}}
        if law is not None:
            theirs = formula(law, cell.params, cell.tokens)
            row["steplaw_formula"] = compare(cell, theirs["batch_size"], theirs["lr"], None,
                                             tolerance)
        rows.append(row)
    return rows


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
                "residual_sd": loss.residual_sd},
            "penalty": {"above": model.penalty.above, "below": model.penalty.below,
                        "points": model.penalty.points,
                        "residual_sd": model.penalty.residual_sd}}


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
            resamples: int = BOOTSTRAP, tolerance: float = TOLERANCE) -> dict:
    """Everything `make peers` reports on Step Law's grid, JSON-ready, and the fitted model
    (key `model`, removed before writing)."""
    runs = read_runs(runs_path)
    cells = cells_of(runs)
    model = fit(cells, resamples)
    law = published(bootstrap_path) if bootstrap_path else None
    return {"runs": len(runs), "cells": cell_rows(cells), "laws": model_summary(model),
            "steplaw_forms": steplaw_forms(cells, resamples),
            "steplaw_rule": steplaw_rule(runs, resamples),
            "published": law, "validation": validate(cells, law, tolerance, resamples),
            "seq_len": SEQ_LEN, "tolerance": tolerance, "model": model}
