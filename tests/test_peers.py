"""`make peers` and `critbatch-recommend --peers`: public grids read from their sources' files.

A planted grid in Step Law's file format stands in for the real one where the real one is not
beside the repository (it has no license: never copied here); the sources' pinned sha256 is
swapped for the planted file's. The real grid, where it is, is checked against the published
numbers (slow)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import PEERS_DIR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_answer import planted_grid
from test_grid_laws import BATCHES, BUDGETS, LR_STEPS, SIZES, planted

from critbatch.analysis.recommend import engine
from critbatch.peers import recommend as peers_recommend
from critbatch.peers import report, sources, steplaw
from critbatch.results.errors import ResultsError
from critbatch.science.answer import Promise

SHARED = PEERS_DIR


def planted_steplaw(folder: Path, noise: float = 2e-3) -> dict[str, Path]:
    """A Step Law-format grid (`steplaw.COLUMNS` and more) and bootstrap file from planted
    laws (`test_grid_laws.planted`), under the sources' file names."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    grid = folder / sources.SOURCES["steplaw"].filename
    with open(grid, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["h", "lr", "bs", "loss", "smooth loss", "D", "N"])
        for n in SIZES:
            for d in BUDGETS[n]:
                for b in BATCHES:
                    for lr in 2e-3 * (b / 256) ** 0.35 * (n / 4e8) ** -0.7 * LR_STEPS / LR_STEPS[6]:
                        loss = planted(n, d, b, lr) + noise * rng.normal()
                        writer.writerow([512, lr, int(b), loss, loss, int(d), int(n)])
    boot = folder / sources.SOURCES["steplaw_bootstrap"].filename
    with open(boot, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(steplaw.BOOTSTRAP_COLUMNS)
        for _ in range(50):
            writer.writerow([1.8 + 0.1 * rng.normal(), -0.71 + 0.03 * rng.normal(),
                             0.31 + 0.02 * rng.normal(), -0.5, 0.57 + 0.02 * rng.normal()])
    return {"steplaw": grid, "steplaw_bootstrap": boot}


@pytest.fixture
def planted_sources(tmp_path, monkeypatch, http_folder):
    """The planted files, with the sources' sha256 and URLs pointing at them (served over
    HTTP from their folder)."""
    files = planted_steplaw(tmp_path / "peers")
    base = http_folder(tmp_path / "peers")
    for key, path in files.items():
        monkeypatch.setitem(sources.SOURCES, key, dataclasses.replace(
            sources.SOURCES[key], sha256=sources.sha256_of(path), url=base + path.name))
    return tmp_path / "peers"


@pytest.mark.slow
def test_make_peers_writes_the_report_json_and_docs_page(planted_sources, tmp_path, capsys):
    """`make peers` with no folder of the files: they are downloaded into the cache (from the
    planted sources' URLs) and read from there. (The joint model on the grid's table:
    `test_the_grid_as_a_table_...` below.)"""
    cache = tmp_path / "cache"
    doc = report.run(None, tmp_path / "out", tmp_path / "docs" / "peers.md", resamples=50,
                     cache=cache, joint=False, answer_resamples=50)
    assert {p.name for p in cache.iterdir()} == {s.filename for k, s in sources.SOURCES.items()
                                                 if k.startswith("steplaw")}
    for name in (report.REPORT_FILE, report.JSON_FILE, "steplaw_loss_vs_lr.png",
                 "steplaw_laws.png", "zhang_cbs.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    page = (tmp_path / "docs" / "peers.md").read_text()
    assert "](peers/steplaw_laws.png)" in page and (tmp_path / "docs/peers/zhang_cbs.png").exists()
    saved = json.loads((tmp_path / "out" / report.JSON_FILE).read_text())
    assert saved["steplaw"]["laws"]["lr"]["terms"] == "B+N"  # the planted lr has no D term
    assert len(saved["steplaw"]["validation"]) == 1 + len(SIZES)
    assert all(v["measured"]["checks"]["batch_within_a_doubling"]
               for v in doc["steplaw"]["validation"])
    assert "### The answer held out in turn" in page
    assert "Step Law: critbatch" in capsys.readouterr().out
    # the page opens with what agrees, what does not and what to take, from the numbers
    summary = page.split("## Summary", 1)[1].split("## Step Law", 1)[0]
    assert "**What agrees.**" in summary and "**What to take from it.**" in summary
    v = saved["steplaw"]["validation_summary"]
    assert (f"in {v['promise_kept']['passed']} of {v['promise_kept']['of']} cases"
            in summary)


@pytest.mark.slow
def test_the_grid_as_a_table_goes_through_the_joint_model_and_gives_the_same_answer(
        planted_sources, tmp_path):
    """Three sizes of the planted grid through critbatch's table path: the joint model's
    verdict and B_crit(L) row, and `recommend --table`'s answer, the same as `--peers`' on
    the same runs (one engine); the table lands in the cache folder given, never beside the
    report."""
    runs = [r for r in steplaw.read_runs(planted_sources / sources.SOURCES["steplaw"].filename)
            if r["params"] <= 4e8]
    cells = steplaw.grid_cells(runs)
    fitted = engine.fit(cells, Promise(), steplaw.SEQ_LEN, resamples=50)
    peers_doc = engine.answer(fitted, *report.QUESTION)
    out = report.joint_on_table(runs, tmp_path / "cache", peers_doc)
    assert (tmp_path / "cache" / report.TABLE_FILE).exists()
    assert out["joint"]["verdict"] in ("resolved", "unresolved")
    assert out["kaplan_joint"]["method"] == "joint"
    doors = out["doors"]
    assert doors["agree_within_5%"], doors
    assert doors["table"]["batch_size"] == pytest.approx(peers_doc["batch_size"], rel=0.05)


@pytest.mark.slow
def test_recommend_from_a_public_grid(planted_sources, tmp_path, capsys):
    from critbatch.analysis.recommend.cli import main

    main(["--peers", "steplaw", "--peers-dir", str(planted_sources), "--params", "4e8",
          "--tokens", "2e10", "--out", str(tmp_path / "rec"), "--resamples", "60"])
    doc = json.loads((tmp_path / "rec" / peers_recommend.JSON_FILE).read_text())
    assert doc["loss_optimal_batch"] == pytest.approx(300, rel=0.15)  # the planted B_opt
    assert doc["batch_low"] < doc["batch_size"] < doc["batch_high"]
    assert doc["lr_low"] < doc["lr"] < doc["lr_high"]
    assert doc["route"] == engine.ROUTE_OPTIMUM and doc["seq_len"] == steplaw.SEQ_LEN
    assert not doc["headline"]  # inside the grid, the law resolved
    assert "sequences of 2,048 tokens" in capsys.readouterr().out
    main(["--peers", "steplaw", "--peers-dir", str(planted_sources), "--params", "7e10",
          "--tokens", "1e12", "--out", str(tmp_path / "far"), "--resamples", "20"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("steplaw: FAR OUTSIDE THE DATA: 70x the largest model's params")
    main(["--peers", "steplaw", "--peers-dir", str(planted_sources), "--validate", "--out",
          str(tmp_path / "val"), "--resamples", "60"])
    rows = json.loads((tmp_path / "val" / peers_recommend.JSON_FILE).read_text())["validation"]
    assert len(rows) == 1 + len(SIZES) and all("formula" in r for r in rows)
    assert all(r["measured"]["checks"]["promise_kept"] for r in rows)
    # the answer's plot and the held-out cases' plot, as for a sweep of one's own
    for folder in ("rec", "val"):
        assert (tmp_path / folder / "recommend.png").stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--peers", "steplaw", "--width", "512", "--tokens", "1e9"], "--params N"),
    (["--peers", "steplaw", "--params", "inf", "--tokens", "1e9"], "finite"),
    (["--peers", "steplaw", "--params", "1e9", "--tokens", "1e9", "--target-loss", "2"],
     "--target-loss"),
    (["--peers", "steplaw", "--validate", "--params", "1e9"], "drop"),
    (["--peers", "steplaw", "--table", "x.csv", "--params", "1e9", "--tokens", "1e9"],
     "pass one of"),
])
def test_recommend_peers_argument_errors_are_one_line(argv, message, capsys):
    from critbatch.analysis.recommend.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_offline_without_peers_dir_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sources.SOURCES, "steplaw", dataclasses.replace(
        sources.SOURCES["steplaw"], url="http://127.0.0.1:9/dense_lr_bs_loss.csv"))
    monkeypatch.setenv("CRITBATCH_CACHE", str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c",
                           "import dataclasses, sys; from critbatch.peers import sources; "
                           "sources.SOURCES['steplaw'] = dataclasses.replace("
                           "sources.SOURCES['steplaw'], url='http://127.0.0.1:9/x.csv'); "
                           "from critbatch.peers.cli import main; main(['--out', sys.argv[1], "
                           "'--no-docs'])", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "PEERS_DIR" in error[0] and "cannot download" in error[0]


def test_a_grid_too_small_for_its_laws_is_one_line(tmp_path):
    """Two batches per cell, each best on the batch grid's edge: no law, one line."""
    path = tmp_path / "grid.csv"
    rows = ["N,D,bs,lr,smooth loss"] + [f"{n},{d},{b},{lr},{3 - 0.001 * b + (lr - 2e-3) ** 2}"
                                         for n in (1e8, 2e8) for d in (1e9, 2e9)
                                         for b in (32, 64) for lr in (1e-3, 2e-3, 4e-3)]
    path.write_text("\n".join(rows) + "\n")
    cells = steplaw.cells_of(steplaw.read_runs(path))
    with pytest.raises(ResultsError, match="cannot give its laws") as err:
        steplaw.fit(cells, resamples=10)
    assert "\n" not in str(err.value)


def test_one_size_is_validated_on_its_budgets_only():
    """With one model size there is no size to hold out: only its largest budget."""
    cells = [c for c in planted_grid() if c.params in (2e8, 3e8, 4e8)]
    assert [name.split(" ")[0] for name, _, _ in engine.held_out_cases(cells)] == [
        "the", "200M", "300M", "400M"]
    one = [c for c in cells if c.params == 2e8]
    assert [name for name, _, _ in engine.held_out_cases(one)] == [
        "200M at its largest budget, 30B tokens (3.0x its next)"]


def test_a_grid_file_without_its_columns_is_one_line(tmp_path):
    path = tmp_path / "grid.csv"
    path.write_text("N,D,bs,lr\n1,2,3,4\n")
    with pytest.raises(ResultsError, match="no column smooth loss") as err:
        steplaw.read_runs(path)
    assert "\n" not in str(err.value)
    path.write_text("N,D,bs,lr,smooth loss\n1,2,x,4,2.0\n")
    with pytest.raises(ResultsError, match="row 2"):
        steplaw.read_runs(path)


# ---------------------------------------------------------------------------------------------
# The real grids


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / sources.SOURCES["steplaw"].filename).is_file(),
                    reason=f"no local copy of Step Law's grid in {SHARED}")
