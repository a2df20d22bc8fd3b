"""Two draws of one sweep (science.replicates, analysis.draws): is the joint model's misfit
noise or its own error? Planted worlds where each answer is known, a calibration over null
worlds, and the check's place in fits.json from run folders of two draws."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from critbatch.analysis.bcrit.draws import draw_of
from critbatch.analysis.bcrit.report import analyse
from critbatch.analysis.bcrit.synthetic import synthetic_branched_sweep
from critbatch.analysis.joint.report import draws_lines, seeds_text
from critbatch.results.runs import load_runs
from critbatch.science.joint import PLAIN, JointData
from critbatch.science.joint_planted import PlantedWorld, planted_world
from critbatch.science.replicates import SIMULATIONS, check_draws
from critbatch.science.synthetic import SyntheticTruth

WORLD = PlantedWorld(l_inf=(1.0,), a=(3.3,), alpha=(0.16,))  # one width: fast fits
RUN_SIGMA = 0.0125  # nats/token, one run's seed noise (the cpu sweep's order)


def two_draws(seed: int, bias: float = 0.0, noise_factor: float = 1.0
              ) -> tuple[JointData, JointData]:
    """Two independent draws of the planted branched sweep. `bias` (nats/token) is a shape
    the model lacks, the same in both draws: batch 32 worse and batch 64 better than the
    model at the large budgets, the other way round at the small ones. `noise_factor`: the
    draws' true noise over the sigma they state."""
    drawn = []
    for k in (0, 1):
        data = planted_world(WORLD, rng=np.random.default_rng(1000 + 2 * seed + k),
                             sigma=RUN_SIGMA * noise_factor)
        shape = (np.where(data.batch == 32, 1.0, np.where(data.batch == 64, -1.0, 0.0))
                 * np.where(data.tokens > 5e5, 1.0, -1.0))
        drawn.append(dataclasses.replace(data, loss=data.loss + bias * shape,
                                         sigma=data.sigma / noise_factor))
    return drawn[0], drawn[1]


def check(first: JointData, second: JointData, seed: int = 0, simulations: int = SIMULATIONS):
    every = np.arange(len(first))
    return check_draws(first, second, (every, every), PLAIN, simulations=simulations, seed=seed)


@pytest.mark.parametrize("bias, noise_factor, verdict", [
    (0.0, 1.0, "noise"),  # the model right, the sigmas right
    (2 * RUN_SIGMA, 1.0, "model error"),  # a shape the model lacks, in both draws
    (0.0, 3.0, "sigmas too small"),  # the draws scatter 3x what they state
])
def test_each_verdict_in_its_world(bias, noise_factor, verdict):
    result = check(*two_draws(0, bias, noise_factor))
    assert result.verdict == verdict, result.sentence
    assert result.n_cells == 20 and result.simulations >= 90
    if verdict == "model error":
        assert result.correlation > 0.5 and min(result.chi2_per_dof) > 1.5
    if verdict == "sigmas too small":
        assert result.difference_chi2 > 3 * result.n_cells
    doc = result.as_dict()
    assert doc["verdict"] == verdict and doc["difference_dof"] == 20
    assert doc["sentence"].startswith(
        {"noise": "the residuals do not repeat", "model error": "the misfit is the model's",
         "sigmas too small": "the draws differ by more"}[verdict])


def test_too_few_shared_cells_is_an_error():
    first, second = two_draws(0)
    with pytest.raises(ValueError, match="share 2 measured cells"):
        check_draws(first, second, (np.arange(2), np.arange(2)), PLAIN)
    bounds = dataclasses.replace(second, upper=np.arange(len(second)) >= 2)  # 2 measured
    with pytest.raises(ValueError, match="share 2 measured cells"):
        check(first, bounds)


@pytest.mark.slow
def test_a_shape_is_found_where_the_sigmas_are_also_too_small():
    """The residuals' correlation does not depend on the sigmas' scale: a shape of 3 run
    sigmas in draws that scatter twice what they state is still the model's error, and the
    sentence says both."""
    result = check(*two_draws(0, bias=3 * RUN_SIGMA, noise_factor=2.0))
    assert result.verdict == "model error" and result.difference_p < 0.05
    assert "the sigmas are too small" in result.sentence


