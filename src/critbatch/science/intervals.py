"""Central intervals of resampled draws: the one place a confidence level turns into
percentiles. numpy only."""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95  # every interval in the report is a central 95% interval
MIN_DRAWS = 20  # fewer finite draws than this give no interval
# a bootstrap's refits at the smoke scale, a pipeline test whose runs of a few dozen steps
# measure nothing (its report and every answer say so): enough to run every path
SMOKE_RESAMPLES = 20


def refits_at(resamples: int | None, scale: str | None) -> int | None:
    """The bootstrap refits to make: `resamples` when given, else SMOKE_RESAMPLES at the
    smoke scale, else None (the fitting code's own default)."""
    return SMOKE_RESAMPLES if resamples is None and scale == "smoke" else resamples


def central_percentiles(confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentiles (in %) that bound the central `confidence` interval: (2.5, 97.5) at
    95%."""
    if not 0 < confidence < 1:
        raise ValueError(f"a confidence level lies between 0 and 1, not {confidence}")
    tail = 100 * (1 - confidence) / 2
    return tail, 100 - tail


def percentile_band(draws, confidence: float = CONFIDENCE, axis: int | None = None):
    """(low, high): the central `confidence` interval of `draws`, along `axis` (a band of
    curves with axis=0); the draws are taken as they are (filter non-finite ones first)."""
    low, high = np.percentile(draws, central_percentiles(confidence), axis=axis)
    return low, high


def percentile_interval(values, confidence: float = CONFIDENCE, log: bool = True
                        ) -> tuple[float | None, float | None]:
    """The central `confidence` interval of draws (None with fewer than MIN_DRAWS finite
    ones); with `log` the draws are of a logged quantity and the interval is exponentiated."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if len(values) < MIN_DRAWS:
        return None, None
    lo, hi = (float(x) for x in percentile_band(values, confidence))
    return (math.exp(lo), math.exp(hi)) if log else (lo, hi)
