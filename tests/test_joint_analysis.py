"""The joint model in the B_crit study (analysis/joint/): from run
folders of a planted branched sweep to fits.json's `joint` and its Kaplan rows, the
held-out predictions and the report's opening lines."""

from __future__ import annotations

import json
import math

import pytest

from critbatch.analysis.bcrit import bcrit
from critbatch.analysis.bcrit.report import run_analysis
from critbatch.analysis.bcrit.synthetic import synthetic_branched_sweep
from critbatch.analysis.joint.joint import RESOLVED_WIDTH, decide
from critbatch.analysis.joint.report import held_out_summary, verdict
from critbatch.results.runs import load_runs
from critbatch.science.synthetic import SyntheticTruth

OPTIMIZERS = ("adamw", "muon")
TRUTH = SyntheticTruth(b_crit=200.0, seq_len=64)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("joint")
    synthetic_branched_sweep(root, TRUTH, optimizers=OPTIMIZERS)
    return root, bcrit.analyse(load_runs([root], progress=False)["runs"])


def test_joint_rows_recover_the_planted_bcrit(sweep):
    """The synthetic world's B_crit is 200 sequences at every loss: exponent 0, and
    B* = 200 x seq_len tokens."""
    _, result = sweep
    rows = {r["optimizer"]: r for r in result["fits"]["kaplan"] if r["method"] == "joint"}
    assert set(rows) == set(OPTIMIZERS)
    for row in rows.values():
        assert abs(row["exponent"]) < 0.3
        assert row["b_star_tokens"] == pytest.approx(200 * TRUTH.seq_len, rel=0.05)
        assert row["exponent_low"] <= row["exponent"] <= row["exponent_high"]
        assert row["interval"].startswith("95% parametric bootstrap")
        assert set(bcrit_row_keys()) <= set(row)


def bcrit_row_keys():
    from critbatch.analysis.bcrit.kaplan import ROW_KEYS
    return ROW_KEYS


def test_held_out_budget_is_predicted(sweep):
    """Two held-out sets of one width: the whole largest budget (five batches), and its four
    batches above the baseline with the baseline's cell there kept in the refit."""
    _, result = sweep
    for doc in result["fits"]["joint"].values():
        held, anchored = doc["held_out"]
        assert held["held_out"] == "the largest budget" and held["n_cells"] == 5
        assert anchored["held_out"] == "the largest budget above its smallest batch"
        assert anchored["n_cells"] == 4
        assert 8 not in {r["batch_size"] for r in anchored["rows"]}
        for one in (held, anchored):
            assert one["tokens_reach"] == pytest.approx(2.0, rel=0.01)
            assert one["within_2_sigma"] == one["n_cells"]
            # the seed test passed: the refit's spread (a diagnosis of misses) is not computed
            assert one["within_2_predictive_sigma"] is None
            assert all(row["predicted_loss_sd"] is None for row in one["rows"])
        assert "the largest budget (x2 the refit's tokens)" in held_out_summary(doc)
        assert doc["chi2_per_dof"] < 1
        assert doc["loss_alone"] is None  # one width: nothing to test


def test_a_missed_budget_whose_larger_batches_are_predicted_names_the_curve():
    """The verdict says which part failed: the whole largest budget missed, its larger
    batches (baseline kept) predicted: the example curve, not the law."""
    from critbatch.analysis.joint.joint import curve_not_law

    whole = {"held_out": "the largest budget", "n_cells": 5, "within_2_sigma": 1}
    anchored = {"held_out": "the largest budget above its smallest batch", "n_cells": 4,
                "within_2_sigma": 4}
    assert "4 of 4 larger batches" in curve_not_law([whole, anchored])
    assert curve_not_law([whole, {**anchored, "within_2_sigma": 2}]) is None
    assert curve_not_law([{**whole, "within_2_sigma": 5}, anchored]) is None
    doc = {"optimizer": "muon", "b_star_tokens": 1e5, "exponent": 2.0, "exponent_low": 1.5,
           "exponent_high": 2.5, "interval": "95% parametric bootstrap", "log_loss_span": 0.3,
           "chi2_per_dof": 1.1, "held_out": [whole, anchored]}
    text = verdict(doc)
    assert "unresolved" in text and "example curve's extrapolation" in text


