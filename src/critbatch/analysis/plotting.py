"""Figure helpers shared by the reports (B_crit, stability, batch schedules).

Figures use the Agg backend (no display needed), fixed margins in inches (tight_layout would
draw every figure twice) and are saved at 90 dpi. Every log axis is ticked by `log_axes`, so
it carries at least two labelled ticks at any range; `save_figure` wraps every title and axis
label that would not fit (`fit_texts`). matplotlib is imported on first use, so an analysis
that draws nothing never loads it.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

from critbatch.results import files

MAX_PANELS = 6  # groups drawn per figure (more make the plots slow and unreadable)
# A log axis spanning less than this factor is ticked like a linear one (evenly spaced round
# numbers): over so short a range the log scale is nearly linear, and powers of ten or their
# 2 and 5 multiples would leave one tick or none.
LINEAR_TICKS_BELOW = 4.0
# From LINEAR_TICKS_BELOW up to this factor, ticks at 1, 2, 3 and 5 x 10^k (at most 2x
# apart, so two fall inside); above it, 1, 2 and 5 x 10^k (at most 2.5x apart).
DENSE_SUBS_BELOW = 6.25
# Tick values in this range are written as plain numbers (0.05, 20, 5000); outside it in
# powers of ten (2 x 10^-3, 5 x 10^6).
PLAIN_NUMBERS = (1e-2, 1e4)


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


LEGEND_IN = 1.9  # inches right of each panel for its legend (`outside_legend`)


def panel_grid(n: int, title: str, panel_in: tuple[float, float] = (5.0, 4.0),
               max_cols: int = 3):
    """A figure of `n` panels (at least one), `max_cols` to a row, each `panel_in` inches
    (width, height) plus LEGEND_IN to its right for its legend, under `title` (wrapped to
    the figure's width when it is saved); returns (figure, the n axes)."""
    n = max(1, n)
    cols = min(max_cols, n)
    rows = math.ceil(n / cols)
    width_in, height_in = (panel_in[0] + LEGEND_IN) * cols, panel_in[1] * rows
    fig, axes = pyplot().subplots(rows, cols, figsize=(width_in, height_in), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    axes_in = panel_in[0] - 0.8  # the y label and ticks take the rest of a panel
    fig.subplots_adjust(left=0.8 / width_in, right=1 - (LEGEND_IN + 0.1) / width_in,
                        bottom=0.55 / height_in, top=1 - 0.7 / height_in,
                        wspace=(LEGEND_IN + 0.8) / axes_in, hspace=0.5)
    fig.suptitle(title, fontsize=9)
    return fig, list(axes.flat[:n])


# ---------------------------------------------------------------------------------------------
# Log axes


def log_axes(ax, x: bool = True, y: bool = False) -> None:
    """Log scale on the x and/or y axis of `ax`, ticked by `log_ticks`.

    Call it once the data are drawn and any limits set: the ticks follow the axis's range.
    """
    for on, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            set_scale("log")
            log_ticks(axis)


def log_ticks(axis) -> None:
    """Tick a log `axis` so that at least two ticks carry a label, whatever its range lo..hi.

    - two powers of ten or more inside: matplotlib's decades (`LogLocator`,
      `LogFormatterSciNotation`: 10^k), unlabelled minor ticks at 2..9 x 10^k;
    - fewer, over a factor LINEAR_TICKS_BELOW or more: labelled ticks at 1, 2, (3,) 5 x 10^k
      (`LogLocator` with `subs`), unlabelled minor ticks at the other multiples;
    - a narrower range: evenly spaced round numbers (`MaxNLocator`), as on a linear axis.

    Within PLAIN_NUMBERS the labels are plain numbers (`ScalarFormatter`), outside it powers
    of ten (`LogFormatterSciNotation`; on the narrowest axes, a x 10^k beside the axis).

    The choice is made for the axis's current view limits.
    """
    from matplotlib.ticker import (
        LogFormatterSciNotation,
        LogLocator,
        MaxNLocator,
        NullFormatter,
        NullLocator,
        ScalarFormatter,
    )

    lo, hi = sorted(axis.get_view_interval())
    if not (lo > 0 and math.isfinite(hi)):  # nothing drawn: matplotlib's defaults
        return
    decades = math.floor(math.log10(hi) + 1e-9) - math.ceil(math.log10(lo) - 1e-9) + 1
    if decades >= 2:
        axis.set_major_locator(LogLocator(base=10))
        axis.set_major_formatter(LogFormatterSciNotation(base=10))
        axis.set_minor_locator(LogLocator(base=10, subs="auto"))
    elif hi / lo >= LINEAR_TICKS_BELOW:
        subs = (1.0, 2.0, 3.0, 5.0) if hi / lo < DENSE_SUBS_BELOW else (1.0, 2.0, 5.0)
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_minor_locator(LogLocator(base=10, subs=[s for s in range(1, 10)
                                                         if s not in subs]))
        plain = PLAIN_NUMBERS[0] <= lo and hi < PLAIN_NUMBERS[1]
        axis.set_major_formatter(
            ScalarFormatter(useOffset=False) if plain else
            LogFormatterSciNotation(base=10, labelOnlyBase=False,
                                    minor_thresholds=(math.inf, math.inf)))
    else:
        axis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10], min_n_ticks=2))
        axis.set_minor_locator(NullLocator())
        formatter = ScalarFormatter(useOffset=False, useMathText=True)
        formatter.set_powerlimits(tuple(round(math.log10(v)) for v in PLAIN_NUMBERS))
        axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


