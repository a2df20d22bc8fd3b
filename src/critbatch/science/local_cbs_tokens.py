"""The local critical batch in the per-run B_crit's currency: the excess in effective tokens.

The rule of `science.local_cbs` marks where a larger batch first loses measurably, not where
it costs twice the tokens, so it is not the per-run B_crit's currency. `tokens_equivalent`
converts a branch's excess over k = 1 into the tokens the k = 1 branch needed for the same
loss, and the per-run formula (docs/science.md, section 3) into a local B_crit comparable with
the run-averaged ones.

Units: losses in nats/token, batch sizes in sequences, tokens as counted by the trainer.
numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True)
class TokensEquivalent:
    """A branch's excess over k = 1 in effective tokens, and the local B_crit it implies
    (`tokens_equivalent`). An end of the interval that is unbounded, or not given, is None."""

    multiplier: int  # k
    excess: float  # nats/token: the k branch's final loss minus the k = 1 branch's
    effective_tokens: float | None  # tokens after the fork the k = 1 branch needed for it
    ratio: float | None  # r = window tokens / effective_tokens
    b_crit: float | None  # sequences: (k B - B r) / (r - 1), for 1 < r < k only
    b_crit_low: float | None  # sequences: from the excess's upper bound (0: B_crit may be 0)
    b_crit_high: float | None  # sequences: from the excess's lower bound
    note: str | None  # why b_crit is None, or what the interval leaves open


def tokens_equivalent(base_batch_size: int, multiplier: int, fork_tokens: float,
                      window_tokens: float, curve_tokens: ArrayLike, curve_losses: ArrayLike,
                      excess: float,
                      bounds: tuple[float, float] | None = None) -> TokensEquivalent:
    """The local B_crit of branch k in the currency of the per-run B_crit (section 3).

    The tolerance rule says where a larger batch first loses measurably; this says what the
    loss costs. The k = 1 branch's validation loss L_1(t) over the window, at cumulative
    tokens t from the fork t_0 to its end t_0 + W (`curve_tokens`, `curve_losses`: its eval
    points, the first usually the loss at the fork), is interpolated monotonically in log t
    (`science.fits.LossCurve`: PCHIP, points not below every earlier one dropped) and never
    extrapolated. The k branch's final loss L_1(t_0 + W) + `excess` (its excess over k = 1 on
    the same validation sequences, seed-paired where the design allows) is worth

        E_eff = L_1^{-1}(L_1(t_0 + W) + excess) - t_0

    tokens of the k = 1 branch. With r = W / E_eff, E = E_min (1 + k B / B_crit) and
    E_eff = E_min (1 + B / B_crit) give the per-run formula with the baseline b = B
    (`science.laws.bcrit_corrected`): B_crit = (k B - B r) / (r - 1), in sequences.

    - excess <= 0 (r <= 1): no measurable cost; b_crit None, b_crit_low from the upper bound;
    - a loss above the curve's highest (usually the fork's: the branch lost ground): None;
    - r >= k (no better than k = 1 after as many steps): None, worse than the model allows.

    `bounds` = (lower, upper) of the excess give the interval: b_crit_high from the lower,
    b_crit_low from the upper (B_crit falls as the excess rises). Assumptions: B_crit is
    constant over the window (an instantaneous value); the k = 1 curve is exact (its own seed
    scatter is not in the interval). Bias: between eval points the curve is a chord in log
    tokens, above a convex loss curve, so E_eff comes out long, r short and B_crit high; so
    too when the window ends with a cooldown (the curve's inner points are not annealed).
    """
    from critbatch.science.fits import LossCurve
    from critbatch.science.laws import bcrit_corrected

    k, b = int(multiplier), float(base_batch_size)
    if k < 2 or base_batch_size < 1 or not window_tokens > 0:
        raise ValueError(f"k = {multiplier}, B = {base_batch_size}, window {window_tokens}: "
                         "give k >= 2, a base batch >= 1 sequence and a window > 0 tokens")
    few = len(np.atleast_1d(curve_tokens)) < 2
    curve = None if few else LossCurve(curve_tokens, curve_losses, extrapolate=False)
    end = fork_tokens + window_tokens
    if (curve is None or curve.pchip is None
            or not math.isclose(curve.tokens[-1], end, rel_tol=1e-9)):
        return TokensEquivalent(k, excess, None, None, None, None, None, note=(
            "the k = 1 curve over the window does not fall to its end (fewer than two "
            "decreasing points, or the end not the lowest): no effective tokens"))
    low_loss, high_loss = curve.loss_range

    def read(x: float) -> tuple[float | None, float]:
        """(r, B_crit on the extended line: inf for r <= 1, 0 above the curve or r >= k)."""
        if x <= 0:
            return (1.0 if x == 0 else None), math.inf
        if low_loss + x > high_loss:
            return None, 0.0
        e_eff = curve.tokens_for(low_loss + x)[0] - fork_tokens
        if e_eff <= 0:  # the loss at the fork itself: no progress at all
            return None, 0.0
        r = window_tokens / e_eff
        return r, max(0.0, bcrit_corrected(k * b, b, r))

    r, value = read(excess)
    low = read(bounds[1])[1] if bounds else math.inf
    high = read(bounds[0])[1] if bounds else math.inf
    note = None
    if value == math.inf:
        note = "no measurable cost (r <= 1)" + (f"; B_crit > {low:.3g}" if low < math.inf
                                                else "")
    elif r is None:
        note = "the branch ended above the k = 1 curve (above the loss at the fork)"
    elif value == 0:
        note = f"r = {r:.3g} >= k: no better than k = 1 after as many steps"
    elif bounds and high == math.inf:
        note = "interval unbounded above: the excess is within its noise of 0"
    return TokensEquivalent(
        multiplier=k, excess=excess, effective_tokens=None if r is None else window_tokens / r,
        ratio=r, b_crit=value if 0 < value < math.inf else None,
        b_crit_low=low if bounds and low < math.inf else None,
        b_crit_high=high if bounds and high < math.inf else None, note=note)
