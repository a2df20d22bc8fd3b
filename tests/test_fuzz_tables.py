"""Generated results tables through `fit_bcrit` and `recommend`: a report or one line, never a
traceback (analysis/fit_bcrit.py, analysis/recommend.py, critbatch.analysis.bcrit.tables).

Each example is a small table built mostly from a plausible loss model (so that many reach the
joint fit, critbatch.science.joint), with some of its cells corrupted: NaN, inf, negative, huge
or blank losses, duplicated rows, diverged runs, lrs a hair apart, budgets below one batch.
Whatever the table, both commands' `main(argv)` must either write their report or stop with
SystemExit(non-zero) and one line on stderr (`critbatch.results.errors.user_errors`); any other
exception is a bug. Examples are seeded (`derandomize=True`) and not shrunk, to keep the run
bounded: a failing example is printed as the CSV text of its table (`note`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PEERS_DIR
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from test_recommend import write_csv

from critbatch.analysis.bcrit import cli as fit_bcrit_cli
from critbatch.analysis.recommend import cli as recommend_cli

STEPLAW = PEERS_DIR / "steplaw_dense_lr_bs_loss.csv"
SEQ_LENS = (1, 16, 128, 512, 2048)
MAX_BATCH_TOKENS = 4 * 2**20  # the largest batch: 4M tokens
FIT_FILES = ("report.md", "fits.json", "bcrit.csv")
RECOMMEND_FILES = ("recommend.md", "recommend.json", "recommend.png")
# Seeded, bounded and unshrunk: the suite's runtime stays about a minute on two cores.
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                phases=(Phase.explicit, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
# What a corruption does to one row's loss (None: the row is duplicated or diverged instead).
BAD_LOSSES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "negative": -1.5,
              "zero": 0.0, "huge": 1e300, "tiny": 1e-300, "blank": "", "dup": None,
              "diverged": None}


@dataclass(repr=False)
class Table:
    """A generated table: its rows (every row the same columns) and its file format."""

    rows: list[dict]
    suffix: str  # ".csv" or ".jsonl"
    clean: bool = False  # no corruption, every budget a batch or more, lrs a grid: must succeed

    def __repr__(self) -> str:
        return f"Table({len(self.rows)} rows, {self.suffix}; its CSV text is noted above)"

    def csv_text(self) -> str:
        """The table as CSV text (what a failing example prints)."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.rows[0]))
        writer.writeheader()
        writer.writerows(self.rows)
        return buffer.getvalue()


def write_table(table: Table, folder: Path) -> Path:
    """The table as a file in `folder`: CSV (test_recommend.write_csv) or JSON Lines (NaN and
    inf as Python's json writes them; a blank cell as "")."""
    path = folder / f"grid{table.suffix}"
    if table.suffix == ".csv":
        return write_csv(table.rows, path)
    path.write_text("".join(json.dumps(row) + "\n" for row in table.rows))
    return path


def plausible_loss(params: float, batch_tokens: float, tokens: float, lr: float,
                   best_lr: float, noise: float) -> float:
    """L0 + A N^-0.3 + C (tokens / (1 + B / B_crit))^-0.3 + lr parabola + noise: the loss of a
    run that trained `tokens` at a batch of `batch_tokens` (B_crit 2^20 tokens)."""
    effective = tokens / (1 + batch_tokens / 2**20)
    return (1.7 + 40 * params ** -0.3 + 60 * max(effective, 1.0) ** -0.3
            + 0.1 * math.log(lr / best_lr) ** 2 + noise)