def test_range_check_refits_without_the_cells_above_the_baseline(sweep):
    """Larger batches at the smallest budgets lose more than the baseline ever did; without
    them the planted law (exponent 0) comes back too, inside the interval."""
    _, result = sweep
    for doc in result["fits"]["joint"].values():
        check = doc["above_baseline_range"]
        flagged = [c for c in doc["cells"] if c["above_baseline_range"]]
        top = max(c["val_loss"] for c in doc["cells"] if c["batch_size"] == min(
            x["batch_size"] for x in doc["cells"]))
        assert check["n_cells"] == len(flagged) > 0
        assert all(c["val_loss"] > top for c in flagged)
        assert abs(check["exponent"]) < 0.3
        assert doc["exponent_low"] <= check["exponent"] <= doc["exponent_high"]
        assert "leans on" not in verdict(doc)


def test_verdict_says_unresolved_when_the_law_leans_on_cells_above_the_baseline():
    """The range check's shift is judged against its own sd: 3 sd away leaves the law
    unresolved, 1 sd does not; a fits.json from before that sd judges the refit against the
    full fit's interval."""
    check = {"n_cells": 6, "exponent": 2.6, "chi2_per_dof": 0.5, "shift_sd": 0.1,
             "shift_sigmas": 8.0}
    doc = {"optimizer": "adamw", "b_star_tokens": 1e6, "exponent": 1.8, "exponent_low": 1.5,
           "exponent_high": 2.1, "log_loss_span": 0.4, "interval": "95% ...",
           "above_baseline_range": check}
    text = verdict(doc)
    assert "unresolved" in text and decide(doc)["verdict"] == "unresolved"
    assert "without the 6 cell(s) above the baseline's loss range 1/alpha_B is 2.60, 8.0 sd" in text
    check.update(exponent=1.9, shift_sigmas=1.0)
    assert "unresolved" not in verdict(doc) and decide(doc)["verdict"] == "resolved"
    assert decide(doc)["reasons"] == []
    del check["shift_sigmas"], check["shift_sd"]  # an older fits.json
    check["exponent"] = 2.6
    assert "outside its interval" in verdict(doc)
    check["exponent"] = 2.0
    assert "unresolved" not in verdict(doc)


