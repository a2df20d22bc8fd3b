"""The batch-size schedule study: does growing the batch save steps at no cost in tokens?

`sweeps/schedules.yaml` trains, per optimizer and at equal tokens, five arms: a constant
small batch, a constant large batch, a `ramp` (small -> large over a fraction of the budget),
an `adaptive` batch that follows the online gradient noise scale B_noise between the two
(McCandlish et al. 2018: train near the critical batch, which grows as the loss falls) and a
`measured` batch that doubles as the local critical batch measured by branched training
grows (Merrill et al. 2025; make sweep-local-cbs). Every arm has a wsd lr schedule, so each
ends annealed.

The key number per arm is the **steps saved against the constant small batch at the loss
the arm reaches**. With L the arm's final validation loss,

    S_small(L)  = optimizer steps the constant small batch needs to reach L;
    steps_saved = S_small(L) - steps_arm       (and as a % of S_small(L)).

S_small(L) is read off the small batch's **annealed** points when it has them: the final
(steps, val_loss) of its cooldown branches (`train.branch_budgets`, each the run annealed
to a smaller budget) and of the run itself. The two points that bracket L are interpolated
linearly in log(step), so steps saved are exact up to that interpolation
(`s_small_reference` "annealed"). A small run without branches (older sweeps) is read off
its own validation curve instead, whose intermediate points come before its lr decay has
finished: its loss at step S is higher than that of a run annealed to end at S, so
S_small(L) overstates what the small batch needs and steps saved are an upper estimate
("unannealed curve: upper estimate"). Either way, when L is below every point,
S_small(L) > steps_small, and steps_small - steps_arm is reported as a lower bound.

`report.run_analysis` (what `analysis/schedules.py` calls) loads the runs, analyses them
here (`analyse`) and writes, through `run_study`, `report.md`, `schedules.json` (schema in
`report.schedules_document`) and the figures of `plots`. Batch sizes in sequences; losses in
nats/token unless `_per_byte`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from critbatch.results.runs import BRANCHES_DIR, is_finite, is_number
from critbatch.science.rules import lr_multiplier

SWEEP = "schedules"
KINDS = ("constant", "ramp", "adaptive", "measured")
ANNEALED, UNANNEALED = "annealed", "unannealed curve: upper estimate"  # s_small_reference
SMALL, LARGE = "constant small", "constant large"
TOKENS_TOLERANCE = 0.01  # an arm whose tokens differ from the small arm's by more is flagged
MAX_BNOISE_POINTS = 400  # B_noise points drawn per arm (thinned evenly)
MODEL_KEYS = ("data_name", "vocab_size", "seq_len", "width", "depth")


# ---------------------------------------------------------------------------------------------
# One run's schedule


def schedule_of(run: dict) -> dict:
    """The batch schedule a run's summary records, with fallbacks for runs written before
    the trainer recorded it (a constant batch: start = final = batch_size, mean = tokens /
    (steps * seq_len), no changes, no B_noise).

    Returns {batch_schedule, batch_size_start, batch_size_final, batch_size_max,
    batch_size_mean, batch_changes, b_noise}; sizes in sequences. `batch_size_final` is the
    last step's batch (a scheduled run's last steps may shrink to fit the token budget);
    `batch_size_max` the largest it trained.
    """
    batch = run["batch_size"]
    kind = run.get("batch_schedule")
    kind = kind if isinstance(kind, str) and kind else "constant"

    def number(key: str, default: float | None) -> float | None:
        value = run.get(key)
        return value if is_number(value) and math.isfinite(value) else default

    mean_default = (run["tokens"] / (run["steps"] * run["seq_len"])
                    if run["steps"] > 0 and run["seq_len"] > 0 else float(batch))
    changes = run.get("batch_changes")
    changes = [c for c in changes if isinstance(c, dict) and is_number(c.get("batch_size"))] \
        if isinstance(changes, list) else []
    start, final = number("batch_size_start", batch), number("batch_size_final", batch)
    return {
        "batch_schedule": kind,
        "batch_size_start": start,
        "batch_size_final": final,
        "batch_size_max": number("batch_size_max", max([start, final] + [
            c["batch_size"] for c in changes])),
        "batch_size_mean": number("batch_size_mean", mean_default),
        "batch_changes": changes,
        "b_noise": number("b_noise", None),
    }


def batch_trajectory(run: dict, metrics: list[dict] | None) -> list[dict]:
    """The batch size a run used, as a step function of tokens.

    Returns segments [{step, tokens, batch_size}]: from optimizer step `step + 1` on (after
    `tokens` tokens) the batch was `batch_size` sequences; a last point at the run's end
    closes the function. Read from the per-step `batch_size` of metrics.jsonl; without it
    (older runs), from the summary's `batch_changes` and start size; else constant.
    """
    rows = [r for r in metrics or [] if is_number(r.get("step")) and is_number(r.get("tokens"))]
    if rows and all(is_number(r.get("batch_size")) for r in rows):
        out, prev_step, prev_tokens = [], 0, 0
        for r in rows:
            if not out or r["batch_size"] != out[-1]["batch_size"]:
                out.append({"step": prev_step, "tokens": prev_tokens,
                            "batch_size": r["batch_size"]})
            prev_step, prev_tokens = r["step"], r["tokens"]
        return out + [{"step": prev_step, "tokens": prev_tokens,
                       "batch_size": out[-1]["batch_size"]}]
    sched = schedule_of(run)
    out = [{"step": 0, "tokens": 0, "batch_size": sched["batch_size_start"]}]
    for change in sched["batch_changes"]:
        if is_number(change.get("step")) and is_number(change.get("tokens")):
            out.append({"step": change["step"], "tokens": change["tokens"],
                        "batch_size": change["batch_size"]})
    return out + [{"step": run["steps"], "tokens": run["tokens"],
                   "batch_size": out[-1]["batch_size"]}]


def b_noise_trace(metrics: list[dict] | None,
                  max_points: int = MAX_BNOISE_POINTS) -> list[tuple[float, float]]:
    """(tokens, B_noise in sequences) from the online estimate in metrics.jsonl, thinned."""
    points = [(r["tokens"], r["b_noise"]) for r in metrics or []
              if is_finite(r.get("b_noise")) and r["b_noise"] > 0 and is_number(r.get("tokens"))]
    stride = max(1, math.ceil(len(points) / max_points))
    return points[::stride]


# ---------------------------------------------------------------------------------------------
# Steps the constant small batch needed


class Crossing(NamedTuple):
    """Steps a curve needed to reach a loss.

    `kind`: "interpolated" (between two eval points, linear in log step), "first_eval" (the
    first eval point is already at or below the loss: `steps` is that point, an upper bound),
    "not_reached" (every point is above it: `steps` is None), "no_curve".
    """

    steps: float | None
    kind: str


def steps_to_reach(curve: list[dict], loss: float) -> Crossing:
    """Optimizer steps a run needed to reach `loss`, read off its validation curve.

    The curve (eval points {step, val_loss}) need not be monotone: the first point at or
    below `loss` is the crossing, and with the point before it brackets `loss`; the loss is
    taken as linear in log(step) between them, so
    `log S = log s0 + (loss - l0) / (l1 - l0) * (log s1 - log s0)`.
    """
    points = sorted((p["step"], p["val_loss"]) for p in curve
                    if is_finite(p.get("val_loss")) and is_number(p.get("step")) and p["step"] > 0)
    if not points or not is_finite(loss):
        return Crossing(None, "no_curve")
    for i, (step, value) in enumerate(points):
        if value <= loss:
            if i == 0:
                return Crossing(float(step), "first_eval")
            s0, l0 = points[i - 1]
            frac = (loss - l0) / (value - l0)  # l0 > loss >= value, so 0 < frac <= 1
            return Crossing(math.exp(math.log(s0) + frac * (math.log(step) - math.log(s0))),
                            "interpolated")
    return Crossing(None, "not_reached")


def annealed_points(reference: dict, branches: list[dict]) -> list[dict]:
    """The small batch's annealed (step, val_loss) points, as eval points {step, val_loss}:
    each completed cooldown branch's end and the run's own end, ascending in steps; [] when
    it has no completed branch (then only its unannealed curve can be read)."""
    ends = [b for b in branches if b["status"] == "completed" and is_finite(b["val_loss"])]
    if not ends:
        return []
    return sorted(({"step": r["steps"], "val_loss": r["val_loss"]} for r in [*ends, reference]),
                  key=lambda p: p["step"])


def split_branches(runs: list[dict]) -> tuple[list[dict], dict[Path, list[dict]]]:
    """The runs that are arms, and the cooldown branches by their parent run folder (resolved):
    a branch is a run with `branch_of` set in `<parent>/branches/<name>/`."""
    arms, branches = [], defaultdict(list)
    for r in runs:
        folder = Path(r["run_dir"])
        if r.get("branch_of") and folder.parent.name == BRANCHES_DIR:
            branches[folder.parent.parent.resolve()].append(r)
        else:
            arms.append(r)
    return arms, branches


# ---------------------------------------------------------------------------------------------
# Arms


def arm_kind(run: dict) -> str:
    return schedule_of(run)["batch_schedule"]


def batch_range(run: dict) -> str:
    """'16->256': the batch an arm starts at and the one it was configured to reach (ramp)
    or be capped at (adaptive)."""
    return f"{schedule_of(run)['batch_size_start']:g}->{run['batch_size']:g}"


def name_arms(runs: list[dict]) -> list[tuple[str, dict]]:
    """Name each run of one optimizer by its arm.

    Constant runs: the smallest batch is "constant small", the largest "constant large",
    any other "constant B=<b>"; a lone constant batch is "constant large" when it is at least
    every growing arm's configured batch (ramp target, adaptive cap) and above their start,
    else "constant small". Ramp and
    adaptive runs are "ramp" and "adaptive", or "ramp 16->256" when there are several of a
    kind. Names still shared (several lrs or seeds) get "(lr ...)", then "(seed ...)", then
    the run folder. Returned in the order small, ramp, adaptive, other, large.
    """
    constant = [r for r in runs if arm_kind(r) == "constant"]
    growing = [r for r in runs if arm_kind(r) != "constant"]
    sizes = sorted({r["batch_size"] for r in constant})
    named = []
    for r in constant:
        b = r["batch_size"]
        if len(sizes) == 1:
            large = bool(growing) and all(
                b >= g["batch_size"] and b > schedule_of(g)["batch_size_start"] for g in growing)
            name = LARGE if large else SMALL
        else:
            name = SMALL if b == sizes[0] else LARGE if b == sizes[-1] else f"constant B={b:g}"
        named.append([name, r])
    count = defaultdict(int)
    for r in growing:
        count[arm_kind(r)] += 1
    for r in growing:
        kind = arm_kind(r)
        named.append([kind if count[kind] == 1 else f"{kind} {batch_range(r)}", r])
    for suffix in (lambda r: f"lr {r['lr']:.3g}", lambda r: f"seed {r['seed']}",
                   lambda r: Path(r["run_dir"]).name):
        clash = defaultdict(int)
        for name, _ in named:
            clash[name] += 1
        for item in named:
            if clash[item[0]] > 1:
                item[0] = f"{item[0]} ({suffix(item[1])})"
    order = {SMALL: 0, "ramp": 1, "adaptive": 2, "measured": 3, LARGE: 5}

    def rank(item):
        name, r = item
        base = SMALL if name.startswith(SMALL) else LARGE if name.startswith(LARGE) else \
            arm_kind(r) if arm_kind(r) in order else None
        return (order.get(base, 4), r["batch_size"], name)

    return [(name, r) for name, r in sorted(named, key=rank)]


def pick_reference(named: list[tuple[str, dict]]) -> tuple[dict | None, list[str]]:
    """The constant-small run that the other arms are compared with, and warnings.

    Among several constant-small runs (several lrs or seeds), the completed one with the
    lowest final loss.
    """
    smalls = [r for name, r in named if name.startswith(SMALL)]
    if len(smalls) <= 1:
        return (smalls[0] if smalls else None), []
    ok = [r for r in smalls if r["status"] == "completed" and is_finite(r["val_loss"])]
    best = min(ok, key=lambda r: r["val_loss"]) if ok else smalls[0]
    return best, [f"{len(smalls)} constant-small runs for {best['optimizer']}: comparing with "
                  f"the lowest final loss ({best['run_dir']})"]


def peak_lr(run: dict, batch_size_max: float | None) -> float | None:
    """The highest lr the arm trained at: its base lr carried by its rule to the largest batch
    it trained. summary.json's `lr` is the lr at `train.batch_size`, the cap, which a measured
    or adaptive batch may never reach."""
    base, rule, at = run.get("base_lr"), run.get("lr_scaling"), run.get("base_batch_size")
    if not (is_finite(base) and is_finite(batch_size_max) and is_finite(at) and rule):
        return run["lr"]
    return base * lr_multiplier(rule, batch_size_max, at)


def analyse_arm(name: str, run: dict, reference: dict | None,
                annealed: list[dict] | None = None) -> dict:
    """One arm's row: its schedule, cost, loss, and steps saved against `reference`, read off
    its `annealed` points when there are any, else off its validation curve."""
    sched = schedule_of(run)
    completed = run["status"] == "completed" and is_finite(run["val_loss"])
    row: dict[str, Any] = {
        "arm": name, "batch_schedule": sched["batch_schedule"], "run_dir": run["run_dir"],
        "status": run["status"], "lr": peak_lr(run, sched["batch_size_max"]),
        "seq_len": run["seq_len"],
        "batch_size_start": sched["batch_size_start"],
        "batch_size_final": sched["batch_size_final"],
        "batch_size_max": sched["batch_size_max"], "batch_size_mean": sched["batch_size_mean"],
        "batch_changes": sched["batch_changes"],
        "b_noise": sched["b_noise"], "steps": run["steps"], "tokens": run["tokens"],
        "val_loss": run["val_loss"] if completed else None,
        "val_loss_per_byte": run["val_loss_per_byte"] if completed else None,
        "is_reference": run is reference, "tokens_ratio": None, "val_loss_delta": None,
        "val_loss_per_byte_delta": None,
        "s_small": None, "s_small_kind": None, "steps_saved": None, "steps_saved_percent": None,
        "steps_saved_bound": None,
        "s_small_reference": (ANNEALED if annealed else UNANNEALED) if reference else None,
        "note": "",
    }
    ref_ok = reference is not None and reference["status"] == "completed" and is_finite(
        reference["val_loss"])
    if ref_ok:
        row["tokens_ratio"] = run["tokens"] / reference["tokens"]
        if completed:
            row["val_loss_delta"] = run["val_loss"] - reference["val_loss"]
            row["val_loss_per_byte_delta"] = (run["val_loss_per_byte"]
                                              - reference["val_loss_per_byte"])
    if run is reference:
        row.update(s_small_kind="reference", note="the reference: steps saved are against it")
        return row
    if not completed:
        row.update(s_small_kind="arm_diverged", note=f"the arm {run['status']}: no final loss")
        return row
    if reference is None:
        row.update(s_small_kind="no_reference",
                   note="no constant-small run: steps saved cannot be read")
        return row
    if not ref_ok:
        row.update(s_small_kind="reference_diverged",
                   note="the constant-small run diverged: steps saved cannot be read")
        return row
    crossing = steps_to_reach(annealed or reference["curve"], run["val_loss"])
    row["s_small_kind"] = crossing.kind
    steps_small = reference["steps"]
    if crossing.kind == "interpolated":
        saved = crossing.steps - run["steps"]
        row.update(s_small=crossing.steps, steps_saved=saved,
                   steps_saved_percent=100 * saved / crossing.steps)
    elif crossing.kind == "not_reached":
        saved = steps_small - run["steps"]
        row.update(steps_saved=saved, steps_saved_percent=100 * saved / steps_small,
                   steps_saved_bound="lower",
                   note=f"not reached by the constant small batch (its final loss "
                        f"{reference['val_loss']:.4f}): S_small > {steps_small:,} steps, "
                        "steps saved at least the bound shown")
    elif crossing.kind == "first_eval":
        saved = crossing.steps - run["steps"]
        row.update(s_small=crossing.steps, steps_saved=saved,
                   steps_saved_percent=100 * saved / crossing.steps, steps_saved_bound="upper",
                   note="the small run was below this loss at its "
                        + ("smallest annealed budget" if annealed else "first eval point")
                        + ": S_small and steps saved are at most the values shown")
    else:
        row["note"] = "the constant-small run has no usable validation curve"
    return row


def group_key(run: dict) -> tuple:
    return (run["optimizer"], *(run[k] for k in MODEL_KEYS))


def analyse(runs: list[dict], left_out: list[dict] | None = None,
            warnings: list[str] | None = None) -> dict:
    """Group runs by optimizer (and model), name their arms and compare them.

    Runs of another sweep are left out when any run is from the schedules sweep. Returns
    {"groups": [{name, optimizer, model, reference, arms: [analyse_arm rows]}], "left_out",
    "warnings", "n_runs"}.
    """
    left_out = list(left_out or [])
    warnings = list(warnings or [])
    if any(r.get("sweep") == SWEEP for r in runs):
        for r in runs:
            if r.get("sweep") != SWEEP:
                left_out.append({"run_dir": r["run_dir"], "reason": "other sweep",
                                 "detail": f"sweep {r.get('sweep')!r}, not {SWEEP!r}"})
        runs = [r for r in runs if r.get("sweep") == SWEEP]
    elif runs:
        warnings.append(f"no run is from the {SWEEP!r} sweep: analysing every run given")
    runs, branches = split_branches(runs)
    unknown = sorted({arm_kind(r) for r in runs} - set(KINDS))
    if unknown:
        warnings.append(f"unknown batch_schedule {', '.join(unknown)}: shown as their own arms")
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        by_key[group_key(r)].append(r)
    models = {key[1:] for key in by_key}
    groups = []
    for key in sorted(by_key, key=str):
        optimizer, model = key[0], dict(zip(MODEL_KEYS, key[1:], strict=True))
        name = optimizer if len(models) == 1 else (
            f"{optimizer}, {model['data_name']} w{model['width']} d{model['depth']} "
            f"T{model['seq_len']}")
        named = name_arms(by_key[key])
        reference, notes = pick_reference(named)
        warnings += notes
        annealed = annealed_points(reference, branches.get(
            Path(reference["run_dir"]).resolve(), [])) if reference else []
        arms = [analyse_arm(n, r, reference, annealed) for n, r in named]
        if reference is None:
            warnings.append(f"{name}: no constant-small run, so no steps saved")
        elif reference["status"] != "completed" or not is_finite(reference["val_loss"]):
            warnings.append(f"{name}: the constant-small run {reference['status']} "
                            f"({reference['run_dir']}), so no steps saved")
        for a in arms:
            ratio = a["tokens_ratio"]
            if a["status"] == "completed" and ratio is not None and \
                    abs(ratio - 1) > TOKENS_TOLERANCE:
                warnings.append(f"{name} {a['arm']}: {a['tokens']:,} tokens, {ratio:.3f}x the "
                                f"constant small batch's (not equal tokens; compare with care)")
            if a["status"] != "completed":
                warnings.append(f"{name} {a['arm']} {a['status']} ({a['run_dir']})")
        groups.append({"name": name, "optimizer": optimizer, "model": model,
                       "reference": reference["run_dir"] if reference else None,
                       "s_small_reference": arms[0]["s_small_reference"] if arms else None,
                       "annealed_points": annealed, "arms": arms,
                       "runs": {a["arm"]: r for a, (_, r) in zip(arms, named, strict=True)}})
    return {"groups": groups, "left_out": left_out, "warnings": warnings, "n_runs": len(runs)}
