"""The B_crit report's figures (`bcrit_report` writes them through `write_plots`): final loss
against tokens and against lr per batch size, effective tokens, the Pareto frontiers, B_crit
against loss with Kaplan's law, and the joint model's fit (`joint_report.plot_joint`).
Units as in `analysis.bcrit`: batch sizes in sequences, losses in nats/token, tokens seen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from critbatch.analysis import plotting
from critbatch.analysis.joint import report as joint_report
from critbatch.analysis.render import fmt
from critbatch.science.intervals import percentile_band
from critbatch.science.laws import KAPLAN_B_STAR_TOKENS, KAPLAN_EXPONENT

PLOTS = {
    "loss_vs_tokens": "Final loss versus tokens per batch size, with the baseline interpolant",
    "lr_sensitivity": "Final loss versus learning rate per batch size (largest budget)",
    "effective_tokens": "Effective (baseline-equivalent) tokens versus tokens seen",
    "pareto": "Steps versus tokens to reach each target loss, with fitted hyperbolas",
    "bcrit_vs_loss": "B_crit vs loss: estimates, fits, Kaplan's law, B_noise, online B_noise",
    "joint_fit": joint_report.PLOT_CAPTION,
    "noise_ratio": "B_crit(L) of the joint model and the online B_noise read at the peak lr, "
                   "against the loss (bands 95%)",
}


def _panels(groups: list[dict], title: str):
    """One panel per group: (figure, [(group, axes)])."""
    fig, axes = plotting.panel_grid(len(groups), title)
    return fig, list(zip(groups, axes, strict=False))


def plot_loss_vs_tokens(groups: list[dict], path: Path) -> None:
    plt = plotting.pyplot()
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
        plotting.log_axes(ax)
        if not g["cells"]:
            plotting.empty_axes(ax, "no runs: steps-to-target rows only")
        plotting.label_axes(ax, "tokens seen", "final validation loss (nats/token)", g["name"],
                            legend=bool(g["cells"]))
    plotting.save_figure(fig, path)


def plot_lr_sensitivity(groups: list[dict], path: Path) -> None:
    plt = plotting.pyplot()
    fig, panels = _panels(groups, PLOTS["lr_sensitivity"])
    for g, ax in panels:
        if not g["budgets"]:
            plotting.empty_axes(ax, "no runs: steps-to-target rows only")
            continue
        budget = max(g["budgets"])
        cs = sorted((c for c in g["cells"] if c.tokens == budget), key=lambda c: c.batch_size)
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(cs))))
        for color, c in zip(colors, cs, strict=False):
            ax.plot(c.lrs, c.losses, "o-", color=color, label=f"B={c.batch_size}")
            ax.plot([c.lr], [c.loss], "*", color=color, ms=10)
        ax.plot([], [], "*", color="k", ms=10, ls="none", label="refined optimum")
        plotting.log_axes(ax)
        plotting.label_axes(ax, "peak learning rate", "final validation loss (nats/token)",
                            f"{g['name']}, {budget:,} tokens")
    plotting.save_figure(fig, path)


def plot_effective_tokens(groups: list[dict], path: Path) -> None:
    plt = plotting.pyplot()
    fig, panels = _panels(groups, PLOTS["effective_tokens"])
    for g, ax in panels:
        rows = [r for r in g["per_run"] if r["effective_tokens"]]
        if not rows:
            plotting.empty_axes(ax, "no baseline: no effective tokens")
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
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "batch size (sequences)", "effective tokens (baseline tokens)",
                            f"{g['name']} (dotted: tokens seen)", legend=bool(rows))
    plotting.save_figure(fig, path)


def plot_pareto(groups: list[dict], path: Path) -> None:
    plt = plotting.pyplot()
    fig, panels = _panels(groups, PLOTS["pareto"])
    for g, ax in panels:
        seq_len = g["key"]["seq_len"]
        if not g["pareto"]:
            plotting.empty_axes(ax, "no Pareto frontier:\nneeds two batch sizes\nwith several "
                                    "budgets")
        colors = plt.cm.cividis(np.linspace(0, 0.9, max(1, len(g["pareto"]))))
        for color, p in zip(colors, g["pareto"], strict=False):
            ax.plot(p["tokens"], p["steps"], "o", color=color,
                    label=f"{p['target_loss']:.3f}: {fmt(p['b_crit'], '.3g')}")
            if p["s_min"] and p["e_min"] and p["s_min"] > 0 and p["e_min"] > 0:
                b = np.geomspace(min(p["batch_sizes"]) / 3, max(p["batch_sizes"]) * 3, 60)
                s = p["s_min"] + p["e_min"] / b
                ax.plot(s * b * seq_len, s, "-", color=color, lw=1)
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "tokens E to reach the target loss", "optimizer steps S",
                            g["name"], legend=bool(g["pareto"]))
        if g["pareto"]:
            ax.get_legend().set_title("target loss L* (nats/token):\nB_crit (sequences)",
                                      prop={"size": 7})
    plotting.save_figure(fig, path)


METHOD_STYLES = {"per_run": ("o", "-"), "pareto": ("s", "--"), "noise": ("^", ":"),
                 "online_noise": ("x", "-."), "joint": ("", (0, (8, 2)))}


def plot_bcrit_vs_loss(rows: list[dict], points: list[dict], path: Path) -> None:
    """Each (optimizer, method) series with its own marker (method) and colour (optimizer),
    its fitted line, and Kaplan et al.'s law for reference."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6.5 + plotting.LEGEND_IN + 0.6, 4.8))
    fig.subplots_adjust(left=0.1, right=0.6, bottom=0.11, top=0.93)
    optimizers = sorted({p["optimizer"] for p in points})
    colors = {opt: f"C{i}" for i, opt in enumerate(optimizers)}
    for opt in optimizers:
        for method, (marker, _) in METHOD_STYLES.items():
            ps = [p for p in points if p["optimizer"] == opt and p["method"] == method]
            if ps:
                ax.plot([p["loss"] for p in ps], [p["b_crit_tokens"] for p in ps], marker,
                        color=colors[opt], ls="none", label=f"{opt} {method.replace('_', ' ')}")
    if points:
        losses = np.array([p["loss"] for p in points])
        grid = np.geomspace(losses.min() / 1.05, losses.max() * 1.05, 50)
        for r in rows:  # a fit whose interval does not cover is no line to read a law off
            if r["method"] in METHOD_STYLES and r["b_star_tokens"] and r.get("shown", True):
                ax.plot(grid, r["b_star_tokens"] / grid ** r["exponent"],
                        ls=METHOD_STYLES[r["method"]][1], color=colors[r["optimizer"]], lw=1,
                        label=f"{r['optimizer']} {r['method'].replace('_', ' ')} fit: "
                              f"B*/L^{r['exponent']:.2f}")
        ax.plot(grid, KAPLAN_B_STAR_TOKENS / grid ** KAPLAN_EXPONENT, "k-", lw=1.5,
                label="Kaplan et al. 2020: 2e8 / L^4.8")
        plotting.outside_legend(ax)
    else:
        plotting.empty_axes(ax, "no B_crit estimate yet")
    plotting.log_axes(ax, x=True, y=True)
    plotting.label_axes(ax, "loss L (nats/token)", "B_crit (tokens)", PLOTS["bcrit_vs_loss"],
                        legend=False)
    plotting.save_figure(fig, path)


