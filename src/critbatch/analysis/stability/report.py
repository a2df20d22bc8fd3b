"""The stability study's report and pipeline: report.md's tables, the plots, stability.json
(science.md section 6) and `run_analysis`.

- `report.md`         the question, the inputs, the rules, per group the lr tuning, the
                      per-batch verdicts and the accumulation check, the warnings;
- `train_loss.png`, `grad_norm.png`, `accumulation.png`, `lr_tuning.png`;
- `stability.json`    the same numbers, machine-readable (`stability_document`).

`run_analysis` (what `analysis/stability.py` calls) loads the runs (`inputs`), judges them
(`stability.analyse`) and writes all of these through `render.run_study`. Units: batch sizes in
sequences, losses in nats/token (stability.json also has them per byte), steps are optimizer
steps.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from critbatch.analysis import plotting, render
from critbatch.analysis.render import fmt_nan, md_table
from critbatch.analysis.stability.inputs import default_inputs, default_out, load_stability_runs
from critbatch.analysis.stability.rules import (
    ACCUM_DEVIATION,
    ACCUM_FIRST_STEPS,
    ACCUM_STAGE,
    BATCH_STAGE,
    LR_STAGE,
    RULES,
    SPIKE_FACTOR,
    THRESHOLDS,
    WHY_UNSTABLE,
)
from critbatch.analysis.stability.stability import analyse
from critbatch.results.runs import is_finite

SCHEMA_VERSION = 1  # of stability.json
GROUP_KEYS = ("name", "scale", "optimizer", "lr_scaling", "base_batch_size", "base_lr",
              "tail_window", "lr_tuning", "per_batch", "accumulation", "warnings")
WANDB_COLUMNS = ("group", "batch_size", "lr", "steps", "status", "val_loss",
                 "val_loss_per_byte", "tail_var_train_loss", "tail_var_grad_norm", "verdict")
MAX_ACCUM_ROWS = 4  # accumulation comparisons drawn
PLOTS = {
    "train_loss": "Train loss versus step per batch size (faint: every step; solid: moving "
                  "average)",
    "grad_norm": "Gradient norm before clipping versus step per batch size (faint: every step; "
                 "solid: moving average)",
    "accumulation": "Gradient accumulation versus the plain batch: train loss and its "
                    "difference",
    "lr_tuning": "Final validation loss versus learning rate at the base batch",
}


# ---------------------------------------------------------------------------------------------
# report.md


def lr_tuning_table(tuning: dict) -> str:
    rows = [[fmt_nan(r["lr"], ".3g") + (" **best**" if r["best"] else ""),
             fmt_nan(r["val_loss"], ".4f"), r["status"], str(r["n_runs"])]
            for r in tuning["rows"]]
    return md_table(["lr", "final val loss (nats/token)", "status", "runs"], rows)


def per_batch_tables(group: dict) -> str:
    rows, why = [], []
    for r in group["per_batch"]:
        lr_ratio = (r["lr"] / group["base_lr"]) if group["base_lr"] else None
        rows.append([str(r["batch_size"]), fmt_nan(r["lr"], ".3g"), fmt_nan(lr_ratio, ".3g"),
                     str(r["steps"]), r["status"],
                     *(fmt_nan(r[k], ".4f") for k in (
                         "first_train_loss", "final_train_loss", "val_loss",
                         "tail_mean_train_loss")),
                     *(fmt_nan(r[k], ".3g") for k in (
                         "tail_var_train_loss", "tail_mean_grad_norm", "tail_var_grad_norm",
                         "max_grad_norm")),
                     fmt_nan(r["grad_norm_spikes"], "d"), f"**{r['verdict']}**"])
        window = (f"{r['tail_first_step']}-{r['tail_last_step']}" if r["tail_steps"]
                  else "-")
        why.append([str(r["batch_size"]), window, fmt_nan(r["grad_norm_cv"], ".3g"),
                    fmt_nan(r["grad_norm_cv_ratio"], ".2f"),
                    fmt_nan(r["grad_norm_cv_excess"], ".2f"),
                    fmt_nan(r["tail_spike_ratio"], ".3g"), fmt_nan(r["loss_noise"], ".3g"),
                    fmt_nan(r["loss_noise_ratio"], ".2f"), r["verdict"],
                    r["verdict_reason"] or ""])
    first = md_table(
        ["batch (seq)", "lr used", "lr / base lr", "steps", "status",
         "first train loss (nats/token)", "final train loss (nats/token)",
         "final val loss (nats/token)", "tail mean train loss (nats/token)",
         "tail var train loss ((nats/token)^2)",
         "tail mean grad norm", "tail var grad norm", "max grad norm",
         f"steps with grad norm > {SPIKE_FACTOR:g}x median", "verdict"], rows)
    second = md_table(
        ["batch (seq)", "tail (steps)", "tail grad-norm CV", "CV / reference",
         "CV / reference x sqrt(B / B_ref)", "tail max / median grad norm",
         "tail loss noise B x Var", "noise / reference", "verdict", "why"], why)
    return first + "\n\nThe statistics behind the verdicts:\n\n" + second


def accumulation_table(entries: list[dict]) -> str:
    rows = []
    for e in entries:
        micro = e["micro_batch_size"] or e["batch_size"]
        rows.append([f"{e['batch_size']} = {e['batch_size'] // micro} x {micro}",
                     fmt_nan(e["lr"], ".3g"), e["plain_stage"] or "-",
                     e["dtype"] or "-", str(e["steps_compared"]),
                     fmt_nan(e["max_abs_diff"], ".3g"), fmt_nan(e["max_rel_diff"], ".3g"),
                     fmt_nan(e["first_steps_max_abs_diff"], ".3g"),
                     fmt_nan(e["first_steps_max_rel_diff"], ".3g"),
                     fmt_nan(e["first_steps_max_rel_diff_grad_norm"], ".3g"),
                     fmt_nan(e["first_step_rel_above"], "d"), fmt_nan(e["delta_val_loss"], "+.3g"),
                     f"**{e['verdict']}**"])
    return md_table(
        ["batch (seq) = micro-batches x micro (seq)", "lr used", "plain run from", "dtype",
         "steps compared", "max abs diff (nats/token)", "max rel diff",
         f"first {ACCUM_FIRST_STEPS} steps: max abs diff (nats/token)",
         f"first {ACCUM_FIRST_STEPS} steps: max rel diff",
         f"first {ACCUM_FIRST_STEPS} steps: max rel diff of grad norm",
         f"first step with rel diff > {ACCUM_DEVIATION:g}", "delta final val loss (nats/token)",
         "verdict"], rows)


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str],
                    elapsed_s: float) -> str:
    lines = [
        "# Small-batch stability report", "",
        "**The question** (science.md section 6). `Var(g_B) = Var(g_1) / B`: how small can the "
        "batch be before training becomes unstable or diverges, with the learning rate tuned "
        "at the base batch and carried to the others by a scaling rule? And does gradient "
        "accumulation (micro-batches summed into one step) reproduce the plain batch to float "
        "precision, as it must? Batch sizes in sequences; losses in nats/token; steps are "
        "optimizer steps; grad norm is the global L2 norm of the gradient before clipping.",
        "",
        render.inputs_line(result, inputs, elapsed_s), "",
        "## Rules", "",
        f"- **Tail window**: {RULES['tail_window']}.",
        f"- **diverged**: {RULES['diverged']}.",
        f"- **unstable**: {RULES['unstable']}.",
        f"- **stable**: {RULES['stable']}.",
        f"- **Accumulation**: {RULES['accumulation']}.", "",
        WHY_UNSTABLE, "",
    ]
    if not result["groups"]:
        lines += ["No group to analyse.", ""]
    for g in result["groups"]:
        tw = g["tail_window"]
        lines += [f"## {g['name']}", "",
                  f"Base batch {g['base_batch_size']} sequences, base lr "
                  f"{fmt_nan(g['base_lr'], '.4g')}, lr_scaling {g['lr_scaling']}. Tail window: "
                  f"the last {tw['steps']} steps (of {tw['planned_steps']} planned).", "",
                  f"### Learning-rate tuning at batch {g['base_batch_size']}", ""]
        if g["lr_tuning"]:
            t = g["lr_tuning"]
            edge = {"low": " (on the low edge of the grid)", "high": " (on the high edge of the "
                    "grid)", "single": " (a one-lr grid)"}.get(t["edge"], "")
            lines += [f"Best lr: {fmt_nan(t['best_lr'], '.3g')}{edge}.", "", lr_tuning_table(t), ""]
        else:
            lines += [f"No {LR_STAGE} runs for this optimizer.", ""]
        lines += ["### Per batch size", ""]
        lines += [per_batch_tables(g) if g["per_batch"] else f"No {BATCH_STAGE} runs.", ""]
        lines += ["### Gradient accumulation versus the plain batch", ""]
        lines += [accumulation_table(g["accumulation"]) if g["accumulation"]
                  else f"No {ACCUM_STAGE} runs.", ""]
        for e in g["accumulation"]:
            lines += [f"- `{e['accum_run_dir']}` against `{e['plain_run_dir'] or 'nothing'}`: "
                      f"**{e['verdict']}**.", ""]
    lines += render.plots_section(plots, PLOTS)
    lines += render.warnings_section(result["warnings"])
    lines += ["", "## Runs left out", "",
              render.left_out_table(result["left_out"]) if result["left_out"] else "None."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over `window` points (over the points so far for the first ones)."""
    if window <= 1:
        return values
    sums = np.convolve(values, np.ones(window), mode="full")[: len(values)]
    return sums / np.minimum(np.arange(1, len(values) + 1), window)


