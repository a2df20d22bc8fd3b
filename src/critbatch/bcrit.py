"""The critical batch size from finished runs: pure fitting functions, no I/O, no torch.

Three measurements of B_crit (formulas in `../shared/docs/science.md`, sections 1, 3-5):

1. **Tokens-equivalent, per run** (McCandlish et al. 2018). A small-batch baseline b at
   several budgets gives final loss versus tokens, L_b(E). A run with batch B that saw E
   tokens and reached loss L is worth E_eff = L_b^{-1}(L) baseline tokens. With
   E = E_min (1 + B/B_crit), E_eff = E_min (1 + b/B_crit) and r = E / E_eff:
   B_crit = (B - b r) / (r - 1).
2. **Pareto frontier.** For a target loss, each batch size needs E(B) tokens and
   S(B) = E(B) / (B seq_len) steps; S = S_min + E_min / B, so B_crit(L*) = E_min / S_min.
3. **Kaplan's law** (Kaplan et al. 2020, section 5.1): B_crit(L) = B* / L^(1/alpha_B) over
   the estimates above and the measured gradient noise scale B_noise.

Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token unless
a name ends in `_per_byte`; `tokens` are training tokens seen.

`analyse(runs)` runs everything on the runs loaded by `critbatch.runs.load_runs` and returns
plain dicts and lists; `critbatch.report` turns them into files. `synthetic_sweep` writes run
directories generated from the McCandlish model itself (for tests and `benchmark`).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from warnings import catch_warnings, simplefilter

import numpy as np

from critbatch.runs import SCHEMA_VERSION, is_finite, write_json_atomic

GROUP_KEYS = ("data_name", "vocab_size", "seq_len", "width", "depth", "optimizer")
KAPLAN_B_STAR_TOKENS = 2e8  # Kaplan et al. 2020, GPT-2 tokenizer on WebText2
KAPLAN_EXPONENT = 4.8  # 1/alpha_B, alpha_B ~ 0.21
MIN_BASELINE_BUDGETS = 3
CONFIDENCE = 0.95  # every interval in the report is a central 95% interval
PARETO_TARGETS = 5  # target losses per Pareto frontier

# The sweeps that fill each gap (make targets; see sweeps/).
FIX_BASELINE = "`make sweep-batch` (its baseline sweep trains the smallest batch at four budgets)"
FIX_BATCH = "`make sweep-batch` (batch sizes x learning rates at the main budget)"
FIX_PARETO = ("the baseline stage at a second batch size too, e.g. `python -m critbatch.train "
              "--config-dir sweeps --config-name baseline scale=cpu train.batch_size=32`")


# ---------------------------------------------------------------------------------------------
# Grouping


def group_name(key: tuple) -> str:
    """A readable label for a group key (GROUP_KEYS order)."""
    data, vocab, seq_len, width, depth, optimizer = key
    return f"{data} V{vocab} T{seq_len} w{width} d{depth} {optimizer}"


def split_runs(runs: list[dict]) -> tuple[dict[tuple, list[dict]], list[dict], list[str]]:
    """Group comparable runs and leave out the unusable ones.

    Runs are comparable when data, vocabulary, seq_len, width, depth and optimizer agree
    (GROUP_KEYS). Left out, each with a reason: `diverged` (status), `NaN` (a completed run
    whose final loss is not finite), `incomplete` (no eval point or no tokens) and
    `mismatched` (a data fingerprint that differs from the majority of its group: same
    corpus name, different text or tokenizer) and `scheduled batch` (a ramp or adaptive
    batch: no one batch size). Returns (groups, left_out, warnings).
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    left_out, warnings = [], []
    for run in runs:
        where = run.get("run_dir", "?")
        if run["status"] == "diverged":
            step = run.get("diverged_step")
            detail = run.get("status_reason") or "training loss blew up"
            left_out.append({"run_dir": where, "reason": "diverged",
                             "detail": f"{detail}" + (f" at step {step}" if step else "")})
        elif not is_finite(run["val_loss"]):
            left_out.append({"run_dir": where, "reason": "NaN",
                             "detail": f"final val_loss is {run['val_loss']}"})
        elif run.get("batch_schedule", "constant") != "constant":
            left_out.append({"run_dir": where, "reason": "scheduled batch", "detail": (
                f"a {run['batch_schedule']} batch ({run.get('batch_size_start')} -> "
                f"{run.get('batch_size_max', run['batch_size'])} sequences, mean "
                f"{run.get('batch_size_mean', float('nan')):.1f}, {run['steps']:,} steps for "
                f"{run['tokens']:,} tokens) has no single batch size to fit B_crit at; "
                "python analysis/schedules.py compares it by its steps and tokens")})
        elif not run["curve"] or not run["tokens"] or not run["batch_size"]:
            left_out.append({"run_dir": where, "reason": "incomplete",
                             "detail": "no eval point, tokens or batch_size recorded"})
        else:
            groups[tuple(run[k] for k in GROUP_KEYS)].append(run)
    for key, members in list(groups.items()):
        prints = Counter(r["data_fingerprint"] for r in members)
        majority = prints.most_common(1)[0][0]
        keep = [r for r in members if r["data_fingerprint"] == majority]
        for r in members:
            if r["data_fingerprint"] != majority:
                left_out.append({"run_dir": r["run_dir"], "reason": "mismatched",
                                 "detail": f"data_fingerprint differs from the other "
                                           f"{len(keep)} runs of {group_name(key)}"})
        groups[key] = keep
    seq_lens = sorted({k[2] for k in groups})
    if len(seq_lens) > 1:
        warnings.append(f"mixed seq_len {seq_lens}: runs with different contexts are not "
                        "comparable; each seq_len is analysed as its own group")
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0]))), left_out, warnings


# ---------------------------------------------------------------------------------------------
# Best learning rate per cell


