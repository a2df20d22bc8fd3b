"""`recommend` where loss keeps falling towards small batches: planted sweeps in, the planted
batch, lr and loss out (science.recommend, analysis.recommend.engine, analysis/recommend.py)."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from critbatch.analysis.bcrit import tables
from critbatch.analysis.recommend import engine
from critbatch.analysis.recommend.recommend import fit_model, sized_sweeps
from critbatch.science.answer import Promise
from critbatch.science.intervals import SMOKE_RESAMPLES
from critbatch.science.joint import Form
from critbatch.science.recommend import (
    FIXED_SIZE_EXPONENT,
    fastest_within,
    joint_vector,
    joint_vector_derivative,
    to_target_loss,
)
from critbatch.science.recommend_planted import (
    BATCHES,
    BUDGETS,
    LARGER,
    SEQ_LEN,
    SWEEP_SIZES,
    planted_lr,
    planted_rows,
    truth,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("form", [Form(), Form(power=True), Form(small_batch=True, power=True)])
@pytest.mark.parametrize("n_sizes", [1, 2, 3, 5])
def test_the_law_s_derivative_in_its_parameters_is_the_finite_difference_one(form, n_sizes):
    """`joint_vector_derivative` (analytic, in every fit's Jacobian) against central
    differences of `joint_vector`, at random parameters and sizes for 0, 1 and 2 size terms
    and each optional term: the faults guarded are a wrong column (a sign, a missing factor
    of the exponent) and a misplaced row, either of which makes the fits' steps wrong."""
    from critbatch.science.recommend import size_terms

    rng = np.random.default_rng(n_sizes)
    terms = size_terms(n_sizes)
    for _ in range(10):
        theta = np.concatenate([[rng.uniform(0, 3)], rng.normal(0, 1, terms),
                                [rng.normal(), rng.normal(-1, 0.5), rng.normal(5, 2),
                                 rng.uniform(0, 8)], rng.uniform(0.5, 2, form.extra)])
        sizes = np.exp(rng.uniform(math.log(1e6), math.log(1e9), n_sizes))
        exact = joint_vector_derivative(theta, sizes, terms, form)
        numeric = np.empty_like(exact)
        for k in range(len(theta)):
            step = np.zeros(len(theta))
            step[k] = 1e-6 * max(1.0, abs(theta[k]))
            numeric[:, k] = (joint_vector(theta + step, sizes, terms, form)
                             - joint_vector(theta - step, sizes, terms, form)) / (2 * step[k])
        assert exact == pytest.approx(numeric, rel=1e-6, abs=1e-8)


def write_csv(rows: list[dict], path: Path) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def sweep_of(rows: list[dict], tmp_path: Path):
    runs, _ = tables.read_table(write_csv(rows, tmp_path / "grid.csv"))
    return sized_sweeps(runs, [])["adamw"]


def fitted_of(sweep, resamples: int = 40, seed: int = 0, **kwargs) -> engine.Fitted:
    return engine.fit(engine.grid_cells(sweep), Promise(), sweep.seq_len, sweep,
                      resamples=resamples, seed=seed, **kwargs)


def recommend_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "analysis" / "recommend.py"), *args,
                           "--wandb", "disabled"], capture_output=True, text=True)


def test_the_fastest_batch_within_a_promise_is_mccandlish_s_at_its_loss():
    """At the loss L the answer reaches, E(B)/E(B_ref) = (1 + B/B_crit)/(1 + B_ref/B_crit) is
    1 + eps exactly: B = eps B_crit + (1 + eps) B_ref; and within a tolerance in nats the loss
    given up is the tolerance."""
    world = truth()
    for eps in (0.05, 0.1, 0.3):
        out = fastest_within(world, LARGER, 6e6, 8, SEQ_LEN, overhead=eps)
        assert out["loss_optimal_batch"] == 8 and out["loss_optimal_is_smallest"]
        assert out["batch_size"] == pytest.approx(eps * out["b_crit"] + (1 + eps) * 8, rel=2e-3)
        assert out["tokens_over_min"] == pytest.approx(1 + out["batch_size"] / out["b_crit"])
        assert out["steps_over_min"] == pytest.approx(1 + out["b_crit"] / out["batch_size"])
    nats = fastest_within(world, LARGER, 6e6, 8, SEQ_LEN, tolerance=0.02)
    assert nats["loss_given_up"] == pytest.approx(0.02, abs=2e-4)


