"""`critbatch-recommend --peers steplaw`: the batch and lr of a run from a public grid alone.

For users without a sweep of their own. The grid's laws (`science.grid_laws.fit_grid`, terms
chosen by held-out prediction) answer for (N, D): the largest batch within the tolerance of
the predicted best, the lr at that batch, the predicted loss, each with the cell bootstrap's
interval where it has one, how far the target lies beyond the grid, and Step Law's own
formula beside it. `--validate` holds out each size's largest budget and the largest model in
turn (`steplaw.validate`). Losses are in the grid's units (StepFun's corpus and tokenizer):
the batch and lr carry over to another corpus better than the loss does.
"""

from __future__ import annotations

import math
from pathlib import Path

from critbatch.analysis.render import fmt, json_clean
from critbatch.peers import steplaw
from critbatch.peers.sources import SOURCES, locate
from critbatch.results.errors import ConfigError
from critbatch.results.files import write_json_atomic, write_text_atomic

GRIDS = ("steplaw",)  # the public grids `--peers` knows
FAR = 10.0  # beyond this factor of the grid's largest size or budget: a loud warning
JSON_FILE = "recommend.json"
REPORT_FILE = "recommend.md"


def load(source: str, peers_dir: str | None, cache: str | None):
    if source not in GRIDS:
        raise ConfigError(f"--peers {source}: unknown grid; pass one of {', '.join(GRIDS)}")
    cache_dir = Path(cache) if cache else None
    grid = locate(SOURCES["steplaw"], peers_dir, cache_dir)
    boot = locate(SOURCES["steplaw_bootstrap"], peers_dir, cache_dir)
    return steplaw.cells_of(steplaw.read_runs(grid)), steplaw.published(boot)


def extrapolation(cells, params: float, tokens: float) -> tuple[dict, list[str]]:
    sizes = [c.params for c in cells]
    budgets = [c.tokens for c in cells]
    extra = {"params_ratio_to_largest": params / max(sizes),
             "tokens_ratio_to_largest": tokens / max(budgets),
             "params_range": [min(sizes), max(sizes)], "tokens_range": [min(budgets), max(budgets)]}
    warnings = []
    ratios = (params / max(sizes), tokens / max(budgets), min(sizes) / params,
              min(budgets) / tokens)
    if max(ratios) > FAR:
        warnings.append(f"FAR OUTSIDE THE GRID: the target lies {max(ratios):.3g}x beyond its "
                        "sizes or budgets; check the answer with a short run first")
    elif max(ratios) > 1:
        warnings.append(f"extrapolated: {max(ratios):.3g}x beyond the grid's sizes or budgets")
    return extra, warnings


def answer(source: str, params: float, tokens: float, tolerance: float,
           peers_dir: str | None = None, cache: str | None = None,
           resamples: int = steplaw.BOOTSTRAP) -> dict:
    """The recommendation document for (params, tokens) from the public grid `source`."""
    cells, published = load(source, peers_dir, cache)
    model = steplaw.fit(cells, resamples)
    out = model.answer(params, tokens, tolerance)
    extra, warnings = extrapolation(cells, params, tokens)
    power = 2 ** math.floor(math.log2(out["batch_size"]))
    return {"grid": source, "params": params, "tokens": tokens, "seq_len": steplaw.SEQ_LEN,
            "tolerance": tolerance, **out, "batch_size_power_of_two": power,
            "lr_at_power_of_two": model.lr.predict(params, tokens, power),
            "steplaw_formula": steplaw.formula(published, params, tokens),
            "laws": {"b_opt": model.b_opt.held_out["chosen"], "lr": model.lr.held_out["chosen"]},
            "extrapolation": extra, "warnings": warnings,
            "units": "batch in sequences of 2,048 tokens; loss in nats/token on the grid's "
                     "corpus and tokenizer; intervals: 95% prediction intervals (a bootstrap "
                     "over the grid's cells, with each law's residual scatter)"}


def lines_of(doc: dict) -> list[str]:
    def interval(lo, hi, spec):
        return f" [{format(lo, spec)}, {format(hi, spec)}]" if lo is not None else ""

    f = doc["steplaw_formula"]
    return [
        f"{doc['grid']}: N = {doc['params']:.3g} params, D = {doc['tokens']:.3g} tokens, "
        f"tolerance {doc['tolerance']} nats/token",
        f"  batch  {doc['batch_size']:.0f} sequences"
        + interval(doc["batch_size_low"], doc["batch_size_high"], ".0f")
        + f" (loss-optimal {doc['b_opt']:.0f}; power of two below: "
          f"{doc['batch_size_power_of_two']})",
        f"  lr     {doc['lr']:.3g}" + interval(doc["lr_low"], doc["lr_high"], ".3g")
        + f" (at {doc['batch_size_power_of_two']}: {doc['lr_at_power_of_two']:.3g})",
        f"  loss   {fmt(doc['predicted_loss'])} nats/token predicted (the grid's corpus)",
        "  (intervals: 95% prediction intervals from a bootstrap over the grid's cells)",
        f"  Step Law's formula: batch {f['batch_size']:.0f}, lr {f['lr']:.3g}",
        f"  laws kept by held-out tests: B_opt in {doc['laws']['b_opt']}, lr in "
        f"{doc['laws']['lr']}",
        *(f"warning: {w}" for w in doc["warnings"])]


def validation_lines(rows: list[dict]) -> list[str]:
    out = ["held out in turn: critbatch (fitted without the case) | Step Law's formula "
           "(fitted on every cell)"]
    for v in rows:
        c, s = v["critbatch"], v.get("steplaw_formula")
        out.append(f"  {v['case']}")
        for who, r in (("critbatch", c), ("Step Law", s)):
            if r is None:
                continue
            loss = ("" if r["predicted_loss"] is None else
                    f", loss {r['predicted_loss']:.3f} vs {r['measured_loss']:.3f}")
            checks = ", ".join(f"{k} {'ok' if ok else 'NO'}" for k, ok in r["checks"].items()
                               if ok is not None)
            out.append(f"    {who:9s} batch {r['batch_size']:.0f} vs {r['measured_batch_size']:.0f}"
                       f", lr {r['lr']:.3g} vs {r['measured_lr']:.3g}{loss}: {checks}")
    return out


def run(source: str, params: float | None, tokens: float | None, tolerance: float,
        peers_dir: str | None, cache: str | None, out: str | None, json_file: str | None,
        do_validate: bool) -> dict:
    if do_validate:
        cells, published = load(source, peers_dir, cache)
        doc = {"grid": source, "validation": steplaw.validate(cells, published, tolerance)}
        lines = validation_lines(doc["validation"])
    else:
        doc = answer(source, params, tokens, tolerance, peers_dir, cache)
        lines = lines_of(doc)
    doc = json_clean(doc)
    folder = Path(out or f"runs/peers/recommend-{source}")
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / JSON_FILE, doc)
    write_text_atomic(folder / REPORT_FILE, "```\n" + "\n".join(lines) + "\n```\n")
    if json_file:
        write_json_atomic(Path(json_file), doc)
    print("\n".join(lines))
    print(f"report: {folder / REPORT_FILE}", flush=True)
    return doc
