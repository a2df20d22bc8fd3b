"""Do the intervals and the verdict keep their level? `make coverage`.

    python -m critbatch.bench.coverage [--worlds 200] [--kinds "own form,bend"] [--jobs 2]
                                       [--seed 0] [--out runs/coverage/joint] [--docs FILE]

Draws `--worlds` planted sweeps of each kind (`science.coverage_worlds`: the joint model's own
form, worlds that depart from it one way each, and the cpu preset's own design), writes each
as a results table, reads it back and fits it exactly as `fit_bcrit --table` does
(`analysis.bcrit.bcrit.analyse`), and counts, per kind:

- how often each 95% interval shown to users holds the truth: 1/alpha_B, B* (tokens; where
  the world has one);
- the verdict's errors: "resolved" while the interval misses the truth (false resolved), and
  "unresolved" while the interval holds the truth and is narrower than 1 (false unresolved,
  the calibration test's definition).

Each rate comes with its binomial (Clopper-Pearson) 95% interval. The worlds run in `--jobs`
processes, each fit on one BLAS thread; progress is printed per world. Writes coverage.json
(per kind and quantity `covered` and `n`; for the verdict `resolved`, `false_resolved`,
`false_unresolved` and `n`; every world's numbers) and coverage.md to --out, and with --docs the
page to the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from critbatch.analysis.render import json_clean, md_table
from critbatch.results.errors import user_errors
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.results.runs import short_revision
from critbatch.science.coverage_worlds import KINDS, table_rows, truth, world_of
from critbatch.science.fits import binomial_interval

RESOLVED_WIDTH = 1.0  # the verdict's width: an interval narrower than this should say resolved


def fit_world(kind: str, seed: int) -> dict:
    """One world of `kind`: its table through `bcrit.analyse`, the joint model's document
    beside the truth."""
    from critbatch.analysis.bcrit import bcrit
    from critbatch.analysis.bcrit.tables import load_tables, write_table
    from critbatch.analysis.render import one_blas_thread

    world = world_of(kind, seed)
    rows = table_rows(world, seed)
    true = truth(world, rows)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "world.csv"
        write_table(rows, path)
        loaded = load_tables([path])
    with one_blas_thread(), contextlib.redirect_stdout(io.StringIO()):
        result = bcrit.analyse(loaded["runs"], **loaded["analyse_kwargs"])
    doc = result["fits"]["joint"].get("adamw") or {}
    out = {"kind": kind, "seed": seed, "widths": len(world.l_inf), "gamma": world.gamma,
           "truth": true, "rows": len(rows)}
    out.update({k: doc.get(k) for k in (
        "exponent", "exponent_low", "exponent_high", "b_star_tokens", "b_star_tokens_low",
        "b_star_tokens_high", "verdict", "reasons", "chi2_per_dof", "form", "n_cells")})
    at_loss = doc.get("b_crit_at_loss") or {}
    if at_loss:
        true["b_crit"] = b_crit_truth(world, rows, at_loss["loss"])
        out["b_crit_at_loss"] = at_loss
    out["failed_checks"] = [c["check"] for c in doc.get("checks", [])
                            if c["status"] != "pass"]
    test = doc.get("loss_alone")
    out["loss_alone_rejected"] = None if not test or test.get("holds") is None else (
        not test["holds"])
    out["covered"] = {
        "exponent": holds(true["exponent"], doc.get("exponent_low"), doc.get("exponent_high")),
        "b_star": None if true["b_star_tokens"] is None else holds(
            true["b_star_tokens"], doc.get("b_star_tokens_low"), doc.get("b_star_tokens_high")),
        "b_crit": None if not at_loss else holds(true["b_crit"], at_loss.get("low"),
                                                   at_loss.get("high"))}
    out["kaplan"] = {r["method"]: holds(true["exponent"], r.get("exponent_low"),
                                        r.get("exponent_high"))
                     for r in result["fits"].get("kaplan", [])
                     if r["optimizer"] == "adamw" and r["method"] in ("per_run", "pareto")}
    return out


def b_crit_truth(world, rows: list[dict], loss: float) -> float:
    """The world's B_crit (sequences) at `loss`, at the tokens of the first width's smallest
    batch's largest budget (the cell the reference loss is read from; only the `tokens too`
    kind's B_crit depends on them)."""
    params = world.params[0]
    base = [r for r in rows if r["batch_size"] == world.batches[0] and r["params"] == params]
    return float(world.b_crit(loss, max(r["tokens"] for r in base)))


