"""The B_crit report's opening: per optimizer, what to act on and how far to trust it.

For each optimizer, `sweep_summary` asks the answer engine (`analysis.recommend.engine`) for the
sweep's own largest model at its largest budget: B_crit at the loss it predicts there (95%
bootstrap interval), the recommended batch and lr, beside the best loss the sweep measured
there. The joint
model's held-out check gives the verdict, and a reliability line says when the numbers are
not meaningful and why: the smoke scale, an unbounded interval, an unresolved law, a model
that misfits the losses or missed its held-out cells. Goes into fits.json as `summary`, at
the top of report.md and at the end of what the sweep prints.
"""

from __future__ import annotations

import numpy as np

from critbatch.analysis.joint.joint import RESOLVED_WIDTH, leans_on_extrapolation, passes
from critbatch.analysis.joint.report import held_out_text
from critbatch.analysis.recommend import engine
from critbatch.analysis.recommend.recommend import beta2_of, sized_sweeps
from critbatch.analysis.render import fmt, fmt_interval, md_table
from critbatch.results.errors import ResultsError
from critbatch.results.runs import scale_of
from critbatch.science.answer import Promise
from critbatch.science.intervals import refits_at

MISFIT = 2.0  # chi2/dof above which the model does not describe the losses


def held_out_verdict(doc: dict | None) -> tuple[str, bool | None]:
    """("<set>: k of n within 2 seed sigma (k2 with the refit's spread); ...", whether each
    set reached HELD_OUT_SHARE within 2 seed sigma)."""
    sets = (doc or {}).get("held_out") or []
    if not sets:
        return "no held-out check possible", None
    return "; ".join(map(held_out_text, sets)), all(map(passes, sets))


def reliability(row: dict, doc: dict | None, scale: str | None) -> list[str]:
    """Why the row's numbers are not a measurement (empty when nothing says so)."""
    why = []
    if scale == "smoke":
        why.append("smoke scale: runs of a few dozen steps test the pipeline and measure "
                   "nothing; run SCALE=cpu or gpu")
    if row.get("b_crit") is not None and (row.get("b_crit_low") is None
                                          or row.get("b_crit_high") is None):
        why.append("B_crit's interval is unbounded (too few bootstrap refits converged)")
    if doc:
        low, high = doc.get("exponent_low"), doc.get("exponent_high")
        if low is None or high is None or high - low > RESOLVED_WIDTH:
            why.append("the B_crit(L) law is unresolved: 1/alpha_B "
                       f"{fmt_interval(doc['exponent'], low, high, '.2f')}")
        leans = leans_on_extrapolation(doc)
        if leans:
            why.append(f"the B_crit(L) law leans on losses the baseline never reached ({leans})")
        if doc.get("chi2_per_dof", 0) > MISFIT:
            why.append(f"the model misfits the losses (chi2/dof {doc['chi2_per_dof']:.1f}): "
                       "its intervals are widened, its shape is in doubt")
    if row.get("held_out_ok") is False:
        why.append("the refit missed its held-out cells")
    return why


def sweep_summary(runs: list[dict], joint: dict, promise: Promise | None = None,
                  warnings: list[str] | None = None,
                  noise_ratio: dict | None = None, resamples: int | None = None) -> list[dict]:
    """One row per optimizer (see the module docstring); an optimizer whose cells cannot
    carry the answer gets a row with `reason` instead. `noise_ratio`: fits.json's, whose
    ratio joins each row (`noise_ratio`: ratio, low, high, losses, or the reason it has
    none). `resamples`: the bootstrap's refits (None: the engine's; SMOKE_RESAMPLES at the
    smoke scale)."""
    scale = scale_of(runs)
    promise = promise or Promise()
    # a smoke sweep measures nothing (its row says so): a rough interval is enough
    refits = refits_at(resamples, scale)
    rows = []
    for optimizer, sweep in sized_sweeps(runs, []).items():
        doc = joint.get(optimizer)
        print(f"  summary ({optimizer}): the answer's fit and bootstrap ...", flush=True)
        size = max(sweep.sizes)
        mine = [c for c, p in zip(sweep.cells, sweep.params, strict=True) if p == size]
        top = max(c.budget for c in mine)
        measured = min((c for c in mine if c.budget == top), key=lambda c: c.loss)
        tokens = float(np.median([c.tokens for c in mine if c.budget == top]))
        row = {"optimizer": optimizer, "params": size, "tokens": tokens,
               "measured_loss": measured.loss, "measured_batch_size": measured.batch_size,
               "measured_lr": measured.lr,
               "noise_ratio": ratio_row((noise_ratio or {}).get(optimizer))}
        try:
            fitted = engine.fit(engine.grid_cells(sweep), promise, sweep.seq_len, sweep,
                                resamples=refits, report_verdict=doc,
                                pipeline_test=scale == "smoke")
            ans = engine.answer(fitted, size, tokens)
        except ResultsError as err:
            rows.append({**row, "reason": str(err), "reliable": False,
                         "why": [str(err)]})
            continue
        row.update({k: ans.get(k) for k in (
            "batch_size", "batch_low", "batch_high", "lr", "lr_low", "lr_high",
            "loss_optimal_batch", "loss_optimal_lr", "overhead", "tolerance", "loss_given_up",
            "predicted_loss", "predicted_loss_low", "predicted_loss_high", "b_crit",
            "b_crit_low", "b_crit_high", "steps", "route", "verdict", "seq_len")})
        row["beta2"] = beta2_of(sweep.beta2_rule, round(ans["batch_size"]), sweep.seq_len)
        row["held_out"], row["held_out_ok"] = held_out_verdict(doc)
        row["why"] = reliability(row, doc, scale)
        row["reliable"] = not row["why"]
        rows.append(row)
    if warnings is not None and any(not r["reliable"] for r in rows):
        warnings.append("summary: " + "; ".join(
            f"{r['optimizer']}: not a measurement ({r['why'][0]})" for r in rows
            if not r["reliable"]))
    return rows


