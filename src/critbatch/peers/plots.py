"""The figures of the public-sweeps report: Step Law's loss against lr per batch with the fitted
optima, its laws against the measured optima, and Zhang et al.'s CBS across sizes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from critbatch.analysis.plotting import label_axes, log_axes, panel_grid, save_figure
from critbatch.peers.steplaw import SEQ_LEN

LR_CURVES = "steplaw_loss_vs_lr.png"
LAWS = "steplaw_laws.png"
ZHANG = "zhang_cbs.png"
CAPTIONS = {
    LR_CURVES: "Step Law's grid: final (smoothed) training loss against peak lr, one line per "
               "batch size, for the held-out cells; a cross marks each batch's refined best "
               "lr, the star the cell's loss-optimal batch and its lr.",
    LAWS: "Left: the lr at each cell's loss-optimal batch against critbatch's law in (N, D) "
          "and Step Law's formula. Right: the loss-optimal batch (tokens) against the token "
          "budget, with critbatch's law per model size and Step Law's D-only law.",
    ZHANG: "Zhang et al.'s CBS (their rule) per model size from critbatch's fits, with the "
           "fitted power law and theirs.",
}


def lr_curves(runs: list[dict], cells: list[dict], shown: list[tuple[float, float]],
              path: Path) -> None:
    fig, axes = panel_grid(len(shown), "Step Law: loss against lr per batch (nats/token)")
    for ax, (n, d) in zip(axes, shown, strict=True):
        cell = next(c for c in cells if c["params"] == n and c["tokens"] == d)
        mine = [r for r in runs if r["params"] == n and r["tokens"] == d
                and math.isfinite(r["loss"])]
        batches = sorted({r["batch_size"] for r in mine})
        colours = _colours(len(batches))
        for b, colour in zip(batches, colours, strict=True):
            pts = sorted((r["lr"], r["loss"]) for r in mine if r["batch_size"] == b)
            ax.plot(*zip(*pts, strict=True), "-", color=colour, lw=1, alpha=0.8,
                    label=f"B={b:.0f} seq")
            opt = next(p for p in cell["batches"] if p["batch_size"] == b)
            ax.plot(opt["lr"], opt["loss"], "x", color=colour, ms=6)
        ax.plot(cell["lr_opt"], cell["loss_opt"], "*", color="k", ms=12,
                label=f"B_opt={cell['b_opt']:.0f} seq")
        best = cell["loss_opt"]
        ax.set_ylim(best - 0.01, best + 0.15)
        log_axes(ax, x=True)
        label_axes(ax, "peak lr", "final loss (nats/token)",
                   f"N={n / 1e6:.0f}M, D={d / 1e9:.0f}B tokens")
    save_figure(fig, path)


def _colours(n: int) -> list:
    from critbatch.analysis.plotting import pyplot

    cmap = pyplot().get_cmap("viridis")
    return [cmap(i / max(n - 1, 1)) for i in range(n)]


def laws(result: dict, model, formula, path: Path) -> None:
    cells = [c for c in result["cells"] if c["b_opt_edge"] is None]
    fig, (left, right) = panel_grid(2, "Step Law's grid: critbatch's laws and Step Law's")
    measured = np.array([c["lr_opt"] for c in cells])
    ours = np.array([model.lr_at_b_opt.predict(c["params"], c["tokens"]) for c in cells])
    left.plot(measured, ours, "o", label="critbatch law")
    if formula:
        theirs = np.array([formula(c["params"], c["tokens"])["lr"] for c in cells])
        left.plot(measured, theirs, "s", mfc="none", label="Step Law formula")
    span = [measured.min() / 1.3, measured.max() * 1.3]
    left.plot(span, span, "k:", lw=1, label="equal")
    log_axes(left, x=True, y=True)
    label_axes(left, "measured lr at B_opt", "predicted lr at B_opt", "lr at the loss-optimal "
               "batch, per (N, D) cell")
    sizes = sorted({c["params"] for c in cells})
    for n, colour in zip(sizes, _colours(len(sizes)), strict=True):
        mine = sorted((c["tokens"], c["b_opt"] * SEQ_LEN) for c in cells if c["params"] == n)
        right.plot(*zip(*mine, strict=True), "o", color=colour, label=f"N={n / 1e6:.0f}M")
        grid = np.geomspace(min(c["tokens"] for c in cells), max(c["tokens"] for c in cells), 20)
        right.plot(grid, [model.b_opt.predict(n, d) * SEQ_LEN for d in grid], "-",
                   color=colour, lw=1)
    if formula:
        grid = np.geomspace(min(c["tokens"] for c in cells), max(c["tokens"] for c in cells), 20)
        right.plot(grid, [formula(sizes[0], d)["batch_size"] * SEQ_LEN for d in grid], "k--",
                   lw=1, label="Step Law (D only)")
    log_axes(right, x=True, y=True)
    label_axes(right, "token budget D (tokens)", "loss-optimal batch (tokens)",
               "B_opt against D: points measured, lines fitted")
    save_figure(fig, path)


def zhang(result: dict, path: Path) -> None:
    fig, (ax,) = panel_grid(1, "Zhang et al. 2025: critical batch size across model sizes")
    n = np.array([s["n_millions"] for s in result["sizes"]])
    cbs = np.array([s["cbs"] for s in result["sizes"]])
    low = np.array([s.get("cbs_boot_low") or s["cbs"] for s in result["sizes"]])
    high = np.array([s.get("cbs_boot_high") or s["cbs"] for s in result["sizes"]])
    ax.errorbar(n, cbs, yerr=[cbs - low, high - cbs], fmt="o", capsize=3,
                label="critbatch fits (95% bootstrap)")
    ax.plot(n, [s["published_cbs"] for s in result["sizes"]], "s", mfc="none",
            label="published per size")
    grid = np.geomspace(n.min(), n.max(), 20)
    law = result["cbs_law"]
    ax.plot(grid, law["d"] * grid ** law["beta"], "-",
            label=f"critbatch: {law['d']:.3g} N^{law['beta']:.3f}")
    ax.plot(grid, law["published_d"] * grid ** law["published_beta"], "k:",
            label=f"published: {law['published_d']:.3g} N^{law['published_beta']:.3f}")
    log_axes(ax, x=True, y=True)
    label_axes(ax, "model size N (millions of parameters)", "CBS (sequences of 512 tokens)",
               "CBS = 0.2 E_min/S_min + 307.2 (their rule)")
    save_figure(fig, path)
