"""The B_crit study's report: fits.json, bcrit.csv and the pipeline of `analysis/fit_bcrit.py`.

`run_analysis` loads runs (local folders, W&B or tables of runs and steps to a target loss:
`critbatch.analysis.bcrit.tables`), analyses them (`critbatch.analysis.bcrit.bcrit`)
and writes, through `render.run_study`:

- `report.md`   the summary first (`analysis.summary`), then the measured law per
                optimizer (the joint model's verdict), the question, the groups, the
                tables (in the form of science.md sections 3 and 8) and every warning
                (`markdown`);
- `*.png`       loss vs tokens, lr sensitivity, effective tokens, S-E Pareto frontiers,
                B_crit vs loss, the joint model (`plots`);
- `fits.json`   the machine-readable fits (public keys: per_run, pareto, kaplan (one row per
                optimizer and method), kaplan_points, lr_scaling, warnings, online_noise (the
                online B_noise(L) series), consistency (per-run against Pareto B_crit at each
                target loss), joint (`analysis.joint`: per optimizer the model of every
                cell, its interval, the loss-alone test and the held-out predictions),
                summary (`analysis.summary`: per optimizer B_crit at the final loss, the
                recommended batch and lr there, the held-out verdict, and whether the
                numbers are a measurement), lr_edge_cells (per optimizer, the cells whose
                best lr is the lowest or highest tried), lr_search (the sweep's lr search
                per optimizer and draw: lrs added, why, tokens), noise_ratio (per optimizer
                B_crit(L) / B_noise(L) at matched losses, `analysis.noise_ratio`);
                B_crit in sequences with `_tokens` twins);
- `bcrit.csv`   the per-run table;
- a W&B run (job_type "analysis", in the group most of the analysed runs were logged in).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path

from critbatch.analysis import render
from critbatch.analysis.bcrit import bcrit, best_lr, draws
from critbatch.analysis.bcrit.markdown import exponent_text, report_markdown
from critbatch.analysis.bcrit.plots import write_plots
from critbatch.analysis.bcrit.tables import csv_text, export_rows, load_tables, write_table
from critbatch.analysis.joint import report as joint_report
from critbatch.analysis.recommend import summary
from critbatch.analysis.render import fmt, fmt_interval
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_text_atomic
from critbatch.results.runs import load_runs, load_wandb_runs

LR_SEARCH_RECORD = "lr_search.json"  # what the sweep's lr search writes in its stage folder
PER_RUN_COLUMNS = (
    "run_dir", "group", "optimizer", "batch_size", "tokens", "lr", "lr_edge", "val_loss",
    "val_loss_per_byte", "val_loss_sigma", "effective_tokens", "r", "b_crit", "b_crit_low",
    "b_crit_high", "b_crit_naive", "b_crit_tokens", "b_crit_low_tokens", "b_crit_high_tokens",
    "b_crit_log_linear", "extrapolated", "baseline_batch", "note", "budget", "below_baseline",
    "interval", "few_steps", "in_kaplan",
)
# The sweeps analysed by default, each one folder runs/<sweep>/<scale>: the batch sweep (its
# runs, their cooldown branches and the batch_seeds stage) and the widths sweep (with
# widths_seeds).
SWEEP_STAGES = ("batch", "widths")


# ---------------------------------------------------------------------------------------------
# Inputs


def default_inputs(runs_root: str | Path = "runs") -> tuple[list[Path], str]:
    """The most recently written sweep folder of SWEEP_STAGES under `runs_root` (never a
    single run's or an ad-hoc multirun's folder); and a sentence saying which and why."""
    folders = render.sweep_folders(runs_root, SWEEP_STAGES)
    if not folders:
        where = " or ".join(f"{runs_root}/{s}/<scale>/" for s in SWEEP_STAGES)
        raise ResultsError(f"no batch or widths sweep with finished runs under {runs_root}/ "
                           f"(looked in {where}); pass run directories, or train a sweep "
                           "first (make sweep-batch)")
    latest = folders[0]
    return [latest.path], (f"no paths given: analysing {latest.path}, the most recent "
                           f"{' or '.join(SWEEP_STAGES)} sweep (its newest run finished "
                           f"{latest.age()})")


# ---------------------------------------------------------------------------------------------
# fits.json and bcrit.csv


FITS_KEYS = ("per_run", "pareto", "kaplan", "kaplan_points", "lr_scaling", "warnings",
             "online_noise", "consistency", "joint", "summary", "lr_edge_cells", "lr_search",
             "noise_ratio")


def fits_document(result: dict, inputs: list[str] | None = None) -> dict:
    """The public fits.json: exactly FITS_KEYS (the inputs are named in report.md, not
    here)."""
    return {k: result["fits"][k] for k in FITS_KEYS}


def lr_search_records(runs: list[dict]) -> dict:
    """The lr searches of the sweep folders the runs lie in (each folder's lr_search.json, as
    the sweep wrote it: per optimizer and draw the lrs added, why and their tokens), keyed
    "<folder>: <optimizer and draw>"; empty for runs no search added to (tables, W&B)."""
    folders = {Path(r["run_dir"]).parent for r in runs if r.get("run_dir")
               and not r.get("branch_of")}
    out = {}
    for folder in sorted(folders):
        path = folder / LR_SEARCH_RECORD
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for draw, record in sorted(doc.items()):
            out[f"{folder}: {draw}"] = record
    return out


def write_csv(result: dict, out: Path) -> list[str]:
    """`bcrit.csv` in `out`: the per-run table (PER_RUN_COLUMNS); returns its file name."""
    write_text_atomic(out / "bcrit.csv", csv_text(PER_RUN_COLUMNS, result["fits"]["per_run"]))
    return ["bcrit.csv"]


# ---------------------------------------------------------------------------------------------
# W&B, the printed summary and the pipeline


def majority_logged_group(groups: list[dict]) -> str:
    """The W&B group most of the analysed runs were logged in (`render.logged_group` of each
    group's first run, weighted by the group's runs); "single" when there is no group."""
    names = Counter()
    for g in groups:
        run_dir = g["cells"][0].run_dir if g["cells"] else None
        names[render.logged_group(run_dir, g["sweep"])] += g["n_runs"]
    return names.most_common(1)[0][0] if names else "single"


def wandb_fields(result: dict, loaded: dict) -> dict:
    """The analysis run's group, its per-run table and its summary (the Kaplan fit)."""
    fits = result["fits"]
    cols = [c for c in PER_RUN_COLUMNS if c != "note"]
    summary = {f"kaplan_exponent/{k['optimizer']}/{k['method']}": k["exponent"]
               for k in fits["kaplan"]}
    summary.update({f"kaplan_b_star_tokens/{k['optimizer']}/{k['method']}": k["b_star_tokens"]
                    for k in fits["kaplan"]})
    return {
        "group": majority_logged_group(result["groups"]),
        "tables": {"per_run": (cols, [[r.get(c) for c in cols] for r in fits["per_run"]])}
        if fits["per_run"] else None,
        "summary": {**summary, "n_warnings": len(fits["warnings"])}}