@pytest.mark.study
def test_calibrated_in_null_worlds_and_finds_a_shape():
    """40 worlds with the model right: each test (5% level) fires in at most 5 (2 expected;
    the scratch run of 60 such worlds: 2 "model error", 4 "sigmas too small"); 20 worlds
    with a shape of 2 run sigmas: "model error" in at least 15. Each check simulates 50
    pairs of draws, not the analysis's 100: a p-value (1 + beyond) / (1 + simulations) is
    valid at any count, so the same worlds test the same calibration in half the time."""
    null = [check(*two_draws(seed), seed=seed, simulations=50).verdict for seed in range(40)]
    assert null.count("model error") <= 5 and null.count("sigmas too small") <= 5, null
    shaped = [check(*two_draws(seed, bias=2 * RUN_SIGMA), seed=seed, simulations=50).verdict
              for seed in range(20)]
    assert shaped.count("model error") >= 15, shaped


def test_draw_of_reads_the_grid_seed_override():
    assert draw_of({"overrides": ["scale=cpu", "grid.seed=10", "train.batch_size=8"]}) == 10
    assert draw_of({"overrides": ["scale=cpu"]}) == 0
    assert draw_of({}) == 0  # a table row or an older run folder: the default draw


@pytest.mark.slow
def test_two_draws_in_fits_json(tmp_path):
    """Run folders of two draws (the second's runs carry `grid.seed=10` and seeds 10-11, as
    `make sweep-batch ARGS="grid.seed=10 ..."` writes them) analysed together: the joint
    document compares them; one draw alone gives `draws` None."""
    truth = SyntheticTruth(b_crit=200.0, seq_len=64)
    first, second = tmp_path / "first", tmp_path / "second"
    synthetic_branched_sweep(first, truth, optimizers=("adamw",))
    synthetic_branched_sweep(second, truth, optimizers=("adamw",),
                             seed_loss_offsets=(0.003, -0.001))
    for path in second.rglob("summary.json"):  # as grid.seed=10 with seeds 11, 12 writes them
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({**summary, "seed": summary["seed"] + 10,
                                    "overrides": ["grid.seed=10"]}))
    both = analyse(load_runs([first, second], progress=False)["runs"])
    doc = both["fits"]["joint"]["adamw"]["draws"]
    assert doc["draws"] == [0, 10] and doc["n_draws"] == 2
    assert doc["n_cells"] == both["fits"]["joint"]["adamw"]["n_cells"]
    assert doc["verdict"] in ("noise", "model error", "sigmas too small")
    assert 0 < doc["difference_p"] <= 1 and -1 <= doc["residual_correlation"] <= 1
    alone = analyse(load_runs([first], progress=False)["runs"])
    assert alone["fits"]["joint"]["adamw"]["draws"] is None


@pytest.mark.slow
def test_draws_that_share_runs_are_not_compared(tmp_path):
    """A second draw trained at the default baseline seeds repeats the first's seeded runs
    bit for bit: not independent, so no check, and a warning says what to change."""
    truth = SyntheticTruth(b_crit=200.0, seq_len=64)
    first, second = tmp_path / "first", tmp_path / "second"
    synthetic_branched_sweep(first, truth, optimizers=("adamw",))
    synthetic_branched_sweep(second, truth, optimizers=("adamw",))
    for path in second.rglob("summary.json"):
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({**summary, "overrides": ["++grid.seed='10'"]}))
    both = analyse(load_runs([first, second], progress=False)["runs"])
    assert both["fits"]["joint"]["adamw"]["draws"] is None
    assert any("the draws share" in w and "grid.baseline_seeds" in w
               for w in both["warnings"])


def test_the_report_says_which_reading_applies():
    """The report's table of the check, and the verdict's seeds sentence: with the misfit
    shown to be the model's own error only the misfit-kept projection is quoted."""
    draws = {"draws": [0, 10], "n_cells": 24, "chi2_per_dof": [1.6, 2.34],
             "difference_chi2": 19.7, "difference_dof": 24, "difference_p": 0.77,
             "residual_correlation": 0.8, "residual_correlation_p": 0.0099,
             "verdict": "model error"}
    table = "\n".join(draws_lines({"muon": {"optimizer": "muon", "draws": draws}}))
    assert ("| muon | 0 vs 10 | 24 | 1.60 / 2.34 | 19.7 / 24 | 0.77 | +0.80 | 0.0099 "
            "| model error |") in table
    assert draws_lines({"muon": {"optimizer": "muon", "draws": None}}) == []
    precision = {"seeds_for_target": 23.0, "seeds_for_target_misfit_kept": None,
                 "noise_scale": 2.25}
    assert "23x" in seeds_text(precision) and "if the misfit is the model's" in seeds_text(
        precision)
    said = seeds_text(precision, draws)
    assert said.startswith("two draws show the misfit to be the model's own error")
    assert "no number of seeds" in said and "23x" not in said
    assert "about 40x" in seeds_text({**precision, "seeds_for_target_misfit_kept": 39.2}, draws)
    assert seeds_text(precision, {**draws, "verdict": "noise"}) == seeds_text(precision)
