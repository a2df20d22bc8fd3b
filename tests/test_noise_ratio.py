"""B_crit against B_noise (`analysis.bcrit.noise_ratio`): a planted ratio and drift are found,
the interval holds the truth, decaying-lr readings never enter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from critbatch.analysis.bcrit.noise_ratio import noise_ratio, readings_of, width_curves
from critbatch.analysis.bcrit.online_noise import lr_phase

B_STAR, GAMMA, SEQ_LEN = 2.0e4, 3.0, 64


def doc(losses=(3.8, 4.6), draws=None) -> dict:
    """A joint document of law B_crit(L) = B_STAR L^-GAMMA fitted on cells at `losses`."""
    return {"b_star_tokens": B_STAR * SEQ_LEN, "seq_len": SEQ_LEN, "exponent": GAMMA,
            "cells": [{"val_loss": x} for x in losses], "law_draws": draws}


def readings(ratio: float, drift: float = 0.0, runs: int = 5, sd: float = 0.05,
             seed: int = 0, losses=(3.9, 4.1, 4.3, 4.5)) -> list[dict]:
    """Peak-lr readings of `runs` runs whose B_noise is B_crit(L) / (ratio (L/4.2)^drift)
    times lognormal noise of `sd`."""
    rng = np.random.default_rng(seed)
    out = []
    for run in range(runs):
        for x in losses:
            loss = x + rng.uniform(-0.05, 0.05)
            b_crit = B_STAR * loss**-GAMMA
            out.append({"run_dir": f"r{run}", "val_loss": loss, "source": "noise_readings",
                        "b_noise": b_crit / (ratio * (loss / 4.2) ** drift)
                        * math.exp(sd * rng.standard_normal())})
    return out


def test_a_planted_ratio_is_found_and_its_interval_holds_it():
    covered = steady = 0
    for seed in range(40):
        out = noise_ratio(readings(3.0, seed=seed), doc(), seed=seed, resamples=400)
        covered += out["low"] <= 3.0 <= out["high"]
        steady += out["drifts"] is False
    # 95% nominal: 40 draws, at least 34 (p of fewer at a true 95% is below 0.01)
    assert covered >= 34 and steady >= 34
    out = noise_ratio(readings(3.0, sd=1e-6), doc(), resamples=200)
    assert out["ratio"] == pytest.approx(3.0, rel=1e-4)
    assert out["slope"] == pytest.approx(0.0, abs=1e-3)
    assert out["same_order"] is True and out["n_runs"] == 5 and out["n_readings"] == 20
    assert out["losses"][0] >= 3.8 and out["losses"][1] <= 4.6
    assert all(r["b_crit"] == pytest.approx(B_STAR * r["val_loss"] ** -GAMMA)
               for r in out["readings"])


def test_a_drifting_ratio_is_said_to_drift_and_far_apart_is_not_the_same_order():
    out = noise_ratio(readings(0.02, drift=-4.0, sd=0.02), doc(), resamples=400)
    # ln r = const + drift ln L: the slope of ln(B_crit / B_noise) on ln L is the drift
    assert out["slope"] == pytest.approx(-4.0, abs=0.3)
    assert out["drifts"] is True and out["slope_high"] < 0
    assert out["high"] < 0.1 and out["same_order"] is False


def test_the_law_s_own_uncertainty_widens_the_interval():
    rng = np.random.default_rng(1)
    gammas = GAMMA + 0.5 * rng.standard_normal(200)
    # refits that trade B* against the exponent through the middle of the losses
    draws = {"exponent": gammas.tolist(),
             "b_star": (B_STAR * 4.2 ** (gammas - GAMMA)
                        * np.exp(0.3 * rng.standard_normal(200))).tolist()}
    tight = noise_ratio(readings(3.0), doc(), resamples=400)
    wide = noise_ratio(readings(3.0), doc(draws=draws), resamples=400)
    assert wide["high"] / wide["low"] > 2 * tight["high"] / tight["low"]
    assert wide["low"] <= 3.0 <= wide["high"]


def test_readings_outside_the_law_s_losses_or_without_a_law_are_not_compared():
    out = noise_ratio(readings(3.0, losses=(5.0, 5.5)), doc())
    assert out["ratio"] is None and "within the losses the joint model" in out["left_out"]
    assert noise_ratio(readings(3.0), None)["left_out"].startswith("no joint model")
    assert noise_ratio([], doc())["left_out"].startswith("no peak-lr reading")
    one = noise_ratio(readings(3.0, runs=1), doc())
    assert one["ratio"] is None and "it needs 2 runs" in one["left_out"]


def test_only_constant_lr_eval_points_stand_in_for_readings_in_older_runs():
    run = {"steps": 1000, "warmup_steps": 10, "schedule": "wsd", "cooldown_fraction": 0.2,
           "curve": [{"step": s, "tokens": s * 512, "val_loss": 5.0 - s / 1000,
                      "b_noise": 100.0 + s} for s in (5, 100, 800, 801, 1000)]}
    assert [lr_phase(run, s) for s in (5, 10, 11, 800, 801, 1000)] == [
        "warmup", "warmup", "constant", "constant", "decaying", "decaying"]
    points, source = readings_of(run)
    assert source == "curve" and [p["step"] for p in points] == [100, 800]
    assert lr_phase({**run, "schedule": "cosine"}, 500) == "decaying"
    assert lr_phase({**run, "schedule": "constant"}, 1000) == "constant"
    # a run that wrote its readings: those, not its curve
    written = {**run, "noise_readings": [{"step": 400, "tokens": 1, "val_loss": 4.6,
                                          "b_noise": 50.0}, {"step": 600, "tokens": 2,
                                                             "val_loss": 4.4, "b_noise": None}]}
    points, source = readings_of(written)
    assert source == "noise_readings" and [p["step"] for p in points] == [400]


def widths_readings(factors: dict, seed: int = 0) -> list[dict]:
    """Readings of three runs per width, B_noise = factor_w x 300 (4.2 / L)^3 x 5% noise."""
    rng = np.random.default_rng(seed)
    out = []
    for width, factor in factors.items():
        for run in range(3):
            for x in (3.9, 4.1, 4.3, 4.5):
                loss = x + rng.uniform(-0.05, 0.05)
                out.append({"run_dir": f"w{width}_r{run}", "width": width, "val_loss": loss,
                            "source": "noise_readings",
                            "b_noise": factor * 300 * (4.2 / loss) ** 3
                            * math.exp(0.05 * rng.standard_normal())})
    return out


def test_one_b_noise_curve_across_widths_is_found_and_a_shifted_width_is_not():
    same = width_curves(widths_readings({64: 1.0, 96: 1.0, 128: 1.0}), doc(), resamples=400)
    assert same["one_curve"] is True and len(same["pairs"]) == 3
    assert 3.9 < same["common_loss"] < 4.5
    for row in same["widths"]:
        assert row["low"] <= 300 * (4.2 / same["common_loss"]) ** 3 <= row["high"]
        assert row["ratio"]["ratio"] is not None  # B_crit's ratio per width
    shifted = width_curves(widths_readings({64: 1.0, 96: 1.0, 128: 2.0}), doc(), resamples=400)
    assert shifted["one_curve"] is False
    assert [p["differs"] for p in shifted["pairs"]] == [False, True, True]
    # the ratio per width follows: the shifted width's B_noise is twice as large
    ratios = {row["width"]: row["ratio"]["ratio"] for row in shifted["widths"]}
    assert ratios[64] / ratios[128] == pytest.approx(2.0, rel=0.1)
    assert width_curves(widths_readings({64: 1.0}), doc()) is None


def test_each_width_s_b_crit_is_predicted_from_the_other_widths_ratio():
    """Calibrated on two widths, the third's B_noise predicts its B_crit: within the interval
    where B_noise(L) is one curve, outside it for a width whose B_noise is twice as large."""
    same = width_curves(widths_readings({64: 1.0, 96: 1.0, 128: 1.0}), doc(), resamples=400)
    assert [h["width"] for h in same["held_out"]] == [64, 96, 128]
    for h in same["held_out"]:
        assert h["within"] and h["low"] < h["measured"] < h["high"]
        assert h["measured"] == pytest.approx(B_STAR * h["loss"] ** -GAMMA)
        assert h["measured_from"] == "the law the widths share"
    shifted = width_curves(widths_readings({64: 1.0, 96: 1.0, 128: 2.0}), doc(), resamples=400)
    wide = {h["width"]: h for h in shifted["held_out"]}
    assert not wide[128]["within"] and wide[128]["measured"] < wide[128]["low"]
    assert wide[128]["predicted"] == pytest.approx(2 * wide[128]["measured"], rel=0.15)
    # a per-width law from the loss-alone test is the measured side where there is one
    own = doc()
    own.update(widths=["width 64 depth 2", "width 96 depth 2", "width 128 depth 2"],
               loss_alone={"per_width_b_star": [B_STAR, B_STAR, 2 * B_STAR],
                           "per_width_exponents": [GAMMA] * 3})
    fitted = width_curves(widths_readings({64: 1.0, 96: 1.0, 128: 1.0}), own, resamples=400)
    last = fitted["held_out"][-1]
    assert last["measured"] == pytest.approx(2 * B_STAR * last["loss"] ** -GAMMA)
    assert last["measured_from"].startswith("its own law")


def test_the_report_section_shows_the_ratio_the_widths_and_the_held_out_widths():
    from critbatch.analysis.bcrit.markdown import noise_ratio_section

    rows = widths_readings({64: 1.0, 96: 1.0, 128: 1.0})
    ratio = {**noise_ratio(rows, doc(), resamples=200),
             "widths": width_curves(rows, doc(), resamples=200)}
    text = "\n".join(noise_ratio_section({"adamw": ratio, "muon": noise_ratio([], doc())}))
    assert "| adamw | " in text and "no peak-lr reading" in text
    assert "one curve?" in text and "predicted B_crit (sequences) [95%]" in text
    assert text.count("| adamw | 64 |") == 1