def test_target_loss_tokens_follow_the_model():
    world = truth()
    # 0.1 nats/token is 25% more tokens at 4.0 for batch 8; batch 64 costs 16% more, 512 124%
    rows = to_target_loss(world, LARGER, 4.0, [8, 64, 512], SEQ_LEN, 0.1)
    for r in rows["rows"]:
        e_min = float(world.e_min(4.0, LARGER))
        assert r["tokens"] == pytest.approx(e_min * (1 + r["batch_size"] / world.b_crit(4.0)))
        assert r["steps"] == math.ceil(r["tokens"] / (r["batch_size"] * SEQ_LEN))
    assert rows["batch_size"] == 64
    assert rows["tokens"] <= rows["allowed_tokens"]
    assert to_target_loss(world, LARGER, 1.0, [8, 64], SEQ_LEN, 0.01)["batch_size"] is None


def test_noiseless_world_gives_back_its_law_and_its_lr(tmp_path):
    sweep = sweep_of(planted_rows(truth(), SWEEP_SIZES, None), tmp_path)
    assert sweep.sizes == list(map(float, SWEEP_SIZES))
    fitted = fitted_of(sweep, resamples=0)
    assert fitted.route == engine.ROUTE_B_CRIT  # loss keeps falling towards batch 8
    fit = fitted.model.fit
    assert fit.gamma == pytest.approx(4.8, abs=0.3)
    assert fit.size_exponent == pytest.approx(0.3, abs=0.05)
    lr = fitted.lr  # the planted lr* ~ B^0.5 N^-0.5, no budget term
    assert "+".join(lr.columns) == "B+N"
    assert lr.exponent("B") == pytest.approx(0.5, abs=0.02)
    assert lr.exponent("N") == pytest.approx(-0.5, abs=0.02)
    tokens = 4 * BUDGETS[-1]
    for b in (8, 64, 256):
        assert float(fit.predict_loss(LARGER, b, tokens)[0]) == pytest.approx(
            float(truth().predict_loss(LARGER, b, tokens)[0]), abs=0.01)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.slow
def test_the_answer_for_a_larger_model_lands_on_the_planted_one(tmp_path, seed):
    """Three sizes to 1.5M tokens; a 4x larger model on 4x the tokens: the batch within 10%
    of the planted world's fastest within the promise, the lr within 15% of the planted
    optimum at it, the promise in nats within 5% of the planted one; the first line says
    the target lies beyond the data."""
    world = truth()
    sweep = sweep_of(planted_rows(world, SWEEP_SIZES, np.random.default_rng(seed)), tmp_path)
    tokens = 4 * BUDGETS[-1]
    doc = engine.answer(fitted_of(sweep, seed=seed), LARGER, tokens)
    planted = fastest_within(world, LARGER, tokens, BATCHES[0], SEQ_LEN, overhead=0.1)
    assert doc["batch_size"] == pytest.approx(planted["batch_size"], rel=0.1)
    assert doc["batch_low"] <= doc["batch_size"] <= doc["batch_high"]
    assert doc["lr"] == pytest.approx(float(planted_lr(doc["batch_size"], LARGER)), rel=0.15)
    assert doc["loss_given_up"] == pytest.approx(planted["loss_given_up"], rel=0.05)
    assert doc["loss_optimal_batch"] == BATCHES[0]
    assert doc["extrapolation"]["params_ratio"] == pytest.approx(LARGER / SWEEP_SIZES[-1])
    assert doc["headline"][-1].startswith("EXTRAPOLATED: 4x the largest model's params")