@st.composite
def results_tables(draw: st.DrawFn, rich: bool = False) -> Table:
    """A small results table: groups x batches x budgets x lrs x seeds of the plausible loss
    model, with optional columns dropped and a few cells corrupted. `rich`: at least two
    batches and budgets, and mostly a params column (what recommend's law needs)."""
    seq_len = draw(st.sampled_from(SEQ_LENS))
    top = int(math.log2(MAX_BATCH_TOKENS // seq_len))  # 2^top sequences: 4M tokens
    exps = draw(st.lists(st.integers(0, top), min_size=1 + rich, max_size=5, unique=True))
    batches = sorted(2**e for e in exps)
    # Budgets: a factor 2 apart from a multiple of the largest batch (below 1: zero steps).
    base = max(batches) * seq_len * 2.0 ** draw(st.integers(-2, 8))
    budgets = [int(base * 2**i) for i in range(draw(st.integers(1 + rich, 4)))]
    n_groups = draw(st.integers(1, 3))
    sizes = [int(draw(st.sampled_from((1e5, 1e6, 3e7, 1e9))) * 4**g) for g in range(n_groups)]
    columns = {name: draw(st.booleans()) for name in ("group", "optimizer", "lr", "seed",
                                                      "params", "warmup_steps", "width")}
    columns["params"] |= rich and draw(st.sampled_from((True, True, False)))
    columns["group"] |= n_groups > 1 and not columns["params"]  # else one group of sizes
    n_lrs = draw(st.integers(1, 4)) if columns["lr"] else 1
    lr_step = draw(st.sampled_from((2.0, 1.0000001)))  # a grid, or lrs a hair apart
    lr_offset = draw(st.sampled_from((0, 0, 1, -1, 3)))  # grid steps off: the best on an edge
    n_seeds = draw(st.integers(1, 3))
    sigma = draw(st.sampled_from((0.0, 0.003, 0.03)))
    optimizers = draw(st.sampled_from((["adamw"], ["adamw"], ["adamw", "muon"])))
    rng = random.Random(draw(st.integers(0, 2**16)))
    rows = []
    for g, n in enumerate(sizes):
        for b in batches:
            best = 3e-3 * (b * seq_len / 2**16) ** 0.5 * (n / 1e6) ** -0.5
            for d in budgets:
                for k in range(n_lrs):
                    lr = best * lr_step ** (k - (n_lrs - 1) / 2 + lr_offset)
                    for seed in range(n_seeds):
                        row = {"group": f"N{n}" if columns["group"] and n_groups > 1 else "g",
                               "optimizer": optimizers[(k + seed) % len(optimizers)],
                               "lr": lr, "seed": seed, "params": n,
                               "warmup_steps": 10 * g, "width": 64 * 2**g,
                               "batch_size": b, "seq_len": seq_len, "tokens": d,
                               "loss": plausible_loss(n, b * seq_len, d, lr, best,
                                                      rng.gauss(0, sigma))}
                        rows.append({c: v for c, v in row.items() if columns.get(c, True)})
    # Corruptions: one row's, or every row's at its budget, or the whole table's.
    corruptions = draw(st.lists(st.tuples(
        st.sampled_from(sorted(BAD_LOSSES)), st.integers(0, 10**6),
        st.sampled_from(("row", "row", "row", "budget", "table"))), max_size=3))
    clean = (not corruptions and lr_step == 2.0
             and all(d >= b * seq_len for b in batches for d in budgets))
    for kind, at, scope in corruptions:
        hit = rows[at % len(rows)]
        for row in [hit] if scope == "row" else [
                r for r in list(rows) if scope == "table" or r["tokens"] == hit["tokens"]]:
            if kind == "dup":
                rows.append(dict(row))
            elif kind == "diverged":
                row["status"] = "diverged"
            else:
                row["loss"] = BAD_LOSSES[kind]
    if any("status" in r for r in rows):
        for r in rows:
            r.setdefault("status", "completed")
    rng.shuffle(rows)
    return Table(rows, draw(st.sampled_from((".csv", ".csv", ".jsonl"))), clean)


def outcome(main: Callable[[list[str]], None], argv: list[str]) -> str:
    """Run a command's main(argv): "ok", or its one-line error (SystemExit, non-zero code).
    Any other exception propagates and fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            text = err.getvalue()
            assert exc.code not in (0, None), text
            assert "Traceback" not in text, text
            lines = text.strip().splitlines()
            assert len(lines) == 1, text
            return lines[0]
    return "ok"


def assert_report(out: Path, names: tuple[str, ...]) -> None:
    """The report folder holds every file named."""
    for name in names:
        assert (out / name).is_file(), f"{name} not written to {out}"


def fit(table: Path, out: Path, *options: str) -> str:
    """fit_bcrit on one table (with its `options`); on success its report is written."""
    result = outcome(fit_bcrit_cli.main, ["--table", str(table), "--out", str(out),
                                          "--wandb", "disabled", *options])
    if result == "ok":
        assert_report(out, FIT_FILES)
    return result


def recommend(table: Path, out: Path, *target: str) -> str:
    """recommend on one table (target: --params N --tokens D, or --validate)."""
    result = outcome(recommend_cli.main, ["--table", str(table), *target, "--out", str(out),
                                          "--wandb", "disabled"])
    if result == "ok":
        assert_report(out, RECOMMEND_FILES)
    return result


# ---------------------------------------------------------------------------------------------
# Generated tables


@pytest.mark.slow
@settings(FUZZ, max_examples=40)
@given(table=results_tables())
def test_fit_bcrit_reports_or_fails_in_one_line(table, tmp_path_factory):
    """Any generated table gives fit_bcrit's report (report.md, fits.json, bcrit.csv) or one
    line on stderr with a non-zero exit: no traceback; and a clean table (no corruption)
    always its report (the fault guarded: a fit_bcrit that refuses good tables)."""
    note(table.csv_text())
    folder = tmp_path_factory.mktemp("fit")
    # the smoke scale's 20 refits of the answer's summary, as recommend's fuzzer below
    result = fit(write_table(table, folder), folder / "out", "--resamples", "20")
    assert result == "ok" or not table.clean, result


@settings(FUZZ, max_examples=60)
@given(table=results_tables(rich=True), validate=st.booleans(),
       target=st.sampled_from(((1e7, 2e9), (1073741824, 2e10), (1e5, 1e6))))
@pytest.mark.slow
def test_recommend_answers_or_fails_in_one_line(table, validate, target, tmp_path_factory):
    """Any generated table gives recommend's answer (recommend.md/.json/.png), for a target
    size and budget or held out (--validate), or one line on stderr: no traceback."""
    note(table.csv_text())
    folder = tmp_path_factory.mktemp("recommend")
    args = ["--validate"] if validate else ["--params", str(target[0]), "--tokens",
                                            str(target[1])]
    # the smoke scale's 20 refits: every path of the answer runs, at a third of the time
    result = recommend(write_table(table, folder), folder / "out", *args, "--resamples", "20")
    # a clean table is answered, or refused only for being too small (a model needs cells)
    assert result == "ok" or not table.clean or "needs" in result, result


# ---------------------------------------------------------------------------------------------
# Large and real tables


@pytest.mark.slow
def test_fit_bcrit_on_ten_thousand_rows(tmp_path):
    """A 10,000-row table (5 sizes x 5 budgets x 8 batches x 5 lrs x 10 seeds of the loss
    model, with noise) is fitted without error."""
    rng = random.Random(0)
    rows = []
    for n in (1e6, 4e6, 1.6e7, 6.4e7, 2.56e8):
        for d in (2**26, 2**27, 2**28, 2**29, 2**30):
            for b in (8, 16, 32, 64, 128, 256, 512, 1024):
                best = 3e-3 * (b * 512 / 2**16) ** 0.5 * (n / 1e6) ** -0.5
                for lr in (best / 4, best / 2, best, best * 2, best * 4):
                    for seed in range(10):
                        loss = plausible_loss(n, b * 512, d, lr, best, rng.gauss(0, 0.01))
                        rows.append({"group": f"N{int(n)}", "optimizer": "adamw", "lr": lr,
                                     "seed": seed, "params": int(n), "batch_size": b,
                                     "seq_len": 512, "tokens": d, "loss": loss})
    assert len(rows) == 10_000
    assert fit(write_csv(rows, tmp_path / "big.csv"), tmp_path / "out", "--resamples",
               "20") == "ok"


def steplaw_rows(one_group: bool) -> list[dict]:
    """The Step Law grid as critbatch table rows, read from the local copy (never copied into
    the repository): a group per model size, or one group with a params column."""
    with open(STEPLAW, newline="") as handle:
        source = list(csv.DictReader(handle))
    rows = []
    for r in source:
        n = int(r["N"])
        row = {"group": "steplaw" if one_group else f"N{n}", "optimizer": "adamw",
               "batch_size": int(r["bs"]), "seq_len": 2048, "lr": float(r["lr"]),
               "tokens": int(float(r["D"])), "loss": float(r["loss"])}
        rows.append({**row, "params": n} if one_group else row)
    return rows


@pytest.mark.slow
@pytest.mark.skipif(not STEPLAW.is_file(), reason=f"no local copy of {STEPLAW.name}")
@pytest.mark.parametrize("one_group", [False, True], ids=["group-per-size", "params-column"])
def test_steplaw_grid_through_both_commands(tmp_path, one_group):
    """The real Step Law grid (1,911 runs, 5 sizes), whose bootstrap refits once crashed
    fit_bcrit (least_squares: "Each lower bound must be strictly less than each upper
    bound"; "array must not contain infs or NaNs"), goes through fit_bcrit to a report with
    a joint row and through recommend (1.07B params, 2e10 tokens) to an answer."""
    table = write_csv(steplaw_rows(one_group), tmp_path / "steplaw.csv")
    assert fit(table, tmp_path / "fit") == "ok"
    fits = json.loads((tmp_path / "fit" / "fits.json").read_text())
    assert [r for r in fits["kaplan"] if r["method"] == "joint" and r["optimizer"] == "adamw"]
    assert fits["joint"]["adamw"]["verdict"] in ("resolved", "unresolved")
    answered = recommend(table, tmp_path / "recommend", "--params", "1073741824", "--tokens",
                         "2e10")
    # recommend predicts across sizes from the params column; without it, one line says so
    assert answered == "ok" if one_group else "without a model size" in answered
