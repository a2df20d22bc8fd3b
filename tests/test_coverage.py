"""The coverage study (`bench.coverage`, `science.coverage_worlds`): its planted worlds are what
they say, a world is fitted as `fit_bcrit --table` fits it, and the counts are right."""

from __future__ import annotations

import math

import numpy as np
import pytest

from critbatch.bench import coverage
from critbatch.science.coverage_worlds import KINDS, World, table_rows, truth, world_of
from critbatch.science.fits import binomial_interval


def test_a_planted_run_ends_where_its_tokens_reach():
    """The loss solves E(B, L, D) = D: the tokens to reach it are the run's own."""
    world = world_of("small batches lose", 1)
    for width, batch, tokens in ((0, 8, 4e5), (3, 128, 3e6), (2, 32, 1.5e6)):
        loss = world.loss_at(width, batch, tokens)
        assert world.tokens_to(loss, width, batch, tokens) == pytest.approx(tokens, rel=1e-6)
    own = world_of("own form", 1)  # no small-batch term: a larger batch ends higher
    assert own.loss_at(0, 64, 1.5e6) > own.loss_at(0, 32, 1.5e6)
    # with it, batch 8 loses to 16 (B_s = 4)
    assert world.loss_at(0, 8, 1.5e6) > world.loss_at(0, 16, 1.5e6)


def test_each_kind_departs_from_the_model_as_it_says():
    own, bend, tokens = (world_of(k, 0) for k in ("own form", "bend", "tokens too"))
    assert own.b_crit(4.0, 1e6) == pytest.approx(own.b_star * 4.0**-own.gamma)
    # the bend: the exponent below the bend is gamma - 1.8
    ratio = bend.b_crit(4.0, 1e6) / bend.b_crit(4.4, 1e6)
    assert math.log(ratio) / math.log(4.4 / 4.0) == pytest.approx(bend.gamma - 1.8)
    assert tokens.b_crit(4.0, 3e6) / tokens.b_crit(4.0, 1.5e6) == pytest.approx(2**0.3)
    trunk = table_rows(world_of("trunk noise", 1), 1)
    branches = [r for r in trunk if r["branch_of"]]
    trunks = {r["run"] for r in trunk if not r["branch_of"]}
    assert branches and all(r["branch_of"] in trunks and r["branch_of"] != r["run"]
                            for r in branches)
    cpu = world_of("cpu design", 0)
    assert cpu.batches == (8, 16, 32, 64, 128) and len(cpu.budgets) == 5
    # like the analysis, no run of fewer than 3x the preset's 10-step warmup: batch 128 loses
    # its 1/8 budget (22 steps), every other run stays
    steps = {(r["batch_size"], r["tokens"] // (r["batch_size"] * r["seq_len"]))
             for r in table_rows(cpu, 0)}
    assert min(s for _, s in steps) >= 30
    assert sorted(s for b, s in steps if b == 128) == [45, 91, 137, 183]
    assert len({s for b, s in steps if b == 8}) == 5
    with pytest.raises(ValueError, match="unknown kind"):
        world_of("nope", 0)


def test_the_truth_is_the_planted_exponent_where_the_law_is_a_power_of_the_loss():
    for kind in ("own form", "heavy tails", "cpu design"):
        world = world_of(kind, 2)
        assert truth(world, table_rows(world, 2))["exponent"] == world.gamma
    # a bend: between its two exponents
    bend = world_of("bend", 0)
    assert bend.gamma - 1.8 < truth(bend, table_rows(bend, 0))["exponent"] < bend.gamma


def test_a_noiseless_own_form_world_is_fitted_back_to_its_exponent(monkeypatch):
    monkeypatch.setattr(coverage, "world_of",
                        lambda kind, seed: World(kind=kind, sigma=1e-4, seeds=1))
    out = coverage.fit_world("own form", 0)
    assert out["exponent"] == pytest.approx(4.8, abs=0.05)
    assert out["covered"]["exponent"] and out["verdict"] == "resolved"


def test_the_summary_counts_coverage_and_the_verdict_s_errors():
    def world(kind, covered, low, high, verdict):
        return {"kind": kind, "covered": {"exponent": covered, "b_star": None},
                "truth": {"b_star_tokens": None}, "exponent_low": low, "exponent_high": high,
                "verdict": verdict}

    rows = [world("own form", True, 4.5, 5.0, "resolved"),
            world("own form", False, 5.0, 5.4, "resolved"),  # false resolved
            world("own form", True, 4.4, 5.1, "unresolved"),  # false unresolved
            world("own form", True, 3.0, 6.0, "unresolved"),  # wide: rightly unresolved
            world("own form", None, None, None, "unresolved")]  # no interval
    s = coverage.summarise(rows)["own form"]
    assert s["exponent"]["covered"] == 3 and s["exponent"]["n"] == 4
    assert s["exponent"]["without_interval"] == 1
    v = s["verdict"]
    assert (v["resolved"], v["false_resolved"], v["covered_and_narrow"],
            v["false_unresolved"]) == (2, 1, 2, 1)
    low, high = binomial_interval(19, 20)
    assert low < 0.95 < high and high < 1


def test_the_kinds_are_named_in_the_command_line():
    with pytest.raises(SystemExit):
        coverage.main(["--kinds", "own form,nope"])
    assert len(KINDS) == len(set(KINDS)) >= 8


@pytest.mark.slow
def test_make_coverage_writes_its_table(tmp_path, capsys):
    doc = coverage.run(2, ("own form", "bend"), 2, 0, tmp_path / "out", tmp_path / "page.md")
    assert set(doc["summary"]) == {"own form", "bend"}
    assert (tmp_path / "out" / "coverage.json").stat().st_size > 0
    page = (tmp_path / "page.md").read_text()
    assert "| own form |" in page and "make coverage WORLDS=2" in page
    assert np.isfinite([r["truth"]["exponent"] for r in doc["results"]]).all()