def refine_best_lr(lrs: list[float], losses: list[float]) -> tuple[float, float, str | None]:
    """The best learning rate of a grid, refined by a parabola in log(lr).

    Takes the grid minimum and fits the parabola through it and its two neighbours in
    x = log(lr) (exact through three points, any spacing); its vertex is the refined optimum
    (lr*, L*). Assumes the loss is smooth in log(lr) near the optimum. Returns
    (lr*, L*, edge): `edge` is None, or "low"/"high" when the minimum is the first/last grid
    point, in which case (lr*, L*) is that grid point: the true optimum lies outside the
    grid. A single-point grid returns it with edge "single".
    """
    order = np.argsort(lrs)
    grid = np.asarray(lrs, dtype=float)[order]
    x = np.log(grid)
    y = np.asarray(losses, dtype=float)[order]
    i = int(np.argmin(y))
    if len(x) == 1:
        return float(grid[0]), float(y[0]), "single"
    if i == 0 or i == len(x) - 1:
        return float(grid[i]), float(y[i]), "low" if i == 0 else "high"
    (x0, x1, x2), (y0, y1, y2) = x[i - 1 : i + 2], y[i - 1 : i + 2]
    # Newton divided differences: y = y1 + d1 (x - x1) + c (x - x0)(x - x1) ... written at x1.
    s01, s12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c = (s12 - s01) / (x2 - x0)
    if c <= 0:  # flat: no curvature to refine with
        return float(grid[i]), float(y1), None
    slope_at_x1 = s01 + c * (x1 - x0)
    x_star = x1 - slope_at_x1 / (2 * c)
    y_star = y1 - slope_at_x1**2 / (4 * c)
    return float(np.exp(x_star)), float(y_star), None


@dataclass
class Cell:
    """One (batch size, token budget) of a group at its best learning rate."""

    batch_size: int  # sequences
    tokens: int  # training tokens seen
    lr: float  # refined best lr
    loss: float  # nats/token at the refined best lr (mean over seeds)
    loss_sigma: float  # nats/token: seed std error, else the lr refinement's size; NaN: unknown
    bytes_per_token: float
    run_dir: str  # the grid run nearest the optimum
    edge: str | None  # None, "low", "high" or "single" (see refine_best_lr)
    edge_diverged: bool  # the neighbour beyond the edge was tried and diverged
    lrs: list[float] = field(default_factory=list)  # the grid, sorted
    losses: list[float] = field(default_factory=list)  # mean loss per grid lr
    n_seeds: int = 1
    curve: list[dict] = field(default_factory=list)  # eval points of run_dir

    @property
    def loss_per_byte(self) -> float:
        return self.loss / self.bytes_per_token


def best_lr_cells(runs: list[dict], diverged_lrs: dict | None = None) -> list[Cell]:
    """Collapse a group's runs into cells (batch size x tokens), each at its best lr.

    Seeds at the same lr are averaged; the standard error of the mean over seeds at the best
    grid lr is the loss uncertainty, or, with one seed, |grid minimum - refined minimum| (how
    much the refinement moved the answer). `diverged_lrs` maps (batch_size, tokens) to the lrs
    that diverged, to say whether an edge optimum has a diverged neighbour.
    """
    by_cell: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_cell[(run["batch_size"], run["tokens"])][float(run["lr"])].append(run)
    cells = []
    for (batch, tokens), by_lr in sorted(by_cell.items()):
        lrs = sorted(by_lr)
        means = [float(np.mean([r["val_loss"] for r in by_lr[lr]])) for lr in lrs]
        lr_star, loss_star, edge = refine_best_lr(lrs, means)
        i = int(np.argmin(means))
        seeds = [r["val_loss"] for r in by_lr[lrs[i]]]
        if len(seeds) > 1:
            sigma = float(np.std(seeds, ddof=1) / math.sqrt(len(seeds)))
        elif edge is None:
            sigma = abs(means[i] - loss_star)
        else:  # one seed and no refinement: the uncertainty is unknown, not zero
            sigma = float("nan")
        tried = (diverged_lrs or {}).get((batch, tokens), [])
        edge_diverged = (edge == "high" and any(lr > lrs[-1] for lr in tried)) or (
            edge == "low" and any(lr < lrs[0] for lr in tried))
        best_run = by_lr[lrs[i]][0]
        cells.append(Cell(batch_size=int(batch), tokens=int(tokens), lr=lr_star, loss=loss_star,
                          loss_sigma=sigma, bytes_per_token=float(best_run["bytes_per_token"]),
                          run_dir=best_run["run_dir"], edge=edge, edge_diverged=edge_diverged,
                          lrs=lrs, losses=means, n_seeds=len(seeds), curve=best_run["curve"]))
    return cells


# ---------------------------------------------------------------------------------------------
# Loss versus tokens: monotone interpolation, power-law extrapolation, inversion


def fit_power_law(tokens: np.ndarray, losses: np.ndarray) -> tuple[float, float, float] | None:
    """Least-squares fit of L(E) = L_inf + A * E^-alpha (E in tokens, L in nats/token).

    The saturating power law of Kaplan et al. 2020 (their L(D)); unweighted least squares in
    L with L_inf in [0, min L), A > 0, 0 < alpha <= 5, tokens scaled by their maximum for
    conditioning. Needs three points or more; returns (L_inf, A, alpha) or None when the fit
    fails or has too few points.
    """
    from scipy.optimize import OptimizeWarning, curve_fit

    if len(tokens) < 3:
        return None
    scale = float(np.max(tokens))
    u = np.asarray(tokens, dtype=float) / scale
    y = np.asarray(losses, dtype=float)
    lo = float(np.min(y))

    def model(u, l_inf, a, alpha):
        return l_inf + a * u ** (-alpha)

    p0 = (0.8 * lo, max(1e-6, float(np.max(y)) - 0.8 * lo) / 2, 0.5)
    try:
        with catch_warnings():  # 3 points, 3 parameters: no covariance, by design
            simplefilter("ignore", OptimizeWarning)
            (l_inf, a, alpha), _ = curve_fit(model, u, y, p0=p0, maxfev=20000, bounds=(
                [0.0, 0.0, 1e-3], [lo * (1 - 1e-9), np.inf, 5]))
    except (RuntimeError, ValueError):
        return None
    return float(l_inf), float(a * scale**alpha), float(alpha)


