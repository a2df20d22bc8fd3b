"""Figure helpers shared by the reports (B_crit, stability, batch schedules).

Figures use the Agg backend (no display needed), fixed margins in inches (tight_layout would
draw every figure twice) and are saved at 90 dpi. matplotlib is imported on first use, so an
analysis that draws nothing never loads it.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

MAX_PANELS = 6  # groups drawn per figure (more make the plots slow and unreadable)


def pyplot():
    """`matplotlib.pyplot` on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shown_groups(groups: list, warnings: list[str]) -> list:
    """The groups a per-group figure draws (the first MAX_PANELS); a warning when that is not
    all of them."""
    if len(groups) > MAX_PANELS:
        warnings.append(f"plots show the first {MAX_PANELS} of {len(groups)} groups")
    return groups[:MAX_PANELS]


def panel_grid(n: int, title: str, panel_in: tuple[float, float] = (5.0, 4.0),
               max_cols: int = 3):
    """A figure of `n` panels (at least one), `max_cols` to a row, each `panel_in` inches
    (width, height), under the wrapped `title`; returns (figure, the n axes)."""
    n = max(1, n)
    cols = min(max_cols, n)
    rows = math.ceil(n / cols)
    width_in, height_in = panel_in[0] * cols, panel_in[1] * rows
    fig, axes = pyplot().subplots(rows, cols, figsize=(width_in, height_in), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    fig.subplots_adjust(left=0.8 / width_in, right=1 - 0.15 / width_in, bottom=0.55 / height_in,
                        top=1 - 0.7 / height_in, wspace=0.3, hspace=0.5)
    fig.suptitle(textwrap.fill(title, int(16 * width_in)), fontsize=9)
    return fig, list(axes.flat[:n])


def log_axes(ax, x: bool = True, y: bool = False) -> None:
    """Log scale without minor tick labels (they overlap over a decade or less)."""
    from matplotlib.ticker import NullFormatter

    for on, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            set_scale("log")
            axis.set_minor_formatter(NullFormatter())


def label_log_ticks(axis, values: list[float]) -> None:
    """Label a log axis at `values` (rounded to 3 digits) when they span under a decade, where
    matplotlib would label one tick or none."""
    values = sorted(v for v in values if v is not None and math.isfinite(v) and v > 0)
    if not values or values[-1] / values[0] >= 10:
        return
    ticks = values if len(values) <= 6 else list(np.geomspace(values[0], values[-1], 5))
    ticks = sorted({float(f"{t:.3g}") for t in ticks})
    axis.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])


def empty_axes(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)


def label_axes(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=7)


def save_figure(fig, path: Path) -> None:
    fig.savefig(path, dpi=90)
    pyplot().close(fig)
