"""What a bigger sweep would pin (science.precision): the linearised sd of the joint law's
exponent against the scatter of real refits (as measured and for a moved design), its exact
scaling with the seeds, the misfit's floor, where the exponent is not pinned, and the
report's table and verdict."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from critbatch.science.joint import Form, JointFit
from critbatch.science.joint_fit import fit_joint
from critbatch.science.joint_planted import PlantedWorld, planted_world
from critbatch.science.precision import (
    Plan,
    exponent_index,
    exponent_sd,
    misfit_kept,
    moved_design,
    projected_widths,
    seeds_for,
)

# one width, Kaplan's exponent, B_crit 40-330 sequences over the cells' losses
WORLD = PlantedWorld(l_inf=(1.0,), a=(3.3,), alpha=(0.16,))
SIGMA = 0.0125  # nats/token: one run's seed noise, the cpu sweep's order
BATCHES = (8, 16, 32, 64, 128)


def refit_sd(world: PlantedWorld, worlds: int = 60, **design) -> float:
    """The sd of 1/alpha_B over `worlds` noisy draws of `world`'s sweep (independent noise,
    known sigma), each fitted from the truth."""
    truth, rng = world.fit(), np.random.default_rng(7)
    gammas = [fit_joint(planted_world(world, sigma=SIGMA, shared=0.0, rng=rng, **design),
                        start=truth.as_vector(), form=truth.form).exponent
              for _ in range(worlds)]
    return float(np.std(gammas, ddof=1))


@pytest.mark.parametrize("power", [1.0, 0.7])
def test_exponent_sd_is_the_scatter_of_refits(power):
    """The linearised sd at the truth against the sd of 1/alpha_B over 60 refits of the same
    design, with McCandlish's form and with a planted power p = 0.7 fitted free: within the
    scatter of an sd estimated from 60 draws (about 9%; the bounds allow 3 of those).
    Measured 2026-12-02: 0.244 against 0.247-0.258 (three seeds), 0.668 against 0.723."""
    world = replace(WORLD, power=power)
    truth = world.fit()
    linear = exponent_sd(planted_world(world, sigma=SIGMA, shared=0.0), truth)
    assert 0.75 < refit_sd(world) / linear < 1.3
    assert truth.as_vector()[exponent_index(truth)] == WORLD.gamma


def test_a_moved_design_is_the_sweep_of_that_design():
    """Plan(2, 2) of the measured cells against a sweep drawn at twice the budget with
    batches 16-256: the projected sd matches that sweep's refit scatter; Plan() reproduces
    the noiseless cells."""
    truth = WORLD.fit()
    exact = planted_world(WORLD, sigma=SIGMA, shared=0.0)
    np.testing.assert_allclose(moved_design(exact, truth).loss, exact.loss, atol=1e-7)
    moved = moved_design(exact, truth, Plan(tokens=2, batches=2))
    scatter = refit_sd(WORLD, batches=tuple(2 * b for b in BATCHES), budget=3e6)
    assert 0.75 < scatter / exponent_sd(moved, truth) < 1.3
    assert not moved.upper.any() and (moved.loss < exact.loss).all()


def test_more_seeds_shrink_the_sd_as_one_over_their_root():
    truth, exact = WORLD.fit(), planted_world(WORLD, sigma=SIGMA, shared=0.0)
    four = moved_design(exact, truth, Plan(seeds=4))
    assert exponent_sd(four, truth) == pytest.approx(0.5 * exponent_sd(exact, truth), rel=1e-6)


def test_the_exponent_index_with_optional_terms_and_per_width_laws():
    fit = JointFit(np.array([1.0, 0.8]), np.array([3.3, 3.3]), np.array([0.16, 0.16]),
                   np.array([3e5, 4e5]), np.array([4.8, 5.1]), b_small=2.0, power=0.7,
                   form=Form(small_batch=True, power=True))
    assert exponent_index(fit) == 8 and fit.as_vector()[8] == 4.8


def test_an_exponent_the_cells_do_not_pin_has_no_projection():
    truth = WORLD.fit()
    few = planted_world(WORLD, batches=(8,), fractions=(0.5, 1.0), baseline_seeds=1)
    assert exponent_sd(few, truth) == math.inf  # 2 cells, 5 parameters
    doc = projected_widths(few, truth, 6.0, target=3.0)
    assert doc["plans"] == [] and "does not pin" in doc["note"]
    with pytest.raises(ValueError, match="tokens >= batches"):
        Plan(tokens=2, batches=4)


def test_the_misfit_kept_is_a_floor_and_the_seeds_round_trip():
    """With chi2/dof s^2 the share 1 - 1/s^2 of today's variance stays: no plan gets below
    width x sqrt(1 - 1/s^2); the seeds factor `seeds_for` gives lands on the target."""
    assert misfit_kept(6.0, 0.5, 1.0) == pytest.approx(3.0)  # no misfit: the ratio alone
    assert misfit_kept(10.0, 0.0, math.sqrt(5.0)) == pytest.approx(10 * math.sqrt(0.8))
    noise, kept = seeds_for(4.0, 3.0, math.sqrt(1.6))
    assert noise == pytest.approx((4 / 3) ** 2)
    assert misfit_kept(4.0, 1 / math.sqrt(kept), math.sqrt(1.6)) == pytest.approx(3.0)
    assert seeds_for(5.0, 3.0, math.sqrt(1.6))[1] is None  # its floor is 3.06
    assert seeds_for(14.15, 3.0, math.sqrt(5.07))[1] is None  # the floor is 12.7


def test_report_shows_the_projection_and_the_verdict_the_seeds():
    from critbatch.analysis.joint.report import joint_section, verdict

    doc = {"optimizer": "adamw", "b_star_tokens": 1e6, "exponent": 9.9, "exponent_low": 2.7,
           "exponent_high": 16.9, "log_loss_span": 0.43, "interval": "95% ...",
           "precision": {"width_now": 14.2, "noise_scale": 2.25, "seeds_for_target": 22.2,
                         "seeds_for_target_misfit_kept": None, "plans": [
                             {"plan": "x4 seeds", "n_cells": 24, "log_loss_span": 0.44,
                              "sd_ratio": 0.5, "width_95": 7.1,
                              "width_95_misfit_kept": 12.9}]}}
    text = verdict(doc)
    assert "about 23x the seeds" in text and "no number of seeds if the misfit" in text
    doc.update(chi2_per_dof=5.1, dof=18, n_cells=24, n_units=7, widths=["w64"],
               b_star_tokens_low=None, b_star_tokens_high=None, loss_alone=None,
               held_out=[], curves=[])
    table = "\n".join(joint_section({"adamw": doc}))
    assert "| adamw | as measured (95% parametric bootstrap) | 24 | 0.430 | 1 | 14.20 | 14.20 |" \
        in table
    assert "| adamw | x4 seeds | 24 | 0.440 | 0.50 | 7.10 | 12.90 |" in table