class LossCurve:
    """Final loss versus tokens of one batch size (loss decreasing in tokens), and its inverse.

    Inside the measured range: PCHIP (monotone piecewise-cubic Hermite, Fritsch-Carlson) in
    log tokens, which never invents a minimum between points. Outside: the saturating power
    law L = L_inf + A E^-alpha fitted to all points (`fit_power_law`), re-anchored so that it
    passes through the end point it continues (L_inf and alpha from the fit, amplitude from
    the end point), and every value found there is flagged as extrapolated. Points whose loss
    is not below every smaller budget's are dropped (a monotone inverse needs a decreasing
    curve) and listed in `dropped`.
    """

    def __init__(self, tokens, losses, extrapolate: bool = True):
        from scipy.interpolate import PchipInterpolator

        order = np.argsort(tokens)
        e, y = np.asarray(tokens, float)[order], np.asarray(losses, float)[order]
        keep = [0]
        for i in range(1, len(e)):
            if y[i] < y[keep[-1]] and e[i] > e[keep[-1]]:
                keep.append(i)
        self.dropped = [float(e[i]) for i in range(len(e)) if i not in keep]
        self.tokens, self.losses = e[keep], y[keep]
        self.x = np.log(self.tokens)
        self.pchip = PchipInterpolator(self.x, self.losses) if len(keep) >= 2 else None
        self.power_law = fit_power_law(self.tokens, self.losses) if extrapolate else None

    @property
    def loss_range(self) -> tuple[float, float]:
        return float(self.losses[-1]), float(self.losses[0])

    def loss_at(self, tokens: float) -> tuple[float, bool]:
        """(L(E) in nats/token, extrapolated?)."""
        x = math.log(tokens)
        if self.pchip is not None and self.x[0] <= x <= self.x[-1]:
            return float(self.pchip(x)), False
        if self.power_law is None:
            return float("nan"), True
        l_inf, _, alpha = self.power_law
        end = 0 if x < self.x[0] else -1
        return l_inf + (self.losses[end] - l_inf) * (tokens / self.tokens[end]) ** -alpha, True

    def tokens_for(self, loss: float) -> tuple[float, bool]:
        """(E such that L(E) = loss, in tokens; extrapolated?). inf beyond the asymptote."""
        from scipy.optimize import brentq

        lo, hi = self.loss_range
        if self.pchip is not None and lo <= loss <= hi:
            j = int(np.searchsorted(-self.losses, -loss))  # first point with loss <= target
            j = min(max(j, 1), len(self.x) - 1)
            a, b = self.x[j - 1], self.x[j]
            fa, fb = float(self.pchip(a)) - loss, float(self.pchip(b)) - loss
            if fa * fb >= 0:  # the target sits on a node (up to rounding)
                return float(np.exp(a if abs(fa) <= abs(fb) else b)), False
            return float(np.exp(brentq(lambda x: float(self.pchip(x)) - loss, a, b))), False
        if self.power_law is None:
            return float("nan"), True
        l_inf, _, alpha = self.power_law
        if loss <= l_inf:
            return float("inf"), True
        end = -1 if loss < lo else 0
        ratio = (loss - l_inf) / (self.losses[end] - l_inf)
        return float(self.tokens[end] * ratio ** (-1 / alpha)), True


# ---------------------------------------------------------------------------------------------
# B_crit per run (tokens-equivalent analysis)


def bcrit_corrected(batch_size: float, baseline_batch: float, r: float) -> float:
    """B_crit = (B - b r) / (r - 1): McCandlish et al. 2018 with the baseline's own batch.

    From E = E_min (1 + B/B_crit) and E_eff = E_min (1 + b/B_crit), r = E / E_eff. Defined for
    r > 1; r >= B/b gives B_crit <= 0 (the run lost more than the model allows). Units: those
    of B and b.
    """
    return (batch_size - baseline_batch * r) / (r - 1)


def bcrit_naive(batch_size: float, r: float) -> float:
    """B_crit = B / (r - 1): the formula that treats the baseline as an infinitely small batch.

    Overestimates B_crit when b is not far below B_crit; reported only for comparison.
    """
    return batch_size / (r - 1)


