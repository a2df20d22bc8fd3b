"""How often the answer's 95% intervals hold the planted answer: `make recommend-coverage`.

    python -m critbatch.analysis.recommend.coverage [--worlds 50] [--seed 0] [--out DIR]
                                                    [--docs FILE]

Each world is a sweep drawn from `science.recommend_planted` (three model sizes, five batches,
four budgets, three lrs a cell, one run's seed noise 0.01 nats/token; loss falling towards
small batches, so the answer is read through B_crit) and written as a table, read back like a
user's, and answered by `analysis.recommend.engine` exactly as `critbatch-recommend --table`
answers, at two targets: the sweep's largest model at its largest budget (inside the data) and
a model 4x larger on 4x the tokens (beyond it). The planted answer is the planted world's
fastest batch within the promise (`science.recommend.fastest_within` on the truth); the
planted lr, loss and B_crit are the world's at the answer's own batch (and the planted lr at
its loss-optimal batch). Per target it reports how many worlds' 95% intervals hold each
planted value (`QUANTITIES`), with a binomial (Clopper-Pearson) 95% interval on each rate,
the answer's median ratio to the planted batch, and the verdicts.
Writes coverage.json and coverage.md to --out and, with --docs, the page to the docs.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from critbatch.analysis.bcrit import tables
from critbatch.analysis.recommend import engine
from critbatch.analysis.recommend.recommend import sized_sweeps
from critbatch.analysis.render import json_clean, md_table, on_one_blas_thread
from critbatch.results.errors import user_errors
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.results.runs import short_revision
from critbatch.science.answer import Promise
from critbatch.science.fits import binomial_interval
from critbatch.science.recommend import fastest_within
from critbatch.science.recommend_planted import (
    BATCHES,
    BUDGETS,
    LARGER,
    SEQ_LEN,
    SIGMA,
    SWEEP_SIZES,
    planted_lr,
    planted_rows,
    truth,
)

TARGETS = {"inside": (SWEEP_SIZES[-1], BUDGETS[-1]), "beyond": (LARGER, 4 * BUDGETS[-1])}
QUANTITIES = {"batch": "batch (fastest within 10% compute)", "lr": "lr at that batch",
              "loss_optimal_lr": "lr at the loss-optimal batch",
              "predicted_loss": "predicted loss at that batch", "b_crit": "B_crit at its loss"}
TARGET_WORDS = {"inside": "the sweep's largest model at its largest budget",
                "beyond": "4x the largest model's params on 4x its largest budget"}


def world_answers(seed: int, promise: Promise, resamples: int | None = None) -> dict:
    """One planted world's answers at TARGETS, each beside the planted truth."""
    world = truth()
    rows = planted_rows(world, SWEEP_SIZES, np.random.default_rng(seed))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sweep.csv"
        tables.write_table(rows, path)
        runs, _ = tables.read_table(path)
    sweep = sized_sweeps(runs, [])["adamw"]
    fitted = engine.fit(engine.grid_cells(sweep), promise, sweep.seq_len, sweep,
                        resamples=resamples, seed=seed)
    out = {"seed": seed, "route": fitted.route, "verdict": fitted.verdict["verdict"]}
    for name, (params, tokens) in TARGETS.items():
        doc = engine.answer(fitted, params, tokens)
        planted = fastest_within(world, params, tokens, BATCHES[0], SEQ_LEN, promise.overhead,
                                 promise.tolerance)
        # the truth at the answer's own batch: its loss, B_crit there, the best lr there
        loss = float(world.predict_loss(params, doc["batch_size"], tokens)[0])
        out[name] = {
            "batch_size": doc["batch_size"], "batch_low": doc["batch_low"],
            "batch_high": doc["batch_high"], "planted_batch": planted["batch_size"],
            "lr": doc["lr"], "lr_low": doc["lr_low"], "lr_high": doc["lr_high"],
            "planted_lr": float(planted_lr(doc["batch_size"], params)),
            "loss_optimal_lr_low": doc["loss_optimal_lr_low"],
            "loss_optimal_lr_high": doc["loss_optimal_lr_high"],
            "planted_loss_optimal_lr": float(planted_lr(doc["loss_optimal_batch"], params)),
            "predicted_loss_low": doc["predicted_loss_low"],
            "predicted_loss_high": doc["predicted_loss_high"], "planted_predicted_loss": loss,
            "b_crit_low": doc["b_crit_low"], "b_crit_high": doc["b_crit_high"],
            "planted_b_crit": float(world.b_crit(loss)), "loss_given_up": doc["loss_given_up"],
            "planted_loss_given_up": planted["loss_given_up"],
            "headline": doc["headline"]}
    return out


def holds(row: dict, key: str) -> bool | None:
    low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
    if low is None or high is None:
        return None
    return bool(low <= row[f"planted_{key}"] <= high)


