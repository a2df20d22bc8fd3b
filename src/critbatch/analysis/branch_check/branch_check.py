"""Is a cooldown branch as good as a separate run? (`make sweep-branches`)

A branch forks a wsd run at its smaller budget's cooldown and decays to that budget
(training/branches.py), so by construction it *is* the separate wsd run of that budget
(bitwise on CPU, tests/test_branches.py). What that does not say is whether wsd itself is a
fair stand-in for the cosine runs the scaling literature trains. This study compares, for the
baseline batch at one lr, at every budget of the batch sweep:

- the batch sweep's branch (or, at the full budget, its main run),
- a wsd run trained alone at that budget (the same numbers, unless something broke),
- a cosine run trained alone at that budget,

against the seed-to-seed scatter of the batch sweep's baseline (two seeds per cell), and
states the compute a branch costs: its cooldown's tokens and wall time against the separate
run's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from critbatch.analysis.bcrit.best_lr import BUDGET_TOLERANCE
from critbatch.analysis.bcrit.best_lr import seed_scatter as bcrit_seed_scatter
from critbatch.analysis.render import fmt, json_clean, md_table
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.results.runs import load_runs
from critbatch.science.fits import nominal_budgets


def run_key(run: dict) -> tuple:
    """What must agree for two runs to be the same experiment but for schedule and budget."""
    return (run["optimizer"], run["data_name"], run["vocab_size"], run["width"], run["depth"],
            run["seq_len"], run["batch_size"], float(run["base_lr"]), run["seed"])


def seed_scatter(runs: list[dict]) -> dict[str, tuple[float, int]]:
    """Per optimizer, the batch sweep's seed scatter (`best_lr.seed_scatter`: one run's
    standard deviation, pooled over the cells whose best lr has several seeds) and its
    degrees of freedom; optimizers without repeated cells are left out."""
    out = {}
    for opt in sorted({r["optimizer"] for r in runs}):
        mine = [r for r in runs if r["sweep"] == "batch" and r["optimizer"] == opt
                and r["status"] == "completed"]
        budgets = nominal_budgets([r["tokens"] for r in mine], BUDGET_TOLERANCE)
        scatter = bcrit_seed_scatter(mine, budgets) if mine else None
        if scatter:
            out[opt] = scatter
    return out


def compare(runs: list[dict]) -> list[dict]:
    """One row per (optimizer, budget) the check trained: the branch's loss, the separate wsd
    and cosine runs', their differences, and what the branch cost."""
    checks = [r for r in runs if r["sweep"] == "branch_check"]
    sweep = {(run_key(r), r["tokens"]): r for r in runs
             if r["sweep"] == "batch" and r["schedule"] == "wsd"}
    rows = []
    for key in sorted({run_key(r) for r in checks}):
        alone = {(r["schedule"], r["tokens"]): r for r in checks if run_key(r) == key}
        for tokens in sorted({t for _, t in alone}):
            branch = sweep.get((key, tokens))
            wsd, cosine = alone.get(("wsd", tokens)), alone.get(("cosine", tokens))
            row = {"optimizer": key[0], "batch_size": key[6], "lr": key[7], "seed": key[8],
                   "tokens": tokens,
                   "branch_loss": branch["val_loss"] if branch else None,
                   "branch_of": branch.get("branch_of") if branch else None,
                   "wsd_loss": wsd["val_loss"] if wsd else None,
                   "cosine_loss": cosine["val_loss"] if cosine else None}
            row["branch_minus_wsd"] = _diff(row["branch_loss"], row["wsd_loss"])
            row["branch_minus_cosine"] = _diff(row["branch_loss"], row["cosine_loss"])
            if branch and branch.get("branch_at_tokens") and wsd:
                row["branch_tokens_trained"] = tokens - branch["branch_at_tokens"]
                row["branch_token_share"] = row["branch_tokens_trained"] / tokens
                row["branch_wall_s"] = branch["wall_time_s"]
                row["separate_wall_s"] = wsd["wall_time_s"]
            rows.append(row)
    return rows


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def verdict(rows: list[dict], scatter: dict[str, tuple[float, int]]) -> list[str]:
    """Per optimizer: how far the branches sit from the separate wsd and cosine runs, in
    units of that optimizer's seed scatter (negative: the branch ends lower)."""
    lines = []
    for opt in sorted({r["optimizer"] for r in rows}):
        mine = [r for r in rows if r["optimizer"] == opt]
        sd = scatter[opt][0] if opt in scatter else None
        for other in ("wsd", "cosine"):
            diffs = [r[f"branch_minus_{other}"] for r in mine
                     if r[f"branch_minus_{other}"] is not None]
            if not diffs:
                continue
            worst = max(diffs, key=abs)
            if sd is None:
                word = "no seed scatter to compare with"
            elif abs(worst) <= sd:
                word = "within the seed scatter of"
            else:
                word = "worse than" if worst > 0 else "better than"
            size = f" ({worst / sd:+.1f} seed scatters)" if sd else ""
            lines.append(f"{opt}: branches vs separate {other} runs: mean difference "
                         f"{np.mean(diffs):+.4f} nats/token, largest {worst:+.4f}{size}: "
                         f"{word} the separate {other} runs")
    return lines


