"""The joint model's words, tables and plot in the B_crit report (`analysis.joint` computes).

The report opens with the measured law per optimizer, or "unresolved" with the reason; then
a section with the fit, the loss-alone test across widths, each width's example curve and
the held-out predictions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from critbatch.analysis import plotting
from critbatch.analysis.joint.joint import (
    HELD_OUT_SIGMAS,
    RESOLVED,
    RESOLVED_WIDTH,
    curve_not_law,
    decide,
)
from critbatch.analysis.render import fmt, fmt_interval, md_table
from critbatch.science.fits import NOISE_TREND_P
from critbatch.science.joint import TERM_TEST_DRAWS, TERM_TEST_LEVEL, Form, JointFit
from critbatch.science.replicates import MODEL_ERROR

PLOT_CAPTION = ("The joint model per optimizer: every cell's loss (points, +-1 seed sigma) "
                "against tokens, per batch size, with the model's curve; held-out cells hollow, "
                "upper bounds (best lr on the grid's edge) as triangles")


def verdict(doc: dict) -> str:
    """One sentence: the law with its interval, or why it is unresolved (`analysis.joint.
    decide`'s reasons, with the lever arm in ln L, a fitted power, the model's misfit and
    what more seeds would buy)."""
    low, high = doc["exponent_low"], doc["exponent_high"]
    law = (f"B_crit(L) = {doc['b_star_tokens']:.3g} tokens / L^{doc['exponent']:.2f}, "
           f"1/alpha_B {fmt_interval(doc['exponent'], low, high, '.2f')}")
    if low is None or high is None:
        return f"**{doc['optimizer']}: unresolved** ({law}; {doc['interval']})."
    decision = decide(doc)  # a fits.json written before the verdict was data decides here
    why = [f"ln L spans {doc['log_loss_span']:.2f}"]
    if doc.get("transition_power") is not None:
        why.append(f"form {doc['form']} with p = {doc['transition_power']:.2f} fitted (p and "
                   "1/alpha_B trade against each other)")
    if doc.get("chi2_per_dof", 0) > 2:
        why.append(f"the model misfits the losses (chi2/dof {doc['chi2_per_dof']:.1f})")
    curve = curve_not_law(doc.get("held_out", []))
    if curve:
        why.append(curve)
    if decision["verdict"] == RESOLVED:
        return f"**{doc['optimizer']}**: {law} (95% parametric bootstrap; {'; '.join(why)})."
    if high - low > RESOLVED_WIDTH:
        seeds = seeds_text(doc.get("precision") or {}, doc.get("draws"))
        if seeds:
            why.append(seeds)
    return (f"**{doc['optimizer']}: unresolved**: {'; '.join(decision['reasons'])} "
            f"({'; '.join(why)}; fit {law}).")


def seeds_text(precision: dict, draws: dict | None = None) -> str | None:
    """What seeds a 95% interval of RESOLVED_WIDTH would take (`science.precision`), in words;
    None for a fits.json without the projection. Where two draws showed the misfit to be the
    model's own error (`draws`, `analysis.draws`), only the misfit-kept reading applies."""
    noise = precision.get("seeds_for_target")
    if noise is None:
        return None
    if (draws or {}).get("verdict") == MODEL_ERROR:
        kept = precision.get("seeds_for_target_misfit_kept")
        return ("two draws show the misfit to be the model's own error, so "
                + ("no number of seeds gives a 95% interval " if kept is None else
                   f"a 95% interval would take about {math.ceil(kept)}x the seeds to be ")
                + f"{RESOLVED_WIDTH:g} wide")
    text = (f"a 95% interval {RESOLVED_WIDTH:g} wide would take about {math.ceil(noise)}x the "
            "seeds at every cell if the interval falls as 1/sqrt(seeds)")
    if precision.get("noise_scale", 1.0) > 1.0:
        kept = precision.get("seeds_for_target_misfit_kept")
        text += (", no number of seeds if the misfit is the model's own error" if kept is None
                 else f", about {math.ceil(kept)}x if the misfit is the model's own error")
    return text


def headline(documents: dict) -> list[str]:
    """The report's first lines: one verdict per optimizer."""
    if not documents:
        return ["No joint model (see the warnings)."]
    return [verdict(doc) for doc in documents.values()]


