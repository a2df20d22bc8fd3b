"""Turn the analysis of `critbatch.bcrit` into a report folder.

`run_analysis` (what `analysis/fit_bcrit.py` calls) loads runs, analyses them and writes:

- `report.md`   the question, the groups, the tables (in the form of science.md section 3)
                and every warning;
- `*.png`       loss vs tokens, lr sensitivity, effective tokens, S-E Pareto frontiers,
                B_crit vs loss (matplotlib, Agg backend);
- `fits.json`   the machine-readable fits (public keys: per_run, pareto, kaplan, lr_scaling,
                warnings; B_crit in sequences with `_tokens` twins);
- `bcrit.csv`   the per-run table;
- a W&B run (job_type "analysis", in the sweep's group; offline unless told otherwise).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from critbatch.analysis import bcrit
from critbatch.analysis.plotting import empty_axes, label_axes, log_axes, save_figure
from critbatch.analysis.results import latest_sweep_dir, load_runs, load_wandb_runs, read_config
from critbatch.errors import ResultsError
from critbatch.files import write_json_atomic

MAX_PANELS = 6  # groups drawn per figure (more make the plots slow and unreadable)
PLOTS = {
    "loss_vs_tokens": "Final loss versus tokens per batch size, with the baseline interpolant",
    "lr_sensitivity": "Final loss versus learning rate per batch size (largest budget)",
    "effective_tokens": "Effective (baseline-equivalent) tokens versus tokens seen",
    "pareto": "Steps versus tokens to reach each target loss, with fitted hyperbolas",
    "bcrit_vs_loss": "B_crit versus loss: estimates, fit, Kaplan's law and B_noise",
}
PER_RUN_COLUMNS = (
    "run_dir", "group", "optimizer", "batch_size", "tokens", "lr", "lr_edge", "val_loss",
    "val_loss_per_byte", "val_loss_sigma", "effective_tokens", "r", "b_crit", "b_crit_low",
    "b_crit_high", "b_crit_naive", "b_crit_tokens", "b_crit_low_tokens", "b_crit_high_tokens",
    "extrapolated", "baseline_batch", "note",
)
# The sweep stage that pairs with each (run directories runs/<stage>/<scale>/...).
COMPANION_STAGES = {"batch": "baseline", "baseline": "batch", "widths": "widths_batch",
                    "widths_batch": "widths"}


# ---------------------------------------------------------------------------------------------
# Inputs


def default_inputs(runs_root: str | Path = "runs") -> tuple[list[Path], str]:
    """The latest sweep under `runs_root` and its companion stage; and a sentence saying so."""
    latest = latest_sweep_dir(runs_root)
    if latest is None:
        raise ResultsError(f"no runs found under {runs_root}/; pass run directories or train "
                           "some first (make sweep-batch)")
    paths = [latest]
    companion = COMPANION_STAGES.get(latest.parent.name)
    if companion and (latest.parent.parent / companion / latest.name).is_dir():
        paths.append(latest.parent.parent / companion / latest.name)
    names = " and ".join(str(p) for p in paths)
    return paths, f"no paths given: analysing the latest sweep, {names}"


def default_out(paths: list[Path]) -> Path:
    """`<sweep dir>/report`: beside the common folder of the inputs (above a run directory)."""
    common = Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
    if (common / "summary.json").exists():
        common = common.parent
    return common / "report"


# ---------------------------------------------------------------------------------------------
# Formatting


def fmt(x, spec: str = ".4g") -> str:
    """A table cell: '-' for None/NaN, else `format(x, spec)`."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def fmt_interval(value, low, high, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if low is None and high is None:
        return fmt(value, spec)
    upper = fmt(high, spec) if high is not None else "inf"
    return f"{fmt(value, spec)} [{fmt(low, spec)}, {upper}]"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def json_clean(obj):
    """Replace NaN/inf by None and numpy scalars by Python numbers (strict JSON)."""
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ---------------------------------------------------------------------------------------------
# fits.json, bcrit.csv, report.md


def fits_document(result: dict) -> dict:
    """The public fits.json: exactly per_run, pareto, kaplan, lr_scaling, warnings."""
    fits = result["fits"]
    return json_clean({k: fits[k] for k in ("per_run", "pareto", "kaplan", "lr_scaling",
                                            "warnings")})


