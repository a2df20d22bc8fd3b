"""One row of fits.json `local_cbs` per checkpoint (`checkpoint_row`): the decision's fields
and what is reported beside them.

- the paper's EMA rule (`local_critical_batch_ema`, epsilon 0.01 nats) on each branch's
  training losses after the fork (metrics.jsonl rows with tokens > t), `ema_rule`;
- per k the same branches in the per-run B_crit's currency
  (`science.local_cbs_tokens.tokens_equivalent`): the excess over k = 1 (seed-paired where the
  ladders are replicated) read off the k = 1 branch's loss over the window (`k1_curve`: the
  loss at the fork, then its summary.json `curve` points after it, averaged over seeds) as
  effective tokens, and B_crit = (k B - B r) / (r - 1); `curve_warnings` names what biases it;
- the loss at the checkpoint: the base run's validation curve at t (interpolated in log
  tokens), else the k = 1 branch's eval at the fork; the online B_noise there likewise.

Units: batch sizes in sequences unless a name ends in `_tokens`; losses in nats/token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from critbatch.analysis.local_cbs.decision import ladders_of
from critbatch.analysis.local_cbs.reading import BaseRun, Checkpoint
from critbatch.results.runs import is_finite
from critbatch.science.local_cbs import (
    TOLERANCE,
    BranchNoise,
    PairedExcess,
    local_critical_batch_ema,
)
from critbatch.science.local_cbs_tokens import tokens_equivalent

EMA_EPSILON = TOLERANCE  # nats: the paper's bare tolerance, whatever --tolerance says


def curve_value(curve: list[dict], tokens: float, key: str) -> float | None:
    """`key` of a run's eval points at `tokens`: the point itself, else interpolated in log
    tokens between its neighbours (in log value too for B_noise); None outside the curve or
    where the points lack finite positive values."""
    points = sorted((p["tokens"], p[key]) for p in curve
                    if is_finite(p.get("tokens")) and p["tokens"] > 0 and is_finite(p.get(key))
                    and p[key] > 0)
    if not points or not points[0][0] <= tokens <= points[-1][0]:
        return None
    xs = np.log([t for t, _ in points])
    ys = np.array([v for _, v in points], dtype=float)
    if key == "b_noise":
        return float(np.exp(np.interp(math.log(tokens), xs, np.log(ys))))
    return float(np.interp(math.log(tokens), xs, ys))


def checkpoint_loss(base: BaseRun, checkpoint: Checkpoint) -> float | None:
    """The loss at the checkpoint: the base run's curve, else the k = 1 branch's first eval
    (at the fork)."""
    loss = curve_value(base.summary["curve"], checkpoint.tokens, "val_loss")
    if loss is not None:
        return loss
    k1 = checkpoint.branches[0].summary["curve"]
    return curve_value(k1, checkpoint.tokens, "val_loss") if k1 else None


def ema_rule(base_batch: int, checkpoint: Checkpoint, where: str,
             warnings: list[str]) -> int | None:
    """The paper's rule (`local_critical_batch_ema`) on the branches' training losses (a
    diverged branch's ends at infinity), or None (with a warning) when a branch logged no
    step after the fork."""
    empty = [b.run_dir.name for b in checkpoint.branches
             if len(b.train_losses) == 0 and b.losses is not None]
    if empty:
        warnings.append(f"{where}: no metrics.jsonl rows after the fork in {', '.join(empty)}; "
                        "the paper's EMA rule is left blank there")
        return None
    return local_critical_batch_ema(base_batch, [b.multiplier for b in checkpoint.branches],
                                    [b.train_losses if b.losses is not None else [math.inf]
                                     for b in checkpoint.branches], epsilon=EMA_EPSILON)


def k1_curve(base: BaseRun, checkpoint: Checkpoint,
             fork_loss: float | None) -> tuple[list[int], list[float], int]:
    """The k = 1 branch's validation loss over the window: the loss at the fork
    (`checkpoint_loss`, usually the base run's curve interpolated), then its eval points after
    the fork, averaged over the ladders' seeds where all have them; and the window (tokens)."""
    firsts = [ladder[0] for ladder in ladders_of(base, checkpoint)]
    end = int(firsts[0].summary["tokens"])
    seen: dict[int, list[float]] = {}
    for b in firsts:
        for p in b.summary["curve"]:
            if checkpoint.tokens < p["tokens"] <= end and is_finite(p.get("val_loss")):
                seen.setdefault(p["tokens"], []).append(p["val_loss"])
    points = sorted((t, float(np.mean(v))) for t, v in seen.items() if len(v) == len(firsts))
    if fork_loss is not None:
        points.insert(0, (checkpoint.tokens, fork_loss))
    return [t for t, _ in points], [v for _, v in points], end - checkpoint.tokens


def equivalent_fields(base: BaseRun, checkpoint: Checkpoint, fork_loss: float | None,
                      over_first: Sequence[PairedExcess]) -> dict:
    """`tokens_equivalent` (per k after the first: the excess over k = 1 with its bounds, E_eff,
    r, the local B_crit with its interval in sequences and tokens, a note; all null but the
    note at and above a diverged k) and `tokens_equivalent_points` (of the k = 1 curve)."""
    batch, seq_len = int(base.summary["batch_size"]), int(base.summary["seq_len"])
    tokens, losses, window = k1_curve(base, checkpoint, fork_loss)
    ks = [b.multiplier for b in checkpoint.branches]
    out = {}
    for k, c in zip(ks[1:], over_first, strict=False):
        te = tokens_equivalent(batch, k, checkpoint.tokens, window, tokens, losses, c.excess,
                               (c.lower, c.upper))
        out[str(k)] = {"excess": c.excess, "excess_low": c.lower, "excess_high": c.upper,
                       "effective_tokens": te.effective_tokens, "r": te.ratio,
                       "b_crit": te.b_crit, "b_crit_low": te.b_crit_low,
                       "b_crit_high": te.b_crit_high, "note": te.note,
                       "b_crit_tokens": None if te.b_crit is None else te.b_crit * seq_len}
    for k in ks[1 + len(over_first):]:
        out[str(k)] = {**dict.fromkeys(("excess", "excess_low", "excess_high",
                                        "effective_tokens", "r", "b_crit", "b_crit_low",
                                        "b_crit_high", "b_crit_tokens")),
                       "note": "diverged, or above a diverged k"}
    return {"tokens_equivalent": out, "tokens_equivalent_points": len(tokens)}


def checkpoint_row(base: BaseRun, checkpoint: Checkpoint, decided: dict,
                   over_first: Sequence[PairedExcess], noise: BranchNoise | None,
                   tolerance: float, confidence: float, warnings: list[str]) -> dict:
    """One row of fits.json `local_cbs` (ROW_KEYS and a few more) from the checkpoint's
    decision fields and excesses over k = 1 (`decide_base`)."""
    s = base.summary
    batch, seq_len = int(s["batch_size"]), int(s["seq_len"])
    where = f"{base.run_dir.name} at {checkpoint.tokens:,} tokens"
    for b in (*checkpoint.branches, *checkpoint.replicates):
        if b.summary["batch_size"] != b.multiplier * batch:
            warnings.append(f"{where}: branch {b.run_dir.name} trained at batch "
                            f"{b.summary['batch_size']}, not {b.multiplier} x {batch}")
    ks = [b.multiplier for b in checkpoint.branches]
    loss = checkpoint_loss(base, checkpoint)
    if loss is None:
        warnings.append(f"{where}: no validation loss at the checkpoint (neither the base run's "
                        "curve nor the k=1 branch's covers it); left out of the fit")
    return {
        "optimizer": base.optimizer, "lr_scaling": base.lr_scaling, "tokens": checkpoint.tokens,
        "val_loss": loss, **decided, "b_crit_tokens": decided["b_crit"] * seq_len,
        "b_crit_ema": ema_rule(batch, checkpoint, where, warnings),
        "base_batch_size": batch, "multipliers": list(ks),
        "branch_sd": noise.sd if noise else None, "branch_sd_dof": noise.dof if noise else None,
        "branch_pairs": noise.pairs if noise else 0,
        "tolerance": tolerance, "confidence": confidence, "run_dir": str(base.run_dir),
        "b_noise": curve_value(s["curve"], checkpoint.tokens, "b_noise"),
        "seq_len": seq_len, "sequences": len(checkpoint.branches[0].losses),
        "window_tokens": checkpoint.branches[0].summary.get("local_cbs_window_tokens"),
        "in_kaplan": (loss is not None and not decided["lower_bound_only"]
                      and not decided["first_step_rejected"]),
        **equivalent_fields(base, checkpoint, loss, over_first),
    }


def curve_warnings(name: str, base: BaseRun, rows: list[dict]) -> list[str]:
    """What biases the tokens-equivalent B_crit of a base run (both make it high)."""
    out = []
    chords = sum(r["tokens_equivalent_points"] <= 2 for r in rows)
    if chords:
        out.append(f"{name}: at {chords} of {len(rows)} checkpoints the k = 1 curve over the "
                   "window is only its two ends (the fork's loss read off the base run's curve): "
                   "E_eff is read off a straight line in log tokens, which credits too many "
                   "tokens on a convex curve, so the tokens-equivalent B_crit is biased high")
    k1 = base.checkpoints[0].branches[0].summary
    if k1.get("schedule") == "wsd" and k1.get("cooldown_fraction"):
        out.append(f"{name}: the branches end their window with a cooldown; the k = 1 curve's "
                   "inner points are not annealed but its end and the larger branches are, so "
                   "E_eff comes out long and the tokens-equivalent B_crit high")
    return out