@pytest.mark.slow
def test_report_opens_with_the_verdict_and_fits_json_has_joint(sweep, tmp_path):
    root, _ = sweep
    out = tmp_path / "report"
    run_analysis([str(root)], out=str(out), wandb_mode="disabled", resamples=20)
    fits = json.loads((out / "fits.json").read_text())
    assert set(fits["joint"]) == set(OPTIMIZERS)
    report = (out / "report.md").read_text().splitlines()
    # the summary first (what to act on), then the verdict per optimizer
    assert report[2] == "## Summary"
    opening = "\n".join(report[:20])
    assert "**adamw" in opening and "**muon" in opening
    assert opening.index("## Summary") < opening.index("**adamw")
    rows = {r["optimizer"]: r for r in fits["summary"]}
    assert set(rows) == set(OPTIMIZERS)
    for r in rows.values():
        assert r["b_crit_low"] <= r["b_crit"] <= r["b_crit_high"]
        assert r["batch_size"] >= 1 and r["lr"] > 0
        assert isinstance(r["reliable"], bool) and (r["reliable"] or r["why"])
    assert "## The joint model" in report
    # every check behind each verdict, in fits.json and as a table in the report
    text = "\n".join(report)
    for opt, doc in fits["joint"].items():
        names = [c["check"] for c in doc["checks"]]
        assert names[:4] == ["interval", "chi2/dof", "largest residual", "bounds"]
        assert "held out the largest budget" in names
        failing = [c for c in doc["checks"] if c["status"] != "pass"]
        assert (doc["verdict"] == "resolved") == (not failing)
        assert len(doc["reasons"]) == len(failing)
        for c in doc["checks"]:
            assert f"| {opt} | {c['check']} | {c['status']} |" in text
        at = doc["b_crit_at_loss"]
        assert at["low"] <= at["b_crit"] <= at["high"] and at["unit"] == "sequences"
    assert (out / "joint_fit.png").exists()
    for doc in fits["joint"].values():  # each optional term's test, and the form it chose
        for term in (doc["small_batch_term"], doc["transition_power_term"]):
            assert isinstance(term["kept"], bool)
            # the simulated test runs only where the chi-square test keeps the term
            assert term["p_value_simulated"] is None or term["p_value"] < 0.05
            assert not term["kept"] or term["p_value_simulated"] < 0.05
        assert (doc["transition_power"] is not None) == doc["transition_power_term"]["kept"]
        assert ("^p" in doc["form"]) == doc["transition_power_term"]["kept"]
        precision = doc["precision"]  # what a bigger sweep would pin, from the bootstrap's width
        assert precision["width_now"] == pytest.approx(doc["exponent_high"] - doc["exponent_low"])
        assert [p["plan"] for p in precision["plans"]] == [
            "x2 tokens, x2 batches", "x4 tokens, x4 batches", "x4 seeds"]
        assert precision["plans"][2]["sd_ratio"] == pytest.approx(0.5, rel=1e-6)
    assert any(line.startswith("Optional terms") for line in report)
    assert any(line.startswith("What a bigger sweep would pin") for line in report)


def test_the_terms_table_and_verdict_name_a_fitted_power():
    from critbatch.analysis.joint.report import TERM_ROWS, term_row

    test = {"kept": True, "p_value": 1e-5, "chi2_per_dof_without": 10.1,
            "chi2_per_dof_with": 2.7, "b_small": None, "power": 0.63}
    row = term_row({"optimizer": "adamw", "transition_power_term": test}, *TERM_ROWS[1])
    assert row[2] == "p = 0.63" and row[3] == "-"  # a fits.json without the chi2 fields
    doc = {"optimizer": "adamw", "b_star_tokens": 1e6, "exponent": 13.5, "exponent_low": 7.3,
           "exponent_high": 23.0, "log_loss_span": 0.32, "interval": "95% ...",
           "form": "E_min (1 + (B/B_crit)^p)", "transition_power": 0.63}
    assert "p = 0.63 fitted" in verdict(doc) and "unresolved" in verdict(doc)


def test_verdict_says_unresolved_for_a_wide_interval():
    doc = {"optimizer": "adamw", "b_star_tokens": 1e6, "exponent": 1.2, "exponent_low": -1.8,
           "exponent_high": 3.8, "log_loss_span": 0.17, "interval": "95% ..."}
    assert "unresolved" in verdict(doc) and f"wider than {RESOLVED_WIDTH:g}" in verdict(doc)
    doc.update(exponent_low=0.8, exponent_high=1.7)
    assert "unresolved" not in verdict(doc)


def test_verdict_names_misfit_and_missed_held_out_cells():
    doc = {"optimizer": "muon", "b_star_tokens": 1e7, "exponent": 4.8, "exponent_low": 4.4,
           "exponent_high": 5.2, "log_loss_span": 0.5, "interval": "95% ...",
           "chi2_per_dof": 11.3,
           "held_out": [{"held_out": "the largest budget", "n_cells": 5, "within_2_sigma": 1}]}
    text = verdict(doc)
    assert "unresolved" in text and "chi2/dof 11.3" in text
    assert "1 of 5 cells within 2 sigma" in text
    doc.update(chi2_per_dof=1.1, held_out=[{"held_out": "the largest budget", "n_cells": 5,
                                            "within_2_sigma": 5}])
    assert "unresolved" not in verdict(doc)


