"""B_crit against B_noise: how far the gradient noise scale predicts the critical batch.

McCandlish et al. (2018) offer the noise scale as a shortcut to B_crit: B_simple = tr(Sigma) /
|G|^2, read on one run, predicts B_crit "to about an order of magnitude". Both sides are
measured on the same sweep: B_crit(L) = B* L^(-1/alpha_B) by the joint model
(`analysis.joint`), B_noise by the trainer's online tracker. This module relates them at
matched losses.

The readings: every main run (not a cooldown branch) at its batch's best lr (the best grid lr
of that batch's largest budget), its tracker read at the peak lr with a validation loss
(summary.json `noise_readings`; for runs written before those, the eval points of `curve` in
the constant-lr phase, `online_noise.lr_phase`). A reading taken while the lr decays is never
used: |G|^2 collapses in a cooldown and B_noise climbs with it, so it measures the schedule.

The ratio: r(L) = B_crit(L) / B_noise(L) at each reading whose loss lies within the losses
the joint model was fitted on (`losses`). `ratio` is the geometric mean of r over the
readings; `slope` the least-squares d ln r / d ln L (0: the ratio does not drift with the
loss). The 95% interval is a bootstrap over runs (a run's readings resampled together) with
each replicate's B_crit(L) drawn from the joint model's own bootstrap refits
(`joint.<optimizer>.law_draws`), so both sides' uncertainty enters. Verdicts: `same_order`
(the interval within a factor 10 either way: True; wholly outside: False; else None) and
`drifts` (the slope's interval excludes 0).

Units: B_crit, B_noise in sequences; losses in nats/token.
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.analysis.bcrit.online_noise import lr_phase
from critbatch.results.runs import is_finite
from critbatch.results.shortcut import times_ratio
from critbatch.science.intervals import CONFIDENCE, percentile_interval

RESAMPLES = 2000

ORDER = 10.0  # "the same order": within this factor either way
MIN_RUNS = 2


def best_lrs(cells: list) -> dict[int, float]:
    """{batch: the best grid lr of its largest budget} over `best_lr.Cell`s."""
    out = {}
    for batch in sorted({c.batch_size for c in cells}):
        cell = max((c for c in cells if c.batch_size == batch), key=lambda c: c.budget)
        out[batch] = float(cell.lrs[int(np.argmin(cell.losses))])
    return out


def readings_of(run: dict) -> tuple[list[dict], str]:
    """(the run's peak-lr tracker readings, their source): summary.json's `noise_readings`
    where the run wrote them, else its curve's eval points in the constant-lr phase."""
    if "noise_readings" in run:
        points, source = run["noise_readings"] or [], "noise_readings"
    else:
        points = [p for p in run.get("curve") or []
                  if lr_phase(run, int(p["step"])) == "constant"]
        source = "curve"
    return [p for p in points if is_finite(p.get("b_noise")) and p["b_noise"] > 0
            and is_finite(p.get("val_loss")) and p["val_loss"] > 0], source


def constant_lr_readings(members: list[dict], cells: list, group: str,
                         optimizer: str) -> list[dict]:
    """One row per peak-lr reading of the group's main runs at their batch's best lr."""
    best = best_lrs(cells)
    rows = []
    for run in sorted(members, key=lambda r: (r["batch_size"], r["seed"], r["run_dir"])):
        if (run.get("branch_of") or run["status"] != "completed"
                or best.get(run["batch_size"]) != float(run["lr"])):
            continue
        points, source = readings_of(run)
        rows += [{"optimizer": optimizer, "group": group, "run_dir": run["run_dir"],
                  "batch_size": run["batch_size"], "seed": run["seed"],
                  "width": run.get("width"),
                  "step": int(p["step"]), "tokens": p["tokens"],
                  "val_loss": float(p["val_loss"]), "b_noise": float(p["b_noise"]),
                  "source": source} for p in points]
    return rows


def law_of(doc: dict) -> tuple[float, float]:
    """(B* in sequences, 1/alpha_B) of a joint document: the law its widths share."""
    return doc["b_star_tokens"] / doc["seq_len"], doc["exponent"]


def ratio_stats(log_loss: np.ndarray, log_b_noise: np.ndarray, b_star: float,
                gamma: float) -> tuple[float, float | None]:
    """(mean ln r, slope d ln r / d ln L) for one law; slope None without a loss span."""
    y = math.log(b_star) - gamma * log_loss - log_b_noise
    if np.ptp(log_loss) <= 0:
        return float(y.mean()), None
    return float(y.mean()), float(np.polyfit(log_loss, y, 1)[0])


def not_measured(reason: str, readings: int = 0, runs: int = 0) -> dict:
    return {"ratio": None, "low": None, "high": None, "losses": None, "slope": None,
            "slope_low": None, "slope_high": None, "same_order": None, "drifts": None,
            "n_readings": readings, "n_runs": runs, "interval": None, "left_out": reason}


def noise_ratio(readings: list[dict], doc: dict | None, seed: int = 0,
                resamples: int = RESAMPLES) -> dict:
    """`noise_ratio.<optimizer>` of fits.json from the optimizer's peak-lr readings and its
    joint model document (module docstring)."""
    if not readings:
        return not_measured("no peak-lr reading of the online tracker (train.gns.enabled, "
                            "two or more micro-batches a step and a wsd or constant lr)")
    if doc is None or doc.get("exponent") is None:
        return not_measured("no joint model of B_crit(L) to compare with",
                            len(readings), len({r["run_dir"] for r in readings}))
    losses = [c["val_loss"] for c in doc["cells"]]
    lo, hi = min(losses), max(losses)
    used = [r for r in readings if lo <= r["val_loss"] <= hi]
    runs = sorted({r["run_dir"] for r in used})
    if len(runs) < MIN_RUNS:
        return not_measured(
            f"{len(used)} reading(s) from {len(runs)} run(s) within the losses the joint "
            f"model was fitted on ({lo:.3f}-{hi:.3f} nats/token); it needs {MIN_RUNS} runs "
            f"(the {len(readings)} readings span {min(r['val_loss'] for r in readings):.3f}-"
            f"{max(r['val_loss'] for r in readings):.3f})", len(readings),
            len({r["run_dir"] for r in readings}))
    log_loss = np.log([r["val_loss"] for r in used])
    log_noise = np.log([r["b_noise"] for r in used])
    b_star, gamma = law_of(doc)
    mean, slope = ratio_stats(log_loss, log_noise, b_star, gamma)
    draws = doc.get("law_draws") or {}
    laws = list(zip(draws.get("b_star", []), draws.get("exponent", []), strict=True)) or [
        (b_star, gamma)]
    rng = np.random.default_rng(seed)
    index = {run: np.flatnonzero([r["run_dir"] == run for r in used]) for run in runs}
    means, slopes = [], []
    for j in range(resamples):
        pick = np.concatenate([index[runs[k]] for k in rng.integers(len(runs), size=len(runs))])
        m, s = ratio_stats(log_loss[pick], log_noise[pick], *laws[j % len(laws)])
        means.append(m)
        if s is not None:
            slopes.append(s)
    low, high = percentile_interval(means, CONFIDENCE)
    s_low, s_high = (percentile_interval(slopes, CONFIDENCE, log=False)
                     if len(slopes) >= resamples // 2 else (None, None))
    same = (True if low >= 1 / ORDER and high <= ORDER
            else False if high < 1 / ORDER or low > ORDER else None)
    return {"ratio": math.exp(mean), "low": float(low), "high": float(high),
            "losses": [float(np.exp(log_loss.min())), float(np.exp(log_loss.max()))],
            "slope": slope, "slope_low": None if s_low is None else float(s_low),
            "slope_high": None if s_high is None else float(s_high),
            "same_order": same,
            "drifts": None if s_low is None else bool(s_low > 0 or s_high < 0),
            "n_readings": len(used), "n_runs": len(runs),
            "sources": sorted({r["source"] for r in used}),
            "interval": f"{CONFIDENCE:.0%} bootstrap over {len(runs)} runs (a run's readings "
                        f"together) x the joint model's {len(laws)} bootstrap law(s), "
                        f"{resamples} draws",
            "left_out": None,
            "readings": [{**r, "b_crit": float(b_star * r["val_loss"] ** -gamma)}
                         for r in used]}


def width_curves(readings: list[dict], doc: dict | None, seed: int = 0,
                 resamples: int = RESAMPLES) -> dict | None:
    """Does B_noise(L) depend on the model's size at equal loss? Per width, a power law
    ln B_noise = a + k ln L through its readings, read at a common loss (the geometric
    middle of the losses every width's readings span), with a 95% bootstrap over that
    width's runs; `one_curve`: no pair of widths differs there (each pair's difference of
    ln B_noise has a 95%/pairs interval holding 0; Bonferroni), False where one pair does,
    None without two widths of two runs each that share losses. Each width also gets its
    own `noise_ratio` against the joint law (B_crit's ratio across widths), and with three
    widths or more each is predicted from the others (`held_out_widths`)."""
    by_width: dict = {}
    for r in readings:
        by_width.setdefault(r.get("width"), []).append(r)
    usable = {w: rows for w, rows in by_width.items()
              if len({r["run_dir"] for r in rows}) >= MIN_RUNS
              and np.ptp(np.log([r["val_loss"] for r in rows])) > 0}
    if len(usable) < 2:
        return None
    lo = max(min(r["val_loss"] for r in rows) for rows in usable.values())
    hi = min(max(r["val_loss"] for r in rows) for rows in usable.values())
    out = {"common_loss": None, "one_curve": None, "pairs": [], "widths": [], "held_out": []}
    rng = np.random.default_rng(seed)
    draws = {}
    for w, rows in sorted(usable.items()):
        row = {"width": w, "n_runs": len({r["run_dir"] for r in rows}),
               "ratio": {k: v for k, v in noise_ratio(rows, doc, seed=seed,
                                                      resamples=resamples // 4).items()
                         if k != "readings"}}
        out["widths"].append(row)
        if lo < hi:
            at = math.log(math.sqrt(lo * hi))
            draws[w] = curve_draws(rows, at, rng, resamples)
            low, high = percentile_interval(draws[w], CONFIDENCE)
            row.update(b_noise_at=float(np.exp(np.median(draws[w]))), low=low, high=high)
    if lo >= hi:
        out["reason"] = "the widths' readings share no loss"
        return out
    out["common_loss"] = math.sqrt(lo * hi)
    names = sorted(draws)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    for a, b in pairs:  # Bonferroni: each pair at 1 - (1 - CONFIDENCE) / pairs
        d_lo, d_hi = percentile_interval(draws[a] - draws[b], 1 - (1 - CONFIDENCE) / len(pairs),
                                         log=False)
        out["pairs"].append({"widths": [a, b], "log_ratio_low": d_lo, "log_ratio_high": d_hi,
                             "differs": d_lo is not None and bool(d_lo > 0 or d_hi < 0)})
    out["one_curve"] = not any(p["differs"] for p in out["pairs"])
    out["held_out"] = held_out_widths(usable, doc, out["common_loss"], rng, resamples)
    return out


def measured_b_crit(doc: dict, width, loss: float) -> tuple[float, str]:
    """B_crit of one width at `loss` (sequences) from the joint model: its own law where the
    loss-alone test fitted one per width, else the law the widths share."""
    test = doc.get("loss_alone") or {}
    labels = [str(label).split()[1] if str(label).startswith("width ") else None
              for label in doc.get("widths", [])]
    if test.get("per_width_b_star") and str(width) in labels:
        i = labels.index(str(width))
        return (test["per_width_b_star"][i] * loss ** -test["per_width_exponents"][i],
                "its own law (the loss-alone test's per-width fit)")
    b_star, gamma = law_of(doc)
    return b_star * loss**-gamma, "the law the widths share"


def held_out_widths(usable: dict, doc: dict | None, loss: float, rng,
                    resamples: int) -> list[dict]:
    """Each width held out in turn: the ratio calibrated on the other widths' readings times
    the held-out width's B_noise at `loss` predicts its B_crit there (95%: the ratio's
    bootstrap and the width's B_noise, combined in log), against the B_crit the joint model
    measured for it (`measured_b_crit`). Needs two other widths and a law."""
    if doc is None or doc.get("exponent") is None or len(usable) < 3:
        return []
    out = []
    for w, rows in sorted(usable.items()):
        others = [r for v, rr in usable.items() if v != w for r in rr]
        ratio = noise_ratio(others, doc, seed=0, resamples=resamples // 4)
        if ratio["ratio"] is None:
            continue
        noise = curve_draws(rows, math.log(loss), rng, resamples)
        centre, low, high = times_ratio(float(np.exp(np.median(noise))), float(np.std(noise)),
                                        ratio)
        measured, source = measured_b_crit(doc, w, loss)
        out.append({"width": w, "loss": loss, "predicted": centre, "low": low, "high": high,
                    "ratio_from": sorted(v for v in usable if v != w),
                    "measured": measured, "measured_from": source,
                    "within": bool(low <= measured <= high)})
    return out


def curve_draws(rows: list[dict], at: float, rng, resamples: int) -> np.ndarray:
    """ln B_noise at ln L = `at` from power laws refitted on the width's runs resampled."""
    runs = sorted({r["run_dir"] for r in rows})
    x = np.log([r["val_loss"] for r in rows])
    y = np.log([r["b_noise"] for r in rows])
    index = [np.flatnonzero([r["run_dir"] == run for r in rows]) for run in runs]
    out = []
    for _ in range(resamples):
        pick = np.concatenate([index[k] for k in rng.integers(len(runs), size=len(runs))])
        if np.ptp(x[pick]) > 0:
            out.append(np.polyval(np.polyfit(x[pick], y[pick], 1), at))
    return np.array(out)


def noise_ratios(groups: list[dict], joint: dict) -> dict:
    """{optimizer: `noise_ratio`} over the groups' `noise_readings` (every optimizer with a
    group, measured or not), with `widths` (`width_curves`) where several widths read."""
    by_optimizer: dict[str, list[dict]] = {}
    for g in groups:
        by_optimizer.setdefault(g["key"]["optimizer"], []).extend(g.get("noise_readings", []))
    out = {}
    for opt, rows in sorted(by_optimizer.items()):
        seed = sum(map(ord, opt))
        out[opt] = {**noise_ratio(rows, joint.get(opt), seed=seed),
                    "widths": width_curves(rows, joint.get(opt), seed=seed)}
    return out