# ---------------------------------------------------------------------------------------------
# Text


def empty_axes(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)


def label_axes(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend:
        outside_legend(ax)


def outside_legend(ax) -> None:
    """The axes' legend to its right, clear of the data (`panel_grid` leaves LEGEND_IN)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def wrap_to(text, max_px: float, renderer, vertical: bool = False) -> None:
    """Re-wrap the matplotlib Text `text` onto as few lines as keep it within `max_px` pixels
    wide (tall, for `vertical` text such as a y label); one word a line at worst."""
    def size() -> float:
        box = text.get_window_extent(renderer)
        return box.height if vertical else box.width

    if size() <= max_px:
        return
    words = " ".join(text.get_text().split())
    width = len(words)
    while width > 1:
        width = min(width - 1, max(1, int(width * max_px / size())))
        text.set_text(textwrap.fill(words, width, break_long_words=False))
        if size() <= max_px:
            return


def fit_texts(fig) -> None:
    """Wrap what would not fit: each axes' title and x label to the axes' width, its y label
    to its height, the figure's own texts (the suptitle) to the figure's width; then lower the
    top row of axes until their titles clear the suptitle, and move the axes in from any
    edge that tick labels or axis labels cross."""
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    for ax in shown:
        wrap_to(ax.title, ax.bbox.width, renderer)
        wrap_to(ax.xaxis.label, ax.bbox.width, renderer)
        wrap_to(ax.yaxis.label, ax.bbox.height, renderer, vertical=True)
    for text in fig.texts:
        wrap_to(text, 0.96 * fig.bbox.width, renderer)
    if not shown:
        return
    # Room above the top row: the suptitle (from its top at ~0.98 of the height) and the
    # tallest title of the row with its pad, plus a small gap.
    pad_px = fig.dpi / 72 * (6 + 4)  # axes.titlepad (6 pt) and a 4 pt gap
    sup_px = max((t.get_window_extent(renderer).height for t in fig.texts if t.get_text()),
                 default=0.0)
    title_px = max(ax.title.get_window_extent(renderer).height for ax in shown
                   if ax.title.get_text()) if any(ax.title.get_text() for ax in shown) else 0.0
    need = (0.02 * fig.bbox.height + sup_px + title_px + pad_px) / fig.bbox.height
    top = max(ax.get_position().y1 for ax in shown)
    if top > 1 - need:
        fig.subplots_adjust(top=1 - need)
    inside_edges(fig, renderer)


def inside_edges(fig, renderer, pad_in: float = 0.05) -> None:
    """Widen the left, bottom and right margins by whatever the figure's artists (tick
    labels, axis labels, legends) overrun its edges, plus `pad_in` inches."""
    box = fig.get_tightbbox(renderer)  # inches
    width_in, height_in = fig.get_size_inches()
    over_left, over_bottom = pad_in - box.x0, pad_in - box.y0
    over_right = box.x1 - (width_in - pad_in)
    if max(over_left, over_bottom, over_right) <= 0:
        return
    p = fig.subplotpars
    fig.subplots_adjust(left=p.left + max(0.0, over_left) / width_in,
                        bottom=p.bottom + max(0.0, over_bottom) / height_in,
                        right=p.right - max(0.0, over_right) / width_in)


SAVE_DPI = 90


def save_figure(fig, path: Path) -> None:
    """Fit the texts (`fit_texts`), save `fig` to `path` at SAVE_DPI (atomically: a reader
    sees the old image or the new one) and close it. The texts are measured at the dpi they
    are drawn at: the canvas keeps one renderer per size and dpi and matplotlib caches each
    text's layout per renderer, so the drawing reuses what the fitting measured (at another
    dpi it laid every tick label out again: half of a report's plotting time)."""
    fig.set_dpi(SAVE_DPI)
    fit_texts(fig)
    image = io.BytesIO()
    fig.savefig(image, dpi=SAVE_DPI, format=Path(path).suffix.lstrip(".") or "png")
    pyplot().close(fig)
    files.write_bytes_atomic(path, image.getvalue())