def checks_lines(documents: dict) -> list[str]:
    """The verdict's checks per optimizer (fits.json `joint.<optimizer>.checks`; absent in a
    fits.json from before they were recorded), and B_crit at the reference loss."""
    rows = [[doc["optimizer"], c["check"], c["status"], c["detail"] or "-"]
            for doc in documents.values() for c in doc.get("checks") or []]
    lines = []
    if rows:
        lines += ["The verdict's checks (each must pass for \"resolved\"; chi2/dof against "
                  "the range the noise alone reaches in 97.5% of simulated draws, linearised "
                  "at the fit):", "", md_table(["optimizer", "check", "status", "detail"], rows),
                  ""]
    at = [[doc["optimizer"], f"{doc['b_crit_at_loss']['loss']:.4f}",
           fmt_interval(doc["b_crit_at_loss"]["b_crit"], doc["b_crit_at_loss"]["low"],
                        doc["b_crit_at_loss"]["high"], ".3g")]
          for doc in documents.values() if doc.get("b_crit_at_loss")]
    if at:
        lines += ["B_crit at the lowest loss the smallest batch of the first width measured "
                  "(sequences; 95% parametric bootstrap, each refit choosing its form):", "",
                  md_table(["optimizer", "loss (nats/token)", "B_crit (sequences) [95%]"], at),
                  ""]
    return lines


def held_out_text(held: dict) -> str:
    """One held-out set in words: "<set> (x2 the refit's tokens): k of n within 2 seed sigma
    (k2 within 2 predictive sigma)", the reach and the second count where known."""
    if held.get("refit_failed"):
        return f"{held['held_out']}: the refit failed ({held['refit_failed']})"
    if held.get("cannot") and not held.get("rows"):
        return f"{held['held_out']}: cannot be formed ({held['cannot']})"
    reach = (f" (x{held['tokens_reach']:.3g} the refit's tokens)" if held.get("tokens_reach")
             else "")
    predictive = held.get("within_2_predictive_sigma")
    return (f"{held['held_out']}{reach}: {held['within_2_sigma']} of {held['n_cells']} within "
            f"{HELD_OUT_SIGMAS:g} seed sigma"
            + (f" ({predictive} within {HELD_OUT_SIGMAS:g} predictive sigma)"
               if predictive is not None else "")
            + (f"; {held['cannot']}" if held.get("cannot") else ""))


def held_out_summary(doc: dict) -> str:
    return "; ".join(map(held_out_text, doc["held_out"])) or "none possible"


def range_summary(doc: dict) -> str:
    """The range check in a few words: the refit's exponent and how many cells it left out."""
    check = doc.get("above_baseline_range")
    if not check:
        return "-"  # a fits.json from before the check
    if not check["n_cells"]:
        return "no such cell"
    if check.get("refit_failed"):
        return f"{check['n_cells']} cells; the refit failed ({check['refit_failed']})"
    if check["exponent"] is None:
        return f"{check['n_cells']} cells; too few left to refit"
    return f"{check['exponent']:.2f} ({check['n_cells']} cells left out)"


def sharing_lines(documents: dict) -> list[str]:
    """How much of one run's noise its cooldown branches share, per optimizer: measured from
    the trunks trained at several seeds, or assumed (fits.json joint.<optimizer>.trunk_sharing;
    absent in a fits.json from before it was measured)."""
    rows = []
    for doc in documents.values():
        s = doc.get("trunk_sharing")
        if not s:
            continue
        rows.append([doc["optimizer"], f"{s['fraction']:.2f}",
                     (f"measured: {s['trunks']} (batch, lr) trained at several seeds, "
                      f"{s['dof']} seed dof, {s['budget_pairs']} budget pairs")
                     if s["source"] == "seeds" else
                     "assumed: too few trunks trained at several seeds to measure it"])
    if not rows:
        return []
    return ["A trunk's shared noise: the correlation of one seed's loss deviations between two "
            "budgets of its run and branches (each (batch, lr)'s deviations from its seeds' "
            "mean scaled by their own unshared sd, pooled per budget pair, averaged over the "
            "pairs). "
            "The bootstrap, the term tests and the two draws' check redraw that share of "
            "each cell's noise once per trunk:", "",
            md_table(["optimizer", "share of the variance shared", "source"], rows), ""]


