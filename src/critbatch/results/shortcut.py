"""The noise scale's shortcut to B_crit: B_noise at a checkpoint times the ratio B_crit / B_noise
a sweep measured (fits.json `noise_ratio.<optimizer>`, `analysis.bcrit.noise_ratio`).

McCandlish et al. (2018) propose reading B_crit off B_noise; critbatch calibrates the
proposal: a sweep measures B_crit(L) / B_noise(L) at matched losses, with the tracker read at
the peak lr, and `estimate` carries it to a checkpoint with an interval. The estimate is
trusted (`b_crit_estimate_valid`) only where the checkpoint's loss lies in the losses the
ratio was measured at and its lr had not decayed: a cooldown's B_noise is not the one the
ratio was calibrated on. Units: sequences; losses in nats/token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

Z95 = 1.959964


def ratio_from(fits_path: Path, optimizer: str) -> tuple[dict | None, str]:
    """(`noise_ratio.<optimizer>` of a fits.json, or None; why not, when None)."""
    try:
        doc = json.loads(fits_path.read_text())
    except (OSError, ValueError) as err:
        return None, f"{fits_path} is not readable ({type(err).__name__})"
    ratio = (doc.get("noise_ratio") or {}).get(optimizer)
    if ratio is None:
        return None, (f"{fits_path} has no noise_ratio for {optimizer} (an older report: run "
                      "fit_bcrit on the sweep again)")
    if ratio.get("ratio") is None:
        return None, f"{fits_path}: {optimizer}'s ratio was not measured ({ratio['left_out']})"
    return ratio, ""


def sweep_fits(run_dir: Path) -> Path:
    """Where a sweep run's report lies: <sweep folder>/report/fits.json (a cooldown branch's
    sweep folder is its parent run's)."""
    folder = run_dir.parent
    if folder.name == "branches":
        folder = folder.parent.parent
    return folder / "report" / "fits.json"


def times_ratio(value: float, sd_log: float, ratio: dict) -> tuple[float, float | None,
                                                                  float | None]:
    """(value x ratio, its 95% interval): the ratio's 95% bootstrap interval (as a normal of
    the same width in log) and `value`'s own log sd (one sigma), combined in log; no bounds
    where `value`'s sd is infinite."""
    sd = math.hypot(math.log(ratio["high"] / ratio["low"]) / (2 * Z95), sd_log)
    centre = ratio["ratio"] * value
    if not math.isfinite(sd):
        return centre, None, None
    return centre, centre * math.exp(-Z95 * sd), centre * math.exp(Z95 * sd)


def estimate(b_noise: float | None, b_noise_high: float | None, loss: float, decayed: bool,
             ratio: dict | None, source: str, reason: str) -> dict:
    """noise.json's shortcut fields: `b_crit_estimate` (sequences) with its 95% interval,
    `ratio_source` (which sweep's ratio, its losses), `b_crit_estimate_valid` and its
    `b_crit_estimate_note`. The interval combines, in log, the ratio's 95% bootstrap (as a
    normal of the same width) and B_noise's 68% jackknife (one sigma)."""
    out = {"b_crit_estimate": None, "b_crit_estimate_low": None, "b_crit_estimate_high": None,
           "ratio_source": None, "b_crit_estimate_valid": False,
           "b_crit_estimate_note": reason}
    if ratio is None:
        return out
    out["ratio_source"] = {"fits": source, "ratio": ratio["ratio"], "low": ratio["low"],
                           "high": ratio["high"], "losses": ratio["losses"],
                           "interval": ratio.get("interval")}
    if b_noise is None:
        out["b_crit_estimate_note"] = "B_noise is not resolved at this checkpoint (increase K)"
        return out
    sd_noise = math.log(b_noise_high / b_noise) if b_noise_high else math.inf
    centre, low, high = times_ratio(b_noise, sd_noise, ratio)
    lo, hi = ratio["losses"]
    notes = []
    if not lo <= loss <= hi:
        notes.append(f"the checkpoint's loss {loss:.4f} lies outside the losses the ratio was "
                     f"measured at ({lo:.4f}-{hi:.4f} nats/token): an extrapolation")
    if decayed:
        notes.append("the checkpoint was taken after its lr decayed; the ratio was measured "
                     "with B_noise at the peak lr, and a cooldown raises B_noise: measure a "
                     "checkpoint from the constant-lr phase")
    out.update(b_crit_estimate=centre, b_crit_estimate_low=low, b_crit_estimate_high=high,
               b_crit_estimate_valid=not notes,
               b_crit_estimate_note="; ".join(notes) or None)
    return out


def line(r: dict) -> str:
    """What the program prints about the estimate."""
    if r["b_crit_estimate"] is None:
        return f"B_crit from B_noise: none ({r['b_crit_estimate_note']})"
    src = r["ratio_source"]
    low, high = r["b_crit_estimate_low"], r["b_crit_estimate_high"]
    interval = f" [{low:,.0f}, {high:,.0f}] (95%)" if low is not None else " (unbounded)"
    text = (f"B_crit from B_noise: {r['b_crit_estimate']:,.0f} sequences{interval} = B_noise x "
            f"{src['ratio']:.3g} [{src['low']:.3g}, {src['high']:.3g}], the ratio of "
            f"{src['fits']} at {src['losses'][0]:.3f}-{src['losses'][1]:.3f} nats/token")
    if not r["b_crit_estimate_valid"]:
        text += f"; NOT to be trusted: {r['b_crit_estimate_note']}"
    return text