def summarise(worlds: list[dict]) -> dict:
    out = {}
    for name in TARGETS:
        rows = [w[name] for w in worlds]
        entry = {}
        for key in QUANTITIES:
            seen = [h for r in rows if (h := holds(r, key)) is not None]
            hits = sum(seen)
            entry[key] = {"held": hits, "of": len(seen), "missing": len(rows) - len(seen),
                          "rate_interval": binomial_interval(hits, len(seen)) if seen else None}
        ratios = [r["batch_size"] / r["planted_batch"] for r in rows]
        entry["median_batch_ratio"] = float(np.median(ratios))
        entry["batch_ratio_range"] = [float(min(ratios)), float(max(ratios))]
        out[name] = entry
    verdicts = [w["verdict"] for w in worlds]
    out["verdicts"] = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    return out


def markdown(doc: dict) -> str:
    s = doc["summary"]
    rows = []
    for name in TARGETS:
        e = s[name]
        for key, label in QUANTITIES.items():
            c = e[key]
            low, high = c["rate_interval"] or (math.nan, math.nan)
            rows.append([TARGET_WORDS[name], label, f"{c['held']} of {c['of']}",
                         f"{c['held'] / c['of']:.0%} [{low:.0%}, {high:.0%}]" if c["of"]
                         else "-", str(c["missing"])])
    ratio = "; ".join(f"{TARGET_WORDS[n]}: median {s[n]['median_batch_ratio']:.2f} "
                      f"(range {s[n]['batch_ratio_range'][0]:.2f}-"
                      f"{s[n]['batch_ratio_range'][1]:.2f})" for n in TARGETS)
    p = doc["provenance"]
    return "\n".join([
        "# The answer's intervals on planted sweeps", "",
        f"Generated by `{p['command']}` on {p['date']} (revision {p['git_revision']}, "
        f"{p['elapsed_s'] / 60:.1f} min, load average {p['load_average']:.1f} at the end).", "",
        f"{doc['worlds']} planted sweeps, each three model sizes "
        f"({', '.join(f'{n:,}' for n in SWEEP_SIZES)} non-embedding params) x batches "
        f"{', '.join(map(str, BATCHES))} (sequences of {SEQ_LEN} tokens) x budgets "
        f"{', '.join(f'{b:,}' for b in BUDGETS)} tokens, three lrs a factor 2 apart per cell, "
        f"one run's seed noise {SIGMA} nats/token, B_crit(L) = 3.2e5 L^-4.8 sequences. Each is "
        "read back as a table and answered by `critbatch-recommend --table`'s engine with the "
        "default promise (10% more compute than the loss-optimal batch); the planted answer is "
        "the planted world's own fastest batch within that promise. A 95% interval should hold "
        "the planted value in about 95% of the worlds; the bracket is the rate's binomial "
        "(Clopper-Pearson) 95% interval.", "",
        md_table(["target", "interval of", "holds the planted value", "rate [95%]",
                  "worlds without an interval"], rows), "",
        f"The answer's batch over the planted one: {ratio}. The answer is the batch whose "
        "overhead, averaged over the bootstrap's draws, is the promise, so it sits a little "
        "below the draws' median by design.", "",
        "Verdicts: " + ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()) + ".", ""])


@on_one_blas_thread
def run(worlds: int, seed: int, out: Path, docs: Path | None,
        resamples: int | None = None) -> dict:
    t0 = time.perf_counter()
    promise = Promise()
    answers = []
    for i in range(worlds):
        answers.append(world_answers(seed + i, promise, resamples))
        held = sum(bool(holds(w["beyond"], "batch")) for w in answers)
        print(f"  world {i + 1}/{worlds}: the batch interval held the planted answer beyond "
              f"the data in {held} of {i + 1} ({time.perf_counter() - t0:.0f} s)", flush=True)
    elapsed = time.perf_counter() - t0
    doc = json_clean({
        "worlds": worlds, "seed": seed, "answers": answers, "summary": summarise(answers),
        "provenance": {"date": datetime.date.today().isoformat(),
                       "git_revision": short_revision(), "elapsed_s": elapsed,
                       "load_average": os.getloadavg()[0],
                       "command": f"make recommend-coverage WORLDS={worlds}"}})
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "coverage.json", doc)
    text = markdown(doc)
    write_text_atomic(out / "coverage.md", text)
    if docs:
        docs.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(docs, text)
    s = doc["summary"]
    for name in TARGETS:
        b = s[name]["batch"]
        print(f"{TARGET_WORDS[name]}: batch interval held the planted answer in {b['held']} of "
              f"{b['of']}")
    print(f"report: {out / 'coverage.md'}" + (f", {docs}" if docs else "")
          + f" ({elapsed:.0f} s)", flush=True)
    return doc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, default=50, help="planted sweeps (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="the first world's seed")
    parser.add_argument("--out", default="runs/coverage", help="report folder")
    parser.add_argument("--docs", help="also write the page here (e.g. "
                                       "docs/results/recommend_coverage.md)")
    args = parser.parse_args(argv)
    if args.worlds < 1:
        parser.error("--worlds must be 1 or more")
    with user_errors():
        run(args.worlds, args.seed, Path(args.out), Path(args.docs) if args.docs else None)


if __name__ == "__main__":
    main()
