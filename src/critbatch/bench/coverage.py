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
    out["covered"] = {
        "exponent": holds(true["exponent"], doc.get("exponent_low"), doc.get("exponent_high")),
        "b_star": None if true["b_star_tokens"] is None else holds(
            true["b_star_tokens"], doc.get("b_star_tokens_low"), doc.get("b_star_tokens_high"))}
    return out


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
        for key in ("exponent", "b_star"):
            seen = [w["covered"][key] for w in mine if w["covered"][key] is not None]
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
        out[kind] = entry
    return out


def rate(hits: int, n: int, interval: list[float] | None) -> str:
    if not n:
        return "-"
    return f"{hits} of {n}: {hits / n:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def markdown(doc: dict) -> str:
    s, p = doc["summary"], doc["provenance"]
    rows = []
    for kind, e in s.items():
        v = e["verdict"]
        rows.append([kind, rate(e["exponent"]["covered"], e["exponent"]["n"],
                                e["exponent"]["rate_interval"]),
                     rate(e["b_star"]["covered"], e["b_star"]["n"], e["b_star"]["rate_interval"]),
                     f"{v['resolved']} of {v['n']}",
                     rate(v["false_resolved"], v["n"], v["false_resolved_rate_interval"]),
                     rate(v["false_unresolved"], v["covered_and_narrow"],
                          v["false_unresolved_rate_interval"])])
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
        "single B*.", "",
        md_table(["kind", "1/alpha_B interval holds the truth", "B* interval holds the truth",
                  "resolved", "false resolved (of all)",
                  "false unresolved (of those covered and narrower than 1)"], rows), ""])


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