def power_band(x: np.ndarray, y: np.ndarray, units: list, grid: np.ndarray,
               resamples: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A power law y = c x^k through (x, y) on `grid`, with its 95% band from refits on
    resampled units (a unit's points together)."""
    lx, ly = np.log(x), np.log(y)
    fit = np.polyval(np.polyfit(lx, ly, 1), np.log(grid))
    names = sorted(set(units))
    index = [np.flatnonzero([u == n for u in units]) for n in names]
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(resamples):
        pick = np.concatenate([index[k] for k in rng.integers(len(names), size=len(names))])
        if np.ptp(lx[pick]) > 0:
            lines.append(np.polyval(np.polyfit(lx[pick], ly[pick], 1), np.log(grid)))
    if not lines:
        return np.exp(fit), np.exp(fit), np.exp(fit)
    lo, hi = percentile_band(lines, axis=0)
    return np.exp(fit), np.exp(lo), np.exp(hi)


def plot_noise_ratio(groups: list[dict], ratios: dict, joint: dict, path: Path) -> None:
    """Per optimizer: the joint model's B_crit(L) with the band of its bootstrap laws, and
    the peak-lr B_noise readings (filled: within the law's losses, compared; open: outside)
    with a power law through the compared ones and its band over resampled runs."""
    optimizers = sorted(ratios)
    fig, axes = plotting.panel_grid(max(1, len(optimizers)), PLOTS["noise_ratio"])
    for ax, opt in zip(axes, optimizers or [None], strict=False):
        readings = [r for g in groups if g["key"]["optimizer"] == opt
                    for r in g.get("noise_readings", [])]
        doc, ratio = joint.get(opt), ratios.get(opt) or {}
        if doc is None or not readings:
            plotting.empty_axes(ax, f"{opt}: " + (ratio.get("left_out") or "nothing to show"))
            continue
        cells = [c["val_loss"] for c in doc["cells"]]
        grid = np.geomspace(min(cells), max(cells), 40)
        b_star, gamma = doc["b_star_tokens"] / doc["seq_len"], doc["exponent"]
        ax.plot(grid, b_star * grid ** -gamma, "C0-", lw=1.5,
                label=f"B_crit(L), 1/alpha_B {gamma:.2f}")
        draws = doc.get("law_draws")
        if draws:
            curves = [b * grid ** -g for b, g in zip(draws["b_star"], draws["exponent"],
                                                    strict=True)]
            lo, hi = percentile_band(curves, axis=0)
            ax.fill_between(grid, lo, hi, color="C0", alpha=0.2,
                            label="B_crit 95% (refits)")
        inside = [r for r in readings if min(cells) <= r["val_loss"] <= max(cells)]
        outside = [r for r in readings if r not in inside]
        for rows, face, what in ((inside, "C1", "B_noise, peak lr"),
                                 (outside, "none", "outside the law's L")):
            if rows:
                ax.plot([r["val_loss"] for r in rows], [r["b_noise"] for r in rows], "o",
                        mfc=face, mec="C1", ms=4, ls="none",
                        label=f"{what} ({len(rows)})")
        x = np.array([r["val_loss"] for r in inside])
        # a line through readings at one loss is no law: at least 5% apart in loss
        if len({r["run_dir"] for r in inside}) >= 2 and np.ptp(np.log(x)) >= 0.05:
            xs = np.geomspace(x.min(), x.max(), 30)
            line, lo, hi = power_band(x, np.array([r["b_noise"] for r in inside]),
                                      [r["run_dir"] for r in inside], xs)
            ax.plot(xs, line, "C1--", lw=1.2, label="B_noise(L) fit")
            ax.fill_between(xs, lo, hi, color="C1", alpha=0.2, label="B_noise 95% (runs)")
        if ratio.get("ratio") is not None:
            ax.set_title(f"{opt}: B_crit / B_noise {ratio['ratio']:.3g} "
                         f"[{ratio['low']:.3g}, {ratio['high']:.3g}]", fontsize=9)
        else:
            ax.set_title(opt, fontsize=9)
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "validation loss L (nats/token)", "batch (sequences)",
                            ax.get_title())
    plotting.save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    """Every plot of PLOTS as `<name>.png` in `out`; returns {name: file name}."""
    groups = plotting.shown_groups(result["groups"], result["warnings"])
    plot_loss_vs_tokens(groups, out / "loss_vs_tokens.png")
    plot_lr_sensitivity(groups, out / "lr_sensitivity.png")
    plot_effective_tokens(groups, out / "effective_tokens.png")
    plot_pareto(groups, out / "pareto.png")
    plot_bcrit_vs_loss(result["fits"]["kaplan"], result["fits"]["kaplan_points"],
                       out / "bcrit_vs_loss.png")
    joint_report.plot_joint(result["fits"]["joint"], out / "joint_fit.png")
    plot_noise_ratio(result["groups"], result["fits"]["noise_ratio"], result["fits"]["joint"],
                     out / "noise_ratio.png")
    return {name: f"{name}.png" for name in PLOTS}