def per_run_bcrit(cell: Cell, baseline: LossCurve, baseline_batch: int, baseline_sigma: float,
                  seq_len: int) -> dict:
    """Effective tokens, r and B_crit (with its interval) for one cell against the baseline.

    The loss uncertainty is the cell's `loss_sigma` and the baseline's (`baseline_sigma`,
    the mean over its cells) added in quadrature; the interval is the B_crit of the losses
    L +- 1.96 sigma, inverted through the same baseline curve (None when a sigma is unknown:
    a single lr or an edge optimum with one seed). r <= 1 means no measurable
    cost: `b_crit` is None and `b_crit_low` is the bound implied by the upper end of r (None
    when that end is <= 1 too). An unbounded end of an interval is None.
    """
    z = 1.959963984540054
    sigma = math.hypot(cell.loss_sigma, baseline_sigma)  # NaN when either is unknown
    e_eff, extrapolated = baseline.tokens_for(cell.loss)
    e_hi = e_lo = float("nan")
    if math.isfinite(sigma):
        e_hi, _ = baseline.tokens_for(cell.loss - z * sigma)  # lower loss: more tokens worth
        e_lo, _ = baseline.tokens_for(cell.loss + z * sigma)
    r = cell.tokens / e_eff if e_eff > 0 else float("nan")
    r_hi = cell.tokens / e_lo if e_lo > 0 else float("nan")
    r_lo = cell.tokens / e_hi if e_hi > 0 else float("nan")
    b, B = baseline_batch, cell.batch_size

    def bc(r_value: float) -> float | None:
        if not math.isfinite(r_value) or r_value <= 1:
            return None
        return max(0.0, bcrit_corrected(B, b, r_value))

    b_crit = bc(r)
    note = None
    if not math.isfinite(r):
        note = "outside the baseline's range and no extrapolation possible"
    elif r <= 1:
        low = bc(r_hi)
        note = "no measurable cost" + (f" (B_crit > {low:.3g})" if low else "")
    elif b_crit == 0.0:
        note = f"r = {r:.3g} >= B/b: worse than the model allows (too few steps?)"
    row = {
        "run_dir": cell.run_dir, "batch_size": B, "tokens": cell.tokens, "lr": cell.lr,
        "lr_edge": cell.edge, "val_loss": cell.loss, "val_loss_per_byte": cell.loss_per_byte,
        "val_loss_sigma": sigma,
        "effective_tokens": e_eff if math.isfinite(e_eff) else None,
        "r": r if math.isfinite(r) else None,
        "b_crit": b_crit,
        "b_crit_low": bc(r_hi),
        "b_crit_high": bc(r_lo) if b_crit is not None else None,
        "b_crit_naive": bcrit_naive(B, r) if math.isfinite(r) and r > 1 else None,
        "extrapolated": bool(extrapolated),
        "baseline_batch": b, "note": note,
    }
    for k in ("b_crit", "b_crit_low", "b_crit_high", "b_crit_naive"):
        row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
    return row


def choose_baseline(cells: list[Cell], forced: int | None = None) -> tuple[int | None, str | None]:
    """The baseline batch: the smallest with >= 3 budgets (or `forced` with >= 2).

    Returns (batch size or None, warning or None).
    """
    budgets = Counter(c.batch_size for c in cells)
    if forced is not None:
        if budgets.get(forced, 0) >= 2:
            warn = None if budgets[forced] >= MIN_BASELINE_BUDGETS else (
                f"baseline batch {forced} has only {budgets[forced]} budgets; its curve is a "
                "straight line between them and cannot be extrapolated")
            return forced, warn
        return None, (f"--baseline-batch {forced} has {budgets.get(forced, 0)} budget(s) here; "
                      f"it needs at least 2; run {FIX_BASELINE}")
    for batch in sorted(budgets):
        if budgets[batch] >= MIN_BASELINE_BUDGETS:
            return batch, None
    have = ", ".join(f"{b}: {n}" for b, n in sorted(budgets.items()))
    return None, (f"no batch size has {MIN_BASELINE_BUDGETS} token budgets (budgets per batch "
                  f"size: {have}), so there is no baseline curve and no per-run B_crit; run "
                  f"{FIX_BASELINE}")


# ---------------------------------------------------------------------------------------------
# Pareto frontier S = S_min + E_min / B


def fit_pareto(batch_sizes, steps) -> dict:
    """Fit S(B) = S_min + E_min / B at one target loss (McCandlish et al. 2018, eq. 2.11).

    `batch_sizes` in sequences, `steps` the optimizer steps each needs to reach the target.
    Weighted least squares (scipy `curve_fit`), each point with sigma proportional to its S
    (relative errors: reading E off a loss curve errs by a fraction of E), and the covariance
    scaled by the residuals. B_crit = E_min / S_min (sequences) with a 95% interval from the
    delta method on log B_crit and Student's t (needs three batch sizes or more; with two the
    fit is exact and the intervals are None). Assumes the model holds at this loss.
    """
    from scipy.optimize import curve_fit
    from scipy.stats import t as student_t

    x = 1.0 / np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    n = len(s)
    out = {"n_batch_sizes": n, "s_min": None, "e_min": None, "b_crit": None,
           "b_crit_low": None, "b_crit_high": None, "s_min_low": None, "s_min_high": None,
           "e_min_low": None, "e_min_high": None}
    if n < 2:
        return out
    a = np.stack([np.ones_like(x), x], axis=1) / s[:, None]  # weighted linear system
    (s_min, e_min), *_ = np.linalg.lstsq(a, np.ones_like(s), rcond=None)
    if n > 2:
        (s_min, e_min), cov = curve_fit(lambda x, s0, e0: s0 + e0 * x, x, s,
                                        p0=(s_min, e_min), sigma=s, absolute_sigma=False)
    out.update(s_min=float(s_min), e_min=float(e_min))
    if s_min <= 0 or e_min <= 0:
        return out
    out["b_crit"] = float(e_min / s_min)
    if n > 2 and np.all(np.isfinite(cov)):
        tq = float(student_t.ppf(0.5 + CONFIDENCE / 2, n - 2))
        sd_s, sd_e = math.sqrt(max(cov[0, 0], 0)), math.sqrt(max(cov[1, 1], 0))
        var_log = cov[1, 1] / e_min**2 + cov[0, 0] / s_min**2 - 2 * cov[0, 1] / (e_min * s_min)
        sd_log = math.sqrt(max(var_log, 0.0))
        out.update(b_crit_low=out["b_crit"] * math.exp(-tq * sd_log),
                   b_crit_high=out["b_crit"] * math.exp(tq * sd_log),
                   s_min_low=s_min - tq * sd_s, s_min_high=s_min + tq * sd_s,
                   e_min_low=e_min - tq * sd_e, e_min_high=e_min + tq * sd_e)
    return out


