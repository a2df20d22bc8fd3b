"""Runs into comparable groups, and each group's cells at their best learning rate.

A group is the runs that may be compared: same data, vocabulary, seq_len, model and optimizer
(GROUP_KEYS); `split_runs` forms them and leaves out the unusable runs with a reason. A cell
is one (batch size, token budget) of a group at its best lr (`best_lr_cells`: the vertex of
the parabola in ln lr, `science.fits.refine_best_lr`, over the mean loss of each grid lr's
seeds), with its loss's standard error and its trunk (the run whose training it is part of,
`trunks`). Every study that fits losses starts from these cells (`analysis.bcrit`, the joint
model, recommend, the two-draw check). No I/O, no torch.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from critbatch.results.runs import is_finite
from critbatch.science.fits import nominal_budgets, refine_best_lr

# A group's key: runs are comparable when all of these agree. `group_label` is None for runs
# of this codebase, else an external table's `group` column (`analysis.tables`); in a table
# without widths `params_nonembedding` splits a labelled group by model size (one corpus still)
GROUP_KEYS = ("data_name", "vocab_size", "seq_len", "width", "depth", "optimizer", "group_label",
              "params_nonembedding")
UNKNOWN_OPTIMIZER = "unknown"  # a table without an optimizer column
BUDGET_TOLERANCE = 0.01  # runs whose tokens are this close (relative) share one budget
# A run of fewer optimizer steps than this many times its lr warmup measures the warmup, not
# the batch (cpu sweep of 2026-12-01: batch 128 at 1/8 of the budget trained 22 steps, 10 of
# them warmup): its cell is flagged `few_steps` (`too_few_steps`) and kept out of the per-run
# Kaplan points and the Pareto fits
MIN_STEPS_PER_WARMUP = 3


# ---------------------------------------------------------------------------------------------
# Grouping


def group_key(run: dict) -> tuple:
    """The run's group key (GROUP_KEYS order; a missing `group_label` is None)."""
    return tuple(run.get(k) for k in GROUP_KEYS)


def model_name(key: tuple) -> str:
    """What a group's runs share but the optimizer: the table's group label, or the data,
    vocabulary, seq_len, width and depth."""
    data, vocab, seq_len, width, depth, _, label = key[:7]
    return label if label is not None else f"{data} V{vocab} T{seq_len} w{width} d{depth}"


def group_name(key: tuple) -> str:
    """A readable label for a group key: its model and optimizer (the model alone when the
    optimizer is unknown)."""
    fields, model = dict(zip(GROUP_KEYS, key, strict=False)), model_name(key)
    if fields.get("width") is None and fields.get("params_nonembedding") is not None:
        model += f" N{fields['params_nonembedding']:.3g}"
    return model if fields["optimizer"] == UNKNOWN_OPTIMIZER else f"{model} {fields['optimizer']}"