def joint_section(documents: dict) -> list[str]:
    """The section: fit table, loss-alone test, curves, held-out cells."""
    lines = ["## The joint model", "",
             "Every cell of an optimizer (all widths, batches, budgets; best lr, seeds "
             "averaged) fitted at once: E = E_min(L; N) (1 + B / B_crit(L)), one example curve "
             "L = L_N + A_N (E_min / 1e6 tokens)^-alpha_N per width N, one "
             "B_crit(L) = B* / L^(1/alpha_B) for all widths; two optional terms, each kept "
             "where its likelihood-ratio test, asymptotic and simulated, demands it (see "
             "the terms' table): a small-batch factor "
             "(1 + B_s / B), then a power, (B / B_crit)^p in place of B / B_crit (B_crit stays "
             "the batch that needs twice the minimal tokens). Weighted least squares on the "
             "losses (weights: the seed noise at the cell's batch and tokens: one pooled sd, "
             "or a power of the tokens where a likelihood-ratio test keeps one at p < "
             f"{NOISE_TREND_P:g}; per batch where the batches' seeds differ by the same test). "
             "Cells of fewer than 3x the warmup "
             "steps are left out; a cell whose best lr is on the grid's edge counts as an "
             "upper bound (a one-sided residual: only a prediction above it costs). "
             "Interval: 95% parametric bootstrap (every loss redrawn around the model with "
             "its seed noise, a run and its cooldown branches sharing the part of the "
             "variance the seeds measure (below; half where they cannot), widened by "
             "sqrt(chi2/dof over the mean the noise alone gives) when the model misfits "
             "beyond it; each draw first redraws every seed-noise estimate from its "
             "effective degrees of freedom, since a few seeds pin a sigma only to within "
             "0.6-1.4x, and each refit chooses its own form as the fit did). The "
             "loss-alone test compares the shared law against one law per width "
             "(chi-square difference, its p from the statistic's own simulated distribution; "
             "p < 0.05 rejects \"B_crit depends on the loss alone\"). "
             "Held out: the model refitted without the largest budget; without its batches "
             "above the smallest (the baseline's cell there kept: the law alone "
             "extrapolates); with several widths, without the widest model's batches above "
             "its smallest; each refit predicts the cells it left out; residuals in seed "
             "sigmas (where no run was repeated, in the refit's own scatter), and where a set "
             "misses, also in predictive sigmas that add the refit's spread. Range check: the "
             "law refitted without the cells whose loss lies above every loss of their "
             "width's smallest batch, where E_min comes from the example curve's form rather "
             "than from baseline data; a shift of the exponent beyond 3 sds of the shift's "
             "own noise (linearised, nested fits) leaves the law unresolved. Resolved means "
             "1/alpha_B known to +-0.5: a 95% interval at most 1 wide and every check passed; "
             "a check that cannot be formed leaves it unresolved (the checks' table below; "
             "fits.json: joint.<optimizer>.verdict, reasons and checks).", ""]
    if not documents:
        return lines + ["No joint model (see the warnings).", ""]
    rows = []
    for doc in documents.values():
        test = doc["loss_alone"]
        rows.append([
            doc["optimizer"], fmt_interval(doc["exponent"], doc["exponent_low"],
                                           doc["exponent_high"], ".2f"),
            fmt_interval(doc["b_star_tokens"], doc["b_star_tokens_low"],
                         doc["b_star_tokens_high"]),
            f"{doc['chi2_per_dof']:.2f} ({doc['dof']} dof)",
            f"{doc['n_cells']} ({doc['n_units']})" + (
                f", {doc['n_upper_bounds']} bounds" if doc.get("n_upper_bounds") else ""),
            ", ".join(doc["widths"]),
            f"{doc['log_loss_span']:.3f}",
            "-" if test is None or test["holds"] is None else (
                "holds" if test["holds"] else "rejected") + f" (p = {test['p_value']:.3g})",
            held_out_summary(doc), range_summary(doc)])
    lines += [md_table(["optimizer", "1/alpha_B [95%]", "B* (tokens) [95%]", "chi2/dof",
                        "cells (runs)", "widths", "ln L span", "loss alone",
                        "held out", "1/alpha_B without cells above the baseline's losses"],
                       rows), ""]
    lines += checks_lines(documents)
    lines += [failures_text(doc) for doc in documents.values() if failures_text(doc)]
    terms = [term_row(doc, *term) for doc in documents.values() for term in TERM_ROWS
             if doc.get(term[1])]
    if terms:
        lines += ["Optional terms, each tested against the form before it: the chi-square "
                  "difference over one parameter (scaled by the richer fit's chi2/dof where "
                  "that exceeds 1) and, where that keeps the term and the sigmas are "
                  "estimated from seeds, the same statistic's share "
                  f"among {TERM_TEST_DRAWS} data sets simulated without the term, each noise "
                  "estimate redrawn from its degrees of freedom; kept where both p < "
                  f"{TERM_TEST_LEVEL:g}:", "",
                  md_table(["optimizer", "term", "fitted value", "chi2 without -> with",
                            "chi2/dof without", "chi2/dof with", "p (chi-square)",
                            "p (simulated)", "kept"], terms), ""]
    plans = [row for doc in documents.values() for row in plan_rows(doc)]
    if plans:
        lines += ["What a bigger sweep would pin: 1/alpha_B's 95% interval width projected for "
                  "the same design moved (every run longer with its batches scaled alike, or "
                  "every cell at more seeds), each cell at the fitted model's loss with its "
                  "measured seed noise: the bootstrap's width now times the ratio of the "
                  "linearised (Gauss-Newton) sds, plan over the design as measured. Where "
                  "the model misfits (chi2/dof > 1) the bootstrap widened the noise by "
                  "sqrt(chi2/dof); the last column keeps that excess, as the model's own "
                  "error would stay. It assumes the fitted law and form hold where the design "
                  "moves to (science.md section 8):", "",
                  md_table(["optimizer", "plan", "cells", "ln L span", "sd ratio",
                            "95% width", "95% width, misfit kept"], plans), ""]
    lines += draws_lines(documents)
    noise = [[doc["optimizer"], n["width"], noise_batch(n), f"{n['sd_ref']:.4f}",
              f"{n['ref_tokens']:,.0f}", f"{n['slope']:+.2f}", str(n["dof"]),
              "-" if n.get("effective_dof") is None else f"{n['effective_dof']:.1f}",
              "-" if n["p_value"] is None else f"{n['p_value']:.3g}"]
             for doc in documents.values() for n in doc.get("seed_noise", [])]
    if noise:
        lines += ["Seed noise of one run (sd = sd_ref (E / E_ref)^slope, from the cells "
                  "trained at several seeds at their best lr; slope 0: no trend at p < "
                  f"{NOISE_TREND_P:g}, each batch's own slope at that over the batches). "
                  "Each cell's sigma is its batch's where the batches' seeds differ (a "
                  f"likelihood-ratio test against one pooled trend at p < {NOISE_TREND_P:g}), "
                  "else the "
                  "pooled one's. Effective dof: what the bootstrap redraws the estimate from "
                  "(the budgets of one run share its trunk, so they count in part):", "",
                  md_table(["optimizer", "width", "batch (seq)", "sd_ref (nats/token)",
                            "E_ref (tokens)", "slope", "dof", "effective dof", "p (slope 0)"],
                           noise), ""]
    lines += sharing_lines(documents)
    curves = [[doc["optimizer"], c["width"], f"{c['l_inf']:.3f}", f"{c['a']:.3f}",
               f"{c['alpha']:.3f}"] for doc in documents.values() for c in doc["curves"]]
    lines += ["Example curves (L = L_N + A (E_min / 1e6 tokens)^-alpha; nats/token):", "",
              md_table(["optimizer", "width", "L_N", "A", "alpha"], curves), ""]
    held = [[doc["optimizer"], h["held_out"], r["width"], str(r["batch_size"]),
             f"{r['tokens']:,}", f"{r['val_loss']:.4f}",
             fmt(r["predicted_loss"], ".4f") + (f" +- {r['predicted_loss_sd']:.4f}"
                                                if r.get("predicted_loss_sd") else ""),
             fmt(r["residual_sigmas"], "+.2f") + (" (bound)" if r.get("upper_bound") else ""),
             fmt(r.get("residual_predictive_sigmas"), "+.2f")]
            for doc in documents.values() for h in doc["held_out"] for r in h["rows"]]
    if held:
        lines += ["Held-out cells: measured against predicted loss (nats/token; +- the "
                  "refit's own spread, sd over its parametric bootstrap), residual "
                  "(measured - predicted) in seed sigmas, the verdict's test, and in the "
                  "predictive sigma sqrt(seed sigma^2 + spread^2):", "",
                  md_table(["optimizer", "held out", "width", "batch", "tokens", "measured",
                            "predicted", "residual (seed sigma)",
                            "residual (predictive sigma)"], held), ""]
    return lines