def pareto_frontiers(cells: list[Cell], seq_len: int,
                     optimizer: str) -> tuple[list[dict], str | None]:
    """Pareto fits at PARETO_TARGETS target losses across the range all curves share.

    Uses every batch size with two budgets or more: its final loss versus tokens at the best
    lr (a `LossCurve`, interpolation only). Returns (rows, warning).
    """
    by_batch: dict[int, list[Cell]] = defaultdict(list)
    for c in cells:
        by_batch[c.batch_size].append(c)
    curves = {b: LossCurve([c.tokens for c in cs], [c.loss for c in cs], extrapolate=False)
              for b, cs in sorted(by_batch.items()) if len(cs) >= 2}
    curves = {b: c for b, c in curves.items() if c.pchip is not None}
    if len(curves) < 2:
        return [], (f"Pareto frontier needs two batch sizes with several budgets each "
                    f"({len(curves)} here); run {FIX_PARETO}")
    lo = max(c.loss_range[0] for c in curves.values())
    hi = min(c.loss_range[1] for c in curves.values())
    if lo >= hi:
        return [], ("Pareto frontier: the batch sizes' loss ranges do not overlap; add budgets "
                    f"with {FIX_PARETO}")
    rows = []
    for target in np.linspace(lo, hi, PARETO_TARGETS):
        batches = np.array(sorted(curves))
        tokens = np.array([curves[b].tokens_for(float(target))[0] for b in batches])
        steps = tokens / (batches * seq_len)
        fit = fit_pareto(batches, steps)
        row = {"optimizer": optimizer, "target_loss": float(target), **fit,
               "batch_sizes": batches.tolist(), "steps": steps.tolist(),
               "tokens": tokens.tolist()}
        for k in ("b_crit", "b_crit_low", "b_crit_high", "e_min"):
            row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
        rows.append(row)
    warn = None
    if len(curves) == 2:
        warn = (f"Pareto frontier for {optimizer} rests on two batch sizes: exact fit, no "
                f"confidence interval; add batch sizes with {FIX_PARETO}")
    return rows, warn


# ---------------------------------------------------------------------------------------------
# Kaplan's law and learning-rate scaling


def fit_log_linear(x, y) -> dict | None:
    """Ordinary least squares y = c + k x with 95% Student-t intervals (None with < 2 points).

    Intervals are None with exactly two points (exact fit).
    """
    from scipy.stats import t as student_t

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 2 or np.ptp(x) < 1e-12:
        return None
    a = np.stack([np.ones_like(x), x], axis=1)
    (c, k), *_ = np.linalg.lstsq(a, y, rcond=None)
    out = {"intercept": float(c), "slope": float(k), "n": n, "intercept_sd": None,
           "slope_sd": None, "t": None, "residual_sd": None}
    if n > 2:
        resid = y - a @ np.array([c, k])
        s2 = float(resid @ resid) / (n - 2)
        cov = s2 * np.linalg.inv(a.T @ a)
        out.update(intercept_sd=math.sqrt(cov[0, 0]), slope_sd=math.sqrt(cov[1, 1]),
                   t=float(student_t.ppf(0.5 + CONFIDENCE / 2, n - 2)),
                   residual_sd=math.sqrt(s2))
    return out


def _exp(x: float) -> float | None:
    """exp(x), or None where it overflows a float (an interval too wide to state)."""
    return math.exp(x) if x < 700 else None


def fit_kaplan(losses, b_crit_tokens) -> dict:
    """Fit Kaplan et al. 2020's B_crit(L) = B* / L^(1/alpha_B) (their eq. 5.3).

    Ordinary least squares of log B_crit = log B* - (1/alpha_B) log L, L in nats/token,
    B_crit in tokens, every point weighted equally (each estimate's own uncertainty is not
    used: the scatter between methods dominates). Returns B* (tokens) and the exponent
    1/alpha_B with 95% intervals (None with fewer than three points), next to Kaplan's
    2e8 tokens and 4.8; the constants depend on corpus and tokenizer, the exponent less so.
    """
    out = {"b_star_tokens": None, "b_star_tokens_low": None, "b_star_tokens_high": None,
           "exponent": None, "exponent_low": None, "exponent_high": None,
           "n_points": len(losses), "kaplan_b_star_tokens": KAPLAN_B_STAR_TOKENS,
           "kaplan_exponent": KAPLAN_EXPONENT}
    fit = fit_log_linear(np.log(losses), np.log(b_crit_tokens)) if len(losses) else None
    if fit is None:
        return out
    out.update(b_star_tokens=_exp(fit["intercept"]), exponent=-fit["slope"])
    if fit["t"] is not None:
        t = fit["t"]
        out.update(b_star_tokens_low=_exp(fit["intercept"] - t * fit["intercept_sd"]),
                   b_star_tokens_high=_exp(fit["intercept"] + t * fit["intercept_sd"]),
                   exponent_low=-fit["slope"] - t * fit["slope_sd"],
                   exponent_high=-fit["slope"] + t * fit["slope_sd"])
    return out


def kaplan_prediction_tokens(loss: float, b_star_tokens: float, exponent: float) -> float:
    """B_crit(L) = B* / L^exponent in tokens (L in nats/token)."""
    return b_star_tokens / loss**exponent


def fit_lr_scaling(batch_sizes, lrs) -> dict | None:
    """Best lr versus batch size as a power law, lr* = c B^k (science.md, section 5).

    Least squares of log lr* on log B over the batch sizes below the largest (above B_crit
    the optimum stops growing, so the largest is left out when there are three or more).
    Adam is expected between k = 0.5 and 1, SGD near 1. None with fewer than two points.
    """
    order = np.argsort(batch_sizes)
    b, lr = np.asarray(batch_sizes, float)[order], np.asarray(lrs, float)[order]
    if len(b) >= 3:
        b, lr = b[:-1], lr[:-1]
    fit = fit_log_linear(np.log(b), np.log(lr))
    if fit is None:
        return None
    out = {"exponent": fit["slope"], "exponent_low": None, "exponent_high": None,
           "n_points": fit["n"], "batch_sizes": b.tolist(), "lrs": lr.tolist(),
           "lr_at_1": math.exp(fit["intercept"])}
    if fit["t"] is not None:
        out.update(exponent_low=fit["slope"] - fit["t"] * fit["slope_sd"],
                   exponent_high=fit["slope"] + fit["t"] * fit["slope_sd"])
    return out