def test_several_widths_are_one_model_with_the_loss_alone_test(tmp_path):
    """Two widths of one planted world (B_crit 200 at every loss): one joint model per
    optimizer over both, the loss-alone test run and holding, and both held-out sets (the
    largest budget; the widest model's batches above its smallest) predicted."""
    from critbatch.analysis.bcrit.synthetic import synthetic_sweep

    synthetic_sweep(tmp_path, TRUTH, baseline_batch=16, batch_sizes=(32, 64, 128, 256),
                    budgets_tokens=(2**20, 2**21, 2**22, 2**23), all_budgets=True,
                    widths=(32, 64), seeds=(0, 1), seed_loss_offsets=[0.003, -0.003])
    result = bcrit.analyse(load_runs([tmp_path], progress=False)["runs"])
    doc = result["fits"]["joint"]["adamw"]
    assert doc["widths"] == ["width 32 depth 2", "width 64 depth 2"]
    assert doc["loss_alone"]["holds"] and doc["loss_alone"]["extra_parameters"] == 2
    assert [h["held_out"] for h in doc["held_out"]] == [
        "the largest budget", "the largest budget above its smallest batch",
        "width 64 depth 2 above its smallest batch"]
    for held in doc["held_out"]:
        assert held["within_2_sigma"] == held["n_cells"] > 0
    # the largest budget is one doubling beyond the refit's; the widest model's larger
    # batches are held out whole: a reach in width, not in tokens
    budget, _, width = doc["held_out"]
    assert budget["tokens_reach"] == pytest.approx(2.0, rel=0.01)
    assert width["tokens_reach"] is None
    assert all(r["tokens_reach"] is None for r in width["rows"])
    assert doc["b_star_tokens"] == pytest.approx(200 * TRUTH.seq_len, rel=0.05)


def test_summary_says_when_the_numbers_are_not_a_measurement():
    from critbatch.analysis.recommend.summary import reliability

    row = {"b_crit": 70.0, "b_crit_low": 50.0, "b_crit_high": 90.0, "held_out_ok": True}
    good = {"exponent": 4.8, "exponent_low": 4.5, "exponent_high": 5.3, "chi2_per_dof": 1.2}
    assert reliability(row, good, "cpu") == []
    assert "smoke scale" in reliability(row, good, "smoke")[0]
    assert any("unbounded" in w for w in reliability({**row, "b_crit_high": None}, good, "cpu"))
    wide = {**good, "exponent_low": 1.0, "exponent_high": 7.0}
    assert any("unresolved" in w for w in reliability(row, wide, "gpu"))
    assert any("misfits" in w for w in reliability(row, {**good, "chi2_per_dof": 9.0}, "gpu"))
    assert any("held-out" in w for w in reliability({**row, "held_out_ok": False}, good, "gpu"))


def test_the_scale_comes_from_the_summary_before_the_config(tmp_path):
    """A table row (no run folder) says its scale, as does a run's summary.json; config.json
    is read only when neither does."""
    from critbatch.analysis.recommend.summary import scale_of

    assert scale_of([{"scale": "smoke", "run_dir": str(tmp_path / "gone")}]) == "smoke"
    (tmp_path / "config.json").write_text('{"config": {"scale": "cpu"}}')
    assert scale_of([{"run_dir": str(tmp_path)}]) == "cpu"
    assert scale_of([{"run_dir": None}]) is None


def test_the_smoke_scale_refits_its_bootstrap_fewer_times(sweep):
    """At the smoke scale (a pipeline test, which the report says measures nothing) the joint
    model's bootstrap refits SMOKE_RESAMPLES times, at any other RESAMPLES times, and the
    interval's label says how many. The fault guarded: every smoke sweep's report spending
    100 refits (most of its time) on numbers it calls no measurement."""
    from critbatch.analysis.joint.joint import RESAMPLES
    from critbatch.science.intervals import SMOKE_RESAMPLES

    root, result = sweep
    runs = load_runs([root], progress=False)["runs"]
    smoke = bcrit.analyse([{**run, "scale": "smoke"} for run in runs])
    for doc, count in ((result["fits"]["joint"], RESAMPLES),
                       (smoke["fits"]["joint"], SMOKE_RESAMPLES)):
        assert set(doc) == set(OPTIMIZERS)
        for joint in doc.values():
            assert joint["failed_refits"]["bootstrap_tried"] == count
            assert f"refitted {joint['resamples']} times" in joint["interval"]