def split_runs(runs: list[dict]) -> tuple[dict[tuple, list[dict]], list[dict], list[str]]:
    """Group comparable runs and leave out the unusable ones.

    Runs are comparable when data, vocabulary, seq_len, width, depth and optimizer agree
    (GROUP_KEYS). Left out, each with a reason: `diverged` (status), `NaN` (a completed run
    whose final loss is not finite), `incomplete` (no eval point or no tokens) and
    `mismatched` (a data fingerprint that differs from the majority of its group: same
    corpus name, different text or tokenizer) and `scheduled batch` (a ramp or adaptive
    batch: no one batch size). Returns (groups, left_out, warnings).
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    left_out, warnings = [], []
    for run in runs:
        where = run.get("run_dir", "?")
        if run["status"] == "diverged":
            step = run.get("diverged_step")
            detail = run.get("status_reason") or "training loss blew up"
            left_out.append({"run_dir": where, "reason": "diverged",
                             "detail": f"{detail}" + (f" at step {step}" if step else "")})
        elif not is_finite(run["val_loss"]):
            left_out.append({"run_dir": where, "reason": "NaN",
                             "detail": f"final val_loss is {run['val_loss']}"})
        elif run.get("batch_schedule", "constant") != "constant":
            left_out.append({"run_dir": where, "reason": "scheduled batch", "detail": (
                f"a {run['batch_schedule']} batch ({run.get('batch_size_start')} -> "
                f"{run.get('batch_size_max', run['batch_size'])} sequences, mean "
                f"{run.get('batch_size_mean', float('nan')):.1f}, {run['steps']:,} steps for "
                f"{run['tokens']:,} tokens) has no single batch size to fit B_crit at; "
                "python analysis/schedules.py compares it by its steps and tokens")})
        elif not run["curve"] or not run["tokens"] or not run["batch_size"]:
            left_out.append({"run_dir": where, "reason": "incomplete",
                             "detail": "no eval point, tokens or batch_size recorded"})
        else:
            groups[group_key(run)].append(run)
    for key, members in list(groups.items()):
        prints = Counter(r["data_fingerprint"] for r in members)
        majority = prints.most_common(1)[0][0]
        keep = [r for r in members if r["data_fingerprint"] == majority]
        for r in members:
            if r["data_fingerprint"] != majority:
                left_out.append({"run_dir": r["run_dir"], "reason": "mismatched",
                                 "detail": f"data_fingerprint differs from the other "
                                           f"{len(keep)} runs of {group_name(key)}"})
        groups[key] = keep
    seq_lens = sorted({k[2] for k in groups})
    if len(seq_lens) > 1:
        warnings.append(f"mixed seq_len {seq_lens}: runs with different contexts are not "
                        "comparable; each seq_len is analysed as its own group")
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0]))), left_out, warnings


# ---------------------------------------------------------------------------------------------
# Best learning rate per cell


@dataclass
class Cell:
    """One (batch size, token budget) of a group at its best learning rate."""

    batch_size: int  # sequences
    tokens: int  # training tokens seen
    lr: float  # refined best lr
    loss: float  # nats/token at the refined best lr (mean over seeds)
    loss_sigma: float  # nats/token: the loss's standard error (`sigma_source`); NaN: unknown
    bytes_per_token: float
    run_dir: str  # the grid run nearest the optimum
    edge: str | None  # None, "low", "high" or "single" (see refine_best_lr)
    edge_diverged: bool  # the neighbour beyond the edge was tried and diverged
    lrs: list[float] = field(default_factory=list)  # the grid, sorted
    losses: list[float] = field(default_factory=list)  # mean loss per grid lr
    n_seeds: int = 1
    curve: list[dict] = field(default_factory=list)  # eval points of run_dir
    budget: int = 0  # the nominal token budget (tokens of runs within 1% are one budget)
    sigma_source: str | None = None  # "seeds", "seed scatter", "lr refinement" or None
    trunk: str = ""  # the run whose training run_dir is: run_dir itself, or a branch's parent
    steps: int = 0  # optimizer steps of run_dir
    warmup_steps: int | None = None  # lr warmup steps of run_dir; None: not recorded
    few_steps: bool = False  # steps < MIN_STEPS_PER_WARMUP x warmup_steps (`too_few_steps`)

    @property
    def loss_per_byte(self) -> float:
        return self.loss / self.bytes_per_token


def too_few_steps(steps: int, warmup_steps: int | None) -> bool:
    """Whether a run of `steps` optimizer steps with `warmup_steps` of lr warmup is too short
    to measure its batch: steps < MIN_STEPS_PER_WARMUP x warmup_steps.

    Most of such a run's updates are taken at a fraction of the peak lr, so its final loss says
    how fast the warmup went, not what the batch size costs; a larger batch at a small budget
    hits this first. A run that did not record its warmup (older folders, tables) is never
    flagged.
    """
    return warmup_steps is not None and steps < MIN_STEPS_PER_WARMUP * warmup_steps


def trunks(runs: list[dict]) -> dict[str, str]:
    """Each run's trunk: the run directory whose training it is part of. A run's own, or for
    a cooldown branch (`branch_of`: its parent's folder name) the parent of that name among
    `runs` of the same sweep (a sibling folder of that name when the parent is not among
    them). A run and its branches share one trunk: they are not independent measurements."""
    mains = {(r.get("sweep"), Path(r["run_dir"]).name): r["run_dir"] for r in runs
             if not r.get("branch_of")}
    out = {}
    for r in runs:
        parent = r.get("branch_of")
        out[r["run_dir"]] = r["run_dir"] if not parent else mains.get(
            (r.get("sweep"), parent), str(Path(r["run_dir"]).parent / parent))
    return out


def seed_blocks(runs: list[dict], budgets: dict[int, int]) -> list[tuple[tuple, np.ndarray]]:
    """Per (batch size, lr) trained at several seeds, each seed a trunk (a run and its cooldown
    branches): the nominal budgets every such trunk reached, and the seeds x budgets array of
    their losses (nats/token), as `science.fits.trunk_sharing` reads them. Runs without a
    seed, and trunks of one budget, say nothing of the sharing and are left out."""
    trunk = trunks(runs)
    by_trunk: dict[str, dict[int, float]] = defaultdict(dict)
    where: dict[str, tuple] = {}
    for run in runs:
        if run.get("seed") is None:
            continue
        by_trunk[trunk[run["run_dir"]]][budgets[run["tokens"]]] = float(run["val_loss"])
        where[trunk[run["run_dir"]]] = (run["batch_size"], float(run["lr"]))
    families: dict[tuple, list[dict[int, float]]] = defaultdict(list)
    for name, losses in by_trunk.items():
        if len(losses) >= 2:
            families[where[name]].append(losses)
    blocks = []
    for _, members in sorted(families.items()):
        common = sorted(set.intersection(*(set(m) for m in members)))
        if len(members) >= 2 and len(common) >= 2:
            blocks.append((tuple(common), np.array([[m[b] for b in common] for m in members])))
    return blocks


def seed_scatter(runs: list[dict], budgets: dict[int, int]) -> tuple[float, int] | None:
    """(standard deviation of one run's final loss, degrees of freedom), pooled over the
    (batch, budget) cells whose best grid lr (lowest mean loss) was trained at several seeds;
    None when none was.

    The run-to-run noise of a group: it applies to every cell, single-seed ones included. Only
    the best lr counts, because that is the loss the analysis uses, and an lr far from it can be
    unstable: at cpu scale AdamW at 2.5x its best lr differed by up to 0.24 nats/token between
    two seeds, against at most 0.045 at the best.
    """
    by_cell: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        cell = by_cell[(run["batch_size"], budgets[run["tokens"]])]
        cell[float(run["lr"])].append(float(run["val_loss"]))
    repeated = []
    for by_lr in by_cell.values():
        best = min(by_lr, key=lambda lr: float(np.mean(by_lr[lr])))
        if len(by_lr[best]) > 1:
            repeated.append(by_lr[best])
    dof = sum(len(v) - 1 for v in repeated)
    if dof == 0:
        return None
    pooled = sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in repeated)
    return math.sqrt(pooled / dof), dof


def best_lr_cells(runs: list[dict], diverged_lrs: dict | None = None,
                  scatter: float | None = None, budgets: dict | None = None) -> list[Cell]:
    """A group's runs as cells (batch size x nominal budget: `budgets`, or named here) at best lr.

    A cell whose run trained too few steps for its warmup is flagged (`few_steps`,
    `too_few_steps`); it stays a cell, to be listed, but neither Kaplan's law (through its
    per-run row's `in_kaplan`) nor a Pareto fit (`pareto.batch_curves`) uses it.

    Seeds at the same lr are averaged. The loss uncertainty of a cell is, in order: the
    standard error over its own seeds at the best grid lr ("seeds"), the group's pooled seed
    scatter `scatter` (one run's standard deviation) over sqrt(seeds) ("seed scatter"), or,
    without any seeds, |grid minimum - refined minimum|, how much the lr refinement moved
    the answer ("lr refinement": a size, not a confidence interval). `diverged_lrs` maps
    (batch_size, budget) to the lrs that diverged, to say whether an edge optimum has a
    diverged neighbour.
    """
    budgets = budgets or nominal_budgets([r["tokens"] for r in runs], BUDGET_TOLERANCE)
    trunk = trunks(runs)
    by_cell: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_cell[(run["batch_size"], budgets[run["tokens"]])][float(run["lr"])].append(run)
    cells = []
    for (batch, budget), by_lr in sorted(by_cell.items()):
        lrs = sorted(by_lr)
        means = [float(np.mean([r["val_loss"] for r in by_lr[lr]])) for lr in lrs]
        lr_star, loss_star, edge = refine_best_lr(lrs, means)
        i = int(np.argmin(means))
        seeds = [r["val_loss"] for r in by_lr[lrs[i]]]
        if len(seeds) > 1:
            sigma, source = float(np.std(seeds, ddof=1) / math.sqrt(len(seeds))), "seeds"
        elif scatter is not None:
            sigma, source = scatter / math.sqrt(len(seeds)), "seed scatter"
        elif edge is None:
            sigma, source = abs(means[i] - loss_star), "lr refinement"
        else:  # one seed and no refinement: the uncertainty is unknown, not zero
            sigma, source = float("nan"), None
        tried = (diverged_lrs or {}).get((batch, budget), [])
        edge_diverged = (edge == "high" and any(lr > lrs[-1] for lr in tried)) or (
            edge == "low" and any(lr < lrs[0] for lr in tried))
        best_run = by_lr[lrs[i]][0]
        steps, warmup = int(best_run["steps"]), best_run.get("warmup_steps")
        cells.append(Cell(batch_size=int(batch), tokens=int(best_run["tokens"]), lr=lr_star,
                          loss=loss_star, loss_sigma=sigma,
                          bytes_per_token=float(best_run["bytes_per_token"]),
                          run_dir=best_run["run_dir"], edge=edge, edge_diverged=edge_diverged,
                          lrs=lrs, losses=means, n_seeds=len(seeds), curve=best_run["curve"],
                          budget=int(budget), sigma_source=source,
                          trunk=trunk[best_run["run_dir"]], steps=steps, warmup_steps=warmup,
                          few_steps=too_few_steps(steps, warmup)))
    return cells