def holds(value: float, low: float | None, high: float | None) -> bool | None:
    if low is None or high is None:
        return None
    return bool(low <= value <= high)


def summarise(worlds: list[dict]) -> dict:
    """Per kind: each interval's coverage and the verdict's errors (module docstring)."""
    out = {}
    for kind in dict.fromkeys(w["kind"] for w in worlds):
        mine = [w for w in worlds if w["kind"] == kind]
        entry = {}
        for key in ("exponent", "b_star", "b_crit"):
            seen = [w["covered"].get(key) for w in mine if w["covered"].get(key) is not None]
            applies = [w for w in mine if key != "b_star" or w["truth"]["b_star_tokens"]]
            entry[key] = {"covered": sum(seen), "n": len(seen),
                          "without_interval": len(applies) - len(seen),
                          "rate_interval": binomial_interval(sum(seen), len(seen))}
        resolved = [w for w in mine if w["verdict"] == "resolved"]
        narrow = [w for w in mine if w["covered"]["exponent"]
                  and w["exponent_high"] - w["exponent_low"] < RESOLVED_WIDTH]
        false_resolved = sum(w["covered"]["exponent"] is not True for w in resolved)
        false_unresolved = sum(w["verdict"] != "resolved" for w in narrow)
        entry["verdict"] = {
            "n": len(mine), "resolved": len(resolved), "false_resolved": false_resolved,
            "false_resolved_rate_interval": binomial_interval(false_resolved, len(mine)),
            "covered_and_narrow": len(narrow), "false_unresolved": false_unresolved,
            "false_unresolved_rate_interval": binomial_interval(false_unresolved, len(narrow))}
        tested = [w["loss_alone_rejected"] for w in mine
                  if w.get("loss_alone_rejected") is not None]
        entry["loss_alone"] = {"n": len(tested), "rejected": sum(tested),
                               "rate_interval": binomial_interval(sum(tested), len(tested))}
        failing: dict[str, int] = {}
        for w in mine:
            for name in w.get("failed_checks", []):
                failing[name] = failing.get(name, 0) + 1
        entry["failed_checks"] = dict(sorted(failing.items(), key=lambda kv: -kv[1]))
        for method in ("per_run", "pareto"):
            seen = [w["kaplan"][method] for w in mine
                    if w.get("kaplan", {}).get(method) is not None]
            entry[method] = {"covered": sum(seen), "n": len(seen),
                             "rate_interval": binomial_interval(sum(seen), len(seen))}
        out[kind] = entry
    return out


def rate(hits: int, n: int, interval: list[float] | None) -> str:
    if not n:
        return "-"
    return f"{hits} of {n}: {hits / n:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def markdown(doc: dict) -> str:
    s, p = doc["summary"], doc["provenance"]
    rows, checks, routes = [], [], []
    for kind, e in s.items():
        v = e["verdict"]
        rows.append([kind] + [rate(e[k]["covered"], e[k]["n"], e[k]["rate_interval"])
                              for k in ("exponent", "b_star", "b_crit")]
                    + [f"{v['resolved']} of {v['n']}",
                       rate(v["false_resolved"], v["n"], v["false_resolved_rate_interval"]),
                       rate(v["false_unresolved"], v["covered_and_narrow"],
                            v["false_unresolved_rate_interval"])])
        la = e["loss_alone"]
        checks.append([kind, rate(la["rejected"], la["n"], la["rate_interval"]),
                       ", ".join(f"{name} {n}" for name, n in e["failed_checks"].items())
                       or "none"])
        routes.append([kind] + [rate(e[m]["covered"], e[m]["n"], e[m]["rate_interval"])
                                for m in ("per_run", "pareto")])
    return "\n".join([
        "# Do the joint model's intervals and verdict keep their level?", "",
        f"Generated by `{p['command']}` on {p['date']} (revision {p['git_revision']}, "
        f"{p['elapsed_s'] / 60:.1f} min with {p['jobs']} processes, load average "
        f"{p['load_average']:.1f} at the end).", "",
        f"{doc['worlds']} planted sweeps of each kind (`critbatch.science.coverage_worlds`: "
        "one or four widths and 1/alpha_B 4.8 or 3.5 in turn), each written as a results "
        "table and fitted as `fit_bcrit --table` fits it. A 95% interval should hold the truth "
        "in about 95% of worlds; \"resolved\" should not come with an interval that misses it. "
        "Brackets are binomial (Clopper-Pearson) 95% intervals of each rate. Where B_crit is "
        "not a power of the loss alone (`bend`, `tokens too`), the truth of 1/alpha_B is the "
        "power law that best describes it along the sweep's smallest batch, and there is no "
        "single B*. B_crit is read at the reference loss of `fits.json` "
        "(`joint.<optimizer>.b_crit_at_loss`: the lowest loss of the first width's smallest "
        "batch), where every kind has a true value.", "",
        md_table(["kind", "1/alpha_B interval holds the truth", "B* interval holds the truth",
                  "B_crit at the reference loss: interval holds the truth", "resolved",
                  "false resolved (of all)",
                  "false unresolved (of those covered and narrower than 1)"], rows), "",
        "## The checks behind the verdict", "",
        "The loss-alone test (worlds of four widths) rejects at a nominal 5%: B_crit depends "
        "on the loss alone in every kind but `tokens too`. The checks that were not passed "
        "(failed, or could not be formed), with how many worlds each:", "",
        md_table(["kind", "loss-alone test rejects", "checks not passed (worlds)"], checks), "",
        "## Kaplan's table: the other routes", "",
        "The per-run and Pareto rows of the Kaplan table (`fits.json` `kaplan`) on the same "
        "worlds: how often their 95% interval of 1/alpha_B holds the truth. The report shows "
        "a route's exponent as a measurement only where its interval keeps its level "
        "(`analysis.bcrit.kaplan.left_out_reason`).", "",
        md_table(["kind", "per-run B_crit rows", "Pareto rows"], routes), ""])


