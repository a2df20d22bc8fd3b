"""Gradient accumulation against the plain batch (science.md section 6): accumulating k
micro-batches of m sequences computes exactly the gradient of a batch of k*m, so the two runs'
train-loss curves must agree to float precision over their first steps.

`find_plain_run` finds the plain run an accumulation run must reproduce, `compare_curves`
their step-by-step differences, `accumulation_entry` the comparison with its verdict
(`rules.RULES["accumulation"]`). Relative differences are |accum - plain| / |plain|.
"""

from __future__ import annotations

import math

import numpy as np

from critbatch.analysis.stability.rules import (
    ACCUM_DEVIATION,
    ACCUM_FIRST_STEPS,
    ACCUM_TOLERANCE,
    ACCUM_TOLERANCE_BY_DTYPE,
    BATCH_STAGE,
    DIFFERS,
    LR_RTOL,
    LR_STAGE,
    MATCHES,
    NO_PLAIN,
    NOT_COMPARABLE,
)


def compare_curves(accum: list[dict], plain: list[dict],
                   first_steps: int = ACCUM_FIRST_STEPS) -> dict:
    """Step-by-step train-loss differences of two runs over their common steps.

    Science.md section 6: accumulation computes the plain batch's gradient exactly, so the
    curves may differ only by float rounding (summation order), which training then amplifies
    step after step; the first steps test the claim, the whole run shows the amplification.
    A step where only one run is finite, or both are NaN, counts as an infinite difference.
    Returns steps_compared, max_abs_diff, max_rel_diff (|a - p| / |p|),
    first_steps_max_abs_diff, first_steps_max_rel_diff (over the first `first_steps` common
    steps), first_steps_max_rel_diff_grad_norm, first_step_rel_above (the first step whose
    relative difference exceeds ACCUM_DEVIATION, or None), and the arrays steps, abs_diff,
    rel_diff (for plots; not in the JSON).
    """
    a = {r["step"]: r for r in accum}
    p = {r["step"]: r for r in plain}
    steps = sorted(set(a) & set(p))

    def diffs(key: str) -> tuple[np.ndarray, np.ndarray]:
        x = np.array([a[s][key] for s in steps], dtype=float)
        y = np.array([p[s][key] for s in steps], dtype=float)
        with np.errstate(all="ignore"):
            d = np.where(x == y, 0.0, np.abs(x - y))
            d = np.where(np.isnan(d), math.inf, d)
            rel = np.where(d == 0, 0.0, d / np.abs(y))
            rel = np.where(np.isnan(rel), math.inf, rel)
        return d, rel

    if not steps:
        return {"steps_compared": 0, "max_abs_diff": None, "max_rel_diff": None,
                "first_steps_max_abs_diff": None, "first_steps_max_rel_diff": None,
                "first_steps_max_rel_diff_grad_norm": None, "first_step_rel_above": None,
                "steps": np.array([]), "abs_diff": np.array([]), "rel_diff": np.array([])}
    d, rel = diffs("train_loss")
    _, rel_gn = diffs("grad_norm")
    above = np.nonzero(rel > ACCUM_DEVIATION)[0]
    n = min(first_steps, len(steps))
    return {
        "steps_compared": len(steps),
        "max_abs_diff": float(d.max()), "max_rel_diff": float(rel.max()),
        "first_steps_max_abs_diff": float(d[:n].max()),
        "first_steps_max_rel_diff": float(rel[:n].max()),
        "first_steps_max_rel_diff_grad_norm": float(rel_gn[:n].max()),
        "first_step_rel_above": int(steps[above[0]]) if above.size else None,
        "steps": np.array(steps, dtype=float), "abs_diff": d, "rel_diff": rel,
    }


def accum_tolerance(dtype: str | None) -> float:
    """The relative tolerance of the accumulation check for the runs' compute dtype."""
    return ACCUM_TOLERANCE_BY_DTYPE.get(dtype or "float32", ACCUM_TOLERANCE)


def accumulation_verdict(first_steps_max_rel_diff: float | None, steps_compared: int,
                         tolerance: float = ACCUM_TOLERANCE) -> str:
    """RULES["accumulation"]: matches when the first steps differ by less than `tolerance`
    (relative; `accum_tolerance` of the dtype)."""
    if not steps_compared or first_steps_max_rel_diff is None:
        return NOT_COMPARABLE
    return MATCHES if first_steps_max_rel_diff < tolerance else DIFFERS


def find_plain_run(accum: dict, candidates: list[dict]) -> dict | None:
    """The plain (not accumulated) run that an accumulation run must reproduce.

    Same scale, optimizer, model (width, depth, seq_len), data, seed, batch size, lr used,
    steps, warmup, lr schedule and dtype, micro-batch equal to the batch; from the stability
    stage first, then stability_lr, the same lr_scaling preferred (at an equal lr used the
    rule does not change the computation).
    """
    def same(run: dict) -> bool:
        return (run["stage"] in (BATCH_STAGE, LR_STAGE)
                and all(run.get(k) == accum.get(k) for k in (
                    "scale", "optimizer", "width", "depth", "seq_len", "data_fingerprint",
                    "seed", "batch_size", "steps", "warmup_steps", "schedule", "dtype"))
                and run["micro_batch_size"] in (None, run["batch_size"])
                and math.isclose(run["lr"], accum["lr"], rel_tol=LR_RTOL))

    found = sorted((r for r in candidates if same(r)), key=lambda r: (
        r.get("lr_scaling") != accum.get("lr_scaling"), r["stage"] != BATCH_STAGE, r["run_dir"]))
    return found[0] if found else None


def accumulation_entry(accum: dict, plain: dict | None) -> dict:
    """The comparison of one accumulation run with its plain run (`compare_curves`), with the
    difference of the final validation losses and the verdict."""
    entry = {
        "accum_run_dir": accum["run_dir"], "plain_run_dir": plain["run_dir"] if plain else None,
        "plain_stage": plain["stage"] if plain else None, "optimizer": accum["optimizer"],
        "lr": accum["lr"], "lr_scaling": accum.get("lr_scaling"),
        "batch_size": accum["batch_size"], "micro_batch_size": accum["micro_batch_size"],
        "dtype": accum.get("dtype"), "status_accum": accum["status"],
        "status_plain": plain["status"] if plain else None,
        "first_steps": ACCUM_FIRST_STEPS, "tolerance": accum_tolerance(accum.get("dtype")),
        "deviation_threshold": ACCUM_DEVIATION,
    }
    if plain is None:
        return {**entry, **compare_curves([], []), "delta_val_loss": None,
                "delta_val_loss_per_byte": None, "verdict": NO_PLAIN}
    numbers = compare_curves(accum["metrics"], plain["metrics"])
    return {**entry, **numbers,
            "delta_val_loss": accum["val_loss"] - plain["val_loss"],
            "delta_val_loss_per_byte": accum["val_loss_per_byte"] - plain["val_loss_per_byte"],
            "verdict": accumulation_verdict(numbers["first_steps_max_rel_diff"],
                                            numbers["steps_compared"], entry["tolerance"])}

