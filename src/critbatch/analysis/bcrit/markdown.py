"""The B_crit report's report.md (`report_markdown`): the summary and the joint model's verdict
first, then the question, the groups and one section per measurement, each with its table (in
the form of science.md sections 3 and 8), the plots and every warning.

`report` writes it, with fits.json, bcrit.csv and the plots, through `render.run_study`.
Batch sizes in sequences unless marked tokens; losses in nats/token unless marked nats/byte.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from critbatch.analysis import render
from critbatch.analysis.bcrit import best_lr
from critbatch.analysis.bcrit.plots import PLOTS
from critbatch.analysis.joint import report as joint_report
from critbatch.analysis.recommend import summary
from critbatch.analysis.render import fmt, fmt_interval, md_table
from critbatch.science.laws import KAPLAN_B_STAR_TOKENS, KAPLAN_EXPONENT, MIN_BOOTSTRAP_UNITS
from critbatch.science.rules import lr_multiplier

ONLINE_TABLE_ROWS = 10  # eval points per run shown in report.md (fits.json has all)


def loss_tables(groups: list[dict]) -> list[str]:
    """Loss (nats/token) per batch size x optimizer at the best lr, and its difference from
    the baseline batch's at the same budget.

    One table per model (groups that differ only in optimizer), as in science.md section 3.
    """
    by_model: dict[tuple, list[dict]] = defaultdict(list)
    for g in groups:
        if g["cells"]:  # steps-to-target rows alone have no loss
            by_model[tuple(v for k, v in g["key"].items() if k != "optimizer")].append(g)
    out = []
    for model, gs in by_model.items():
        opts = [g["key"]["optimizer"] for g in gs]
        rows_keys = sorted({(c.batch_size, c.tokens) for g in gs for c in g["cells"]})
        header = ["batch (seq)", "tokens"]
        for o in opts:
            header += [f"{o} loss (nats/token)", f"{o} minus baseline batch (nats/token)",
                       f"{o} best lr trained"]
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
                delta = (cell.loss - base.loss) if base else None
                flag = {"low": " (low edge)", "high": " (high edge)", "single": " (one lr)"}
                row += [fmt(cell.loss, ".4f"),
                        "(the baseline batch)" if base is cell else fmt(delta, "+.4f"),
                        fmt(cell.lr, ".3g") + base_lr_text(cell, g.get("lr_rule"))
                        + flag.get(cell.edge, "")]
            rows.append(row)
        data, vocab, seq_len, width, depth, label, params = model
        size = f", {params:.3g} params" if params is not None and width is None else ""
        title = (f"{label}{size}, seq_len {seq_len}" if label is not None else
                 f"{data}, vocabulary {vocab}, seq_len {seq_len}, width {width}, depth {depth}")
        out.append(f"**{title}** (baseline batch: " + ", ".join(
                       f"{g['key']['optimizer']} {g['baseline_batch'] or 'none'}" for g in gs)
                   + ")\n\n" + md_table(header, rows))
    return out


def base_lr_text(cell: best_lr.Cell, rule: tuple[str, int] | None) -> str:
    """' (optim.lr 0.0016)': the base lr a cell's trained lr came from by its group's rule
    (`rule`: optim.lr_scaling and optim.base_batch_size), '' where the two are equal."""
    if rule is None or rule[0] in (None, "none") or not rule[1] or cell.batch_size == rule[1]:
        return ""
    return f" (optim.lr {cell.lr / lr_multiplier(rule[0], cell.batch_size, rule[1]):.3g})"


QUESTION = (
    "**The question.** How large can the batch be before it costs efficiency? To reach a "
    "loss, training takes S steps and E = B x S examples; McCandlish et al. (2018): "
    "S/S_min - 1 = B_crit/B and E/E_min - 1 = B/B_crit. This report measures B_crit three "
    "ways (tokens-equivalent per run, Pareto frontier, gradient noise scale) and fits "
    "Kaplan et al.'s (2020) B_crit(L) = B*/L^(1/alpha_B). Batch sizes in sequences unless "
    "marked tokens; losses in nats/token unless marked nats/byte; each interval says what it "
    "is (its level, and whether it comes from seeds, a bootstrap or a fit).")


def sweep_label(g: dict) -> str:
    """The sweep stage a group's runs came from; when they came from several, every stage
    with its count of runs (never the majority's name alone)."""
    counts = g.get("sweeps")
    if not counts:
        return str(g["sweep"])
    if len(counts) == 1:
        return str(next(iter(counts)))
    return "mixed: " + ", ".join(f"{name} ({n} runs)" for name, n in counts.most_common())


def groups_table(groups: list[dict]) -> str:
    def runs(g: dict) -> str:
        n = g.get("n_target_rows")
        return str(g["n_runs"]) + (f" (+ {n} steps-to-target rows)" if n else "")

    return md_table(
        ["group", "sweep", "runs", "batch sizes (seq)", "budgets (tokens)", "baseline batch"],
        [[g["name"], sweep_label(g), runs(g), ", ".join(map(str, g["batch_sizes"])),
          ", ".join(f"{t:,}" for t in g["budgets"]), str(g["baseline_batch"] or "none")]
         for g in groups])


def by_optimizer(rows: list[dict], table, empty: str) -> str:
    """`table(rows of one optimizer)` under a `### <optimizer>` heading per optimizer; `empty`
    when there are no rows."""
    optimizers = sorted({r["optimizer"] for r in rows})
    if not optimizers:
        return empty
    return "\n\n".join(f"### {opt}\n\n" + table([r for r in rows if r["optimizer"] == opt])
                       for opt in optimizers)


def extrapolated_cell(row: dict) -> str:
    """A per-run row's `extrapolated` table cell: blank, or yes with the log-linear form's
    B_crit beside the power law's (in the B_crit column)."""
    if not row["extrapolated"]:
        return ""
    other = row.get("b_crit_log_linear")
    return "yes" + (f" (log-linear: {fmt(other, '.3g')})" if other is not None else "")


def per_run_table(per_run: list[dict]) -> str:
    """Every (batch, budget) cell beside the baseline batch against the baseline curve."""
    rows = []
    for r in per_run:
        ratio = (r["effective_tokens"] / r["tokens"]) if r["effective_tokens"] else None
        rows.append([r["group"], str(r["batch_size"]), f"{r['tokens']:,}",
                     fmt(r["val_loss"], ".4f"), fmt(r["effective_tokens"], ",.0f"),
                     fmt(ratio, ".3f"), fmt(r["r"], ".3f"),
                     fmt_interval(r["b_crit"], r["b_crit_low"], r["b_crit_high"]),
                     fmt(r["b_crit_tokens"], ".3g"), fmt(r["b_crit_naive"], ".3g"),
                     extrapolated_cell(r), r["note"] or ""])
    if not rows:
        return "No per-run B_crit (see the warnings)."
    sources = sorted({r["interval"] for r in per_run if r.get("interval")})
    legend = ("\n\nInterval: " + "; ".join(sources) + ".") if sources else (
        "\n\nNo interval: the loss uncertainty is unknown (one seed and no lr refinement).")
    return md_table(["group", "B (seq)", "E (tokens)", "loss (nats/token)", "E_eff (tokens)",
                     "E_eff/E", "r", "B_crit (seq) [interval]", "B_crit (tokens)",
                     "naive B/(r-1) (seq)", "extrapolated", "note"], rows) + legend


def noise_table(noise: list[dict]) -> str:
    """The noise program's measurements (noise.json); the runs' end-of-run online values only
    when there is none (the online values have their own section and fits.json `online_noise`)."""
    if not noise:
        return "No B_noise measurement (noise.json or online tracking) in these runs."
    measured = [p for p in noise if p["kind"] == "b_noise"]
    online = len(noise) - len(measured)
    note = (f"\n\n{online} more: the online tracker's value at the end of each run (fits.json "
            "`noise`, kind `b_noise_online`); B_noise along training is the online series "
            "below.") if measured and online else ""
    noise = measured or noise
    return md_table(
        ["run", "source", "loss (nats/token)", "tr(Sigma)", "abs(G)^2",
         "B_noise (seq) [interval]", "B_noise (tokens)", "K x b", "interval",
         "loss (nats/byte: the unit of science.md's reference table)"],
        [[p["run_dir"], p["kind"], fmt(p["loss"], ".4f"),
          fmt(p.get("trace"), ".3g"), fmt(p.get("g2"), ".3g"),
          fmt_interval(p["b_noise"], p["b_noise_low"], p["b_noise_high"]),
          fmt(p["b_noise_tokens"], ".3g"),
          f"{p['micro_batches']} x {p['micro_batch_size']}" if "micro_batches" in p else "-",
          p.get("interval", "-"), fmt(p["loss_per_byte"], ".4f")]
         for p in noise]) + note


def short_interval(n_batch_sizes: int, low) -> str:
    """A Pareto interval's table cell; its full label (`pareto.pareto_interval_label`) is in
    the legend under the table."""
    if n_batch_sizes <= 2:
        return "none (exact fit)"
    return f"95% fit ({n_batch_sizes - 2} dof)" if low is not None else "none (no covariance)"


def interval_legend(labels) -> str:
    """'Interval: ...' under a table, one sentence per distinct label."""
    labels = sorted({x for x in labels if x})
    return ("\n\nInterval: " + "; ".join(labels) + ".") if labels else ""


def pareto_table(pareto: list[dict]) -> str:
    """Pareto rows (one optimizer, or several told apart by their group)."""
    if not pareto:
        return "No Pareto frontier (see the warnings)."
    return md_table(
        ["group", "target loss (nats/token)", "batch sizes used (seq)", "S_min (steps)",
         "E_min (seq)", "E_min (tokens)", "B_crit (seq) [interval]", "B_crit (tokens)",
         "interval", "in Kaplan's law"],
        [[p["group"], fmt(p["target_loss"], ".4f"), ", ".join(map(str, p["batch_sizes"])),
          fmt(p["s_min"], ".4g"), fmt(p["e_min"], ".4g"), fmt(p["e_min_tokens"], ".4g"),
          fmt_interval(p["b_crit"], p["b_crit_low"], p["b_crit_high"]),
          fmt(p["b_crit_tokens"], ".3g"), short_interval(p["n_batch_sizes"], p["b_crit_low"]),
          f"no: {p['degenerate']}" if p.get("degenerate") else "yes"] for p in pareto]
    ) + interval_legend(p.get("interval") for p in pareto)


def consistency_table(rows: list[dict]) -> str:
    """Per-run against Pareto B_crit at each Pareto target loss (`analysis.consistency`)."""
    if not rows:
        return "No Pareto frontier to compare with (see the warnings)."
    return md_table(
        ["optimizer", "group", "target loss (nats/token)", "Pareto B_crit (seq) [interval]",
         "Pareto interval", "per-run B_crit (seq)", "per-run min-max over batch sizes (seq)",
         "per-run batch sizes (seq)", "ratio per-run/Pareto", "per-run inside the interval"],
        [[r["optimizer"], r["group"], fmt(r["target_loss"], ".4f"),
          fmt_interval(r["pareto_b_crit"], r["pareto_b_crit_low"], r["pareto_b_crit_high"]),
          short_interval(len(r["pareto_batch_sizes"]), r["pareto_b_crit_low"])
          + (" (degenerate)" if r["pareto_degenerate"] else ""),
          fmt(r["per_run_b_crit"], ".3g"),
          f"{fmt(r['per_run_b_crit_min'], '.3g')}-{fmt(r['per_run_b_crit_max'], '.3g')}"
          if r["per_run_b_crit"] else "-",
          ", ".join(map(str, r["per_run_batch_sizes"])) or "none",
          fmt(r["ratio"], ".3f"),
          {True: "yes", False: "no", None: "-"}[r["within_pareto_interval"]]]
         for r in rows]) + interval_legend(r["pareto_interval"] for r in rows)


def thinned(rows: list[dict], keep: int) -> list[dict]:
    """At most `keep` of `rows`, evenly spaced, the first and last included."""
    if len(rows) <= keep:
        return rows
    return [rows[i] for i in sorted({round(j) for j in np.linspace(0, len(rows) - 1, keep)})]


def noise_ratio_section(ratios: dict) -> list[str]:
    """B_crit(L) / B_noise(L) per optimizer, and B_noise across widths (`noise_ratio`)."""
    rows, widths = [], []
    for opt, r in ratios.items():
        if r["ratio"] is None:
            rows.append([opt, "-", "-", "-", "-", r["left_out"]])
        else:
            slope = fmt_interval(r["slope"], r["slope_low"], r["slope_high"], ".2f")
            rows.append([opt, fmt_interval(r["ratio"], r["low"], r["high"], ".3g"),
                         f"{r['losses'][0]:.3f}-{r['losses'][1]:.3f}",
                         f"{slope} ({'drifts' if r['drifts'] else 'no drift shown'})",
                         {True: "yes", False: "no", None: "cannot tell"}[r["same_order"]],
                         f"{r['n_readings']} readings ({', '.join(r['sources'])}) of "
                         f"{r['n_runs']} runs; {r['interval']}"])
        w = r.get("widths")
        if w and w.get("common_loss"):
            widths.append([opt, f"{w['common_loss']:.3f}", "; ".join(
                f"width {x['width']}: {fmt_interval(x['b_noise_at'], x['low'], x['high'], '.3g')}"
                for x in w["widths"]), "yes" if w["one_curve"] else "no"])
    lines = ["## B_crit against B_noise", "",
             "B_crit(L) of the joint model over the online B_noise read at the peak lr "
             "(summary.json `noise_readings`: no decaying lr moves them; for runs that "
             "predate them, their eval points in the constant-lr phase, `curve`), at the readings "
             "within the losses the model was fitted on: the geometric mean ratio with its "
             "95% bootstrap over runs and the law's refits, and the slope d ln ratio / d ln L "
             "(0: the ratio does not drift). McCandlish et al. (2018) expect the same order "
             "(within x10).", "",
             md_table(["optimizer", "B_crit / B_noise [95%]", "losses (nats/token)",
                       "slope [95%]", "same order?", "from"], rows) if rows
             else "No run read the tracker at its peak lr.", ""]
    if widths:
        lines += ["B_noise at one loss across widths (a power law in L per width, 95% over "
                  "its runs; one curve: no pair of widths differs, Bonferroni):", "",
                  md_table(["optimizer", "loss (nats/token)", "B_noise (sequences) [95%]",
                            "one curve?"], widths), ""]
    held = [[opt, str(h["width"]), ", ".join(map(str, h["ratio_from"])),
             fmt_interval(h["predicted"], h["low"], h["high"], ".3g"),
             f"{h['measured']:.3g} ({h['measured_from']})", "yes" if h["within"] else "no"]
            for opt, r in ratios.items() for h in (r.get("widths") or {}).get("held_out", [])]
    if held:
        lines += ["Each width held out: the ratio calibrated on the others times its own "
                  "B_noise predicts its B_crit at that loss (95%), against the joint model's:",
                  "", md_table(["optimizer", "width", "ratio from widths",
                                "predicted B_crit (sequences) [95%]", "measured", "within?"],
                               held), ""]
    return lines


def online_noise_table(rows: list[dict]) -> str:
    """The online B_noise(L) series, at most ONLINE_TABLE_ROWS eval points per run."""
    if not rows:
        return ("No online B_noise series: no eval point of the baseline's main runs carries "
                "a `b_noise` (online tracking needs two micro-batches or more a step: "
                "train.micro_batches >= 2, with train.gns.enabled).")
    runs = list(dict.fromkeys(r["run_dir"] for r in rows))
    shown = [p for run in runs for p in thinned([r for r in rows if r["run_dir"] == run],
                                                 ONLINE_TABLE_ROWS)]
    note = "" if len(shown) == len(rows) else (
        f"\n\n{len(shown)} of {len(rows)} eval points shown (evenly spaced per run); "
        "fits.json `online_noise` holds them all.")
    return md_table(
        ["optimizer", "group", "run", "seed", "step", "tokens", "loss (nats/token)",
         "B_noise (seq)", "B_noise (tokens)"],
        [[r["optimizer"], r["group"], r["run_dir"], str(r["seed"]), str(r["step"]),
          f"{r['tokens']:,}", fmt(r["val_loss"], ".4f"), fmt(r["b_noise"], ".4g"),
          fmt(r["b_noise_tokens"], ".4g")] for r in shown]) + note


def exponent_text(row: dict) -> str:
    """1/alpha_B with its interval, or with the range of per-unit fits (which need not hold the
    pooled value) where there were too few units for an interval."""
    if row["exponent_low"] is not None and row["interval"].startswith("range of"):
        return (f"{fmt(row['exponent'], '.3g')} (per-unit fits {fmt(row['exponent_low'], '.3g')}"
                f" to {fmt(row['exponent_high'], '.3g')})")
    return fmt_interval(row["exponent"], row["exponent_low"], row["exponent_high"])


def kaplan_tables(rows: list[dict], points: list[dict]) -> list[str]:
    """One row per optimizer and method against Kaplan et al.'s numbers (the rows whose
    interval covers on planted worlds; the others named below it, with why), then each
    point."""
    table = [[r["optimizer"], r["method"],
              fmt_interval(r["b_star_tokens"], r["b_star_tokens_low"], r["b_star_tokens_high"]),
              exponent_text(r),
              str(r["n_points"]), r["interval"] + ("" if r["weighted"] else "; unweighted")]
             for r in rows if r.get("shown", True)]
    table.append(["Kaplan et al. 2020", "-", f"{KAPLAN_B_STAR_TOKENS:.0e}",
                  f"{KAPLAN_EXPONENT:g}", "-", "GPT-2 tokenizer on WebText2"])
    lines = [md_table(["optimizer", "method", "B* (tokens) [interval]",
                       "1/alpha_B [interval]", "points", "interval"], table)]
    hidden = [r for r in rows if not r.get("shown", True)]
    if hidden:
        lines += ["", "Left out of the table (in fits.json with `shown: false`), as no "
                  "measurement of the exponent:", ""]
        lines += [f"- {r['optimizer']} {r['method']}: 1/alpha_B {fmt(r['exponent'], '.2f')}; "
                  f"{r['left_out']}" for r in hidden]
    points = [p for p in points if p["method"] != "online_noise"]  # a section of their own
    if points:
        lines += ["", "Each point against its fit and Kaplan's law (the online B_noise series "
                  "is listed in its own section):", ""]
        lines.append(md_table(
            ["optimizer", "method", "loss (nats/token)", "B_crit measured (tokens)",
             "its fit (tokens)", "Kaplan (tokens)", "run"],
            [[p["optimizer"], p.get("kind") or p["method"], fmt(p["loss"], ".4f"),
              fmt(p["b_crit_tokens"], ".3g"), fmt(p["fit_tokens"], ".3g"),
              fmt(p["kaplan_tokens"], ".3g"), p["run_dir"] or "-"] for p in points]))
    return lines


def lr_scaling_table(lr_scaling: dict) -> str:
    if not lr_scaling:
        return "No lr-scaling fit (see the warnings)."
    return md_table(
        ["optimizer", "exponent k [95%]", "batch sizes", "group"],
        [[opt, fmt_interval(f["exponent"], f["exponent_low"], f["exponent_high"]),
          ", ".join(f"{b:g}" for b in f["batch_sizes"]), f["group"]]
         for opt, f in lr_scaling.items()])


def lr_search_lines(edge_cells: dict[str, int], searches: dict[str, dict]) -> list[str]:
    """The cells on an lr edge per optimizer, and what each lr search added and spent."""
    if not edge_cells:
        return []
    lines = ["Cells whose best lr is the lowest or highest lr tried (an upper bound on their "
             "loss, not a measurement; fits.json `lr_edge_cells`): "
             + ", ".join(f"{opt} {n}" for opt, n in edge_cells.items()) + "."]
    for name, record in searches.items():
        grid, spent = record["grid_tokens"], record["search_tokens"]
        rounds = sum(1 for r in record["rounds"] if r["added"])
        left = record.get("unbracketed") or []
        lines.append(
            f"- lr search (`grid.lr_search`) of {name}: {record['search_runs']} lr(s) added in "
            f"{rounds} round(s), {spent / 1e6:,.1f}M tokens beyond the grid's "
            f"{grid / 1e6:,.1f}M ({spent / grid:.0%} more; the search's tokens); "
            + (f"{len(left)} cell(s) left on an edge: {'; '.join(left[:4])}"
               + (" ..." if len(left) > 4 else "") if left else "every cell bracketed"))
    return [*lines, ""]


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str],
                    elapsed_s: float) -> str:
    fits = result["fits"]
    lines = ["# Critical batch size report", "", *summary.markdown(fits["summary"]),
             "The measured B_crit(L) law per optimizer (the joint model below):", "",
             *joint_report.headline(fits["joint"]), "", QUESTION, "",
             render.inputs_line(result, inputs, elapsed_s), "",
             "## Groups", "",
             "Runs are compared only within a group (same data, vocabulary, seq_len, width, "
             "depth and optimizer).", "",
             groups_table(result["groups"])]
    if result["left_out"]:
        lines += ["", "### Runs left out", "", render.left_out_table(result["left_out"])]
    lines += ["", "## Loss at the best learning rate", "",
              "Final validation loss at the best lr of each cell (grid minimum refined by a "
              "parabola in log lr), and its difference from the baseline batch at the same "
              "budget. The lr is the peak lr trained; where `optim.lr_scaling` carried it to "
              "the batch, the base lr it came from (`optim.lr` at `optim.base_batch_size`, "
              "the value in the run folders' names) is in brackets.", "",
              *lr_search_lines(fits.get("lr_edge_cells") or {}, fits.get("lr_search") or {}),
              "\n\n".join(loss_tables(result["groups"])) or "No runs (see the Pareto frontier).",
              "",
              "## Effective tokens and B_crit per run", "",
              "Every (batch, budget) cell beside the baseline batch's (a cooldown branch is a "
              "cell of its own budget). E_eff: baseline tokens that reach the run's loss (PCHIP "
              "in log tokens over the baseline's cells at all its budgets; extrapolated with "
              "L = L_inf + A E^-alpha where marked, and there also with L = a + b ln E through "
              "the baseline's end point, slope from its three end points: the B_crit of that "
              "second form is shown beside the mark, and the interval spans both forms' "
              "intervals, so an extrapolated B_crit never carries a seed-only interval). "
              "r = E/E_eff; B_crit = (B - b r)/(r - 1); "
              "the naive B/(r - 1) ignores the baseline's own batch. A cell whose run trained "
              f"fewer than {best_lr.MIN_STEPS_PER_WARMUP} x its warmup steps measures the "
              "warmup, not the batch: its note says so and it is left out of Kaplan's law and "
              "the Pareto fits.", "",
              by_optimizer(fits["per_run"], per_run_table,
                           "No per-run B_crit (see the warnings)."),
              "", "## B_noise measured", "",
              noise_table([p for p in result["noise"] if "loss" in p]),
              "", "## Pareto frontier", "",
              "Per target loss: steps S(B) = E(B)/(B seq_len) each batch size needs, E(B) read "
              "off its loss-versus-tokens curve at the best lr (its cells at every budget but "
              "those of too few steps for their warmup, interpolated, never extrapolated). "
              "All targets of a group use one set of batch sizes: the most whose curves all "
              "reach a common range of losses (then the widest range), with the targets "
              "spread over that range, so B_crit(L) does not jump where a set would change "
              "(a set of two is an exact fit, no interval; a fit on three has one degree of "
              "freedom; batch sizes left out are named in the warnings). Weighted "
              "least-squares fit of S = S_min + E_min/B (weights 1/S: relative errors); "
              "B_crit = E_min/S_min.",
              "", by_optimizer(fits["pareto"], pareto_table,
                               "No Pareto frontier (see the warnings)."),
              "", "## Per-run against Pareto B_crit", "",
              "At each Pareto target loss: the per-run B_crit there (per batch size, log "
              "B_crit interpolated linearly in loss between the two cells of adjacent budgets "
              "whose losses bracket the target; then a mean of log B_crit over batch sizes "
              "weighted by their intervals) against the Pareto B_crit. Both measure B_crit, so "
              "the ratio should be near 1. The per-run values share one baseline curve: their "
              "min-max spread is shown, not an interval.", "",
              consistency_table(fits["consistency"]),
              "", "## Online B_noise along training", "",
              "The online tracker's B_noise (EMA of the two-batch estimator over micro-batches) "
              "at each eval point, against that eval's validation loss: the baseline batch's "
              "main runs (not cooldown branches) at the best lr of its largest budget, every "
              "seed. Fitted as its own Kaplan method (online_noise), apart from the B_crit "
              "estimates and from the measurements of noise.json.", "",
              online_noise_table(fits["online_noise"]),
              "", *noise_ratio_section(fits.get("noise_ratio") or {}),
              *joint_report.joint_section(fits["joint"]),
              "## Kaplan's law B_crit(L) = B* / L^(1/alpha_B)", "",
              "Fitted per optimizer and per method, in log-log (L in nats/token, B in tokens), "
              "each point weighted by its own uncertainty. Per-run and Pareto B_crit measure "
              "the same quantity but are not pooled (a group's runs and its Pareto frontier are "
              "read off the same cells); B_noise "
              "is a different quantity (B_simple) with rows of its own, never pooled: noise "
              "(the noise program's noise.json) and online_noise (the online tracker along "
              "the baseline's runs). Degenerate Pareto fits are left out (see the Pareto "
              "table). Each interval column says its level and what was resampled: a 95% "
              "percentile bootstrap over independent units (runs, Pareto frontiers, groups or "
              "blocks of eval points), or with fewer than "
              f"{MIN_BOOTSTRAP_UNITS} units, where such a bootstrap covers less than it "
              "claims, the range of the estimates fitted to each unit alone. Kaplan et "
              "al. (2020): B* = 2e8 tokens, 1/alpha_B = 4.8 (GPT-2 tokenizer on WebText2: "
              "compare the exponent and the order of magnitude).", "",
              *kaplan_tables(fits["kaplan"], fits["kaplan_points"]),
              "", "## Learning rate versus batch size", "",
              "Best lr (refined) against batch size at one budget, power law lr* ~ B^k over the "
              "batch sizes below the largest (Adam expected 0.5 <= k <= 1).", "",
              lr_scaling_table(fits["lr_scaling"]), ""]
    lines += render.plots_section(plots, PLOTS)
    lines += render.warnings_section(result["warnings"],
                                     result.get("warning_fixes", render.WARNING_FIXES))
    return "\n".join(lines) + "\n"