def test_step_law_and_zhang_reproduced_from_their_own_files(tmp_path):
    """The real grid through `critbatch-peers`: critbatch's exponents overlap Step Law's
    bootstrap intervals (lr in N and D at the loss-optimal batch, the batch in D); the answer
    held out in turn (six cases) keeps its promise of 10% more compute (its measured loss given
    up at most the promised one + 0.004 nats/token) in 5 or more, its 95% interval holds the
    measured largest batch within the promise in 5 or more, its batch lies within a doubling of
    it in all, and its loss-optimal answer gives up a median no worse than Step Law's formula's
    + 0.002 (measured 2026-12-06: 6, 6, 6 of 6; 0.0023 against 0.0017); --table and --peers
    give one answer; and Zhang et al.'s S_min, E_min within 2% with the CBS exponent's
    interval holding their 0.468."""
    proc = subprocess.run([sys.executable, "-m", "critbatch.peers.cli", "--peers-dir",
                           str(SHARED), "--out", str(tmp_path / "out"), "--docs",
                           str(tmp_path / "docs" / "peers.md"), "--resamples", "1000",
                           "--cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out" / report.JSON_FILE).read_text())
    step = doc["steplaw"]
    assert all(row[4] == "yes" for row in report.exponent_rows(step))
    summary = step["validation_summary"]
    assert len(step["validation"]) == 6
    assert summary["promise_kept"]["passed"] >= 5, summary
    assert summary["interval_holds"]["passed"] >= 5, summary
    assert summary["batch_within_a_doubling"]["passed"] == 6, summary
    assert (summary["median_loss_optimal_given_up"]
            <= summary["median_formula_given_up"] + 0.002), summary
    assert step["table_path"]["doors"]["agree_within_5%"], step["table_path"]["doors"]
    z = doc["zhang"]
    assert all(abs(s["s_min_rel_diff"]) < 0.02 and abs(s["e_min_rel_diff"]) < 0.02
               for s in z["sizes"])
    law = z["cbs_law"]
    assert law["beta_boot_low"] <= law["published_beta"] <= law["beta_boot_high"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.integers(1, 4), budgets=st.integers(1, 3), batches=st.integers(2, 5),
       lrs=st.integers(1, 4), bowl=st.floats(-0.02, 0.05), nan_share=st.floats(0, 0.5),
       seed=st.integers(0, 2**16))