def write_csv(per_run: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=PER_RUN_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in per_run:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in
                             PER_RUN_COLUMNS})


def loss_tables(groups: list[dict]) -> list[str]:
    """Loss (nats/byte) per batch size x optimizer at the best lr, delta against the baseline.

    One table per model (groups that differ only in optimizer), as in science.md section 3.
    """
    by_model: dict[tuple, list[dict]] = defaultdict(list)
    for g in groups:
        by_model[tuple(v for k, v in g["key"].items() if k != "optimizer")].append(g)
    out = []
    for model, gs in by_model.items():
        opts = [g["key"]["optimizer"] for g in gs]
        rows_keys = sorted({(c.batch_size, c.tokens) for g in gs for c in g["cells"]})
        header = ["batch (seq)", "tokens"]
        for o in opts:
            header += [f"{o} loss (nats/byte)", f"{o} delta vs b", f"{o} best lr"]
        rows = []
        for batch, tokens in rows_keys:
            row = [str(batch), f"{tokens:,}"]
            for g in gs:
                cell = next((c for c in g["cells"] if (c.batch_size, c.tokens) == (batch, tokens)),
                            None)
                base = next((c for c in g["cells"] if c.batch_size == g["baseline_batch"] and
                             c.tokens == tokens), None)
                if cell is None:
                    row += ["-", "-", "-"]
                    continue
                delta = (cell.loss_per_byte - base.loss_per_byte) if base else None
                flag = {"low": " (low edge)", "high": " (high edge)", "single": " (one lr)"}
                row += [fmt(cell.loss_per_byte, ".4f"),
                        "baseline" if base is cell else fmt(delta, "+.4f"),
                        fmt(cell.lr, ".3g") + flag.get(cell.edge, "")]
            rows.append(row)
        data, vocab, seq_len, width, depth = model
        out.append(f"**{data}, vocabulary {vocab}, seq_len {seq_len}, width {width}, depth "
                   f"{depth}** (baseline batch: " + ", ".join(
                       f"{g['key']['optimizer']} {g['baseline_batch'] or 'none'}" for g in gs)
                   + ")\n\n" + md_table(header, rows))
    return out


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str],
                    elapsed_s: float) -> str:
    fits = result["fits"]
    groups = result["groups"]
    lines = [
        "# Critical batch size report", "",
        "**The question.** How large can the batch be before it costs efficiency? To reach a "
        "loss, training takes S steps and E = B x S examples; McCandlish et al. (2018): "
        "S/S_min - 1 = B_crit/B and E/E_min - 1 = B/B_crit. This report measures B_crit three "
        "ways (tokens-equivalent per run, Pareto frontier, gradient noise scale) and fits "
        "Kaplan et al.'s (2020) B_crit(L) = B*/L^(1/alpha_B). Batch sizes in sequences unless "
        "marked tokens; losses in nats/token unless marked nats/byte; intervals are 95%.", "",
        f"Inputs: {', '.join(inputs)}; {result['n_runs']} runs read, "
        f"{len(result['left_out'])} left out; analysis took {elapsed_s:.1f} s.", "",
        "## Groups", "",
        "Runs are compared only within a group (same data, vocabulary, seq_len, width, depth "
        "and optimizer).", "",
    ]
    lines.append(md_table(
        ["group", "sweep", "runs", "batch sizes (seq)", "budgets (tokens)", "baseline batch"],
        [[g["name"], str(g["sweep"]), str(g["n_runs"]), ", ".join(map(str, g["batch_sizes"])),
          ", ".join(f"{t:,}" for t in g["budgets"]), str(g["baseline_batch"] or "none")]
         for g in groups]))
    if result["left_out"]:
        lines += ["", "### Runs left out", ""]
        lines.append(md_table(["run", "reason", "detail"],
                              [[d["run_dir"], d["reason"], d["detail"]]
                               for d in result["left_out"]]))
    lines += ["", "## Loss at the best learning rate", "",
              "Final validation loss at the best lr of each cell (grid minimum refined by a "
              "parabola in log lr), and its difference from the baseline batch at the same "
              "budget.", ""]
    lines += ["\n\n".join(loss_tables(groups)), ""]
    lines += ["## Effective tokens and B_crit per run", "",
              "E_eff: baseline tokens that reach the run's loss (PCHIP in log tokens; "
              "extrapolated with L = L_inf + A E^-alpha where marked). r = E/E_eff; "
              "B_crit = (B - b r)/(r - 1); the naive B/(r - 1) ignores the baseline's own batch.",
              ""]
    rows = []
    for r in fits["per_run"]:
        ratio = (r["effective_tokens"] / r["tokens"]) if r["effective_tokens"] else None
        rows.append([r["group"], str(r["batch_size"]), f"{r['tokens']:,}",
                     fmt(r["val_loss"], ".4f"), fmt(r["effective_tokens"], ",.0f"),
                     fmt(ratio, ".3f"), fmt(r["r"], ".3f"),
                     fmt_interval(r["b_crit"], r["b_crit_low"], r["b_crit_high"]),
                     fmt(r["b_crit_tokens"], ".3g"), fmt(r["b_crit_naive"], ".3g"),
                     "yes" if r["extrapolated"] else "", r["note"] or ""])
    lines.append(md_table(["group", "B (seq)", "tokens E", "loss (nats/token)", "E_eff (tokens)",
                           "E_eff/E", "r", "B_crit (seq) [95%]", "B_crit (tokens)",
                           "naive B/(r-1)", "extrapolated", "note"], rows)
                 if rows else "No per-run B_crit (see the warnings).")
    lines += ["", "## B_noise measured", ""]
    noise = [p for p in result["noise"] if "loss" in p]
    if noise:
        lines.append(md_table(
            ["run", "source", "loss (nats/byte)", "loss (nats/token)", "tr(Sigma)", "abs(G)^2",
             "B_noise (seq) [interval]", "B_noise (tokens)", "K x b", "interval"],
            [[p["run_dir"], p["kind"], fmt(p["loss_per_byte"], ".4f"), fmt(p["loss"], ".4f"),
              fmt(p.get("trace"), ".3g"), fmt(p.get("g2"), ".3g"),
              fmt_interval(p["b_noise"], p["b_noise_low"], p["b_noise_high"]),
              fmt(p["b_noise_tokens"], ".3g"),
              f"{p['micro_batches']} x {p['micro_batch_size']}" if "micro_batches" in p else "-",
              p.get("interval", "-")]
             for p in noise]))
    else:
        lines.append("No B_noise measurement (noise.json or online tracking) in these runs.")
    lines += ["", "## Pareto frontier", "",
              "Per target loss: steps S(B) each batch size needs; weighted least-squares fit "
              "of S = S_min + E_min/B (weights 1/S: relative errors); B_crit = E_min/S_min "
              "(95% interval: delta method on log B_crit).", ""]
    if fits["pareto"]:
        lines.append(md_table(
            ["group", "target loss (nats/token)", "batch sizes", "S_min (steps)",
             "E_min (seq)", "B_crit (seq) [95%]", "B_crit (tokens)"],
            [[p["group"], fmt(p["target_loss"], ".4f"), ", ".join(map(str, p["batch_sizes"])),
              fmt(p["s_min"], ".4g"), fmt(p["e_min"], ".4g"),
              fmt_interval(p["b_crit"], p["b_crit_low"], p["b_crit_high"]),
              fmt(p["b_crit_tokens"], ".3g")] for p in fits["pareto"]]))
    else:
        lines.append("No Pareto frontier (see the warnings).")
    k = fits["kaplan"]
    lines += ["", "## Kaplan's law B_crit(L) = B* / L^(1/alpha_B)", "",
              "Least squares in log-log over every B_crit estimate (L in nats/token, B in "
              "tokens). Kaplan et al. (2020): B* = 2e8 tokens, 1/alpha_B = 4.8 (GPT-2 "
              "tokenizer on WebText2: compare the exponent and the order of magnitude).", ""]
    lines.append(md_table(
        ["", "B* (tokens) [95%]", "1/alpha_B [95%]", "points"],
        [["this fit", fmt_interval(k["b_star_tokens"], k["b_star_tokens_low"],
                                   k["b_star_tokens_high"]),
          fmt_interval(k["exponent"], k["exponent_low"], k["exponent_high"]),
          str(k["n_points"]) + (" (" + ", ".join(f"{n} {kind}" for kind, n in
                                                 k["n_by_kind"].items()) + ")"
                                if k["n_by_kind"] else "")],
         ["Kaplan et al. 2020", "2e+08", "4.8", "-"]]))
    if k["points"]:
        lines += ["", "Each point against the fit and Kaplan's law:", ""]
        lines.append(md_table(
            ["kind", "loss (nats/token)", "B_crit measured (tokens)", "this fit (tokens)",
             "Kaplan (tokens)", "run"],
            [[p["kind"], fmt(p["loss"], ".4f"), fmt(p["b_crit_tokens"], ".3g"),
              fmt(p["fit_tokens"], ".3g"), fmt(p["kaplan_tokens"], ".3g"), p["run_dir"] or "-"]
             for p in k["points"]]))
    lines += ["", "## Learning rate versus batch size", "",
              "Best lr (refined) against batch size at one budget, power law lr* ~ B^k over the "
              "batch sizes below the largest (Adam expected 0.5 <= k <= 1).", ""]
    if fits["lr_scaling"]:
        lines.append(md_table(
            ["optimizer", "exponent k [95%]", "batch sizes", "group"],
            [[opt, fmt_interval(f["exponent"], f["exponent_low"], f["exponent_high"]),
              ", ".join(f"{b:g}" for b in f["batch_sizes"]), f["group"]]
             for opt, f in fits["lr_scaling"].items()]))
    else:
        lines.append("No lr-scaling fit (see the warnings).")
    lines += ["", "## Plots", ""]
    for name, file in plots.items():
        lines += [f"![{PLOTS[name]}]({file})", f"*{PLOTS[name]}.*", ""]
    lines += ["## Warnings", ""]
    lines += [f"- {w}" for w in fits["warnings"]] or ["None."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots


def _panels(groups: list[dict], title: str):
    import matplotlib.pyplot as plt

    shown = groups[:MAX_PANELS]
    n = max(1, len(shown))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    # fixed margins: tight_layout renders every figure twice (most of the report's time)
    width_in, height_in = 5 * cols, 4 * rows
    fig.subplots_adjust(left=0.75 / width_in, right=1 - 0.15 / width_in,
                        bottom=0.55 / height_in, top=1 - 0.6 / height_in, wspace=0.32,
                        hspace=0.45)
    fig.suptitle(title, fontsize=9)
    return fig, list(zip(shown, axes.flat, strict=False))


def plot_loss_vs_tokens(groups: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, panels = _panels(groups, PLOTS["loss_vs_tokens"])
    for g, ax in panels:
        batches = sorted({c.batch_size for c in g["cells"]})
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(batches))))
        for color, b in zip(colors, batches, strict=False):
            cs = sorted((c for c in g["cells"] if c.batch_size == b), key=lambda c: c.tokens)
            ax.plot([c.tokens for c in cs], [c.loss for c in cs], "o-" if len(cs) > 1 else "o",
                    color=color, label=f"B={b}")
        curve = g["baseline"]
        if curve is not None and curve.pchip is not None:
            lo, hi = curve.tokens[0], curve.tokens[-1]
            effs = [r["effective_tokens"] for r in g["per_run"] if r["effective_tokens"]]
            x_in = np.geomspace(lo, hi, 100)
            ax.plot(x_in, [curve.loss_at(x)[0] for x in x_in], "k-", lw=1,
                    label=f"baseline b={g['baseline_batch']} (PCHIP)")
            if curve.power_law is not None:
                span = [min(effs + [lo]) / 1.2, max(effs + [hi]) * 1.2]
                for a, b in ((span[0], lo), (hi, span[1])):
                    if a < b:
                        x = np.geomspace(a, b, 30)
                        ax.plot(x, [curve.loss_at(v)[0] for v in x], "k--", lw=1)
        log_axes(ax)
        label_axes(ax, "tokens seen", "final validation loss (nats/token)", g["name"])
    save_figure(fig, path)