def failures_text(doc: dict) -> str | None:
    """The refits that failed, in one sentence (None where none did or the document predates
    the count): a failed refit is left out and counted, never fatal."""
    failed = doc.get("failed_refits")
    if not failed or not (failed["bootstrap"] or failed["held_out"] or failed["range_check"]):
        return None
    share = failed["bootstrap_share"]
    return (f"{doc['optimizer']}: refits that failed and were left out: {failed['bootstrap']} "
            f"of {failed['bootstrap_tried']} bootstrap"
            + (f" ({share:.0%})" if share is not None else "")
            + f", {failed['held_out']} of {failed['held_out_tried']} held-out, "
            f"{failed['range_check']} range check.\n")


def plot_joint(documents: dict, path: Path) -> None:
    """Per optimizer a panel: the cells of its widest model (points) and the model's curve
    for each batch, drawn over that batch's own token range (not extrapolated)."""
    plt = plotting.pyplot()
    fig, axes = plotting.panel_grid(max(1, len(documents)), PLOT_CAPTION)
    if not documents:
        plotting.empty_axes(axes[0], "no joint model")
    for ax, doc in zip(axes, documents.values(), strict=False):
        width = doc["widths"][-1]
        fit = JointFit(**{k: np.array([c[k] for c in doc["curves"]]) for k in
                          ("l_inf", "a", "alpha")},
                       b_star=np.array([doc["b_star_tokens"] / doc["seq_len"]]),
                       gamma=np.array([doc["exponent"]]), widths=tuple(doc["widths"]),
                       b_small=doc.get("b_small") or 0.0,
                       power=doc.get("transition_power") or 1.0,
                       form=Form(small_batch=doc.get("b_small") is not None,
                                 power=doc.get("transition_power") is not None))
        w = doc["widths"].index(width)
        cells = [c for c in doc["cells"] if c["width"] == width]
        held = {(r["batch_size"], r["tokens"]) for h in doc["held_out"] for r in h["rows"]
                if r["width"] == width}
        batches = sorted({c["batch_size"] for c in cells})
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(batches))))
        for color, b in zip(colors, batches, strict=False):
            mine = [c for c in cells if c["batch_size"] == b]
            tokens = [c["tokens"] for c in mine]
            grid = np.geomspace(min(tokens) / 1.2, max(tokens) * 1.2, 40)
            for c in mine:
                hollow = (b, c["tokens"]) in held
                ax.errorbar(c["tokens"], c["val_loss"], yerr=c["loss_sigma"],
                            fmt="v" if c.get("upper_bound") else "o",
                            color=color, mfc="none" if hollow else color, ms=5)
            model = fit.predict_loss(np.full(len(grid), w), np.full(len(grid), float(b)), grid)
            ax.plot(grid, model, "-", color=color, lw=1, label=f"B={b}")
        plotting.log_axes(ax, x=True)
        plotting.label_axes(ax, "tokens", "loss (nats/token)",
                            f"{doc['optimizer']}, {width}: 1/alpha_B = {doc['exponent']:.2f}")
    plotting.save_figure(fig, path)


