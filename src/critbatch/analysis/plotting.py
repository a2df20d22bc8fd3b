"""Small matplotlib helpers shared by the reports (B_crit, stability, batch schedules).

Figures use the Agg backend (no display needed) and are saved at 90 dpi.
"""

from __future__ import annotations

from pathlib import Path


def log_axes(ax, x: bool = True, y: bool = False) -> None:
    """Log scale without minor tick labels (they overlap over a decade or less)."""
    from matplotlib.ticker import NullFormatter

    for on, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            set_scale("log")
            axis.set_minor_formatter(NullFormatter())


def empty_axes(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)


def label_axes(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=7)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=90)
    plt.close(fig)