def plot_lr_sensitivity(groups: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, panels = _panels(groups, PLOTS["lr_sensitivity"])
    for g, ax in panels:
        budget = max(g["budgets"])
        cs = sorted((c for c in g["cells"] if c.tokens == budget), key=lambda c: c.batch_size)
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(cs))))
        for color, c in zip(colors, cs, strict=False):
            ax.plot(c.lrs, c.losses, "o-", color=color, label=f"B={c.batch_size}")
            ax.plot([c.lr], [c.loss], "*", color=color, ms=10)
        log_axes(ax)
        label_axes(ax, "peak learning rate", "final validation loss (nats/token)",
               f"{g['name']}, {budget:,} tokens (star: refined optimum)")
    save_figure(fig, path)


def plot_effective_tokens(groups: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, panels = _panels(groups, PLOTS["effective_tokens"])
    for g, ax in panels:
        rows = [r for r in g["per_run"] if r["effective_tokens"]]
        if not rows:
            empty_axes(ax, "no baseline: no effective tokens")
        budgets = sorted({r["tokens"] for r in rows})
        labelled = False
        colors = plt.cm.plasma(np.linspace(0, 0.8, max(1, len(budgets))))
        for color, t in zip(colors, budgets, strict=False):
            rs = sorted((r for r in rows if r["tokens"] == t), key=lambda r: r["batch_size"])
            ax.plot([r["batch_size"] for r in rs], [r["effective_tokens"] for r in rs], "o-",
                    color=color, label=f"E_eff, {t:,} tokens seen")
            ax.axhline(t, color=color, ls=":", lw=1)
            ext = [r for r in rs if r["extrapolated"]]
            ax.plot([r["batch_size"] for r in ext], [r["effective_tokens"] for r in ext], "o",
                    mfc="none", mec="k", ms=10,
                    label="extrapolated" if ext and not labelled else None)
            labelled = labelled or bool(ext)
        log_axes(ax, x=True, y=True)
        label_axes(ax, "batch size (sequences)", "effective tokens (baseline tokens)",
               f"{g['name']} (dotted: tokens seen)", legend=bool(rows))
    save_figure(fig, path)


def plot_pareto(groups: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, panels = _panels(groups, PLOTS["pareto"])
    for g, ax in panels:
        seq_len = g["key"]["seq_len"]
        if not g["pareto"]:
            empty_axes(ax, "no Pareto frontier:\nneeds two batch sizes\nwith several budgets")
        colors = plt.cm.cividis(np.linspace(0, 0.9, max(1, len(g["pareto"]))))
        for color, p in zip(colors, g["pareto"], strict=False):
            ax.plot(p["tokens"], p["steps"], "o", color=color,
                    label=f"L*={p['target_loss']:.3f}, B_crit={fmt(p['b_crit'], '.3g')}")
            if p["s_min"] and p["e_min"] and p["s_min"] > 0 and p["e_min"] > 0:
                b = np.geomspace(min(p["batch_sizes"]) / 3, max(p["batch_sizes"]) * 3, 60)
                s = p["s_min"] + p["e_min"] / b
                ax.plot(s * b * seq_len, s, "-", color=color, lw=1)
        log_axes(ax, x=True, y=True)
        label_axes(ax, "tokens E to reach the target loss", "optimizer steps S", g["name"],
               legend=bool(g["pareto"]))
    save_figure(fig, path)


def plot_bcrit_vs_loss(kaplan: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.11, top=0.93)
    styles = {"per_run": ("o", "C0"), "pareto": ("s", "C1"), "b_noise": ("^", "C3"),
              "b_noise_online": ("v", "C4")}
    points = kaplan["points"]
    for kind, (marker, color) in styles.items():
        ps = [p for p in points if p["kind"] == kind]
        if ps:
            ax.plot([p["loss"] for p in ps], [p["b_crit_tokens"] for p in ps], marker,
                    color=color, ls="none", label=kind.replace("_", " "))
    if points:
        losses = np.array([p["loss"] for p in points])
        grid = np.geomspace(losses.min() / 1.05, losses.max() * 1.05, 50)
        if kaplan["exponent"] is not None:
            ax.plot(grid, kaplan["b_star_tokens"] / grid ** kaplan["exponent"], "k-",
                    label=f"fit: {kaplan['b_star_tokens']:.3g} / L^{kaplan['exponent']:.2f}")
        ax.plot(grid, bcrit.KAPLAN_B_STAR_TOKENS / grid ** bcrit.KAPLAN_EXPONENT, "k--",
                label="Kaplan et al. 2020: 2e8 / L^4.8")
        ax.legend(fontsize=8)
    else:
        empty_axes(ax, "no B_crit estimate yet")
    log_axes(ax, x=True, y=True)
    if points:  # a loss range is less than a decade: label it explicitly
        ticks = np.unique(np.round(np.geomspace(grid[0], grid[-1], 6), 2))
        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
    label_axes(ax, "loss L (nats/token)", "B_crit (tokens)", PLOTS["bcrit_vs_loss"], legend=False)
    save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    """Every plot of PLOTS as `<name>.png` in `out`; returns {name: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    groups = result["groups"]
    if len(groups) > MAX_PANELS:
        result["fits"]["warnings"].append(
            f"plots show the first {MAX_PANELS} of {len(groups)} groups")
    plot_loss_vs_tokens(groups, out / "loss_vs_tokens.png")
    plot_lr_sensitivity(groups, out / "lr_sensitivity.png")
    plot_effective_tokens(groups, out / "effective_tokens.png")
    plot_pareto(groups, out / "pareto.png")
    plot_bcrit_vs_loss(result["fits"]["kaplan"], out / "bcrit_vs_loss.png")
    return {name: f"{name}.png" for name in PLOTS}


# ---------------------------------------------------------------------------------------------
# W&B and the whole pipeline


def wandb_group(groups: list[dict]) -> str:
    """The W&B group the analysed runs were logged in, as the trainer chose it (the group
    holding most of the runs; see `logged_group`)."""
    names = Counter()
    for g in groups:
        run_dir = g["cells"][0].run_dir if g["cells"] else None
        names[logged_group(run_dir, g["sweep"])] += g["n_runs"]
    return names.most_common(1)[0][0] if names else "single"


def logged_group(run_dir: str | Path | None, sweep: str | None = None) -> str:
    """The W&B group a run was logged in: the trainer uses `logger.group or sweep or
    "single"`, and logger.group is read back from the run's config.json (the sweeps set it,
    e.g. "batch-cpu")."""
    config = read_config(run_dir) if run_dir is not None else None
    return ((config.get("logger") or {}).get("group") if config else None) or sweep or "single"


def publish_report(out: Path, *, name: str, group: str, mode: str, project: str,
                   config: dict, images: dict[str, str], files: list[str],
                   summary: dict | None = None, tables: dict | None = None) -> str | None:
    """Log a report folder as a W&B run (job_type "analysis") in the experiment's group.

    `images`: {key: png file in `out`}, logged as images; `tables`: {key: (columns, rows)};
    `files` (report.md, the JSON, the plots) go into one artifact named `<name>-report`.
    Returns the run id, or None when `mode` is "disabled" or W&B fails -- a warning then,
    never an error: the report folder is complete without W&B.
    """
    if mode == "disabled":
        return None
    try:
        import wandb

        run = wandb.init(mode=mode, project=project, group=group, job_type="analysis",
                         name=name, dir=str(out), config=config,
                         settings=wandb.Settings(console="off", silent=True))
        with run:
            run.log({key: wandb.Image(str(out / file)) for key, file in images.items()})
            for key, (columns, rows) in (tables or {}).items():
                run.log({key: wandb.Table(columns=list(columns), data=[
                    [json_clean(v) for v in row] for row in rows])})
            run.summary.update(summary or {})
            artifact = wandb.Artifact(f"{name}-report", type="report")
            for file in files:
                artifact.add_file(str(out / file))
            run.log_artifact(artifact)
            return run.id
    except Exception as err:  # W&B problems must not lose the report
        print(f"warning: W&B logging failed ({err}); the report folder is complete", flush=True)
        return None


def log_to_wandb(result: dict, out: Path, plots: dict[str, str], mode: str, project: str,
                 inputs: list[str]) -> str | None:
    """Log the B_crit report as a W&B run (job_type analysis) in the sweep's group."""
    fits = result["fits"]
    cols = [c for c in PER_RUN_COLUMNS if c != "note"]
    k = fits["kaplan"]
    return publish_report(
        out, name="fit_bcrit", group=wandb_group(result["groups"]), mode=mode, project=project,
        config={"inputs": inputs, "n_runs": result["n_runs"]}, images=plots,
        files=["report.md", "fits.json", "bcrit.csv", *plots.values()],
        tables={"per_run": (cols, [[r.get(c) for c in cols] for r in fits["per_run"]])}
        if fits["per_run"] else None,
        summary={"kaplan_b_star_tokens": k["b_star_tokens"], "kaplan_exponent": k["exponent"],
                 "n_warnings": len(fits["warnings"])})


def all_left_out(where: str, left_out: list[dict]) -> ResultsError:
    """The one-line error of an analysis whose every run was left out (with the reasons)."""
    counts = Counter(d["reason"] for d in left_out)
    return ResultsError(f"nothing to analyse under {where}: all {len(left_out)} runs were left "
                        "out (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                        + f"); first: {left_out[0]['detail']}")


def add_wandb_arguments(parser) -> None:
    """--wandb and --project, as every analysis script takes them."""
    parser.add_argument("--wandb", dest="wandb_mode", default="offline",
                        choices=("offline", "online", "disabled"),
                        help="how to log the report to W&B (default: offline)")
    parser.add_argument("--project", default="critbatch", help="W&B project (default: critbatch)")


def run_analysis(paths: list[str] | None = None, out: str | None = None,
                 baseline_batch: int | None = None, from_wandb: str | None = None,
                 group: str | None = None, wandb_mode: str = "offline",
                 project: str = "critbatch", runs_root: str = "runs") -> dict:
    """Load, analyse and write the report folder; returns {"out", "result"}.

    Raises ResultsError (one line for the user) only when nothing can be computed: no runs,
    or every run left out.
    """
    t0 = time.perf_counter()
    if from_wandb:
        loaded = load_wandb_runs(from_wandb, group)
        inputs = [f"W&B {from_wandb}" + (f" group {group}" if group else "")]
        out_dir = Path(out) if out else Path(runs_root) / "wandb" / from_wandb.replace(
            "/", "_") / (group or "all") / "report"
    else:
        if paths:
            roots = [Path(p) for p in paths]
            default = default_out(roots)
        else:
            roots, sentence = default_inputs(runs_root)
            default = roots[0] / "report"  # the latest sweep's, not its companion's
            print(sentence, flush=True)
        loaded = load_runs(roots)
        inputs = [str(p) for p in roots]
        out_dir = Path(out) if out else default
    runs, left_out = loaded["runs"], loaded["left_out"]
    where = ", ".join(inputs)
    if not runs and not left_out:
        raise ResultsError(f"no runs found under {where} (no summary.json); pass run "
                           "directories or a sweep folder, or run make sweep-batch")
    result = bcrit.analyse(runs, baseline_batch, left_out=left_out, warnings=loaded["warnings"])
    if not result["groups"]:
        raise all_left_out(where, result["left_out"])
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, out_dir)
    fits = fits_document(result)
    write_json_atomic(out_dir / "fits.json", fits)
    write_csv(result["fits"]["per_run"], out_dir / "bcrit.csv")
    (out_dir / "report.md").write_text(
        report_markdown(result, inputs, plots, time.perf_counter() - t0))
    log_to_wandb(result, out_dir, plots, wandb_mode, project, inputs)
    print_summary(result, out_dir, time.perf_counter() - t0)
    return {"out": out_dir, "result": result}