@pytest.mark.slow
def test_an_unresolved_law_warns_first_and_widens_the_interval(tmp_path):
    """The same sweep and bootstrap, its law called unresolved by the sweep report: the answer
    says so before its numbers, its interval also spans the answer without extrapolating
    B_crit(L) below the sweep's losses (wider, never narrower), and names the check."""
    sweep = sweep_of(planted_rows(truth(), SWEEP_SIZES, np.random.default_rng(4)), tmp_path)
    target = (LARGER, 8 * BUDGETS[-1])
    resolved = engine.answer(fitted_of(sweep), *target)
    unresolved = engine.answer(fitted_of(sweep, report_verdict={
        "verdict": "unresolved", "reasons": ["1/alpha_B's 95% interval [2.5, 4.6] is wider "
                                             "than 1"]}), *target)
    assert resolved["verdict"] == "resolved" and not resolved["headline"][0].startswith("UNR")
    assert unresolved["verdict"] == "unresolved"
    assert unresolved["headline"][0].startswith("UNRESOLVED: the sweep report: 1/alpha_B's")
    assert unresolved["batch_low"] <= resolved["batch_low"]
    assert unresolved["batch_high"] >= resolved["batch_high"]
    assert (unresolved["batch_high"] / unresolved["batch_low"]
            > 1.2 * resolved["batch_high"] / resolved["batch_low"])
    assert unresolved["batch_without_extrapolation"] is not None
    assert "two short runs" in unresolved["check"]


@pytest.mark.slow
def test_the_smoke_scale_says_pipeline_test_on_every_answer(tmp_path):
    rows = [{**r, "scale": "smoke"} for r in planted_rows(truth(), SWEEP_SIZES,
                                                          np.random.default_rng(2))]
    table = write_csv(rows, tmp_path / "grid.csv")
    proc = recommend_cli("--table", str(table), "--params", str(SWEEP_SIZES[-1]), "--tokens",
                         str(BUDGETS[-1]), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[1]  # after the progress line
    assert first == ("adamw: PIPELINE TEST, NOT A MEASUREMENT (smoke scale): run SCALE=cpu or "
                     "gpu for numbers")
    doc = json.loads((tmp_path / "out" / "recommend.json").read_text())
    assert doc["verdict"] == "pipeline test"
    # a pipeline test refits SMOKE_RESAMPLES times, not the engine's 100
    assert doc["resamples"] + doc["failed_resamples"] == SMOKE_RESAMPLES


@pytest.mark.slow
def test_cli_answers_with_the_recommend_json_fields_and_a_far_target_warns_first(tmp_path):
    table = write_csv(planted_rows(truth(), SWEEP_SIZES, np.random.default_rng(3)),
                      tmp_path / "grid.csv")
    proc = recommend_cli("--table", str(table), "--params", "5e7", "--tokens", "3e8",
                         "--target-loss", "3.5", "--json", str(tmp_path / "answer.json"),
                         "--out", str(tmp_path / "out"), "--resamples", "40")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "answer.json").read_text())
    assert doc["resamples"] + doc["failed_resamples"] == 40  # --resamples reaches the refits
    for key in ("optimizer", "width", "params", "tokens", "seq_len", "batch_size", "batch_low",
                "batch_high", "lr", "lr_low", "lr_high", "loss_optimal_batch",
                "loss_optimal_lr", "overhead", "loss_given_up", "predicted_loss", "verdict",
                "extrapolation", "predicted_loss_low", "predicted_loss_high", "b_crit",
                "b_crit_low", "b_crit_high", "steps", "candidates", "warnings"):
        assert key in doc, key
    assert doc["overhead"] == 0.1 and doc["seq_len"] == SEQ_LEN
    assert doc["extrapolation"]["params_ratio"] > 10
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("adamw: FAR OUTSIDE THE DATA: ")
    assert f"sequences of {SEQ_LEN} tokens" in proc.stdout
    assert doc["target_loss"]["rows"]
    assert (tmp_path / "out" / "recommend.png").stat().st_size > 0


@pytest.mark.slow
def test_a_promise_in_nats_is_kept_in_nats(tmp_path):
    table = write_csv(planted_rows(truth(), SWEEP_SIZES, np.random.default_rng(5)),
                      tmp_path / "grid.csv")
    proc = recommend_cli("--table", str(table), "--params", str(SWEEP_SIZES[-1]), "--tokens",
                         str(BUDGETS[-1]), "--tolerance", "0.02", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "o" / "recommend.json").read_text())
    assert doc["tolerance"] == 0.02 and doc["overhead"] is None
    assert doc["loss_given_up"] == pytest.approx(0.02, abs=1e-3)
    assert "within 0.02 nats/token of the best" in proc.stdout


