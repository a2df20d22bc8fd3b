"""The steps/examples Pareto frontier of one group's cells (docs/science.md, section 3).

For a target loss L*, each batch size B needs E(B) tokens and S(B) = E(B) / (B seq_len)
optimizer steps; McCandlish et al. 2018 give S = S_min + E_min / B, so a straight-line fit of
S against 1/B gives S_min, E_min and B_crit(L*) = E_min / S_min (`science.laws.fit_pareto`).

E(B) is read off each batch size's final loss versus tokens at the best lr (its cells at every
budget but those of too few steps for their warmup, a `LossCurve` without extrapolation): a
batch size can enter the fit at L* only when its curve reaches L* within its budgets.

All targets of one group (one model and optimizer) are fitted from ONE set of batch sizes
(`batch_set`): the largest set whose curves all reach a common range of losses, the widest
such range among sets of that size; the PARETO_TARGETS targets spread over that range. Letting
each target take every batch size that reaches it instead made neighbouring targets rest on
different sets, and B_crit(L) jump where the set changed (cpu sweep of 2026-12-01, width 48:
batches 8-64 at 5.464 nats/token, 16-128 at 5.694). The most batch sizes come first because
the fit has two parameters: on three points its 95% interval (Student's t of 12.7) spanned
more than a factor 100 in 9 of the 11 three-point fits of those sweeps, and two points are an
exact fit without an interval.

Units: batch sizes and E_min in sequences unless a name ends in `_tokens`; S_min in optimizer
steps; losses in nats/token.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from critbatch.science.fits import LossCurve
from critbatch.science.laws import fit_pareto, pareto_degeneracy

PARETO_TARGETS = 5  # target losses per Pareto frontier
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
    (`best_lr.Cell`s; interpolation only). Cells of too few steps for their warmup
    (`few_steps`) are left out: their loss measures the warmup, not the batch."""
    by_batch: dict[int, list] = defaultdict(list)
    for c in cells:
        if not c.few_steps:
            by_batch[c.batch_size].append(c)
    curves = {b: LossCurve([c.tokens for c in cs], [c.loss for c in cs], extrapolate=False)
              for b, cs in sorted(by_batch.items()) if len(cs) >= 2}
    return {b: c for b, c in curves.items() if c.pchip is not None}


def batch_set(ranges: dict[int, tuple[float, float]]
              ) -> tuple[list[int], tuple[float, float]] | None:
    """The batch sizes whose loss ranges (low, high) all cover one common range of positive
    length, and that range: the most batch sizes, then the widest range (then the lowest
    losses). None when no two ranges overlap.

    A set with a common range covers one of the elementary segments between consecutive
    range ends, and every range covering that segment shares the set's property, so the
    largest sets are the covers of those segments: checking each segment's cover is enough.
    """
    edges = sorted({x for r in ranges.values() for x in r})
    best = None
    for a, b in zip(edges, edges[1:], strict=False):
        members = [batch for batch, (lo, hi) in ranges.items() if lo <= a and b <= hi]
        if len(members) < 2:
            continue
        low = max(ranges[m][0] for m in members)
        high = min(ranges[m][1] for m in members)
        key = (len(members), high - low)
        if best is None or key > best[0]:
            best = (key, sorted(members), (low, high))
    return None if best is None else (best[1], best[2])


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
    """Pareto fits at PARETO_TARGETS target losses of one group's `cells` (`best_lr.Cell`).

    Every fit uses the same batch sizes (`batch_set` of the curves of `batch_curves`), listed
    in each row's `batch_sizes` (and counted in `min_batch_sizes`, the name of the rule this
    replaced), at targets spread over the losses they all reach (`spread_targets`). The
    warning names batch sizes with a curve that the set leaves out, and a set of two (an exact
    fit). `fix_hint`: what fills a gap (`FixHints.pareto`, formatted with `batch` and `more`).
    Returns (rows, warning).
    """
    curves = batch_curves(cells)
    batches = sorted({c.batch_size for c in cells})
    if len(curves) < 2:
        return [], (f"Pareto frontier needs two batch sizes with several budgets each "
                    f"({len(curves)} here); " + fix_hint.format(batch=max(batches), more=2))
    ranges = {b: c.loss_range for b, c in curves.items()}
    chosen = batch_set(ranges)
    if chosen is None:
        return [], ("Pareto frontier: the batch sizes' loss ranges do not overlap; "
                    + fix_hint.format(batch=max(curves), more=1))
    members, (low, high) = chosen
    reach = np.array(members)
    rows = []
    for target in spread_targets([(low, high)], PARETO_TARGETS):
        tokens = np.array([curves[b].tokens_for(target)[0] for b in members])
        row = pareto_row(reach, tokens / (reach * seq_len), seq_len, optimizer, target, tokens)
        rows.append({**row, "min_batch_sizes": len(members)})
    warns = []
    left = [b for b in curves if b not in members]
    if left:
        warns.append(f"Pareto frontier for {optimizer} fits batch sizes {members} at every "
                     f"target ({low:.4f}-{high:.4f} nats/token, the losses they all reach); "
                     f"{left} left out: their curves do not reach all of those losses")
    if len(members) == 2:
        warns.append(f"Pareto frontier for {optimizer} rests on two batch sizes: exact fit, no "
                     "confidence interval; " + fix_hint.format(batch=max(curves), more=2))
    return rows, "; ".join(warns) or None