def summary_lines(result: dict) -> list[str]:
    fits = result["fits"]
    lines = [f"  {g['name']}: {g['n_runs']} runs"
             + (f" + {g['n_target_rows']} steps-to-target rows" if g.get("n_target_rows") else "")
             + f", batch sizes {g['batch_sizes']}, baseline {g['baseline_batch'] or 'none'}"
             for g in result["groups"]]
    for r in fits["per_run"]:
        interval = fmt_interval(r["b_crit"], r["b_crit_low"], r["b_crit_high"])
        lines.append(f"  {r['group']}: B={r['batch_size']} tokens={r['tokens']:,} "
                     f"loss={r['val_loss']:.4f} r={fmt(r['r'], '.3f')} B_crit={interval} seq"
                     + (" (extrapolated)" if r["extrapolated"] else ""))
    lines += [joint_report.summary_line(doc) for doc in fits["joint"].values()]
    lines += ["summary (what to act on; report.md opens with it):",
              *summary.lines(fits["summary"])]
    for k in fits["kaplan"]:
        if not k.get("shown", True):
            lines.append(f"  Kaplan {k['optimizer']} {k['method']}: left out ({k['left_out']})")
            continue
        lines.append(f"  Kaplan {k['optimizer']} {k['method']}: B* = "
                     f"{fmt(k['b_star_tokens'], '.3g')} tokens, 1/alpha_B = "
                     f"{exponent_text(k)} "
                     f"({k['n_points']} points; {k['interval']}; Kaplan: 2e8, 4.8)")
    return lines