def report(rows: list[dict], scatter: dict[str, tuple[float, int]], inputs: list[str]) -> str:
    """report.md of the check."""
    table = md_table(
        ["optimizer", "batch (seq)", "lr", "budget (tokens)", "branch loss (nats/token)",
         "separate wsd", "separate cosine", "branch - wsd", "branch - cosine",
         "branch trains (share of budget)", "branch / separate wall time"],
        [[r["optimizer"], str(r["batch_size"]), fmt(r["lr"], ".3g"), f"{r['tokens']:,}",
          fmt(r["branch_loss"], ".4f") + ("" if r["branch_of"] else " (main run)"),
          fmt(r["wsd_loss"], ".4f"), fmt(r["cosine_loss"], ".4f"),
          fmt(r["branch_minus_wsd"], "+.4f"), fmt(r["branch_minus_cosine"], "+.4f"),
          fmt(r.get("branch_token_share"), ".0%"),
          fmt(r["branch_wall_s"] / r["separate_wall_s"], ".2f")
          if r.get("separate_wall_s") else "-"]
         for r in rows])
    sd = ("; ".join(f"{opt} {sd:.4f} nats/token ({dof} degrees of freedom)"
                    for opt, (sd, dof) in scatter.items())
          + " (standard deviation of one run's final loss, pooled over the batch sweep's cells "
            "whose best lr was trained at two seeds)"
          if scatter else "not measured (no two-seed cells in the batch sweep)")
    lines = ["# Cooldown branches against separate runs", "",
             f"Inputs: {', '.join(inputs)}", "",
             "Each row: the batch sweep's branch at that budget (the main run at the full "
             "budget), a wsd run and a cosine run trained alone at the same budget, batch and "
             "lr (seed 0). Losses are final validation losses.", "", table, "",
             f"Seed scatter: {sd}.", ""]
    lines += [f"- {line}" for line in verdict(rows, scatter)]
    return "\n".join(lines) + "\n"


def run_analysis(paths: list[str], out: str | None = None) -> dict:
    """Load the batch sweep and the check's runs, compare, write report.md and
    branch_check.json to `out`; returns the document."""
    loaded = load_runs(paths)
    runs = loaded["runs"]
    rows = compare(runs)
    if not rows:
        raise ResultsError(f"no branch_check runs under {', '.join(paths)}; run make "
                           "sweep-branches (it trains them after the batch sweep)")
    scatter = seed_scatter(runs)
    folder = Path(out) if out else Path(paths[-1]) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"rows": rows,
           "seed_scatter": {opt: {"sd": sd, "dof": dof} for opt, (sd, dof) in scatter.items()},
           "verdict": verdict(rows, scatter)}
    write_json_atomic(folder / "branch_check.json", json_clean(doc))
    text = report(rows, scatter, [str(p) for p in paths])
    write_text_atomic(folder / "report.md", text)
    print(text)
    print(f"report: {folder / 'report.md'}")
    return doc