@pytest.mark.slow
def test_any_grid_answers_or_stops_in_one_line(sizes, budgets, batches, lrs, bowl, nan_share,
                                               seed):
    """Generated grids of any shape (one size, one budget, two batches, one lr, losses flat,
    falling or rising in batch, diverged runs): the laws, the held-out checks and an answer
    come back, or a ResultsError of one line; never a traceback."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(sizes):
        for j in range(budgets):
            for b in 2.0 ** np.arange(4, 4 + batches):
                for lr in 1e-3 * 2.0 ** np.arange(lrs):
                    loss = (3 - 0.1 * i - 0.05 * j + bowl * math.log(b / 64) ** 2
                            + 0.02 * math.log(lr / 2e-3) ** 2 + 1e-3 * rng.normal())
                    runs.append({"params": 1e8 * 2**i, "tokens": 1e9 * 3**j, "batch_size": b,
                                 "lr": lr, "loss": math.nan if rng.random() < nan_share
                                 else loss})
    try:
        cells = steplaw.cells_of(runs)
        steplaw.fit(cells, resamples=20)
        grid = steplaw.grid_cells(runs)
        fitted = engine.fit(grid, Promise(), steplaw.SEQ_LEN, resamples=20)
        engine.validate(grid, Promise(), steplaw.SEQ_LEN, resamples=20)
        answer = engine.answer(fitted, 2e9, 1e10)
    except ResultsError as err:
        assert "\n" not in str(err)
        return
    assert answer["batch_size"] > 0 and answer["lr"] > 0


def test_make_peers_writes_only_where_out_says(monkeypatch):
    """The tracked page is written only when asked (`--docs`, `make docs-results`): `make
    peers OUT=<folder>` leaves the clone's tracked files alone."""
    from critbatch.peers import cli

    calls = []
    monkeypatch.setattr(cli, "run", lambda *args: calls.append(args))
    cli.main(["--out", "elsewhere"])
    cli.main(["--docs", "docs/results/peers.md"])
    assert calls[0][1] == "elsewhere" and calls[0][2] is None
    assert calls[1][2] == "docs/results/peers.md"
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    peers_recipe = makefile.split("\npeers:", 1)[1].split("\n\n", 1)[0]
    assert "--docs" not in peers_recipe and "--docs docs/results/peers.md" in makefile