def analyse(runs: list[dict], baseline_batch: int | str | None = None,
            resamples: int | None = None, **kwargs) -> dict:
    """`bcrit.analyse`, each group also given `sweeps`: a Counter of its analysed runs (the
    ones not left out) per sweep stage, for `sweep_label`; `resamples`: the summary's
    bootstrap refits (`summary.sweep_summary`)."""
    result = bcrit.analyse(runs, baseline_batch=baseline_batch, **kwargs)
    draws.add_draw_checks(runs, result)
    result["fits"]["summary"] = summary.sweep_summary(
        runs, result["fits"]["joint"], warnings=result["warnings"],
        noise_ratio=result["fits"]["noise_ratio"], resamples=resamples)
    result["fits"]["lr_search"] = lr_search_records(runs)
    left_out = {d["run_dir"] for d in result["left_out"]}
    sweeps: dict[tuple, Counter] = defaultdict(Counter)
    rules: dict[tuple, set] = defaultdict(set)  # (optim.lr_scaling, optim.base_batch_size)
    for r in runs:
        if r["run_dir"] not in left_out:
            sweeps[best_lr.group_key(r)][r.get("sweep")] += 1
            rules[best_lr.group_key(r)].add((r.get("lr_scaling"), r.get("base_batch_size")))
    for g in result["groups"]:
        key = tuple(g["key"][k] for k in best_lr.GROUP_KEYS)
        g["sweeps"] = sweeps.get(key, Counter())
        g["lr_rule"] = next(iter(rules[key])) if len(rules.get(key, ())) == 1 else None
    return result


def study(baseline_batch: int | None = None, resamples: int | None = None) -> render.Study:
    """The B_crit study for `render.run_study` (`baseline_batch`: see `bcrit.analyse`;
    `resamples`: the summary's refits, see `analyse`)."""
    return render.Study(name="fit_bcrit", document_file="fits.json",
                        no_runs_fix="a sweep folder, or run make sweep-batch",
                        analyse=partial(analyse, baseline_batch=baseline_batch,
                                        resamples=resamples),
                        write_plots=write_plots, document=fits_document,
                        markdown=report_markdown, wandb=wandb_fields,
                        summary_lines=summary_lines, extra_files=write_csv)


def inputs_of(paths: list[str] | None = None, from_wandb: str | None = None,
              group: str | None = None, tables: list[str] | None = None,
              runs_root: str = "runs") -> tuple:
    """(load, inputs, default report folder) for `render.run_study`: the tables, or the W&B
    project `from_wandb` (only `group`), or `paths`, or else the latest sweep under
    `runs_root` (`default_inputs`, which prints a line saying which)."""
    if tables:
        first = Path(tables[0])
        return (partial(load_tables, tables), [str(t) for t in tables],
                first.with_name(f"{first.stem}-report"))
    if from_wandb:
        return (partial(load_wandb_runs, from_wandb, group),
                [f"W&B {from_wandb}" + (f" group {group}" if group else "")],
                Path(runs_root) / "wandb" / from_wandb.replace("/", "_") / (group or "all")
                / "report")
    if paths:
        roots = [Path(p) for p in paths]
        default = render.default_out(roots)
    else:
        roots, sentence = default_inputs(runs_root)
        default = roots[0] / "report"
        print(sentence, flush=True)
    return partial(load_runs, roots), [str(p) for p in roots], default


def run_analysis(paths: list[str] | None = None, out: str | None = None,
                 baseline_batch: int | None = None, from_wandb: str | None = None,
                 group: str | None = None, wandb_mode: str = "offline",
                 project: str = "critbatch", runs_root: str = "runs",
                 tables: list[str] | None = None, resamples: int | None = None) -> dict:
    """Load, analyse and write the report folder; returns {"out", "result", "document"}.

    The input is one of `tables` (`critbatch.analysis.bcrit.tables`), the W&B project
    `from_wandb` (only `group`), `paths`, or else the latest sweep under `runs_root`
    (`inputs_of`). Raises ResultsError (one line for the user) only when
    nothing can be computed: no runs, a bad table, or every run left out. `resamples`: the
    summary's bootstrap refits (None: the engine's; SMOKE_RESAMPLES at the smoke scale).
    """
    load, inputs, default = inputs_of(paths, from_wandb, group, tables, runs_root)
    return render.run_study(study(baseline_batch, resamples), load, inputs,
                            Path(out) if out else default, wandb_mode=wandb_mode,
                            project=project)


def export_table(file: str, paths: list[str] | None = None, from_wandb: str | None = None,
                 group: str | None = None, tables: list[str] | None = None,
                 runs_root: str = "runs") -> list[dict]:
    """Write the runs of the inputs (as `run_analysis` finds them) as a table of run rows
    (`tables.write_table`, CSV or JSON Lines by the extension); returns the rows."""
    load, inputs, _ = inputs_of(paths, from_wandb, group, tables, runs_root)
    loaded = load()
    if not loaded["runs"]:
        raise render.no_runs(", ".join(inputs), "a sweep folder, or run make sweep-batch")
    rows, skipped = export_rows(loaded["runs"])
    write_table(rows, file)
    for note in skipped:
        print(f"warning: not exported: {note}")
    print(f"{len(rows)} runs from {', '.join(inputs)} written to {file}"
          + (f" ({len(loaded['left_out'])} unreadable runs left out)"
             if loaded["left_out"] else ""), flush=True)
    return rows