# ---------------------------------------------------------------------------------------------
# The whole analysis


def noise_points(runs: list[dict]) -> list[dict]:
    """B_noise measurements: noise.json (kind `b_noise`) and the online tracker's
    summary keys `b_noise`, `b_noise_tokens`, `b_noise_loss` (kind `b_noise_online`)."""
    points = []
    for run in runs:
        group = group_name(tuple(run[k] for k in GROUP_KEYS))
        noise = run.get("noise")
        if noise and noise.get("resolved") and is_finite(noise.get("b_noise_tokens")):
            points.append({
                "kind": "b_noise", "run_dir": run["run_dir"], "group": group,
                "loss": noise["val_loss"],
                "loss_per_byte": noise["val_loss_per_byte"], "b_noise": noise["b_noise"],
                "b_noise_tokens": noise["b_noise_tokens"], "b_noise_low": noise["b_noise_low"],
                "b_noise_high": noise["b_noise_high"], "trace": noise["trace"],
                "g2": noise["g2"], "micro_batches": noise["micro_batches"],
                "interval": noise.get("interval") or "as written by the noise program",
                "micro_batch_size": noise["micro_batch_size"]})
        elif noise is not None:
            points.append({"kind": "b_noise", "run_dir": run["run_dir"], "unresolved": True,
                           "micro_batches": noise.get("micro_batches")})
        if is_finite(run.get("b_noise_tokens")) and is_finite(run.get("b_noise_loss")) and (
                run["b_noise_tokens"] > 0):
            points.append({
                "kind": "b_noise_online", "run_dir": run["run_dir"], "group": group,
                "loss": run["b_noise_loss"],
                "loss_per_byte": run["b_noise_loss"] / run["bytes_per_token"],
                "b_noise": run.get("b_noise"), "b_noise_tokens": run["b_noise_tokens"],
                "b_noise_low": None, "b_noise_high": None})
    return points


def analyse(runs: list[dict], baseline_batch: int | None = None,
            left_out: list[dict] | None = None, warnings: list[str] | None = None) -> dict:
    """Every fit of the report, from loaded runs (see module docstring).

    Returns a dict with `groups` (per group: key, cells, baseline curve, per-run rows,
    Pareto rows, lr scaling), the public `fits` (per_run, pareto, kaplan, lr_scaling,
    warnings), `left_out` and `noise`. Never raises on thin data: what cannot be computed is
    named in the warnings together with the sweep that fills it.
    """
    warnings = list(warnings or [])
    groups, dropped, split_warnings = split_runs(runs)
    left_out = list(left_out or []) + dropped
    warnings += split_warnings
    if dropped:
        counts = Counter(d["reason"] for d in dropped)
        warnings.append("left out: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                        + " (see the table of left-out runs)")
    diverged = defaultdict(list)
    for run in runs:
        if run["status"] == "diverged":
            diverged[(tuple(run[k] for k in GROUP_KEYS), run["batch_size"], run["tokens"])].append(
                float(run["lr"]))
    per_run, pareto, out_groups = [], [], []
    lr_by_opt: dict[str, list] = defaultdict(list)
    for key, members in groups.items():
        name = group_name(key)
        seq_len, optimizer = key[2], key[5]
        cells = best_lr_cells(members, {(b, t): v for (k, b, t), v in diverged.items()
                                        if k == key})
        for c in cells:
            if c.edge in ("low", "high"):
                why = ("the next lr diverged" if c.edge_diverged else "widen the lr grid")
                warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens has its "
                                f"best lr on the {c.edge} edge of the grid ({c.lr:.3g}); {why}")
        single = [c for c in cells if c.edge == "single"]
        if single:
            warnings.append(f"{name}: {len(single)} of {len(cells)} cells were trained at one lr "
                            "only: their loss is not at a tuned lr and has no uncertainty")
        batches = sorted({c.batch_size for c in cells})
        g = {"key": dict(zip(GROUP_KEYS, key, strict=True)), "name": name, "cells": cells,
             "n_runs": len(members), "batch_sizes": batches,
             "budgets": sorted({c.tokens for c in cells}), "baseline_batch": None,
             "baseline": None, "per_run": [], "pareto": [], "lr_scaling": None,
             "sweep": Counter(r["sweep"] for r in members).most_common(1)[0][0]}
        out_groups.append(g)
        if len(batches) < 2:
            warnings.append(f"{name}: one batch size only ({batches[0]}); B_crit needs several: "
                            f"run {FIX_BATCH}")
        b, warn = choose_baseline(cells, baseline_batch)
        if warn:
            warnings.append(f"{name}: {warn}")
        if b is not None:
            base_cells = [c for c in cells if c.batch_size == b]
            curve = LossCurve([c.tokens for c in base_cells], [c.loss for c in base_cells])
            if curve.dropped:
                warnings.append(f"{name}: baseline loss does not fall with tokens at "
                                f"{curve.dropped}; those budgets were dropped from its curve")
            sigma_b = float(np.mean([c.loss_sigma for c in base_cells]))  # NaN if any unknown
            g.update(baseline_batch=b, baseline=curve)
            others = [c for c in cells if c.batch_size != b]
            if not others:
                warnings.append(f"{name}: only the baseline batch {b} was trained; run "
                                f"{FIX_BATCH}")
            for c in others:
                row = per_run_bcrit(c, curve, b, sigma_b, seq_len)
                row.update(optimizer=optimizer, group=name)
                g["per_run"].append(row)
                if row["extrapolated"]:
                    warnings.append(f"{name}: batch {c.batch_size} at {c.tokens:,} tokens: "
                                    "effective tokens extrapolated beyond the baseline's "
                                    "budgets (power law)")
            per_run += g["per_run"]
        rows, warn = pareto_frontiers(cells, seq_len, optimizer)
        if warn and len(batches) >= 2:
            warnings.append(f"{name}: {warn}")
        for row in rows:
            row["group"] = name
        g["pareto"] = rows
        pareto += rows
        # lr scaling: at the budget shared by the most batch sizes (the largest such budget)
        budgets = Counter(c.tokens for c in cells)
        if budgets:
            best_budget = max(budgets, key=lambda t: (budgets[t], t))
            pts = [c for c in cells if c.tokens == best_budget and c.edge is None]
            if len(pts) >= 2:
                lr_by_opt[optimizer].append((len(pts), name, pts))
    lr_scaling = {}
    for opt, options in sorted(lr_by_opt.items()):
        _, name, pts = max(options, key=lambda o: o[0])
        fit = fit_lr_scaling([c.batch_size for c in pts], [c.lr for c in pts])
        if fit:
            lr_scaling[opt] = {**fit, "group": name}
            for g in out_groups:
                if g["name"] == name:
                    g["lr_scaling"] = lr_scaling[opt]
    if not lr_scaling and groups:
        warnings.append("lr scaling: no group has two batch sizes with an interior best lr at "
                        f"one budget; run {FIX_BATCH}")
    noise = noise_points(runs)
    for p in noise:
        if p.get("unresolved"):
            warnings.append(f"B_noise not resolved in {p['run_dir']} (|G|^2 <= 0 with "
                            f"K = {p['micro_batches']}); increase K")
    kaplan = kaplan_analysis(groups, per_run, pareto, [p for p in noise if "loss" in p],
                             warnings)
    return {"groups": out_groups, "left_out": left_out, "noise": noise, "n_runs": len(runs),
            "fits": {"per_run": per_run, "pareto": pareto, "kaplan": kaplan,
                     "lr_scaling": lr_scaling, "warnings": warnings}}