def _batch_colors(groups: list[dict]) -> dict[int, Any]:
    plt = plotting.pyplot()
    batches = sorted({r["batch_size"] for g in groups for r in g["per_batch"]})
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(batches))))
    return dict(zip(batches, colors, strict=False))


def plot_per_batch(groups: list[dict], curves: dict, path: Path, which: int, ylabel: str,
                   title: str, log_y: bool) -> None:
    """Per-step curves (train loss: which=1, grad norm: which=2) per batch size, one panel
    per group: every step faint, a moving average solid, an x where a diverged run ends."""
    fig, axes = plotting.panel_grid(len(groups), title, panel_in=(6.0, 4.2))
    colors = _batch_colors(groups)
    for g, ax in zip(groups, axes, strict=False):
        tops, finite = [], []
        for r in g["per_batch"]:
            steps, values = curves[r["run_dir"]][0], curves[r["run_dir"]][which]
            if not len(steps):
                continue
            values = np.where(np.isfinite(values), values, np.nan)
            color = colors[r["batch_size"]]
            smooth = max(1, min(10, len(values) // 10))
            label = f"B={r['batch_size']}" + (f" ({r['verdict']})" if r["verdict"] != "stable"
                                              else "")
            ax.plot(steps, values, color=color, alpha=0.25, lw=0.6)
            ax.plot(steps, moving_average(values, smooth), color=color, lw=1.4, label=label)
            if r["verdict"] == "diverged" and np.isfinite(values).any():
                last = np.nonzero(np.isfinite(values))[0][-1]
                ax.plot([steps[last]], [values[last]], "x", color=color, ms=8)
            if which == 1 and np.isfinite(values[0]):
                tops.append(values[0])
            finite += list(values[np.isfinite(values)])
        if not g["per_batch"]:
            plotting.empty_axes(ax, f"no {BATCH_STAGE} runs")
        if tops and max(finite) > 1.5 * max(tops):  # a diverging loss must not squash the
            ax.set_ylim(top=1.5 * max(tops))            # others: stop the axis at 1.5 x start
        plotting.log_axes(ax, x=True, y=log_y)
        plotting.label_axes(ax, "optimizer step (steps)", ylabel, g["name"], legend=bool(finite))
    plotting.save_figure(fig, path)


def plot_accumulation(result: dict, path: Path) -> None:
    """Per comparison: the two train-loss curves (left) and |difference| per step on a log
    axis with the tolerance ACCUM_TOLERANCE x |plain loss| (right)."""
    plt = plotting.pyplot()
    entries = [(g, e) for g in result["groups"] for e in g["accumulation"]
               if e["plain_run_dir"]][:MAX_ACCUM_ROWS]
    n = max(1, len(entries))
    width_in = 11 + 2 * plotting.LEGEND_IN
    fig, axes = plt.subplots(n, 2, figsize=(width_in, 3.8 * n), squeeze=False)
    fig.subplots_adjust(left=0.08, right=1 - (plotting.LEGEND_IN + 0.1) / width_in,
                        bottom=0.5 / (3.8 * n), top=1 - 0.6 / (3.8 * n),
                        wspace=0.28 + plotting.LEGEND_IN / 4.6, hspace=0.5)
    fig.suptitle(PLOTS["accumulation"], fontsize=9)
    if not entries:
        axes[0, 1].set_visible(False)
        plotting.empty_axes(axes[0, 0], "no accumulation run with a plain run to compare")
        axes[0, 0].set_axis_off()
    for (g, e), (left, right) in zip(entries, axes, strict=False):
        s_p, loss_p, _ = result["curves"][e["plain_run_dir"]]
        s_a, loss_a, _ = result["curves"][e["accum_run_dir"]]
        left.plot(s_p, loss_p, "-", color="C0", lw=1.2, label=f"plain {e['batch_size']}")
        left.plot(s_a, loss_a, "--", color="C1", lw=1.2,
                  label=f"{e['batch_size'] // (e['micro_batch_size'] or 1)} x "
                        f"{e['micro_batch_size']} accumulated")
        plotting.log_axes(left)
        plotting.label_axes(left, "optimizer step (steps)", "train loss (nats/token)",
                            f"{g['name']}: {e['verdict']}")
        diff = np.where(e["abs_diff"] > 0, e["abs_diff"], np.nan)
        if np.isfinite(diff).any():
            right.plot(e["steps"], diff, ".-", color="C3", lw=0.8, ms=3,
                       label="|accumulated - plain|")
            plain_at = dict(zip(s_p, loss_p, strict=False))
            tol = [e["tolerance"] * abs(plain_at.get(s, np.nan)) for s in e["steps"]]
            right.plot(e["steps"], tol, ":", color="k", lw=1,
                       label=f"{e['tolerance']:g} x plain loss (tolerance)")
            plotting.log_axes(right, x=True, y=True)
        else:
            plotting.empty_axes(right, "identical at every step compared (|difference| = 0)")
            plotting.log_axes(right)
        plotting.label_axes(right, "optimizer step (steps)",
                            "|train loss difference| (nats/token)",
                            f"difference over {e['steps_compared']} steps",
                            legend=bool(np.isfinite(diff).any()))
    plotting.save_figure(fig, path)


def plot_lr_tuning(result: dict, path: Path) -> None:
    """Final validation loss against lr at the base batch, one line per lr grid; a star at
    the best lr, an x (at the top of the axis) for an lr whose runs all diverged."""
    plt = plotting.pyplot()
    width_in = 6.5 + plotting.LEGEND_IN
    fig, ax = plt.subplots(figsize=(width_in, 4.6))
    fig.subplots_adjust(left=0.1, right=1 - (plotting.LEGEND_IN + 0.15) / width_in, bottom=0.12,
                        top=0.92)
    seen, drawn = set(), 0
    several_scales = len({g["scale"] for g in result["groups"]}) > 1
    for g in result["groups"]:
        t = g["lr_tuning"]
        if not t or id(t) in seen:
            continue
        seen.add(id(t))
        color = f"C{drawn}"
        drawn += 1
        ok = [r for r in t["rows"] if is_finite(r["val_loss"])]
        label = g["optimizer"] + (f" ({g['scale']})" if several_scales else "")
        ax.plot([r["lr"] for r in ok], [r["val_loss"] for r in ok], "o-", color=color,
                label=f"{label}, batch {g['base_batch_size']}")
        if t["best_lr"] is not None:
            ax.plot([t["best_lr"]], [t["best_val_loss"]], "*", color=color, ms=13)
        bad = [r["lr"] for r in t["rows"] if not is_finite(r["val_loss"])]
        if bad and ok:
            top = max(r["val_loss"] for r in ok)
            ax.plot(bad, [top] * len(bad), "x", color=color, ms=9, label=f"{label}: diverged")
    if not drawn:
        plotting.empty_axes(ax, f"no {LR_STAGE} runs")
    plotting.log_axes(ax)
    plotting.label_axes(ax, "peak learning rate at the base batch (batch in sequences: see "
                        "legend)", "final validation loss (nats/token)",
                        PLOTS["lr_tuning"] + " (star: best)", legend=bool(drawn))
    plotting.save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    """Every plot of PLOTS as `<name>.png` in `out`; returns {name: file name}."""
    groups = plotting.shown_groups(result["groups"], result["warnings"])
    plot_per_batch(groups, result["curves"], out / "train_loss.png", 1,
                   "train loss (nats/token)", PLOTS["train_loss"], log_y=False)
    plot_per_batch(groups, result["curves"], out / "grad_norm.png", 2,
                   "gradient L2 norm before clipping", PLOTS["grad_norm"],
                   log_y=True)
    plot_accumulation(result, out / "accumulation.png")
    plot_lr_tuning(result, out / "lr_tuning.png")
    return {name: f"{name}.png" for name in PLOTS}


def summary_lines(result: dict) -> list[str]:
    """Per group: the tuned lr, each batch size's verdict, each accumulation check."""
    lines = []
    for g in result["groups"]:
        t = g["lr_tuning"]
        tuned = (f"best lr {fmt_nan(t['best_lr'], '.3g')}" + (
            f" ({t['edge']} edge)" if t["edge"] in ("low", "high") else "")) if t else "no lr grid"
        lines.append(f"  {g['name']}: {tuned} at batch {g['base_batch_size']}; tail window "
                     f"{g['tail_window']['steps']} steps")
        for r in g["per_batch"]:
            lines.append(f"    B={r['batch_size']:<4} lr={fmt_nan(r['lr'], '.3g'):<9} "
                         f"val_loss={fmt_nan(r['val_loss'], '.4f'):<7} {r['verdict']}"
                         + (f" ({r['verdict_reason']})" if r["verdict_reason"] else ""))
        for e in g["accumulation"]:
            lines.append(f"    accumulation {e['batch_size']} as micro-batches of "
                         f"{e['micro_batch_size']}: {e['verdict']} (first {ACCUM_FIRST_STEPS} "
                         "steps: max rel diff "
                         f"{fmt_nan(e['first_steps_max_rel_diff'], '.2g')})")
    return lines


# ---------------------------------------------------------------------------------------------
# stability.json and the pipeline


def stability_document(result: dict, inputs: list[str]) -> dict:
    """The public stability.json (`render.run_study` makes it strict JSON: NaN and inf become
    null).

    {schema_version, inputs: [path], n_runs, rules: {tail_window, diverged, unstable, stable,
     accumulation: sentence}, thresholds: {tail_steps, unstable_ratio, unstable_cv_floor,
     tail_spike_ratio, spike_factor, accum_first_steps, accum_tolerance, accum_deviation},
     groups: [{name, scale, optimizer, lr_scaling, base_batch_size, base_lr,
               tail_window: {steps, planned_steps, rule},
               lr_tuning: null | {optimizer, batch_sizes, best_lr, best_val_loss,
                                  edge: null|"low"|"high"|"single",
                                  rows: [{lr, val_loss, val_loss_per_byte, status, n_runs,
                                          run_dirs, best}]},
               per_batch: [{run_dir, stage, seed, batch_size, micro_batch_size, lr, base_lr,
                            lr_scaling, steps, status, status_reason, diverged_step, val_loss,
                            val_loss_per_byte, n_steps_logged, first_train_loss,
                            final_train_loss, first_nonfinite_step, max_grad_norm, tail_steps,
                            tail_first_step, tail_last_step, tail_mean_train_loss,
                            tail_var_train_loss, tail_mean_grad_norm, tail_var_grad_norm,
                            grad_norm_cv, tail_spike_ratio, grad_norm_spikes, loss_noise,
                            grad_norm_cv_ratio, grad_norm_cv_excess, loss_noise_ratio,
                            verdict: "stable"|"unstable"|"diverged", verdict_reason}],
               accumulation: [{accum_run_dir, plain_run_dir, plain_stage, optimizer, lr,
                               lr_scaling, batch_size, micro_batch_size, dtype, status_accum,
                               status_plain, first_steps, tolerance, deviation_threshold,
                               steps_compared, max_abs_diff, max_rel_diff,
                               first_steps_max_abs_diff, first_steps_max_rel_diff,
                               first_steps_max_rel_diff_grad_norm, first_step_rel_above,
                               delta_val_loss, delta_val_loss_per_byte, verdict}],
               warnings: [sentence]}],
     warnings: [sentence, every group's prefixed by its name],
     left_out: [{run_dir, reason: "corrupt"|"incomplete"|"other sweep", detail}]}

    Losses in nats/token (`_per_byte`: nats/byte), batch sizes in sequences, steps in optimizer
    steps; relative differences are |accum - plain| / |plain|.
    """
    plot_only = ("steps", "abs_diff", "rel_diff")
    groups = []
    for g in result["groups"]:
        doc = {k: g[k] for k in GROUP_KEYS}
        doc["accumulation"] = [{k: v for k, v in e.items() if k not in plot_only}
                               for e in g["accumulation"]]
        if doc["lr_tuning"]:
            doc["lr_tuning"] = {k: v for k, v in doc["lr_tuning"].items() if k != "warnings"}
        groups.append(doc)
    return {
        "schema_version": SCHEMA_VERSION, "inputs": inputs, "n_runs": result["n_runs"],
        "rules": RULES, "thresholds": THRESHOLDS, "groups": groups,
        "warnings": result["warnings"], "left_out": result["left_out"],
    }


def wandb_fields(result: dict, loaded: dict) -> dict:
    """The analysis run's group (that of the first run read) and its per-batch table."""
    first = loaded["runs"][0]
    rows = [[g["name"], *(r.get(c) for c in WANDB_COLUMNS[1:])]
            for g in result["groups"] for r in g["per_batch"]]
    return {"group": render.logged_group(first["run_dir"], first["sweep"]),
            "tables": {"per_batch": (WANDB_COLUMNS, rows)}}


STUDY = render.Study(
    name="stability", document_file="stability.json",
    no_runs_fix="stability sweep folders, or run the stability sweep first",
    analyse=analyse, write_plots=write_plots, document=stability_document,
    markdown=report_markdown, wandb=wandb_fields,
    summary_lines=summary_lines)


def run_analysis(paths: list[str] | None = None, out: str | None = None,
                 runs_root: str | Path = "runs", wandb_mode: str = "offline",
                 project: str = "critbatch") -> dict:
    """Load, analyse and write the report folder; returns {"out", "result", "document"}.

    Raises ResultsError (one line for the user) when nothing can be analysed: a missing path,
    no runs, or every run left out.
    """
    if paths:
        roots = [Path(p) for p in paths]
        default = default_out(roots)
    else:
        roots, default, sentence = default_inputs(runs_root)
        print(sentence, flush=True)
    return render.run_study(STUDY, partial(load_stability_runs, roots), [str(p) for p in roots],
                            Path(out) if out else default, wandb_mode=wandb_mode,
                            project=project)