def summary_line(doc: dict) -> str:
    """The printed line of one optimizer's joint fit."""
    test = doc["loss_alone"]
    return (f"  joint {doc['optimizer']}: 1/alpha_B = "
            f"{fmt_interval(doc['exponent'], doc['exponent_low'], doc['exponent_high'], '.2f')}"
            f", B* = {doc['b_star_tokens']:.3g} tokens, chi2/dof = {doc['chi2_per_dof']:.2f}"
            + ("" if test is None or not math.isfinite(test["p_value"]) else
               f", loss alone p = {test['p_value']:.3g}")
            + f"; held out: {held_out_summary(doc)}; without cells above the baseline's "
              f"losses: {range_summary(doc)}")


# the optional terms: (name, the fits.json test's field, its value's field, value format)
TERM_ROWS = (("small-batch factor (1 + B_s/B)", "small_batch_term", "b_small", "B_s = {:.3g} seq"),
         ("power (B/B_crit)^p", "transition_power_term", "power", "p = {:.2f}"))


def term_row(doc: dict, name: str, field: str, value: str, shown: str) -> list[str]:
    """One optional term's test (`doc[field]`) as a table row, with the richer fit's value."""
    test = doc[field]
    value = "-" if test.get(value) is None else shown.format(test[value])
    chi2 = (f"{test['chi2_without']:.1f} -> {test['chi2_with']:.1f} ({test['dof_with']} dof)"
            if "chi2_with" in test else "-")  # fits.json from before these fields: "-"
    return [doc["optimizer"], name, value, chi2, f"{test['chi2_per_dof_without']:.2f}",
            f"{test['chi2_per_dof_with']:.2f}", f"{test['p_value']:.3g}",
            "-" if test.get("p_value_simulated") is None else f"{test['p_value_simulated']:.3g}",
            "yes" if test["kept"] else "no"]