@pytest.mark.slow
def test_validate_on_a_u_shaped_grid_reads_its_optimum_and_scores_on_the_held_out_runs(
        tmp_path):
    """A grid of four sizes from another codebase where small batches lose too (B_s = 12): the
    loss against batch at fixed tokens is U-shaped, so the engine reads the optimum inside the
    batches; each held-out case is scored on its own runs."""
    rng = np.random.default_rng(7)
    world = truth(b_small=12.0)
    rows = planted_rows(world, (*SWEEP_SIZES, LARGER), rng, batches=(4, 8, 16, 32, 64, 128),
                        sigma=0.003)
    table = write_csv(rows, tmp_path / "grid.csv")
    # the held-out answers' intervals are not checked here: 60 resamples, not 300
    proc = recommend_cli("--table", str(table), "--validate", "--out", str(tmp_path / "out"),
                         "--resamples", "60")
    assert proc.returncode == 0, proc.stderr
    cases = json.loads((tmp_path / "out" / "recommend.json").read_text())[
        "validation"]["adamw"]["cases"]
    assert len(cases) == 1 + 4  # the largest model, and each size's largest budget
    assert all(c["answer"]["route"] == engine.ROUTE_OPTIMUM for c in cases)
    assert sum(c["measured"]["checks"]["batch_within_a_doubling"] for c in cases) >= 4
    assert "held out in turn" in proc.stdout and "promise kept" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--tokens", "1e6"], "say the target"),
    (["--width", "128", "--tokens", "1e6"], "--width needs a sweep of one depth"),
    (["--params", "1e6", "--tokens", "1e6", "--optimizer", "muon"], "the runs have adamw"),
    (["--params", "1e6", "--tokens", "1e6", "--overhead", "0.1", "--tolerance", "0.01"],
     "not allowed with"),
    (["--params", "1e6", "--tokens", "1e6", "--resamples", "5"], "give 20 or more"),
])
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    table = write_csv(planted_rows(truth(), SWEEP_SIZES[:1], None), tmp_path / "grid.csv")
    proc = recommend_cli("--table", str(table), *args, "--out", str(tmp_path / "out"))
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_table_params_column_round_trips(tmp_path):
    rows = planted_rows(truth(), SWEEP_SIZES[:1], None, budgets=BUDGETS[:1], batches=(8,))
    runs, _ = tables.read_table(write_csv(rows, tmp_path / "grid.csv"))
    assert {r["params_nonembedding"] for r in runs} == {SWEEP_SIZES[0]}
    exported, _ = tables.export_rows(runs)
    tables.write_table(exported, tmp_path / "out.csv")
    again, _ = tables.read_table(tmp_path / "out.csv")
    assert [r["params_nonembedding"] for r in again] == [r["params_nonembedding"] for r in runs]
    bad = tmp_path / "bad.csv"
    bad.write_text("batch_size,seq_len,tokens,loss,params\n8,64,1000,5.0,-3\n")
    with pytest.raises(Exception, match="column params"):
        tables.read_table(bad)


def test_validate_with_one_size_holds_out_its_largest_budget(tmp_path):
    sweep = sweep_of(planted_rows(truth(), SWEEP_SIZES[-1:], np.random.default_rng(11)),
                     tmp_path)
    rows = engine.validate(engine.grid_cells(sweep), Promise(), sweep.seq_len, sweep,
                           resamples=20)
    assert [r["case"] for r in rows] == ["98.4M at its largest budget, 1.5M tokens (2.0x its "
                                         "next)".replace("98.4M", "0.0984M")] or len(rows) == 1
    assert rows[0]["tokens"] == pytest.approx(BUDGETS[-1], rel=0.01)
    assert rows[0]["measured"]["measured_largest_within"] >= BATCHES[0]


def test_two_sizes_fix_the_size_exponent_and_say_so(tmp_path):
    sweep = sweep_of(planted_rows(truth(), SWEEP_SIZES[1:], None), tmp_path)
    model = fit_model(sweep, resamples=0)
    assert model.fit.size_terms == 1
    assert model.fit.size_exponent == FIXED_SIZE_EXPONENT
    fitted = fitted_of(sweep, resamples=20)
    assert any("size exponent is fixed" in w for w in engine.size_warnings(fitted, LARGER))
    doc = engine.answer(fitted, LARGER, 2 * BUDGETS[-1])
    true_loss = float(truth().predict_loss(LARGER, doc["batch_size"], 2 * BUDGETS[-1])[0])
    assert doc["predicted_loss"] == pytest.approx(true_loss, abs=0.03)