def test_the_smoke_scale_refits_each_held_out_prediction_fewer_times(sweep, monkeypatch):
    """The held-out sets' prediction spread (where the seed sigmas miss) refits
    SMOKE_RESAMPLES times at the smoke scale, HELD_OUT_RESAMPLES at any other. The fault
    guarded: a smoke sweep's report spending 40 refits per held-out set (11 of the 19 s
    fit_bcrit took on the smoke batch sweep) on numbers it calls no measurement."""
    from critbatch.analysis.joint import joint as joint_module
    from critbatch.science.intervals import SMOKE_RESAMPLES

    asked = []
    held_out = joint_module.held_out

    def recorded(*args, **kwargs):
        asked.append(args[7] if len(args) > 7 else kwargs["resamples"])
        return held_out(*args, **kwargs)

    monkeypatch.setattr(joint_module, "held_out", recorded)
    root, _ = sweep
    runs = load_runs([root], progress=False)["runs"]
    bcrit.analyse(runs)
    bcrit.analyse([{**run, "scale": "smoke"} for run in runs])
    half = len(asked) // 2
    assert half >= 2 and set(asked[:half]) == {joint_module.HELD_OUT_RESAMPLES}
    assert set(asked[half:]) == {SMOKE_RESAMPLES}


@pytest.mark.slow
def test_fit_bcrit_resamples_reach_the_summary_s_refits(sweep, tmp_path, monkeypatch, capsys):
    """`fit_bcrit --resamples 25` refits the summary's answer 25 times (the engine's 100
    otherwise); below 20 it stops in one line. The fault guarded: the flag dropped on its
    way to the engine (the summary then refits 100 times, 5 s of the bench's 400-row table)."""
    from critbatch.analysis.bcrit import cli as fit_bcrit_cli
    from critbatch.analysis.recommend import engine

    asked = []
    fit = engine.fit

    def recorded(*args, **kwargs):
        asked.append(kwargs.get("resamples"))
        return fit(*args, **kwargs)

    monkeypatch.setattr(engine, "fit", recorded)
    root, _ = sweep
    fit_bcrit_cli.main([str(root), "--out", str(tmp_path / "rep"), "--wandb", "disabled",
                        "--resamples", "25"])
    assert asked and set(asked) == {25}
    with pytest.raises(SystemExit) as stop:
        fit_bcrit_cli.main([str(root), "--wandb", "disabled", "--resamples", "5"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--resamples 5: give 20 or more" in err[-1]


def test_a_missed_held_out_set_gets_the_refit_s_spread():
    """Largest-budget losses pushed 0.06 nats/token up miss the seed-sigma test; then each
    prediction carries the refit's bootstrap spread, which can only make more cells agree."""
    from types import SimpleNamespace

    import numpy as np

    from critbatch.analysis.joint.joint import held_out
    from critbatch.science.joint import Form
    from critbatch.science.joint_planted import PlantedWorld, planted_world

    data = planted_world(PlantedWorld(l_inf=(1.0,), a=(3.3,), alpha=(0.16,)), sigma=0.0125,
                         rng=np.random.default_rng(5))
    largest = data.tokens == data.tokens.max()
    data = data.with_loss(data.loss + 0.06 * largest)
    used = [(None, SimpleNamespace(batch_size=int(b), tokens=int(e), loss=float(v)), float(s))
            for b, e, v, s in zip(data.batch, data.tokens, data.loss, data.sigma, strict=True)]
    held = held_out(data, used, ~largest, "the largest budget", form=Form())
    assert held["within_2_sigma"] < 0.8 * held["n_cells"]
    assert held["within_2_predictive_sigma"] >= held["within_2_sigma"]
    for row in held["rows"]:
        assert row["predicted_loss_sd"] > 0
        assert abs(row["residual_predictive_sigmas"]) <= abs(row["residual_sigmas"])


def test_a_held_out_refit_with_only_baseline_cells_left_cannot_be_formed():
    """Where the larger batches were trained at the largest budget only, holding it out
    leaves nothing that pins B_crit: no refit (it ran to its evaluation limit, 546 s on the
    thousand-run benchmark), and the set says it cannot be formed, which the verdict counts
    as "cannot check", never as a pass."""
    from types import SimpleNamespace

    import numpy as np

    from critbatch.analysis.joint.joint import (
        MIN_CELLS,
        decide,
        held_out,
        passes,
        smallest_batch,
    )
    from critbatch.science.joint import Form
    from critbatch.science.joint_planted import PlantedWorld, planted_world

    data = planted_world(PlantedWorld(), sigma=0.0125, rng=np.random.default_rng(5))
    baseline = smallest_batch(data)
    assert set(data.batch[baseline]) == {data.batch.min()} and baseline.sum() >= MIN_CELLS
    used = [(None, SimpleNamespace(batch_size=int(b), tokens=int(e), loss=float(v)), float(s))
            for b, e, v, s in zip(data.batch, data.tokens, data.loss, data.sigma, strict=True)]
    for keep in (baseline, baseline | (np.arange(len(data)) == np.flatnonzero(~baseline)[0])):
        held = held_out(data, used, keep, "x", form=Form())
        assert held["cannot"].startswith("fewer than 2 cells above the smallest batch")
        assert held["rows"] == [] and not passes(held)
        doc = {"exponent_low": 4.5, "exponent_high": 5.0, "held_out": [held]}
        decision = decide(doc)
        assert decision["verdict"] == "unresolved"
        assert decision["reasons"] == [f"cannot check held out x: {held['cannot']}"]
        doc["held_out"] = []  # without the set, the same law passes
        assert decide(doc)["verdict"] == "resolved"


def test_seed_noise_is_pooled_without_a_trend_and_follows_the_tokens_with_one(sweep):
    """The planted sweep's two baseline seeds sit +-0.002 from the loss at every budget: no
    trend, one pooled sd (0.002 sqrt 2) in fits.json. Baseline cells whose three seeds
    scatter 4x more at 1/8 of the budget than at the full one get a falling sd, and every
    cell of the group its sd at its own tokens."""
    from types import SimpleNamespace

    from critbatch.analysis.joint.joint import cells_of, seed_noise

    _, result = sweep
    for doc in result["fits"]["joint"].values():
        (noise,) = doc["seed_noise"]
        assert noise["slope"] == 0 and noise["sd_ref"] == pytest.approx(0.002 * 2**0.5)
        # what the bootstrap redraws it from: a run's budgets count in part (they share it)
        assert noise["effective_dof"] == pytest.approx(
            noise["dof"] / (1 + (noise["budgets"] - 1) * 0.25)) and noise["budgets"] >= 3
    budgets = [187_500, 375_000, 750_000, 1_500_000]
    sds = [0.08, 0.04, 0.03, 0.02]
    cells = [SimpleNamespace(batch_size=8, tokens=e, loss=4.0, n_seeds=3, sigma_source="seeds",
                             loss_sigma=sd / 3**0.5, few_steps=False)
             for e, sd in zip(budgets * 4, sds * 4, strict=True)]
    cells.append(SimpleNamespace(batch_size=64, tokens=187_500, loss=5.0, n_seeds=1,
                                 sigma_source=None, loss_sigma=float("nan"), few_steps=False))
    group = {"cells": cells}
    trend = seed_noise(group).pooled
    assert trend.slope < -0.5 and trend.p_value < 0.05
    used, _ = cells_of([group])
    sigma = {(c.batch_size, c.tokens): s for _, c, s in used}
    assert sigma[(64, 187_500)] == pytest.approx(float(trend.sd(187_500)))
    assert sigma[(8, 1_500_000)] == pytest.approx(float(trend.sd(1_500_000)) / 3**0.5)
    assert sigma[(64, 187_500)] > 3 * sigma[(8, 1_500_000)]
    # seeds of batch 64 ten times noisier than batch 8's: each batch's cells take their own
    cells += [SimpleNamespace(batch_size=64, tokens=e, loss=5.0, n_seeds=3,
                              sigma_source="seeds", loss_sigma=10 * sd / 3**0.5,
                              few_steps=False)
              for e, sd in zip(budgets * 4, sds * 4, strict=True)]
    split = seed_noise(group)
    assert split.p_value < 0.05 and set(split.by_key) == {8, 64}
    used, _ = cells_of([group])
    sigma = {(c.batch_size, c.tokens, c.n_seeds): s for _, c, s in used}
    assert sigma[(64, 187_500, 1)] == pytest.approx(float(split.by_key[64].sd(187_500)))
    assert sigma[(64, 187_500, 1)] / sigma[(8, 187_500, 3)] == pytest.approx(10 * 3**0.5, rel=1e-3)
    # each batch's cells share one noise estimate, redrawn from that batch's effective dof
    from critbatch.analysis.joint.joint import noise_sources

    ids, dofs = noise_sources(used, [group], [split])
    by_batch = {}
    for (_, c, _), i, nu in zip(used, ids, dofs, strict=True):
        by_batch.setdefault(c.batch_size, set()).add((i, nu))
    assert len(by_batch[8]) == len(by_batch[64]) == 1 and by_batch[8] != by_batch[64]
    ((_, nu),) = by_batch[64]
    assert nu == pytest.approx(split.by_key[64].effective_dof(0.5))


@pytest.mark.slow
def test_a_precisely_recovered_law_is_resolved(tmp_path):
    """Two optimizers planted with Kaplan's exponent (AdamW 4.8) and another (Muon 3.5), each
    at 4 sizes x 5 budgets x 10 batches x 5 lrs x 2 seeds: both laws come back within a
    narrow interval that covers the truth, and the verdict (fits.json, as data) calls them
    resolved. A range check that judged its shift against the full fit's 0.06-wide interval
    instead of its own noise once called such a law unresolved."""
    from critbatch.analysis.bcrit.synthetic import synthetic_table
    from critbatch.analysis.bcrit.tables import load_tables
    from critbatch.science.joint_planted import PlantedWorld

    truth = {"adamw": 4.8, "muon": 3.5}
    tables = [synthetic_table(tmp_path / f"{opt}.csv", 2000, seed=i, loss_sd=0.003,
                              optimizer=opt, world=PlantedWorld(
                                  l_inf=(1.0, 0.9, 0.8, 0.7), a=(3.3,) * 4, alpha=(0.16,) * 4,
                                  gamma=gamma, b_star=3.2e5 * 4.2 ** (gamma - 4.8)))
              for i, (opt, gamma) in enumerate(truth.items())]
    loaded = load_tables(tables)
    fits = bcrit.analyse(loaded["runs"], **loaded["analyse_kwargs"])["fits"]
    for opt, gamma in truth.items():
        doc = fits["joint"][opt]
        assert doc["exponent_low"] <= gamma <= doc["exponent_high"]
        assert doc["exponent_high"] - doc["exponent_low"] < 0.2
        assert doc["verdict"] == "resolved" and doc["reasons"] == [], doc["reasons"]
        assert "unresolved" not in verdict(doc)


def test_failed_refits_are_named_without_a_bootstrap_and_a_failed_per_width_fit_tests_nothing():
    """A fit on gamma's bound has no bootstrap (0 tried): a failed range-check refit is still
    one line, and named as failed; a per-width fit that could not be made gives no
    loss-alone verdict rather than "holds"."""
    from critbatch.analysis.joint.joint import refit_failures
    from critbatch.analysis.joint.report import failures_text, range_summary
    from critbatch.science.joint_fit import failed_fit, fit_joint
    from critbatch.science.joint_inference import loss_alone_test
    from critbatch.science.joint_planted import PlantedWorld, planted_world

    check = {"n_cells": 4, "exponent": None, "converged": False, "refit_failed": "the solver"}
    failed = refit_failures({"bootstrap_failed": 0, "resamples": 0}, [], check)
    text = failures_text({"optimizer": "adamw", "failed_refits": failed})
    assert "0 of 0 bootstrap, 0 of 0 held-out, 1 range check" in text
    assert "the refit failed (the solver)" in range_summary({"above_baseline_range": check})
    data = planted_world(PlantedWorld())
    shared = fit_joint(data)
    test = loss_alone_test(shared, failed_fit(data, True, shared.form, "no"))
    assert test["holds"] is None and math.isnan(test["p_value"])


def test_a_repeating_misfit_is_named_by_batch_in_nats():
    """The draws' check calls a misfit the model's own error: the report says, per batch, how
    far the measured losses lie from the model (measured minus model, nats/token)."""
    from critbatch.analysis.joint.report import misfit_by_batch

    def cell(batch, residual, upper=False):
        return {"width": "w64", "batch_size": batch, "residual_sigmas": residual,
                "loss_sigma": 0.01, "upper_bound": upper}

    doc = {"cells": [cell(16, 1.0), cell(16, 0.6), cell(32, -1.0), cell(32, -0.2),
                     cell(32, -5.0, upper=True)]}
    (text,) = misfit_by_batch(doc)
    assert text == "batch 16: -0.0080 (0 of 2 above); batch 32: +0.0060 (2 of 2 above)"


def test_seed_blocks_gather_each_seed_s_run_and_branches_by_batch_and_lr():
    from critbatch.analysis.bcrit.best_lr import seed_blocks

    def run(name, seed, tokens, loss, batch=8, parent=None):
        return {"run_dir": f"/sweep/{name}", "branch_of": parent, "sweep": "s", "seed": seed,
                "batch_size": batch, "lr": 1e-3, "tokens": tokens, "val_loss": loss}

    runs = [r for seed in (0, 1, 2) for r in (
        run(f"b8_s{seed}", seed, 1000, 4.0 + 0.01 * seed),
        run(f"b8_s{seed}_half", seed, 500, 5.0 + 0.02 * seed, parent=f"b8_s{seed}"))]
    runs += [run("b16_s0", 0, 1000, 3.9, batch=16),  # one seed: says nothing
             run("b16_s0_half", 0, 500, 4.9, batch=16, parent="b16_s0"),
             {**run("b8_nos", None, 1000, 4.2)}]  # no seed (a table row): left out
    (budgets, losses), = seed_blocks(runs, {1000: 1000, 500: 500})
    assert budgets == (500, 1000)
    assert losses.tolist() == [[5.0, 4.0], [5.02, 4.01], [5.04, 4.02]]


def test_the_trunk_sharing_used_is_in_fits_json_and_the_report(sweep):
    """The planted sweep seeds only its baseline's 3 lrs at 2 seeds (3 dof): too few to
    measure, so the model assumes SHARED_FRACTION and says so."""
    from critbatch.analysis.joint.report import sharing_lines
    from critbatch.science.joint import SHARED_FRACTION

    _, result = sweep
    for doc in result["fits"]["joint"].values():
        assert doc["trunk_sharing"] == {"fraction": SHARED_FRACTION, "source": "assumed",
                                        "dof": 0, "trunks": 0, "budget_pairs": 0}
    text = "\n".join(sharing_lines(result["fits"]["joint"]))
    assert "assumed: too few trunks" in text and "| 0.50 |" in text