def print_summary(result: dict, out: Path, elapsed_s: float) -> None:
    fits = result["fits"]
    print(f"{result['n_runs']} runs in {len(result['groups'])} group(s), "
          f"{len(result['left_out'])} left out", flush=True)
    for g in result["groups"]:
        print(f"  {g['name']}: {g['n_runs']} runs, batch sizes {g['batch_sizes']}, "
              f"baseline {g['baseline_batch'] or 'none'}")
    for r in fits["per_run"]:
        interval = fmt_interval(r["b_crit"], r["b_crit_low"], r["b_crit_high"])
        print(f"  {r['group']}: B={r['batch_size']} tokens={r['tokens']:,} "
              f"loss={r['val_loss']:.4f} r={fmt(r['r'], '.3f')} B_crit={interval} seq"
              + (" (extrapolated)" if r["extrapolated"] else ""))
    k = fits["kaplan"]
    if k["exponent"] is not None:
        print(f"  Kaplan: B* = {k['b_star_tokens']:.3g} tokens, 1/alpha_B = "
              f"{fmt_interval(k['exponent'], k['exponent_low'], k['exponent_high'])} "
              f"({k['n_points']} points; Kaplan: 2e8, 4.8)")
    for w in fits["warnings"]:
        print(f"warning: {w}")
    print(f"report: {out / 'report.md'} ({elapsed_s:.1f} s)", flush=True)
