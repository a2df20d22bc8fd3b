"""The report from one branched sweep (issue 14, part 4) against a planted McCandlish world:
every batch size at four budgets through cooldown branches, two baseline seeds, the online
B_noise on eval points."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from critbatch.analysis.bcrit import bcrit, best_lr, consistency, pareto
from critbatch.analysis.bcrit.report import run_analysis
from critbatch.analysis.bcrit.synthetic import (
    UNRESOLVED_B_NOISE,
    NoiseLaw,
    synthetic_branched_sweep,
    synthetic_sweep,
)
from critbatch.results.runs import load_runs, read_summary

BASELINE, BATCHES = 8, (16, 32, 64, 128)
BUDGET = 2**23  # tokens of a main run
BUDGETS = [BUDGET // 8, BUDGET // 4, BUDGET // 2, BUDGET]
EVALS = 16  # eval points of a main run
OFFSETS = (0.002, -0.002)  # loss offsets of the two baseline seeds (nats/token)
LAW = NoiseLaw(b_star_tokens=1.2e5, exponent=2.0)
OPTIMIZERS = ("adamw", "muon")


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    root = tmp_path_factory.mktemp("branched")
    truth = synthetic_branched_sweep(root, baseline_batch=BASELINE, batch_sizes=BATCHES,
                                     budget_tokens=BUDGET, optimizers=OPTIMIZERS,
                                     seed_loss_offsets=OFFSETS, noise_law=LAW, evals=EVALS)
    loaded = load_runs([root], progress=False)
    return root, truth, loaded["runs"], bcrit.analyse(loaded["runs"])


def rows_of(rows: list[dict], optimizer: str) -> list[dict]:
    return [r for r in rows if r["optimizer"] == optimizer]


def test_the_branched_design_is_written_as_run_folders(branched):
    root, _, runs, _ = branched
    branches = [r for r in runs if r.get("branch_of")]
    mains = {Path(r["run_dir"]).name for r in runs if not r.get("branch_of")}
    per_optimizer = (len(BATCHES) + 2) * 3  # (batch sizes + a second baseline seed) x lrs
    assert len(mains) == per_optimizer and len(branches) == 3 * len(OPTIMIZERS) * per_optimizer
    for r in branches:
        assert r["branch_of"] in mains and r["tokens"] in BUDGETS[:-1]
        assert r["branch_at_tokens"] == int(0.8 * r["tokens"])
    read_summary(branches[0]["run_dir"])  # a branch is an ordinary, valid summary


def test_pareto_targets_share_the_batch_sizes_whose_curves_all_reach_them(branched):
    _, truth, _, result = branched
    for opt in OPTIMIZERS:
        rows = rows_of(result["fits"]["pareto"], opt)
        assert len(rows) == pareto.PARETO_TARGETS
        for p in rows:
            assert p["batch_sizes"] == [BASELINE, *BATCHES], p  # one set for every target
            assert p["min_batch_sizes"] == len(BATCHES) + 1
            assert abs(p["b_crit"] / truth.b_crit - 1) < 0.02, p  # planted 200 sequences
            assert p["interval"].startswith("95%") and not p["degenerate"]
    assert not any("Pareto" in w for w in result["warnings"])


def test_every_cell_has_a_per_run_bcrit_against_the_four_budget_baseline(branched):
    _, truth, _, result = branched
    for g in result["groups"]:
        assert g["baseline_batch"] == BASELINE
        assert list(g["baseline"].tokens) == BUDGETS  # the baseline curve: all four budgets
        cells = {(r["batch_size"], r["budget"]) for r in g["per_run"]}
        assert cells == {(b, t) for b in BATCHES for t in BUDGETS}
        for r in g["per_run"]:
            assert abs(r["b_crit"] / truth.b_crit - 1) < 0.05, r
            assert r["b_crit_low"] <= r["b_crit"] <= r["b_crit_high"]


def test_the_baseline_seeds_give_every_cell_its_sigma(branched):
    _, _, _, result = branched
    scatter = math.sqrt(2) * OFFSETS[0]  # the standard deviation of +-0.002
    for g in result["groups"]:
        assert g["seed_scatter"] == pytest.approx(scatter)
        assert g["seed_scatter_dof"] == 4  # every budget (branches too) at its best lr
        for c in g["cells"]:
            if c.batch_size == BASELINE:
                assert c.sigma_source == "seeds" and c.n_seeds == 2
                assert c.loss_sigma == pytest.approx(scatter / math.sqrt(2))
            else:
                assert c.sigma_source == "seed scatter"
                assert c.loss_sigma == pytest.approx(scatter)
        assert all("seed-to-seed scatter" in r["interval"] for r in g["per_run"])


def test_a_branch_counts_with_its_run_in_the_kaplan_bootstrap(branched):
    _, _, _, result = branched
    rows = {(k["optimizer"], k["method"]): k for k in result["fits"]["kaplan"]}
    for opt in OPTIMIZERS:
        per_run = rows[(opt, "per_run")]
        assert per_run["n_points"] == 4 * len(BATCHES)
        assert per_run["n_units"] == len(BATCHES)  # one trained run per batch size
        assert per_run["interval"].startswith(f"range of {len(BATCHES)} per-unit estimates")


def test_per_run_and_pareto_agree_on_planted_data(branched):
    _, _, _, result = branched
    rows = result["fits"]["consistency"]
    assert len(rows) == len(result["fits"]["pareto"])
    for r in rows:
        assert r["n_per_run"] >= 3 and r["ratio"] == pytest.approx(1.0, abs=0.03), r
        assert r["per_run_b_crit_min"] <= r["per_run_b_crit"] <= r["per_run_b_crit_max"]
        assert BASELINE not in r["per_run_batch_sizes"]


def test_consistency_interpolates_log_bcrit_between_bracketing_cells():
    """Batch 32 at two budgets: B_crit 100 at loss 3.0 and 400 at 2.8; at 2.9 the per-run
    value is their geometric mean, 200, against a Pareto B_crit of 100."""
    per_run = [{"optimizer": "adamw", "group": "g", "batch_size": 32, "tokens": t,
                "val_loss": loss, "b_crit": b, "b_crit_low": b / 2, "b_crit_high": b * 2}
               for t, loss, b in ((2**20, 3.0, 100.0), (2**21, 2.8, 400.0))]
    frontier = [{"optimizer": "adamw", "group": "g", "target_loss": loss, "b_crit": 100.0,
                 "b_crit_low": 90.0, "b_crit_high": 110.0, "batch_sizes": [8, 32, 128]}
                for loss in (2.9, 3.5)]
    inside, outside = consistency.consistency_rows(frontier, per_run)
    assert inside["per_run_b_crit"] == pytest.approx(200.0)
    assert inside["ratio"] == pytest.approx(2.0) and inside["within_pareto_interval"] is False
    assert inside["n_per_run"] == 1 and inside["per_run_weighted"]
    assert outside["per_run_b_crit"] is None and outside["ratio"] is None
    assert outside["n_per_run"] == 0


def test_online_noise_series_comes_from_the_baseline_main_runs(branched):
    _, _, _, result = branched
    series = result["fits"]["online_noise"]
    usable = EVALS - len(UNRESOLVED_B_NOISE)  # None, NaN and -1 are skipped
    for opt in OPTIMIZERS:
        rows = rows_of(series, opt)
        names = sorted({Path(r["run_dir"]).name for r in rows})
        assert names == ["b8_lr1_s0", "b8_lr1_s1"]  # best lr of the largest budget, no branch
        assert len(rows) == 2 * usable
        for r in rows:
            assert r["b_noise"] == pytest.approx(LAW.b_noise(r["val_loss"], 64))
            assert r["b_noise_tokens"] == pytest.approx(r["b_noise"] * 64)
            assert {"group", "tokens"} <= set(r)


def test_online_noise_gets_its_own_kaplan_row_per_optimizer(branched):
    _, _, _, result = branched
    rows = {(k["optimizer"], k["method"]): k for k in result["fits"]["kaplan"]}
    for opt in OPTIMIZERS:
        row = rows[(opt, "online_noise")]
        assert row["exponent"] == pytest.approx(LAW.exponent, abs=0.01)
        assert row["b_star_tokens"] == pytest.approx(LAW.b_star_tokens, rel=0.01)
        assert row["exponent_low"] <= row["exponent"] <= row["exponent_high"]
        assert "blocks of consecutive eval points" in row["interval"]
        assert (opt, "noise") not in rows  # never pooled with noise.json's B_noise
    points = result["fits"]["kaplan_points"]
    assert sum(p["method"] == "online_noise" for p in points) == len(
        result["fits"]["online_noise"])


def test_old_folders_analyse_as_before_without_an_online_series(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(64, 256, 1024), all_budgets=True)
    result = bcrit.analyse(load_runs([tmp_path], progress=False)["runs"])
    assert result["fits"]["online_noise"] == []
    assert not any(k["method"] == "online_noise" for k in result["fits"]["kaplan"])
    assert not any("online" in w for w in result["warnings"])
    assert all(r["trunk"] == r["run_dir"] for r in result["fits"]["per_run"])
    assert len(result["fits"]["consistency"]) == pareto.PARETO_TARGETS


def test_batch_set_and_spread_targets():
    # most batch sizes first: all three share 1.5-2.0, wider pairs lose
    assert pareto.batch_set({8: (0.0, 2.0), 16: (1.0, 3.0), 32: (1.5, 4.0)}) == (
        [8, 16, 32], (1.5, 2.0))
    # then the widest common range: {16, 32} share 1.0-3.5, {8, 16} only 1.0-2.0
    assert pareto.batch_set({8: (0.0, 2.0), 16: (1.0, 3.5), 32: (0.5, 4.0)}) == (
        [8, 16, 32], (1.0, 2.0))
    assert pareto.batch_set({8: (0.0, 2.0), 16: (1.0, 3.5), 32: (3.0, 4.0)}) == (
        [8, 16], (1.0, 2.0))
    assert pareto.batch_set({8: (0.0, 1.0), 16: (2.0, 3.0)}) is None
    spread = pareto.spread_targets([(0.0, 1.0), (2.0, 3.0)], 4)
    assert spread == pytest.approx([0.25, 0.75, 2.25, 2.75])


def cell(batch: int, tokens: int, loss: float) -> best_lr.Cell:
    return best_lr.Cell(batch_size=batch, tokens=tokens, lr=1e-3, loss=loss, loss_sigma=0.01,
                      bytes_per_token=3.0, run_dir=f"b{batch}_t{tokens}", edge=None,
                      edge_diverged=False)


def test_pareto_targets_of_a_group_all_use_one_batch_set():
    """Five batch sizes; batch 256's curve stops at 3.0, the others reach 2.6. A target below
    3.0 would rest on four batch sizes and one above on five, and B_crit(L) would jump where
    the set changes: every target uses all five, over the losses they all reach (3.0-3.4)."""
    cells = [c for b in (16, 32, 64, 128) for c in (cell(b, 2**20, 3.4), cell(b, 2**23, 2.6))]
    cells += [cell(256, 2**21, 3.4), cell(256, 2**23, 3.0)]
    rows, warn = pareto.pareto_frontiers(cells, 64, "adamw", "add {batch} ({more})")
    assert warn is None and len(rows) == pareto.PARETO_TARGETS
    assert all(r["batch_sizes"] == [16, 32, 64, 128, 256] and r["min_batch_sizes"] == 5
               for r in rows)
    assert all(3.0 < r["target_loss"] < 3.4 for r in rows)


def test_a_batch_size_outside_the_shared_losses_is_left_out_of_every_target_and_named():
    """Batch 256's curve (3.3-3.6) overlaps the others' (2.6-3.4) by 0.1 nats/token, batch
    512's (3.5-3.8) not at all; four batch sizes reach 2.6-3.4, all five only 3.3-3.4. The set
    of five wins (most batch sizes first), and 512 is named as left out."""
    cells = [c for b in (16, 32, 64, 128) for c in (cell(b, 2**20, 3.4), cell(b, 2**23, 2.6))]
    cells += [cell(256, 2**21, 3.6), cell(256, 2**23, 3.3)]
    cells += [cell(512, 2**21, 3.8), cell(512, 2**23, 3.5)]
    rows, warn = pareto.pareto_frontiers(cells, 64, "adamw", "add {batch} ({more})")
    assert all(r["batch_sizes"] == [16, 32, 64, 128, 256] for r in rows)
    assert all(3.3 < r["target_loss"] < 3.4 for r in rows)
    assert "[512] left out" in warn and "3.3000-3.4000 nats/token" in warn


def test_pareto_falls_back_to_two_batch_sizes_with_a_warning():
    """Batch 64's losses (2.6-3.0) overlap batch 16's (2.8-3.4) but not batch 256's (3.1-3.6):
    nowhere do three reach, so each target rests on two batch sizes, the pair that shares
    the most losses (16 and 256: 0.3 nats/token against 0.2)."""
    cells = [cell(16, 2**20, 3.4), cell(16, 2**22, 2.8), cell(64, 2**21, 3.0),
             cell(64, 2**23, 2.6), cell(256, 2**21, 3.6), cell(256, 2**22, 3.1)]
    rows, warn = pareto.pareto_frontiers(cells, 64, "adamw", "add {batch} ({more})")
    assert len(rows) == pareto.PARETO_TARGETS
    assert all(r["batch_sizes"] == [16, 256] and r["min_batch_sizes"] == 2 for r in rows)
    assert "[64] left out" in warn
    assert all(r["b_crit_low"] is None and r["interval"].startswith("none") for r in rows)
    assert "two batch sizes: exact fit" in warn


@pytest.mark.slow
def test_the_report_has_every_table_with_units(branched, tmp_path):
    root, _, _, _ = branched
    out = run_analysis([str(root)], out=str(tmp_path / "report"), wandb_mode="disabled",
                       resamples=20)["out"]
    fits = json.loads((Path(out) / "fits.json").read_text())
    for key, fields in (
            ("consistency", {"optimizer", "group", "target_loss", "pareto_b_crit",
                             "pareto_b_crit_low", "pareto_b_crit_high", "per_run_b_crit",
                             "ratio", "n_per_run"}),
            ("online_noise", {"optimizer", "group", "tokens", "val_loss", "b_noise",
                              "b_noise_tokens"}),
            ("pareto", {"optimizer", "target_loss", "batch_sizes", "s_min", "e_min",
                        "e_min_tokens", "b_crit", "b_crit_low", "b_crit_high", "interval"})):
        assert fits[key] and all(fields <= set(r) for r in fits[key]), key
    text = (Path(out) / "report.md").read_text()
    for needle in ("## Pareto frontier", "### adamw", "### muon", "batch sizes used (seq)",
                   "S_min (steps)", "E_min (seq)", "E_min (tokens)", "95% fit (3 dof)",
                   "Interval: 95%, delta method on log B_crit",
                   "## Effective tokens and B_crit per run",
                   "## Per-run against Pareto B_crit", "ratio per-run/Pareto",
                   "## Online B_noise along training", "B_noise (seq)", "B_noise (tokens)",
                   "| adamw | online_noise |", "blocks of consecutive eval points"):
        assert needle in text, needle
