"""`critbatch-recommend --peers steplaw`: the batch and lr of a run from a public grid alone.

For users without a sweep of their own: the grid's runs go to the same engine as a user's
sweep or table (`analysis.recommend.engine`: one question, one answer), and Step Law's own
formula is shown beside its answer. `--validate` holds out each size's largest budget and the
largest model in turn and scores the answer, and the formula, on the held-out runs. Losses
are in the grid's units (StepFun's corpus and tokenizer): the batch and lr carry over to
another corpus better than the loss does.
"""

from __future__ import annotations

from pathlib import Path

from critbatch.analysis.recommend import engine
from critbatch.analysis.recommend.report import (
    PLOT_FILE,
    answer_lines,
    plot,
    validation_lines,
    validation_plot,
)
from critbatch.analysis.render import json_clean
from critbatch.peers import steplaw
from critbatch.peers.sources import SOURCES, locate
from critbatch.results.errors import ConfigError
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.science.answer import Promise

GRIDS = ("steplaw",)  # the public grids `--peers` knows
JSON_FILE = "recommend.json"
REPORT_FILE = "recommend.md"


def load(source: str, peers_dir: str | None, cache: str | None):
    """The grid's cells (`steplaw.grid_cells`) and Step Law's published fits."""
    if source not in GRIDS:
        raise ConfigError(f"--peers {source}: unknown grid; pass one of {', '.join(GRIDS)}")
    cache_dir = Path(cache) if cache else None
    grid = locate(SOURCES["steplaw"], peers_dir, cache_dir)
    boot = locate(SOURCES["steplaw_bootstrap"], peers_dir, cache_dir)
    return steplaw.grid_cells(steplaw.read_runs(grid)), steplaw.published(boot)


def answer(source: str, params: float, tokens: float, promise: Promise,
           peers_dir: str | None = None, cache: str | None = None,
           resamples: int | None = None) -> dict:
    """The answer document for (params, tokens) from the public grid `source`."""
    return answer_and_fit(source, params, tokens, promise, peers_dir, cache, resamples)[0]


def answer_and_fit(source: str, params: float, tokens: float, promise: Promise,
                   peers_dir: str | None = None, cache: str | None = None,
                   resamples: int | None = None) -> tuple[dict, engine.Fitted]:
    """`answer`, and the engine's fit it came from (for the plot)."""
    cells, published = load(source, peers_dir, cache)
    fitted = engine.fit(cells, promise, steplaw.SEQ_LEN, resamples=resamples)
    doc = {"grid": source, **engine.answer(fitted, params, tokens)}
    doc["steplaw_formula"] = steplaw.formula(published, params, tokens)
    doc["units"] = ("batch in sequences of 2,048 tokens; loss in nats/token on the grid's "
                    "corpus and tokenizer; intervals: 95% prediction intervals")
    return doc, fitted


def formula_of(published: dict):
    return lambda params, tokens: steplaw.formula(published, params, tokens)


def run(source: str, params: float | None, tokens: float | None, promise: Promise,
        peers_dir: str | None, cache: str | None, out: str | None, json_file: str | None,
        do_validate: bool, resamples: int | None = None) -> dict:
    folder = Path(out or f"runs/peers/recommend-{source}")
    folder.mkdir(parents=True, exist_ok=True)
    if do_validate:
        cells, published = load(source, peers_dir, cache)
        rows = engine.validate(cells, promise, steplaw.SEQ_LEN, resamples=resamples,
                               formula=formula_of(published))
        doc = {"grid": source, "validation": rows,
               "summary": engine.validation_summary(rows)}
        lines = validation_lines(source, rows)
        validation_plot({source: rows}, {source: cells}, folder / PLOT_FILE)
    else:
        doc, fitted = answer_and_fit(source, params, tokens, promise, peers_dir, cache,
                                     resamples)
        f = doc["steplaw_formula"]
        lines = answer_lines(doc) + [f"  Step Law's formula: batch {f['batch_size']:,.0f}, "
                                     f"lr {f['lr']:.3g}"]
        plot([doc], {source: fitted}, folder / PLOT_FILE)
    doc = json_clean(doc)
    write_json_atomic(folder / JSON_FILE, doc)
    write_text_atomic(folder / REPORT_FILE, "```\n" + "\n".join(lines) + "\n```\n")
    if json_file:
        write_json_atomic(Path(json_file), doc)
    print("\n".join(lines))
    print(f"report: {folder / REPORT_FILE}", flush=True)
    return doc
