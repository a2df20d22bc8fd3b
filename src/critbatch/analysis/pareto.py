"""The steps/examples Pareto frontier of one group's cells (docs/science.md, section 3).

For a target loss L*, each batch size B needs E(B) tokens and S(B) = E(B) / (B seq_len)
optimizer steps; McCandlish et al. 2018 give S = S_min + E_min / B, so a straight-line fit of
S against 1/B gives S_min, E_min and B_crit(L*) = E_min / S_min (`science.laws.fit_pareto`).

E(B) is read off each batch size's final loss versus tokens at the best lr (its cells at every
budget, a `LossCurve` without extrapolation): a batch size enters the fit at L* only when its
curve reaches L* within its budgets. Targets are not confined to the loss range that every
batch size shares: they span the range where at least `PARETO_MIN_BATCHES` batch sizes reach
(four: a fit of two parameters on three points has one degree of freedom, and its 95% interval,
Student's t of 12.7, spanned more than a factor 100 in 9 of the 11 three-point fits of the cpu
sweeps of 2026-12-01; three where nowhere do four reach, two where nowhere do three: an exact
fit without an interval), each fit with the batch sizes that reach its target. With cooldown
branches every batch size has four budgets, so the frontier spans most of the losses the sweep
saw.

Units: batch sizes and E_min in sequences unless a name ends in `_tokens`; S_min in optimizer
steps; losses in nats/token.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from critbatch.science.fits import LossCurve
from critbatch.science.laws import fit_pareto, pareto_degeneracy

PARETO_TARGETS = 5  # target losses per Pareto frontier
PARETO_MIN_BATCHES = 4  # batch sizes that must reach a target (fewer where none reach)
PARETO_MAX_INTERVAL_FACTOR = 100.0  # a Pareto B_crit interval wider than this is degenerate


def pareto_interval_label(n_batch_sizes: int) -> str:
    """What a Pareto B_crit interval is (`fit_pareto`), for a fit on `n_batch_sizes` points."""
    if n_batch_sizes <= 2:
        return "none: two batch sizes are an exact fit"
    return ("95%, delta method on log B_crit with Student's t (batch sizes - 2 dof) from the "
            "scatter of S about S_min + E_min/B")


def pareto_row(batch_sizes, steps, seq_len: int, optimizer: str, target_loss: float,
               tokens=None) -> dict:
    """One Pareto fit (`fit_pareto`) at `target_loss` with its points (`tokens` default to
    steps x batch x seq_len), its `_tokens` twins, what its interval is (`interval`) and its
    degeneracy (`pareto_degeneracy`; None when it stands)."""
    batches = np.asarray(batch_sizes, dtype=float)
    steps = np.asarray(steps, dtype=float)
    fit = fit_pareto(batches, steps)
    tokens = steps * batches * seq_len if tokens is None else np.asarray(tokens, dtype=float)
    row = {"optimizer": optimizer, "target_loss": float(target_loss), **fit,
           "batch_sizes": [int(b) for b in batches], "steps": steps.tolist(),
           "tokens": tokens.tolist(),
           "degenerate": pareto_degeneracy(fit, PARETO_MAX_INTERVAL_FACTOR),
           "interval": pareto_interval_label(len(batches))}
    for k in ("b_crit", "b_crit_low", "b_crit_high", "e_min"):
        row[f"{k}_tokens"] = None if row[k] is None else row[k] * seq_len
    return row


def batch_curves(cells: list) -> dict[int, LossCurve]:
    """Per batch size with two budgets or more, its final loss versus tokens at the best lr
    (`bcrit.Cell`s; interpolation only). Cells of too few steps for their warmup
    (`few_steps`) are left out: their loss measures the warmup, not the batch."""
    by_batch: dict[int, list] = defaultdict(list)
    for c in cells:
        if not c.few_steps:
            by_batch[c.batch_size].append(c)
    curves = {b: LossCurve([c.tokens for c in cs], [c.loss for c in cs], extrapolate=False)
              for b, cs in sorted(by_batch.items()) if len(cs) >= 2}
    return {b: c for b, c in curves.items() if c.pchip is not None}


def covered_segments(ranges: list[tuple[float, float]], k: int) -> list[tuple[float, float]]:
    """The loss segments (low, high), ascending and merged, that `k` or more of the closed
    `ranges` (low, high) cover; segments of zero length are left out."""
    edges = sorted({x for r in ranges for x in r})
    segments: list[tuple[float, float]] = []
    for a, b in zip(edges, edges[1:], strict=False):
        if sum(lo <= a and b <= hi for lo, hi in ranges) < k:
            continue
        if segments and segments[-1][1] == a:
            segments[-1] = (segments[-1][0], b)
        else:
            segments.append((a, b))
    return segments


def spread_targets(segments: list[tuple[float, float]], n: int) -> list[float]:
    """`n` losses, ascending, at the midpoints of `n` equal slices of the segments' total
    length (the ends themselves are where the fewest batch sizes reach)."""
    total = sum(b - a for a, b in segments)
    targets = []
    for i in range(n):
        pos = (i + 0.5) / n * total
        for a, b in segments:
            if pos <= b - a:
                targets.append(a + pos)
                break
            pos -= b - a
    return targets


def pareto_frontiers(cells: list, seq_len: int, optimizer: str,
                     fix_hint: str) -> tuple[list[dict], str | None]:
    """Pareto fits at PARETO_TARGETS target losses of one group's `cells` (`bcrit.Cell`).

    The targets span the losses that PARETO_MIN_BATCHES batch sizes or more reach (fewer,
    down to two, where nowhere do that many: `spread_targets` of `covered_segments`); each
    fit uses every batch size whose curve (`batch_curves`) reaches its target, listed in the
    row's `batch_sizes`, and records the rule in `min_batch_sizes`. `fix_hint`: what fills a
    gap (`FixHints.pareto`, formatted with `batch` and `more`). Returns (rows, warning).
    """
    curves = batch_curves(cells)
    batches = sorted({c.batch_size for c in cells})
    if len(curves) < 2:
        return [], (f"Pareto frontier needs two batch sizes with several budgets each "
                    f"({len(curves)} here); " + fix_hint.format(batch=max(batches), more=2))
    ranges = {b: c.loss_range for b, c in curves.items()}
    for need in range(PARETO_MIN_BATCHES, 1, -1):
        segments = covered_segments(list(ranges.values()), need)
        if segments:
            break
    if not segments:
        return [], ("Pareto frontier: the batch sizes' loss ranges do not overlap; "
                    + fix_hint.format(batch=max(curves), more=1))
    rows = []
    for target in spread_targets(segments, PARETO_TARGETS):
        reach = np.array([b for b, (lo, hi) in ranges.items() if lo <= target <= hi])
        tokens = np.array([curves[b].tokens_for(target)[0] for b in reach])
        row = pareto_row(reach, tokens / (reach * seq_len), seq_len, optimizer, target, tokens)
        rows.append({**row, "min_batch_sizes": need})
    warn = None
    if need == 2:
        warn = (f"Pareto frontier for {optimizer} rests on two batch sizes: exact fit, no "
                "confidence interval; " + fix_hint.format(batch=max(curves), more=2))
    return rows, warn