def ratio_row(doc: dict | None) -> dict | None:
    """The summary's share of `noise_ratio.<optimizer>`: ratio, interval, losses, verdicts."""
    if doc is None:
        return None
    return {k: doc.get(k) for k in ("ratio", "low", "high", "losses", "same_order", "drifts",
                                    "left_out")}


def ratio_text(row: dict) -> str:
    """'B_crit / B_noise r [low, high] at losses a-b' of a summary row, or why not."""
    r = row.get("noise_ratio")
    if r is None:
        return "- (no online B_noise)"
    if r["ratio"] is None:
        return f"- ({r['left_out']})"
    lo, hi = r["losses"]
    return (f"{fmt_interval(r['ratio'], r['low'], r['high'], '.3g')} at {lo:.3f}-{hi:.3f} "
            "nats/token" + ("; drifts with the loss" if r["drifts"] else ""))


def b_crit_text(row: dict) -> str:
    if row.get("b_crit") is None:
        return "- (the runs have a loss optimum inside their batches: no B_crit is read)"
    return (f"{fmt_interval(row['b_crit'], row['b_crit_low'], row['b_crit_high'], '.3g')} "
            f"sequences ({fmt(row['b_crit'] * row['seq_len'], '.3g')} tokens)")


def batch_text(row: dict) -> str:
    """'batch B [low, high] sequences, lr X [low, high]' of a summary row."""
    lr = fmt_interval(row["lr"], row["lr_low"], row["lr_high"], ".3g")
    batch = fmt_interval(row["batch_size"], row.get("batch_low"), row.get("batch_high"), ",.0f")
    return f"batch {batch} sequences, lr {lr}{beta2_text(row)}"


def markdown(rows: list[dict]) -> list[str]:
    """The report's opening section."""
    if not rows:
        return ["## Summary", "", "No optimizer has cells to summarise (see the warnings).",
                ""]
    table = []
    for r in rows:
        if "reason" in r:
            table.append([r["optimizer"], "-", "-", ratio_text(r), "-", r["reason"]])
            continue
        table.append([
            r["optimizer"], b_crit_text(r), batch_text(r), ratio_text(r),
            r["held_out"], "yes" if r["reliable"] else "no: " + "; ".join(r["why"])])
    return ["## Summary", "",
            f"Per optimizer, at the sweep's largest model ({rows[0]['params']:,.0f} "
            f"non-embedding params) and largest budget ({rows[0]['tokens']:,.0f} tokens): "
            "B_crit at the loss the joint law predicts there (95%, refits on resampled "
            "trunks), the batch `recommend` gives (the largest costing at most 10% more "
            "compute than the loss-optimal batch, with its 95% interval from refits of the "
            "whole choice; lr from the lr law, 95% prediction interval; AdamW's beta2 at that "
            "batch by the runs' rule), B_crit over the online B_noise read at the peak lr at "
            "equal losses (95%, runs resampled, the law's refits; fits.json `noise_ratio`), "
            "the held-out check and whether the numbers are a "
            "measurement. `python analysis/recommend.py` answers for a larger run.", "",
            md_table(["optimizer", "B_crit at the final loss (sequences) [95%]", "recommended here",
                      "B_crit / B_noise [95%]", "held out", "a measurement?"], table), ""]


def beta2_text(row: dict) -> str:
    """", beta2 X" (AdamW's, by the sweep's rule) when the runs recorded it, else ""."""
    return f", beta2 {row['beta2']:.4g}" if row.get("beta2") is not None else ""


def lines(rows: list[dict]) -> list[str]:
    """What the sweep prints last, one line per optimizer."""
    out = []
    for r in rows:
        if "reason" in r:
            out.append(f"  {r['optimizer']}: no summary ({r['reason']})")
            continue
        loss = r["predicted_loss"]
        out.append(
            f"  {r['optimizer']}: B_crit {b_crit_text(r)} at {fmt(loss, '.4f')} nats/token; "
            f"recommended here: {batch_text(r)}; B_crit / B_noise {ratio_text(r)}; "
            + ("a measurement" if r["reliable"] else "NOT a measurement: " + r["why"][0]))
    return out

