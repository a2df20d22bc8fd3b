"""The local critical batch report: fits.json, report.md, the plots and the pipeline of
`analysis/local_cbs.py`.

`run_analysis` reads the base runs (`critbatch.analysis.local_cbs.reading.load_base_run`),
decides every checkpoint (`critbatch.analysis.local_cbs.local_cbs.analyse`) and writes,
atomically, into the report folder (default `<last RUN_DIR>/report/`): `report.md`, the plots
of PLOTS and `fits.json` with the keys FITS_KEYS (described in
critbatch.analysis.local_cbs.local_cbs); then logs the folder to W&B like fit_bcrit (offline
unless told otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from critbatch.analysis import plotting, render
from critbatch.analysis.local_cbs.local_cbs import FITS_KEYS, ROW_KEYS, analyse, check_rule
from critbatch.analysis.local_cbs.reading import (
    find_base_runs,
    label_of,
    load_base_run,
    read_batch_sweep,
)
from critbatch.analysis.render import fmt, fmt_interval, md_table
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.results.runs import LOCAL_CBS_DIR, is_finite
from critbatch.science.laws import KAPLAN_B_STAR_TOKENS, KAPLAN_EXPONENT
from critbatch.science.local_cbs import CONFIDENCE, TOLERANCE

PLOTS = {
    "local_bcrit_vs_tokens": "Local B_crit (sequences) versus tokens trained, per optimizer: "
                             "the rule's and, per k, in effective tokens",
    "local_bcrit_vs_loss": "Local B_crit, online B_noise and the batch sweep's B_crit "
                           "(sequences) versus loss (nats/token)",
}


# ---------------------------------------------------------------------------------------------
# fits.json and report.md


def document(result: dict) -> dict:
    """fits.json: exactly FITS_KEYS (module docstring)."""
    values = (result["rows"], result["kaplan"], result["cost"], result["noise"], result["rule"],
              result["warnings"])
    return dict(zip(FITS_KEYS, values, strict=True))


def bcrit_cell(r: dict) -> str:
    """'k x B = b' (sequences); '>= ...' when every k was accepted (the largest k), '< ...'
    the second k when the first step up was rejected."""
    base = r["base_batch_size"]
    k = r["b_crit"] // base
    if r["first_step_rejected"]:
        k1 = r["multipliers"][1]
        return f"< {k1} x {base} = {k1 * base:,} (first step up rejected)"
    text = f"{k} x {base} = {r['b_crit']:,}"
    return f">= {text} (largest k)" if r["lower_bound_only"] else text


def steps_cell(r: dict) -> str:
    """Per k after the first: 'k: excess (upper)', nats/token."""
    return "; ".join(f"{k}: diverged" if int(k) in r["diverged"] else
                     f"{k}: {r['excess'][k]:+.4f} ({r['upper'][k]:+.4f})" for k in r["excess"])


def checkpoint_table(rows: list[dict]) -> str:
    return md_table(
        ["base run", "tokens", "loss (nats/token)", "local B_crit k x B (seq)",
         "B_crit (tokens)", "margin (nats/token)", "EMA rule (seq)", "online B_noise (seq)",
         "per k: excess (upper bound) vs best smaller, nats/token"],
        [[Path(r["run_dir"]).name, f"{r['tokens']:,}", fmt(r["val_loss"], ".4f"),
          bcrit_cell(r), fmt(r["b_crit_tokens"], ",.0f"), fmt(r["margin"], "+.4f"),
          fmt(r["b_crit_ema"], ",d"), fmt(r["b_noise"], ".3g"), steps_cell(r)]
         for r in rows])


def kaplan_table(rows: list[dict]) -> str:
    table = [[label_of(r),
              fmt_interval(r["b_star_tokens"], r["b_star_tokens_low"], r["b_star_tokens_high"]),
              fmt_interval(r["exponent"], r["exponent_low"], r["exponent_high"]),
              str(r["n_points"]), r["interval"], "; ".join(r["left_out"]) or "none"]
             for r in rows]
    table.append(["Kaplan et al. 2020", f"{KAPLAN_B_STAR_TOKENS:.0e}", f"{KAPLAN_EXPONENT:g}",
                  "-", "GPT-2 tokenizer on WebText2", "-"])
    return md_table(["optimizer, lr rule", "B* (tokens) [interval]", "1/alpha_B [interval]",
                     "checkpoints", "interval", "left out"], table)


def cost_table(rows: list[dict]) -> str:
    return md_table(
        ["optimizer, lr rule", "base run", "checkpoints", "branches (replicates)",
         "branch tokens",
         "base tokens", "tokens / base", "branch wall time (s)", "base wall time (s)",
         "wall time / base"],
        [[label_of(r), Path(r["run_dir"]).name, str(r["checkpoints"]),
          f"{r['branches']} ({r['replicates']})", f"{r['branch_tokens']:,}",
          f"{r['base_tokens']:,}", fmt(r["token_fraction"], ".2f"),
          fmt(r["branch_wall_time_s"], ",.1f"), fmt(r["base_wall_time_s"], ",.1f"),
          fmt(r["wall_fraction"], ".2f")] for r in rows])


def pool_cell(x: dict) -> str:
    """'k: sd [dof], Bartlett p' and the checkpoints bound alone, if any."""
    v = x.get("equal_variance")
    text = f"{x['multiplier']}: {fmt(x['sd'], '.2e')} [{fmt(x['dof'], '.3g')}]"
    if v:
        text += f", Bartlett p = {fmt(v['p_value'], '.2g')}"
        if v["alone_tokens"]:
            text += " (alone: " + ", ".join(f"{t:,}" for t in v["alone_tokens"]) + ")"
    return text


def noise_table(rows: list[dict]) -> str:
    """Per base run: its design, the k = 1 replicates' branch sd, and (replicated design) per
    k the sd of one seed's excess that its bounds used, with Bartlett's test before pooling."""
    return md_table(
        ["optimizer, lr rule", "base run", "design", "k = 1 branch sd (nats/token) [dof, pairs]",
         "per k: pooled sd of the excess the bounds use (nats/token) [dof], equal variances "
         "across checkpoints"],
        [[label_of(r), Path(r["run_dir"]).name, r.get("design", "k = 1 replicates"),
          f"{fmt(r['branch_sd'], '.2e')} [{fmt(r['branch_sd_dof'], '.3g')}, {r['pairs']}]",
          "; ".join(pool_cell(x) for x in r.get("per_k", [])) or "-"] for r in rows])


def equivalent_cell(k: str, te: dict) -> str:
    """'k: B_crit [low, high] (r)' in sequences, or 'k: -' and why."""
    if te["b_crit"] is None:
        return f"{k}: - ({te['note']})"
    return (f"{k}: {fmt_interval(te['b_crit'], te['b_crit_low'], te['b_crit_high'], ',.0f')}"
            f" (r = {te['r']:.3g})")


def equivalent_table(rows: list[dict]) -> str:
    return md_table(
        ["base run", "tokens", "loss (nats/token)", "tolerance rule k x B (seq)",
         "k = 1 curve points", "per k: B_crit in effective tokens (seq) [interval] (r)"],
        [[Path(r["run_dir"]).name, f"{r['tokens']:,}", fmt(r["val_loss"], ".4f"),
          bcrit_cell(r), str(r["tokens_equivalent_points"]),
          "; ".join(equivalent_cell(k, te) for k, te in r["tokens_equivalent"].items())]
         for r in rows])


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str]) -> str:
    rows = result["rows"]
    lines = ["# Local critical batch size by branched training", "",
             f"Inputs: {', '.join(inputs)}; {len(result['bases'])} base run(s), {len(rows)} "
             "checkpoint(s).", "", "## The rule", "", result["rule"]["statement"], "",
             f"The interval: {result['rule']['interval']}.", "",
             "## Noise", "",
             "The k = 1 branch sd is how much one branch's loss moves with the seed (data "
             "order) alone; with replicated ladders every k shares each seed's data order, so "
             "the excess of one k over another scatters far less, and that scatter is what "
             "the bounds use. Before it is pooled over a run's checkpoints, Bartlett's test "
             "asks whether their variances agree; a checkpoint that disagrees is bound on its "
             "own seeds alone (wider; listed as 'alone', with a warning).", "",
             noise_table(result["noise"]), "",
             "## Local B_crit per checkpoint", "",
             "Batch sizes in sequences; margin = tolerance minus the upper bound of the last "
             "accepted k (room the accepted B_crit had; '-' when the first step up was "
             "rejected); online B_noise: the base run's tracker at that point (B_simple, a "
             "different quantity).", ""]
    for label in sorted({label_of(r) for r in rows}):
        lines += [f"### {label}", "",
                  checkpoint_table([r for r in rows if label_of(r) == label]), ""]
    te = result["rule"]["tokens_equivalent"]
    lines += ["## Local B_crit in effective tokens", "", te["statement"], "",
              f"The interval: {te['interval']}.", ""]
    for label in sorted({label_of(r) for r in rows}):
        lines += [f"### {label} (effective tokens)", "",
                  equivalent_table([r for r in rows if label_of(r) == label]), ""]
    lines += ["## Kaplan's law over the local points", "",
              "B_crit(L) = B* / L^(1/alpha_B), unweighted least squares in logs over the "
              "checkpoints with a two-sided B_crit; interval: percentile bootstrap over "
              "checkpoints.", "", kaplan_table(result["kaplan"]), "",
              "## Cost", "",
              "Tokens the branches trained after their forks and their wall time, against the "
              "base run's.", "", cost_table(result["cost"]), ""]
    sweep = result["batch_sweep"]
    if sweep:
        lines += [f"Batch sweep drawn for comparison: {sweep['file']} ({len(sweep['per_run'])} "
                  f"per-run and {len(sweep['pareto'])} Pareto B_crit).", ""]
    lines += render.plots_section(plots, PLOTS) + render.warnings_section(result["warnings"])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots


OPTIMIZER_COLORS = [f"C{i}" for i in range(10)]


def draw_local(ax, rows: list[dict], x_key: str, color: str, label: str) -> None:
    """Local B_crit (filled; '^' for lower bounds, 'v' for upper bounds) and the EMA rule."""
    rows = sorted((r for r in rows if r[x_key] is not None), key=lambda r: r[x_key])
    two = [r for r in rows if not r["lower_bound_only"] and not r["first_step_rejected"]]
    for subset, marker, text in ((two, "o-", ""), ([r for r in rows if r["lower_bound_only"]],
                                                   "^", " (lower bound)"),
                                 ([r for r in rows if r["first_step_rejected"]], "v",
                                  " (first step rejected)")):
        if subset:
            ax.plot([r[x_key] for r in subset], [r["b_crit"] for r in subset],
                    marker if len(subset) > 1 else marker[0], color=color, ms=6,
                    label=f"{label} local B_crit{text}")
    ema = [r for r in rows if r["b_crit_ema"]]
    if ema:
        ax.plot([r[x_key] for r in ema], [r["b_crit_ema"] for r in ema], "x", color=color,
                ms=7, label=f"{label} paper's EMA rule")


def draw_equivalent(ax, rows: list[dict], color: str, label: str) -> None:
    """Per checkpoint and k, the tokens-equivalent local B_crit with its interval (a lower end
    of 0 drawn to a tenth of the value, an open upper end to ten times it: log axes)."""
    pts = [(r["tokens"], te) for r in rows for te in r["tokens_equivalent"].values()
           if te["b_crit"] is not None]
    if not pts:
        return
    y = np.array([te["b_crit"] for _, te in pts])
    low = np.array([te["b_crit_low"] if te["b_crit_low"] is not None else v
                    for v, (_, te) in zip(y, pts, strict=True)])
    high = np.array([te["b_crit_high"] if te["b_crit_high"] is not None else 10 * v
                     for v, (_, te) in zip(y, pts, strict=True)])
    ax.errorbar([t for t, _ in pts], y, yerr=[y - np.maximum(low, y / 10), high - y], fmt="+",
                color=color, alpha=0.6, ms=7, lw=0.8,
                label=f"{label} in effective tokens (each k)")


def plot_vs_tokens(result: dict, path: Path) -> None:
    plt = plotting.pyplot()
    width_in = 6.5 + plotting.LEGEND_IN
    fig, ax = plt.subplots(figsize=(width_in, 4.8))
    fig.subplots_adjust(left=0.1, right=1 - (plotting.LEGEND_IN + 0.15) / width_in, bottom=0.11,
                        top=0.9)
    labels = sorted({label_of(r) for r in result["rows"]})
    for color, label in zip(OPTIMIZER_COLORS, labels, strict=False):
        mine = [r for r in result["rows"] if label_of(r) == label]
        draw_local(ax, mine, "tokens", color, label)
        draw_equivalent(ax, mine, color, label)
    plotting.log_axes(ax, x=True, y=True)
    plotting.label_axes(ax, "tokens trained at the checkpoint (tokens)",
                        "local B_crit (sequences)", PLOTS["local_bcrit_vs_tokens"])
    plotting.save_figure(fig, path)


def draw_batch_sweep(ax, sweep: dict | None, opt: str) -> None:
    if not sweep:
        return
    per_run = [r for r in sweep["per_run"] if r.get("optimizer") == opt]
    pareto = [r for r in sweep["pareto"] if r.get("optimizer") == opt]
    if per_run:
        ax.plot([r["val_loss"] for r in per_run], [r["b_crit"] for r in per_run], "s",
                mfc="none", color="C2", label="batch sweep per-run B_crit")
    if pareto:
        ax.plot([r["target_loss"] for r in pareto], [r["b_crit"] for r in pareto], "D",
                mfc="none", color="C3", label="batch sweep Pareto B_crit")


def plot_vs_loss(result: dict, path: Path) -> None:
    """Per optimizer: the local B_crit and the EMA rule against loss, the base runs' online
    B_noise series, the local Kaplan fit and, with a batch sweep, its per-run and Pareto
    B_crit; everything in sequences."""
    labels = plotting.shown_groups(sorted({label_of(r) for r in result["rows"]}),
                                   result["warnings"])
    fig, axes = plotting.panel_grid(len(labels), PLOTS["local_bcrit_vs_loss"],
                                    panel_in=(6.0, 4.6), max_cols=2)
    for label, ax in zip(labels, axes, strict=True):
        rows = [r for r in result["rows"] if label_of(r) == label]
        opt = rows[0]["optimizer"]
        draw_local(ax, rows, "val_loss", "C0", label)
        for i, base in enumerate(b for b in result["bases"] if b.label == label):
            pts = sorted((p["val_loss"], p["b_noise"]) for p in base.summary["curve"]
                         if is_finite(p.get("b_noise")) and p["b_noise"] > 0
                         and is_finite(p.get("val_loss")) and p["val_loss"] > 0)
            if pts:
                ax.plot(*zip(*pts, strict=True), "-", color="C1", lw=1,
                        label="online B_noise (base run)" if i == 0 else None)
        fit = next(k for k in result["kaplan"] if k["label"] == label)
        losses = [r["val_loss"] for r in rows if r["val_loss"]]
        if fit["exponent"] is not None and fit["b_star_tokens"]:
            grid = np.geomspace(min(losses) / 1.02, max(losses) * 1.02, 50)
            ax.plot(grid, fit["b_star_tokens"] / grid ** fit["exponent"] / fit["seq_len"], "--",
                    color="C0", lw=1, label=f"local fit: B*/L^{fit['exponent']:.2f}")
        draw_batch_sweep(ax, result["batch_sweep"], opt)
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "validation loss L (nats/token)", "batch size (sequences)",
                            label)
    plotting.save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    plot_vs_tokens(result, out / "local_bcrit_vs_tokens.png")
    plot_vs_loss(result, out / "local_bcrit_vs_loss.png")
    return {name: f"{name}.png" for name in PLOTS}


# ---------------------------------------------------------------------------------------------
# The pipeline


def default_paths(runs_root: str | Path = "runs") -> list[Path]:
    """The most recently written runs/local_cbs/<scale> folder (a line says which)."""
    folders = render.sweep_folders(runs_root, (LOCAL_CBS_DIR,))
    if not folders:
        raise ResultsError(f"no base runs under {runs_root}/{LOCAL_CBS_DIR}/<scale>/; pass the "
                           "base run folders, or train the branches first")
    print(f"no paths given: analysing {folders[0].path} (its newest run finished "
          f"{folders[0].age()})", flush=True)
    return [folders[0].path]


def summary_lines(result: dict) -> list[str]:
    lines = []
    for r in result["rows"]:
        equivalent = ", ".join(f"{k}: {fmt(te['b_crit'], ',.0f')}"
                               for k, te in r["tokens_equivalent"].items())
        lines.append(f"  {label_of(r)} {Path(r['run_dir']).name} tokens={r['tokens']:,} "
                     f"loss={fmt(r['val_loss'], '.4f')} local B_crit {bcrit_cell(r)} seq, "
                     f"margin={fmt(r['margin'], '+.4f')} EMA rule={fmt(r['b_crit_ema'], 'd')}"
                     f"; in effective tokens, per k: {equivalent} seq")
    for k in result["kaplan"]:
        lines.append(f"  Kaplan {k['label']} local: 1/alpha_B = "
                     f"{fmt_interval(k['exponent'], k['exponent_low'], k['exponent_high'])} "
                     f"({k['interval']}; Kaplan: {KAPLAN_EXPONENT:g})")
    return lines


def run_analysis(paths: Sequence[str | Path] | None = None, out: str | Path | None = None,
                 tolerance: float = TOLERANCE, confidence: float = CONFIDENCE,
                 batch_sweep: str | Path | None = None, wandb_mode: str = "offline",
                 project: str = "critbatch", runs_root: str | Path = "runs") -> dict:
    """Read the base runs under `paths` (default: the latest runs/local_cbs/<scale>), decide
    every checkpoint, write the report folder (`out`, default `<last path>/report`); returns
    {"out", "result", "document"}. Raises ResultsError (one line) on bad input."""
    check_rule(tolerance, confidence)
    roots = [Path(p) for p in paths] if paths else default_paths(runs_root)
    bases = [load_base_run(d) for d in find_base_runs(roots)]
    sweep = read_batch_sweep(batch_sweep) if batch_sweep else None
    result = analyse(bases, tolerance, confidence, sweep)
    folder = Path(out) if out else roots[-1] / "report"
    folder.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, folder)
    doc = render.json_clean(document(result))
    write_json_atomic(folder / "fits.json", doc)
    inputs = [str(p) for p in roots]
    write_text_atomic(folder / "report.md", report_markdown(result, inputs, plots))
    summary = {f"local_cbs_exponent/{k['optimizer']}_{k['lr_scaling']}": k["exponent"]
               for k in result["kaplan"]}
    render.publish_report(
        folder, name="local_cbs", group=render.logged_group(bases[0].run_dir,
                                                            bases[0].summary.get("sweep")),
        mode=wandb_mode, project=project,
        config={"inputs": inputs, "tolerance": tolerance, "confidence": confidence},
        images=plots, files=["report.md", "fits.json", *plots.values()],
        summary={**summary, "n_checkpoints": len(result["rows"])},
        tables={"local_cbs": (ROW_KEYS, [[json.dumps(r[k]) if isinstance(r[k], dict | list)
                                          else r[k] for k in ROW_KEYS]
                                         for r in result["rows"]])})
    print(f"{len(bases)} base run(s), {len(result['rows'])} checkpoint(s)", flush=True)
    for line in summary_lines(result):
        print(line)
    for w in result["warnings"]:
        print(f"warning: {w}")
    print(f"report: {folder / 'report.md'}", flush=True)
    return {"out": folder, "result": result, "document": doc}
