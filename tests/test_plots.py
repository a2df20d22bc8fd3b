"""Plots and tables that read well: every log axis labelled at any range, every title inside
its figure, one loss unit per table column (nats/token), in all three reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_schedules import write_study as write_schedules_study
from test_stability import write_study as write_stability_study

from critbatch.analysis import plotting
from critbatch.analysis.bcrit import markdown as bcrit_markdown
from critbatch.analysis.bcrit import plots as bcrit_plots
from critbatch.analysis.bcrit import report as bcrit_report
from critbatch.analysis.bcrit.synthetic import synthetic_branched_sweep, synthetic_sweep
from critbatch.analysis.schedules import plots as schedules_plots
from critbatch.analysis.schedules import report as schedules_report
from critbatch.analysis.stability import report as stability_report

# ---------------------------------------------------------------------------------------------
# What a readable figure is


def labelled_ticks(ax, axis: str) -> list:
    """The tick labels of `axis` ("x" or "y"), major and minor, that carry text and lie
    within the view (the figure drawn)."""
    labels = ax.get_xticklabels(which="both") if axis == "x" else ax.get_yticklabels(
        which="both")
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    index = 0 if axis == "x" else 1
    return sorted((t for t in labels if t.get_text() and t.get_visible()
                   and lo * (1 - 1e-9) <= t.get_position()[index] <= hi * (1 + 1e-9)),
                  key=lambda t: t.get_position()[index])


def inside(box, frame, tol: float = 1.0) -> bool:
    return (box.x0 >= frame.x0 - tol and box.x1 <= frame.x1 + tol and box.y0 >= frame.y0 - tol
            and box.y1 <= frame.y1 + tol)


def check_log_axis(ax, axis: str) -> None:
    """At least two labelled ticks, with distinct texts, none overlapping the next."""
    labels = labelled_ticks(ax, axis)
    texts = [t.get_text() for t in labels]
    assert len(labels) >= 2, f"{axis} axis {ax.get_xlim() if axis == 'x' else ax.get_ylim()}: " \
                             f"labels {texts}"
    assert len(set(texts)) == len(texts), texts
    renderer = ax.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert not a.overlaps(b), texts


def check_figure(fig) -> int:
    """Draw `fig`; every title, axis label and tick label inside the figure, the suptitle
    clear of the axes titles, every log axis labelled (`check_log_axis`). Returns the number
    of log axes checked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):  # pyplot.close left a bare canvas
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    titles = [t for t in fig.texts if t.get_text()]
    n_log = 0
    for ax in fig.axes:
        if not (ax.get_visible() and ax.axison):
            continue
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *labelled_ticks(ax, "x"),
                 *labelled_ticks(ax, "y")]
        for text in texts:
            if text.get_text() and text.get_visible():
                box = text.get_window_extent(renderer)
                assert inside(box, frame), f"{text.get_text()!r} {box} outside {frame}"
        for suptitle in titles:
            if ax.title.get_text():
                assert not suptitle.get_window_extent(renderer).overlaps(
                    ax.title.get_window_extent(renderer)), ax.title.get_text()
        for axis in ("x", "y"):
            if (ax.get_xscale() if axis == "x" else ax.get_yscale()) == "log":
                check_log_axis(ax, axis)
                n_log += 1
    for suptitle in titles:
        assert inside(suptitle.get_window_extent(renderer), frame), suptitle.get_text()
    return n_log


@pytest.fixture
def saved_figures(monkeypatch) -> list:
    """Every figure a report saves (through `plotting.save_figure`), kept for inspection."""
    figures = []
    save = plotting.save_figure

    def keep(fig, path):
        save(fig, path)
        figures.append((Path(path).name, fig))

    monkeypatch.setattr(plotting, "save_figure", keep)
    return figures


# ---------------------------------------------------------------------------------------------
# The helpers


