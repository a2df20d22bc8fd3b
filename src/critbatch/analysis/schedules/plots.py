"""The batch-schedule study's figures (`PLOTS`), one panel per optimizer group: the batch each
arm trained at against tokens, with the online B_noise and the measured local B_crit, and the
validation loss against optimizer steps and against tokens."""

from __future__ import annotations

from pathlib import Path

from critbatch.analysis import plotting
from critbatch.analysis.schedules.schedules import LARGE, SMALL, b_noise_trace, batch_trajectory
from critbatch.results.runs import is_finite, read_metrics

PLOTS = {
    "batch_vs_tokens": "Batch size (sequences) versus tokens per arm, with the adaptive arm's "
                       "online B_noise and the measured arm's local B_crit",
    "loss_vs_steps": "Validation loss versus optimizer steps per arm (squares: the annealed "
                     "small-batch points; dotted: steps saved against the constant small "
                     "batch at each arm's final loss)",
    "loss_vs_tokens": "Validation loss versus tokens per arm",
}

ARM_COLORS = {SMALL: "C0", "ramp": "C1", "adaptive": "C2", LARGE: "C3", "measured": "C4"}


def arm_color(a: dict, i: int) -> str:
    for base, color in ARM_COLORS.items():
        if a["arm"].startswith(base):
            return color
    return f"C{5 + i % 5}"


def _figure(n: int, title: str):
    """One row of `n` panels, one per optimizer group."""
    return plotting.panel_grid(n, title, panel_in=(5.5, 4.2), max_cols=max(1, n))


def _metrics(run_dir: str) -> list[dict] | None:
    """The rows of metrics.jsonl; None when it is missing, unreadable or empty."""
    try:
        return read_metrics(run_dir) or None
    except (OSError, ValueError):
        return None


def plot_batch_vs_tokens(groups: list[dict], path: Path) -> list[str]:
    """Panel (a); returns warnings (runs whose trajectory came from the summary)."""
    fig, axes = _figure(len(groups), PLOTS["batch_vs_tokens"])
    warnings = []
    for g, ax in zip(groups, axes, strict=False):
        for i, a in enumerate(g["arms"]):
            run = g["runs"][a["arm"]]
            metrics = _metrics(run["run_dir"])
            if metrics is None:
                warnings.append(f"{g['name']} {a['arm']}: no readable metrics.jsonl; batch "
                                "trajectory drawn from summary.json")
            traj = batch_trajectory(run, metrics)
            # log x: the first segment starts after the first step, not at 0 tokens
            x = [p["tokens"] for p in traj]
            x[0] = traj[0]["batch_size"] * run["seq_len"]
            color = arm_color(a, i)
            ax.step(x, [p["batch_size"] for p in traj], where="post", color=color,
                    label=a["arm"])
            trace = b_noise_trace(metrics)
            if trace and a["batch_schedule"] == "adaptive":
                ax.plot([t for t, _ in trace], [b for _, b in trace], ":", color=color, lw=1,
                        label=f"{a['arm']}: online B_noise")
            measured = run.get("measured_curve")
            if isinstance(measured, dict) and measured.get("tokens"):
                ax.plot(measured["tokens"], measured["b_crit"], "s:", color=color, lw=1, ms=3,
                        label=f"{a['arm']}: measured local B_crit")
        if not g["arms"]:
            plotting.empty_axes(ax, "no runs")
        plotting.log_axes(ax, x=True, y=True)
        plotting.label_axes(ax, "tokens", "batch size (sequences)", g["name"])
    plotting.save_figure(fig, path)
    return warnings


def plot_val_loss(groups: list[dict], path: Path, x: str) -> None:
    """Validation loss versus `x` ("step": panel (b), or "tokens": panel (c)) per arm, a marker
    where each arm ends; against steps, also each arm's steps saved, drawn as a dotted line
    from its end to S_small on the small curve."""
    name, xlabel = {"step": ("loss_vs_steps", "optimizer steps"),
                    "tokens": ("loss_vs_tokens", "tokens")}[x]
    fig, axes = _figure(len(groups), PLOTS[name])
    for g, ax in zip(groups, axes, strict=False):
        drawn = False
        for i, a in enumerate(g["arms"]):
            curve = [p for p in g["runs"][a["arm"]]["curve"] if is_finite(p["val_loss"])
                     and p[x] > 0]
            if not curve:
                continue
            color = arm_color(a, i)
            ax.plot([p[x] for p in curve], [p["val_loss"] for p in curve], "-", color=color,
                    label=a["arm"])
            ax.plot([curve[-1][x]], [curve[-1]["val_loss"]], "o", color=color)
            if x == "step" and a["s_small"] is not None and a["val_loss"] is not None:
                ax.plot([a["steps"], a["s_small"]], [a["val_loss"]] * 2, ":", color=color)
                ax.plot([a["s_small"]], [a["val_loss"]], "x", color=color)
            drawn = True
        if x == "step" and g["annealed_points"]:
            points = g["annealed_points"]
            ax.plot([p["step"] for p in points], [p["val_loss"] for p in points], "s",
                    color=ARM_COLORS[SMALL], mfc="none", label=f"{SMALL}: annealed")
        if not drawn:
            plotting.empty_axes(ax, "no validation curve")
        plotting.log_axes(ax)
        plotting.label_axes(ax, xlabel, "validation loss (nats/token)", g["name"], legend=drawn)
    plotting.save_figure(fig, path)


def write_plots(result: dict, out: Path) -> dict[str, str]:
    """Every plot of PLOTS as `<name>.png` in `out`; returns {name: file name}."""
    groups = result["groups"]
    result["warnings"] += plot_batch_vs_tokens(groups, out / "batch_vs_tokens.png")
    plot_val_loss(groups, out / "loss_vs_steps.png", "step")
    plot_val_loss(groups, out / "loss_vs_tokens.png", "tokens")
    return {name: f"{name}.png" for name in PLOTS}