def test_a_diverged_run_bounds_its_batch_s_lr_from_above(tmp_path):
    """A run at batch 32 that diverged at an lr below the planted optimum: the answer's lr
    valley for that batch stays below it at every budget; other batches keep theirs."""
    rows = planted_rows(truth(), SWEEP_SIZES[-1:], None)
    best = float(planted_lr(32, SWEEP_SIZES[-1]))
    rows.append({**rows[0], "batch_size": 32, "lr": 0.9 * best, "seed": 0, "loss": "",
                 "status": "diverged"})
    for r in rows:
        r.setdefault("status", "completed")
    sweep = sweep_of(rows, tmp_path)
    cells = engine.grid_cells(sweep)
    for cell in cells:
        for b in cell.batches:
            if b.batch == 32:
                assert b.diverged == (0.9 * best,)
                assert b.valley().lr <= 0.9 * best * (1 + 1e-9)
            else:
                assert b.diverged == ()


def test_too_few_cells_for_the_profile_s_laws_fall_back_to_the_joint_model(tmp_path):
    """One size, four budgets, small batches losing too (B_s = 12): the loss has an optimum
    inside the batches, but four cells cannot carry the loss law L*(N, D) a promise in compute
    reads; the sweep still has its joint model, and the answer says it used it."""
    rows = planted_rows(truth(b_small=12.0), SWEEP_SIZES[-1:], np.random.default_rng(1),
                        batches=(4, 8, 16, 32, 64, 128), sigma=0.003)
    sweep = sweep_of(rows, tmp_path)
    cells = engine.grid_cells(sweep)
    assert engine.route_of(cells) == engine.ROUTE_OPTIMUM and len(cells) == 4
    doc = engine.answer(fitted_of(sweep, resamples=20), SWEEP_SIZES[-1], BUDGETS[-1])
    assert doc["route"] == engine.ROUTE_B_CRIT
    assert "read through the joint model instead" in doc["route_words"]
    assert doc["batch_size"] > doc["loss_optimal_batch"] > 4


@pytest.mark.study
def test_the_answer_s_intervals_hold_the_planted_values_on_planted_sweeps():
    """`make recommend-coverage`'s worlds 3-10: at 4x the size and tokens the 95% intervals of
    the batch, the lr at it and at the loss-optimal batch, the loss and B_crit hold the
    planted values in 7 or more of 8 (50 worlds: 48, 50, 50, 46 and 48 of 50; see
    docs/results/recommend_coverage.md)."""
    from critbatch.analysis.recommend.coverage import QUANTITIES, holds, world_answers

    worlds = [world_answers(seed, Promise(), resamples=100)["beyond"] for seed in range(3, 11)]
    for key in QUANTITIES:
        assert sum(bool(holds(w, key)) for w in worlds) >= 7, key


@pytest.mark.slow
def test_the_readme_s_make_recommend_line_on_a_sweep_s_run_folders(tmp_path):
    """The README's `make recommend WIDTH=128 TOKENS=3e7`, end to end: make turns its variables
    into the command (`make -n`), which, run where a sweep's run folders are, finds the latest
    sweep under runs/, answers for width 128 at 3e7 tokens and writes its report there."""
    from critbatch.analysis.bcrit.synthetic import synthetic_sweep

    line = "make recommend WIDTH=128 TOKENS=3e7"
    assert line in (REPO / "README.md").read_text()
    synthetic_sweep(tmp_path / "runs", sweep="batch", all_budgets=True, widths=(64,))
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-o", "install",
                          *line.split()[1:]], cwd=REPO, capture_output=True, text=True,
                         check=True)
    command = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert command == ("CRITBATCH_VIA_MAKE=recommend .venv/bin/python analysis/recommend.py "
                       "--width 128 --tokens 3e7"), command
    command = command.replace(".venv/bin/python", sys.executable).replace(
        "analysis/recommend.py", str(REPO / "analysis" / "recommend.py"))
    proc = subprocess.run(f"{command} --wandb disabled", shell=True, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no paths given: analysing runs/batch/adamw_w64" in proc.stdout
    doc = json.loads((tmp_path / "runs/batch/adamw_w64/report/recommend.json").read_text())
    assert (doc["width"], doc["tokens"], doc["optimizer"]) == (128, 3e7, "adamw")
    assert doc["batch_low"] <= doc["batch_size"] <= doc["batch_high"] and doc["lr"] > 0