def kaplan_analysis(groups: dict, per_run: list[dict], pareto: list[dict], noise: list[dict],
                    warnings: list[str]) -> dict:
    """Collect B_crit(L) points of every kind and fit Kaplan's law over them (`fit_kaplan`).

    Points: per-run B_crit (at the run's loss), Pareto B_crit (at the target loss), B_noise
    (noise.json and online, at the loss measured with it); all in tokens and nats/token. Only
    one corpus and vocabulary can share a fit (the loss scale depends on them): the one with
    the most runs; a warning names any other left out.
    """
    points = []
    for row in per_run:
        if row["b_crit_tokens"]:
            points.append({"kind": "per_run", "loss": row["val_loss"], "group": row["group"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": row["run_dir"]})
    for row in pareto:
        if row["b_crit_tokens"]:
            points.append({"kind": "pareto", "loss": row["target_loss"], "group": row["group"],
                           "b_crit_tokens": row["b_crit_tokens"], "run_dir": None})
    for p in noise:
        points.append({"kind": p["kind"], "loss": p["loss"], "group": p["group"],
                       "b_crit_tokens": p["b_noise_tokens"], "run_dir": p["run_dir"]})
    corpora = Counter()
    for key, members in groups.items():
        corpora[key[:2]] += len(members)
    if len(corpora) > 1:
        keep = corpora.most_common(1)[0][0]
        names = {group_name(k) for k in groups if k[:2] == keep}
        warnings.append(f"Kaplan fit uses {keep[0]} V{keep[1]} only; losses of other corpora or "
                        "vocabularies are on another scale")
        points = [p for p in points if p["group"] in names]
    fit = fit_kaplan([p["loss"] for p in points], [p["b_crit_tokens"] for p in points])
    fit["n_by_kind"] = dict(Counter(p["kind"] for p in points))
    for p in points:
        p["kaplan_tokens"] = kaplan_prediction_tokens(p["loss"], KAPLAN_B_STAR_TOKENS,
                                                      KAPLAN_EXPONENT)
        p["fit_tokens"] = (kaplan_prediction_tokens(p["loss"], fit["b_star_tokens"],
                                                    fit["exponent"])
                           if fit["exponent"] is not None else None)
    fit["points"] = points
    if fit["exponent"] is None:
        warnings.append(f"Kaplan fit needs B_crit at two losses or more ({len(points)} "
                        f"point(s)); run {FIX_PARETO} for B_crit across losses")
    elif fit["exponent_low"] is None:
        warnings.append("Kaplan fit rests on two points: no interval")
    return fit


# ---------------------------------------------------------------------------------------------
# Synthetic sweeps from the McCandlish model (tests and benchmark)


@dataclass
class SyntheticTruth:
    """The model a synthetic sweep is generated from (losses in nats/token)."""

    b_crit: float = 200.0  # sequences
    l_inf: float = 2.0  # L(E_min) = l_inf + a (E_min / 1e6)^-alpha
    a: float = 1.5
    alpha: float = 0.35
    lr_base: float = 1e-3  # best lr at batch 16
    lr_exponent: float = 0.7  # best lr grows as B^lr_exponent
    lr_curvature: float = 0.05  # loss penalty per (ln lr - ln lr*)^2, nats/token
    seq_len: int = 64
    bytes_per_token: float = 3.0

    def loss_of_min_tokens(self, e_min_tokens: float) -> float:
        return self.l_inf + self.a * (e_min_tokens / 1e6) ** -self.alpha

    def final_loss(self, batch_size: float, tokens: float) -> float:
        """L(E / (1 + B / B_crit)): McCandlish et al.'s E = E_min (1 + B/B_crit)."""
        return self.loss_of_min_tokens(tokens / (1 + batch_size / self.b_crit))

    def best_lr(self, batch_size: float) -> float:
        return self.lr_base * (batch_size / 16) ** self.lr_exponent


def synthetic_summary(truth: SyntheticTruth, *, batch_size: int, tokens: int, lr: float,
                      optimizer: str = "adamw", width: int = 64, seed: int = 0,
                      loss_offset: float = 0.0, status: str = "completed",
                      sweep: str = "synthetic") -> dict:
    """A complete summary.json (every SUMMARY_KEYS key) for one synthetic run."""
    steps = tokens // (batch_size * truth.seq_len)
    final = truth.final_loss(batch_size, tokens) + loss_offset + truth.lr_curvature * (
        math.log(lr) - math.log(truth.best_lr(batch_size))) ** 2
    curve = []
    for frac in (0.125, 0.25, 0.5, 1.0):
        s = max(1, int(steps * frac))
        t = s * batch_size * truth.seq_len
        loss = truth.final_loss(batch_size, t) + (final - truth.final_loss(batch_size, tokens))
        curve.append({"step": s, "tokens": t, "val_loss": loss,
                      "val_loss_per_byte": loss / truth.bytes_per_token})
    diverged = status == "diverged"
    return {
        "schema_version": SCHEMA_VERSION, "status": status, "sweep": sweep, "seed": seed,
        "optimizer": optimizer, "lr": lr, "width": width, "depth": 2, "heads": 2,
        "seq_len": truth.seq_len, "vocab_size": 2048, "params": 250_000,
        "params_nonembedding": 100_000, "batch_size": batch_size,
        "micro_batch_size": batch_size, "steps": steps, "tokens": steps * batch_size *
        truth.seq_len, "warmup_steps": 20, "schedule": "cosine",
        "bytes_per_token": truth.bytes_per_token,
        "val_loss": float("nan") if diverged else final,
        "val_loss_per_byte": float("nan") if diverged else final / truth.bytes_per_token,
        "curve": [] if diverged else curve, "wall_time_s": 1.0, "tokens_per_s": 1e5,
        "data_name": "synthetic", "data_fingerprint": "f" * 64, "git_revision": "synthetic",
        "critbatch_version": "0.1.0", "status_reason": "loss > 3x" if diverged else None,
        "diverged_step": 5 if diverged else None,
    }


def synthetic_sweep(root: str | Path, truth: SyntheticTruth | None = None, *,
                    baseline_batch: int = 16, batch_sizes=(64, 128, 256, 512, 1024, 2048),
                    budgets_tokens=(2**21, 2**22, 2**23, 2**24), all_budgets: bool = False,
                    lr_multipliers=(0.5, 1.0, 2.0), optimizers=("adamw",), widths=(64,),
                    seeds=(0,), seed_loss_offsets=None, lr_grid_shift: float = 0.3,
                    diverged_high_lr: bool = False, sweep: str = "synthetic") -> SyntheticTruth:
    """Write run directories generated from the McCandlish model; return the truth.

    The baseline batch runs at every budget, each other batch size at the largest (or at
    every budget with `all_budgets`, for the Pareto frontier). Each cell is a grid of
    learning rates `best_lr(B) * 2^-lr_grid_shift * lr_multipliers` (so the optimum falls
    between grid points), each with loss `final_loss(B, E) + c (ln lr - ln lr*)^2`, plus
    `seed_loss_offsets[i]` for seed i. `diverged_high_lr` adds, per cell, a run at 4x the
    largest lr that diverged. Directory layout: root/<sweep>/<opt>_w<width>/b<B>_t<E>_lr<i>_s<seed>.
    """
    truth = truth or SyntheticTruth()
    root = Path(root)
    offsets = seed_loss_offsets or [0.0] * len(seeds)
    cells = [(baseline_batch, t) for t in budgets_tokens]
    for b in batch_sizes:
        cells += [(b, t) for t in (budgets_tokens if all_budgets else budgets_tokens[-1:])]
    for opt in optimizers:
        for width in widths:
            for batch, tokens in cells:
                center = truth.best_lr(batch) * 2.0**-lr_grid_shift
                grid = [(i, center * m, "completed") for i, m in enumerate(lr_multipliers)]
                if diverged_high_lr:
                    grid.append((len(grid), center * max(lr_multipliers) * 4, "diverged"))
                for i, lr, status in grid:
                    for seed, offset in zip(seeds, offsets, strict=True):
                        summary = synthetic_summary(
                            truth, batch_size=batch, tokens=tokens, lr=lr, optimizer=opt,
                            width=width, seed=seed, loss_offset=offset, status=status,
                            sweep=sweep)
                        name = f"b{batch}_t{tokens}_lr{i}_s{seed}"
                        run_dir = root / sweep / f"{opt}_w{width}" / name
                        run_dir.mkdir(parents=True, exist_ok=True)
                        write_json_atomic(run_dir / "summary.json", summary)
    return truth


def benchmark(root: str | Path, n_runs: int = 1000) -> dict:
    """Time loading + analysing about `n_runs` synthetic runs (no report files); seconds."""
    from critbatch.runs import load_runs

    n_batches = 6
    per_width = (4 + n_batches) * 3 * 2  # cells x lrs x optimizers
    widths = tuple(64 * (i + 1) for i in range(max(1, round(n_runs / per_width))))
    synthetic_sweep(root, optimizers=("adamw", "muon"), widths=widths)
    t0 = time.perf_counter()
    loaded = load_runs([root], progress=False)
    t1 = time.perf_counter()
    result = analyse(loaded["runs"], left_out=loaded["left_out"])
    t2 = time.perf_counter()
    return {"n_runs": len(loaded["runs"]), "load_s": t1 - t0, "analyse_s": t2 - t1,
            "n_per_run": len(result["fits"]["per_run"])}