def run(worlds: int, kinds: tuple[str, ...], jobs: int, seed: int, out: Path,
        docs: Path | None) -> dict:
    t0 = time.perf_counter()
    tasks = [(kind, seed + i) for kind in kinds for i in range(worlds)]
    results = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fit_world, kind, s): (kind, s) for kind, s in tasks}
        for done in as_completed(futures):
            w = done.result()
            results.append(w)
            mine = [r for r in results if r["kind"] == w["kind"]]
            held = sum(bool(r["covered"]["exponent"]) for r in mine)
            print(f"  {len(results)}/{len(tasks)} {w['kind']} seed {w['seed']}: 1/alpha_B "
                  f"{fmt(w['exponent'])} [{fmt(w['exponent_low'])}, {fmt(w['exponent_high'])}]"
                  f" vs {w['truth']['exponent']:.2f}, {w['verdict']}; {w['kind']}: "
                  f"{held} of {len(mine)} held ({time.perf_counter() - t0:.0f} s)", flush=True)
    results.sort(key=lambda r: (kinds.index(r["kind"]), r["seed"]))
    elapsed = time.perf_counter() - t0
    doc = json_clean({
        "worlds": worlds, "kinds": list(kinds), "seed": seed, "summary": summarise(results),
        "results": results,
        "provenance": {"date": datetime.date.today().isoformat(), "git_revision": short_revision(),
                       "elapsed_s": elapsed, "jobs": jobs, "load_average": os.getloadavg()[0],
                       "command": f"make coverage WORLDS={worlds}"
                                  + ("" if kinds == KINDS else f' KINDS="{",".join(kinds)}"')}})
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "coverage.json", doc)
    text = markdown(doc)
    write_text_atomic(out / "coverage.md", text)
    if docs:
        docs.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(docs, text)
    print(text)
    print(f"report: {out / 'coverage.md'}" + (f", {docs}" if docs else "")
          + f" ({elapsed / 60:.1f} min)", flush=True)
    return doc


def fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, default=20, help="planted sweeps per kind "
                                                                "(default 20)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated kinds (default every one: {', '.join(KINDS)})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes (default: one per core)")
    parser.add_argument("--seed", type=int, default=0, help="the first world's seed")
    parser.add_argument("--out", default="runs/coverage/joint", help="report folder")
    parser.add_argument("--docs", help="also write the page here (e.g. "
                                       "docs/results/coverage.md)")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind {unknown[0]!r}; pass some of: {', '.join(KINDS)}")
    if args.worlds < 1 or args.jobs < 1:
        parser.error("--worlds and --jobs must be 1 or more")
    with user_errors():
        run(args.worlds, kinds, args.jobs, args.seed, Path(args.out),
            Path(args.docs) if args.docs else None)


if __name__ == "__main__":
    main()
