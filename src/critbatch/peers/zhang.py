"""Zhang et al. 2025's steps-to-target sweep through critbatch's own fits.

Zhang et al. 2025 (ICLR), "How Does Critical Batch Size Scale in Pre-training?": steps to
a target C4 loss for 5 model sizes x 9 batch sizes (the vendored table, `table_path`; see
data/NOTICE.md). `analyse_zhang` reads it as a steps-to-target table (`analysis.tables`),
fits S(B) = S_min + E_min / B per size with `bcrit.analyse` (what `fit_bcrit.py --table`
writes to fits.json), sets the numbers beside the published ones, and fits their law
CBS = d * N_M^beta over the sizes, with a t interval and a residual bootstrap on beta.

Units: steps are optimizer steps; batch sizes, E_min, B_crit and CBS are sequences of 512
tokens (`_tokens` names: x 512); losses nats/token; N_M is the model's size in millions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from critbatch.analysis.bcrit import bcrit, best_lr
from critbatch.analysis.bcrit.tables import load_tables
from critbatch.science.fits import fit_log_linear
from critbatch.science.intervals import CONFIDENCE, central_percentiles, percentile_band
from critbatch.science.laws import fit_pareto

SEQ_LEN = 512  # tokens per sequence in every row of the sweep

# hlzhang109/critical-batch-size @ c5b509d8cf276bb40388172a08f9d6f644cf44dc,
# plots/chinchilla.ipynb cell 5 stdout: S(B) = a + b/B fitted in log space per size,
# a = S_min (steps), b = E_min (sequences of 512 tokens).
PUBLISHED: dict[str, tuple[float, float]] = {
    "85M": (1293.8268694659337, 2834258.0888740215),
    "151M-ablation": (1752.4211962796799, 5677478.783007255),
    "302M": (2095.3497601960876, 11383269.891870424),
    "604M": (2459.9274969089824, 19449688.58779496),
    "1.2B": (3897.306597333535, 43381130.22429582),
}
# same notebook, cell 7 stdout: CBS = d * N_M^beta (sequences, N_M in millions): (d, beta)
PUBLISHED_CBS = (93.196814043949, 0.4682782328130422)
# The 20%-overhead rule: at B = r E_min / S_min, B S(B) = S_min B + E_min = (1 + r) E_min.
CBS_OVERHEAD = 0.2
# The notebook's printed CBS is r b/a + 307.2 (sequences); with the offset the published a, b
# give its printed CBS to 1e-12, without it they do not (e.g. 85M: 438.1 against 745.3).
CBS_OFFSET = 307.2
# The N_M its law uses: the label's nominal size (85 ... 1200); the exact non-embedding
# counts (84.9 ... 1208) give beta 0.4672 on their CBS instead of 0.4683.
NOMINAL_MILLIONS = {"85M": 85.0, "151M-ablation": 151.0, "302M": 302.0, "604M": 604.0,
                    "1.2B": 1200.0}

UNITS = {
    "steps": "optimizer steps",
    "batch_size": "sequences of 512 tokens (e_min, b_crit, cbs too; _tokens: x 512)",
    "loss": "nats/token, C4 validation, GPT-NeoX tokenizer",
    "params": "non-embedding parameters; n_millions: the label's nominal size in millions",
}
SOURCE = {
    "paper": "Zhang et al. 2025 (ICLR), How Does Critical Batch Size Scale in Pre-training?",
    "repo": "hlzhang109/critical-batch-size",
    "commit": "c5b509d8cf276bb40388172a08f9d6f644cf44dc",
    "where": "plots/chinchilla.ipynb cell 5 (fit input and S_min, E_min, CBS), cell 7 (law)",
    "license": "MIT (Hanlin Zhang); see critbatch/peers/data/NOTICE.md",
}


def table_path() -> Path:
    """The vendored steps-to-target table (critbatch's table format)."""
    return Path(__file__).resolve().parent / "data" / "zhang2025_steps_to_target.csv"


def cbs_rule(s_min, e_min, offset: float = 0.0):
    """Their 20%-overhead critical batch size r E_min / S_min (+ `offset`), sequences."""
    return CBS_OVERHEAD * np.asarray(e_min) / np.asarray(s_min) + offset


def rel_diff(ours: float | None, theirs: float) -> float | None:
    """(ours - theirs) / theirs."""
    return None if ours is None else (ours - theirs) / theirs


def pareto_by_size(path: Path) -> tuple[list[dict], list[str]]:
    """Per model (ascending size): label, params and its one `bcrit.analyse` Pareto row,
    read as `fit_bcrit.py --table` reads the table; and the analysis's warnings."""
    loaded = load_tables([path])
    result = bcrit.analyse(loaded["runs"], left_out=loaded["left_out"],
                           **loaded["analyse_kwargs"])
    names = {best_lr.group_name(best_lr.group_key(t)): (t["group_label"], t["params_nonembedding"])
             for t in loaded["analyse_kwargs"]["targets"]}
    sizes = []
    for name, (label, params) in names.items():
        rows = [r for r in result["fits"]["pareto"] if r["group"] == name]
        if len(rows) != 1:
            raise ValueError(f"{path}: {label} has {len(rows)} target losses; one expected")
        sizes.append({"label": label, "params": params, "pareto": rows[0]})
    return sorted(sizes, key=lambda s: (s["params"] or 0, s["label"])), result["warnings"]


def size_row(size: dict) -> dict:
    """One model's fit beside the published one (module docstring for units)."""
    p, label = size["pareto"], size["label"]
    s_min, e_min = p["s_min"], p["e_min"]
    ok = s_min is not None and e_min is not None and s_min > 0 and e_min > 0
    b_crit = e_min / s_min if ok else None
    cbs_20 = float(cbs_rule(s_min, e_min)) if ok else None
    row = {"label": label, "params": size["params"],
           "n_millions": NOMINAL_MILLIONS.get(label, (size["params"] or math.nan) / 1e6),
           "target_loss": p["target_loss"], "n_batch_sizes": p["n_batch_sizes"],
           "s_min": s_min, "s_min_low": p["s_min_low"], "s_min_high": p["s_min_high"],
           "e_min": e_min, "e_min_low": p["e_min_low"], "e_min_high": p["e_min_high"],
           "interval": p["interval"], "degenerate": p["degenerate"],
           "b_crit": b_crit, "b_crit_low": p["b_crit_low"], "b_crit_high": p["b_crit_high"],
           "b_crit_tokens": None if b_crit is None else b_crit * SEQ_LEN,
           "cbs_20pct": cbs_20, "cbs": None if cbs_20 is None else cbs_20 + CBS_OFFSET}
    if label in PUBLISHED:
        a, b = PUBLISHED[label]
        theirs_cbs = float(cbs_rule(a, b, CBS_OFFSET))
        row.update(published_s_min=a, published_e_min=b, published_b_crit=b / a,
                   published_cbs=theirs_cbs, s_min_rel_diff=rel_diff(s_min, a),
                   e_min_rel_diff=rel_diff(e_min, b), cbs_rel_diff=rel_diff(row["cbs"], theirs_cbs))
    return row


def bootstrap_fits(sizes: list[dict], resamples: int, seed: int) -> tuple[np.ndarray, ...]:
    """(S_min, E_min) draws, each (resamples, sizes), of a residual bootstrap: per size, steps
    redrawn as fit x (1 + r*), r* drawn with replacement from the fit's relative residuals
    S/fit - 1 (centred, scaled by sqrt(n/(n-2))), then refitted with `fit_pareto`.
    A draw whose S_min or E_min is not positive (or fails) is NaN."""
    rng = np.random.default_rng(seed)
    s_draws = np.full((resamples, len(sizes)), np.nan)
    e_draws = np.full_like(s_draws, np.nan)
    for j, size in enumerate(sizes):
        p = size["pareto"]
        batches, steps = np.asarray(p["batch_sizes"], float), np.asarray(p["steps"], float)
        n = len(steps)
        if n < 3 or p["s_min"] is None or p["e_min"] is None:
            continue
        fitted = p["s_min"] + p["e_min"] / batches
        resid = steps / fitted - 1
        resid = (resid - resid.mean()) * math.sqrt(n / (n - 2))
        picks = rng.integers(0, n, size=(resamples, n))
        for i in range(resamples):
            try:
                fit = fit_pareto(batches, fitted * (1 + resid[picks[i]]))
            except (OverflowError, ValueError, RuntimeError):
                continue
            if fit["s_min"] is not None and fit["s_min"] > 0 and fit["e_min"] > 0:
                s_draws[i, j], e_draws[i, j] = fit["s_min"], fit["e_min"]
    return s_draws, e_draws


def power_law(n_millions: np.ndarray, values: np.ndarray, draws: np.ndarray | None,
              published: tuple[float, float] | None) -> dict:
    """values = d * N_M^beta by least squares of log values on log N_M, with the OLS slope's
    Student-t interval and, from `draws` (resamples x sizes; rows with a NaN dropped), the
    bootstrap percentile interval; `published` (d, beta) beside."""
    x = np.log(n_millions)
    fit = fit_log_linear(x, np.log(values))
    if fit is None:
        return {"beta": None, "d": None, "n_points": len(values)}
    out = {"beta": fit["slope"], "d": math.exp(fit["intercept"]), "n_points": fit["n"],
           "t_dof": fit["n"] - 2, "beta_t_low": None, "beta_t_high": None,
           "beta_boot_low": None, "beta_boot_high": None, "d_boot_low": None,
           "d_boot_high": None, "resamples_used": 0}
    if fit["t"] is not None:
        out.update(beta_t_low=fit["slope"] - fit["t"] * fit["slope_sd"],
                   beta_t_high=fit["slope"] + fit["t"] * fit["slope_sd"])
    if draws is not None:
        good = np.log(draws[np.all(np.isfinite(draws) & (draws > 0), axis=1)])
        if len(good) >= 2:
            xc = x - x.mean()
            slopes = (good - good.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
            d = np.exp(good.mean(axis=1) - slopes * x.mean())
            (blo, bhi), (dlo, dhi) = percentile_band(slopes), percentile_band(d)
            out.update(beta_boot_low=float(blo), beta_boot_high=float(bhi),
                       d_boot_low=float(dlo), d_boot_high=float(dhi), resamples_used=len(good))
    if published is not None:
        d_pub, beta_pub = published
        out.update(published_d=d_pub, published_beta=beta_pub)
        for kind in ("t", "boot"):
            low, high = out[f"beta_{kind}_low"], out[f"beta_{kind}_high"]
            out[f"published_beta_in_{kind}"] = (None if low is None
                                                else bool(low <= beta_pub <= high))
    return out


def analyse_zhang(path: Path | None = None, resamples: int = 1000, seed: int = 0) -> dict:
    """Zhang et al.'s sweep (`path`: a table like the vendored one) fitted by critbatch.

    Returns a JSON-ready dict: `sizes` (per model: critbatch's S_min, E_min, B_crit with
    their 95% intervals, CBS = 0.2 E_min/S_min (`cbs_20pct`) and + 307.2 (`cbs`, their
    printed number), the published values and relative differences, bootstrap intervals),
    `cbs_law` and `b_crit_law` (X = d N_M^beta, `power_law`; cbs_20pct = 0.2 B_crit shares
    b_crit_law's exponent: without the offset their rule scales as B_crit), `bootstrap`
    (what was resampled), `units`, `source` and the analysis's `warnings`. `resamples` = 0
    skips the bootstrap; `seed` fixes it.
    """
    path = table_path() if path is None else Path(path)
    sizes, warnings = pareto_by_size(path)
    rows = [size_row(s) for s in sizes]
    n_m = np.array([r["n_millions"] for r in rows], float)
    draws = bootstrap_fits(sizes, resamples, seed) if resamples > 0 else None
    laws = {}
    quantities = (("cbs", lambda s, e: cbs_rule(s, e, CBS_OFFSET), PUBLISHED_CBS),
                  ("cbs_20pct", cbs_rule, None),
                  ("b_crit", lambda s, e: np.asarray(e) / np.asarray(s), None))
    for key, value, published in quantities:
        point = np.array([np.nan if r["s_min"] is None or r["e_min"] is None
                          else value(r["s_min"], r["e_min"]) for r in rows], float)
        boot = None if draws is None else value(*draws)
        if boot is not None:
            for r, col in zip(rows, boot.T, strict=True):
                col = col[np.isfinite(col)]
                lo, hi = percentile_band(col) if len(col) else (None, None)
                r[f"{key}_boot_low"] = None if lo is None else float(lo)
                r[f"{key}_boot_high"] = None if hi is None else float(hi)
        if key == "cbs_20pct":  # 0.2 B_crit: b_crit_law's exponent, a fifth of its d
            continue
        if key == "b_crit":  # the exponent is comparable with theirs, the constant is not
            published = (None, PUBLISHED_CBS[1])
        laws[f"{key}_law"] = {"quantity": key, **power_law(n_m, point, boot, published)}
    return {
        "sizes": rows, **laws,
        "bootstrap": {"resamples": resamples, "seed": seed,
                      "method": "residual: per size, steps = fit x (1 + r*), r* redrawn from "
                                "the relative residuals (centred, x sqrt(n/(n-2))); "
                                "fit_pareto refitted; percentiles "
                                "{:g}/{:g}".format(*central_percentiles(CONFIDENCE))},
        "cbs_definition": f"cbs = {CBS_OVERHEAD:g} E_min/S_min + {CBS_OFFSET:g} sequences, the "
                          "notebook's printed CBS (the offset reproduces their numbers); "
                          "cbs_20pct: without the offset",
        "units": dict(UNITS), "source": {**SOURCE, "table": str(path)},
        "warnings": list(warnings),
    }