@pytest.mark.parametrize("span", [1.01, 1.5, 3.0, 5.0, 9.0, 30.0, 1e4])
@pytest.mark.parametrize("start", [3e-4, 2.7, 8e6])
def test_a_log_axis_has_two_labelled_ticks_at_any_range(tmp_path, span, start):
    """The old plots labelled no tick of an axis spanning less than a decade; every range now
    carries two labelled ticks or more, distinct and not overlapping, minor ones included."""
    fig, (ax,) = plotting.panel_grid(1, "a figure")
    ax.plot([start, start * span], [start * span, start], "o-")
    plotting.log_axes(ax, x=True, y=True)
    plotting.label_axes(ax, "x", "y", "an axes", legend=False)
    plotting.save_figure(fig, tmp_path / "f.png")
    assert check_figure(fig) == 2


def test_a_narrow_log_axis_reads_in_plain_numbers():
    """1.5x of a loss: round values (3.4, 3.6, ...), not powers of ten."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots()
    ax.plot([3.3, 4.95], [1, 2])
    plotting.log_axes(ax)
    fig.canvas.draw()
    values = [float(re.sub(r"[^0-9.]", "", t.get_text())) for t in labelled_ticks(ax, "x")]
    assert len(values) >= 2 and all(3.3 <= v <= 5.0 for v in values)
    plt.close(fig)


def test_long_titles_are_wrapped_inside_the_figure(tmp_path):
    fig, axes = plotting.panel_grid(3, "A figure title far too long for any figure: " * 8,
                                    panel_in=(3.0, 3.0))
    for i, ax in enumerate(axes):
        ax.plot([1, 2], [1, 2])
        plotting.label_axes(ax, "an x label " * 6, "a y label " * 6,
                            f"panel {i}: " + "a title that does not fit one line " * 3,
                            legend=False)
    plotting.save_figure(fig, tmp_path / "f.png")
    check_figure(fig)
    assert all("\n" in ax.title.get_text() for ax in axes)
    assert (tmp_path / "f.png").stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# Every plot of every report


def bcrit_report_of(root: Path, design: str) -> dict:
    if design == "branched":
        synthetic_branched_sweep(root / "runs", optimizers=("adamw", "muon"), sweep="batch",
                                 batch_sizes=(16, 32, 64))
    else:  # two batch sizes 2x apart at one budget: every range under a decade
        synthetic_sweep(root / "runs", batch_sizes=(32, 64), sweep="batch",
                        budgets_tokens=(2**22, 2**23, 2**24))
    return bcrit_report.run_analysis([str(root / "runs")], str(root / "report"),
                                     wandb_mode="disabled", resamples=20)


@pytest.mark.slow
@pytest.mark.parametrize("design", ["branched", "narrow"])
def test_every_bcrit_plot_reads_at_any_range(tmp_path, saved_figures, design):
    bcrit_report_of(tmp_path, design)
    names = [name for name, _ in saved_figures]
    assert names == [f"{name}.png" for name in bcrit_plots.PLOTS]
    n_log = sum(check_figure(fig) for _, fig in saved_figures)
    assert n_log >= 8  # each of the five plots has one log axis or two per panel
    lr = dict(saved_figures)["lr_sensitivity.png"]
    assert all("\n" not in ax.title.get_text() for ax in lr.axes)  # short enough for one line


@pytest.mark.slow
def test_every_stability_and_schedules_plot_reads(tmp_path, saved_figures):
    write_stability_study(tmp_path / "runs", optimizers=("adamw", "muon"))
    stability_report.run_analysis([str(tmp_path / "runs")], str(tmp_path / "stab"),
                                  wandb_mode="disabled")
    write_schedules_study(tmp_path / "sched")
    schedules_report.run_analysis([str(tmp_path / "sched")], str(tmp_path / "sched-report"),
                                  wandb_mode="disabled")
    names = [name for name, _ in saved_figures]
    assert names == [f"{n}.png" for n in (*stability_report.PLOTS, *schedules_plots.PLOTS)]
    assert sum(check_figure(fig) for _, fig in saved_figures) >= 10


# ---------------------------------------------------------------------------------------------
# One loss unit per table


NATS_PER_BYTE_COLUMN = "loss (nats/byte: the unit of science.md's reference table)"


def table_headers(markdown: str) -> list[list[str]]:
    """The header cells of every markdown table (a row followed by a |---| row)."""
    lines = markdown.splitlines()
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line, below in zip(lines, lines[1:], strict=False)
            if line.startswith("|") and re.fullmatch(r"\|(---\|)+", below.strip())]


def check_loss_units(markdown: str) -> int:
    """Every column in nats is in nats/token, but for the one labelled nats/byte column;
    every column about a loss states its unit. Returns the number of tables."""
    headers = table_headers(markdown)
    for header in headers:
        for cell in header:
            if "nats/byte" in cell:
                assert cell == NATS_PER_BYTE_COLUMN, header
            elif "nats" in cell:
                assert re.search(r"\(\(?nats/token", cell), (cell, header)
            elif "loss" in cell.lower() and "noise" not in cell.lower():
                assert re.search(r"\(.+\)", cell), (cell, header)  # e.g. (steps)
    return len(headers)


@pytest.mark.slow
def test_every_report_table_states_losses_in_nats_per_token(tmp_path):
    bcrit = bcrit_report_of(tmp_path / "b", "narrow")
    text = (bcrit["out"] / "report.md").read_text()
    assert check_loss_units(text) >= 6
    # the loss table's numbers are the per-run table's losses, in nats/token
    per_run = bcrit["document"]["per_run"]
    assert per_run
    for r in per_run:
        assert re.search(rf"\| {r['batch_size']} \| {r['tokens']:,} \| {r['val_loss']:.4f} \|",
                         text), r["run_dir"]
    assert "(the baseline batch)" in text

    write_stability_study(tmp_path / "s" / "runs")
    stab = stability_report.run_analysis([str(tmp_path / "s" / "runs")],
                                         str(tmp_path / "s" / "rep"), wandb_mode="disabled")
    assert check_loss_units((stab["out"] / "report.md").read_text()) >= 3

    sched = schedules_report.run_analysis([str(write_schedules_study(tmp_path / "sched"))],
                                          str(tmp_path / "sched-rep"), wandb_mode="disabled")
    assert check_loss_units((sched["out"] / "report.md").read_text()) >= 2
    arms = {a["arm"]: a for a in sched["document"]["groups"][0]["arms"]}
    small = arms["constant small"]["val_loss"]
    assert arms["ramp"]["val_loss_delta"] == pytest.approx(arms["ramp"]["val_loss"] - small)


def test_the_noise_table_keeps_nats_per_byte_in_its_labelled_column():
    point = {"run_dir": "r", "kind": "b_noise", "loss": 3.2, "loss_per_byte": 0.8,
             "trace": 1.0, "g2": 0.1, "b_noise": 10.0, "b_noise_low": None,
             "b_noise_high": None, "b_noise_tokens": 640.0}
    table = bcrit_markdown.noise_table([point])
    assert check_loss_units(table) == 1
    header = table_headers(table)[0]
    row = table.splitlines()[2].strip("|").split("|")
    assert row[header.index("loss (nats/token)")].strip() == "3.2000"
    assert row[header.index(NATS_PER_BYTE_COLUMN)].strip() == "0.8000"


def test_a_figure_is_laid_out_and_drawn_by_one_renderer(tmp_path, monkeypatch):
    """save_figure measures the texts (`fit_texts`) with the renderer that then draws the
    image, so matplotlib's per-renderer text layouts are reused, and the image has SAVE_DPI.
    Fails when the texts are measured at the figure's own dpi (a second renderer: every tick
    label laid out twice, half of a report's plotting time)."""
    from matplotlib.backends import backend_agg
    from PIL import Image

    made = []
    original = backend_agg.RendererAgg.__init__

    def counted(self, *args, **kwargs):
        made.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(backend_agg.RendererAgg, "__init__", counted)
    fig, (ax,) = plotting.panel_grid(1, "a title")
    ax.plot([1, 10, 100, 1000], [5, 4, 3.5, 3.2])
    plotting.log_axes(ax, x=True)
    plotting.save_figure(fig, tmp_path / "one.png")
    assert len(made) == 1, made
    width_in, height_in = 5.0 + plotting.LEGEND_IN, 4.0
    with Image.open(tmp_path / "one.png") as image:
        assert image.size == (round(width_in * plotting.SAVE_DPI),
                              round(height_in * plotting.SAVE_DPI))