def plan_rows(doc: dict) -> list[list[str]]:
    """The projection's table rows of one optimizer: the design as measured (the bootstrap's
    width), then each plan; 'unbounded' where a plan's cells do not pin the exponent."""
    precision = doc.get("precision") or {}
    if not precision.get("plans"):
        return []
    rows = [[doc["optimizer"], "as measured (95% parametric bootstrap)", str(doc["n_cells"]),
             f"{doc['log_loss_span']:.3f}", "1", f"{precision['width_now']:.2f}",
             f"{precision['width_now']:.2f}"]]
    for row in precision["plans"]:
        rows.append([doc["optimizer"], row["plan"], str(row["n_cells"]),
                     fmt(row["log_loss_span"], ".3f"),
                     *(("unbounded" if row[k] is None else f"{row[k]:.2f}")
                       for k in ("sd_ratio", "width_95", "width_95_misfit_kept"))])
    return rows


def noise_batch(row: dict) -> str:
    """A seed-noise row's batch column: its batch, or what the pooled row is (fits.json rows
    written before per-batch noise have neither field and were pooled)."""
    if row.get("batch_size") is not None:
        return str(row["batch_size"])
    p = row.get("batches_differ_p")
    return "all (pooled)" if p is None else f"all (pooled; batches differ: p = {p:.3g})"


def draws_lines(documents: dict) -> list[str]:
    """The two draws' check (`analysis.draws`) per optimizer, where the runs hold two draws."""
    rows = [[doc["optimizer"], " vs ".join(map(str, d["draws"])), str(d["n_cells"]),
             " / ".join(f"{x:.2f}" for x in d["chi2_per_dof"]),
             f"{d['difference_chi2']:.1f} / {d['difference_dof']}", f"{d['difference_p']:.2g}",
             f"{d['residual_correlation']:+.2f}", f"{d['residual_correlation_p']:.2g}",
             d["verdict"]]
            for doc in documents.values() if (d := doc.get("draws"))]
    if not rows:
        return []
    missed = [[doc["optimizer"], *misfit_by_batch(doc)] for doc in documents.values()
              if (doc.get("draws") or {}).get("verdict") == "model error"]
    shape = ["Where the model misses, for the optimizers whose misfit repeats: the measured "
             "loss minus the model's, in nats/token, per batch (mean over its budgets; cells "
             "measured, not bounds; the fit of both draws). A shape the model lacks shows as "
             "a sign that holds across budgets:", "",
             *(f"- {opt}: {text}" for opt, text in missed), ""] if missed else []
    return ["Noise or the model's error? The runs hold two draws of the sweep (`grid.seed`), "
            "each fitted alone in the form above. Their losses' difference, cell by cell in "
            "the combined seed sigma, tests the sigmas; the correlation of each cell's "
            "residuals about its own draw's fit tests the model: noise does not repeat "
            "across independent draws, a shape the model lacks does. Both p-values are "
            "simulated with the model right (science.md section 8):", "",
            md_table(["optimizer", "draws (grid.seed)", "cells", "chi2/dof of each",
                      "difference chi2 / cells", "p (difference)", "residual correlation r",
                      "p (r)", "verdict"], rows), "", *shape]


def misfit_by_batch(doc: dict) -> list[str]:
    """Per width and batch of the joint fit's measured cells: the mean of measured minus
    predicted loss (nats/token) over its budgets, and how many of them lie above the model,
    as one line of text."""
    by_batch: dict[tuple, list[float]] = {}
    for c in doc.get("cells") or []:
        if not c["upper_bound"] and c["residual_sigmas"] is not None:
            # residual_sigmas is (model - measured) / sigma
            by_batch.setdefault((c["width"], c["batch_size"]), []).append(
                -c["residual_sigmas"] * c["loss_sigma"])
    widths = {w for w, _ in by_batch}
    parts = [(f"{w} " if len(widths) > 1 else "") + f"batch {b}: {sum(v) / len(v):+.4f} "
             f"({sum(x > 0 for x in v)} of {len(v)} above)"
             for (w, b), v in sorted(by_batch.items())]
    return ["; ".join(parts)]
