"""make sweep-branches: branches against separate wsd and cosine runs (analysis/branch_check)."""

from __future__ import annotations

import pytest

from critbatch.analysis.branch_check.branch_check import compare, seed_scatter, verdict


def _run(sweep: str, schedule: str, tokens: int, loss: float, seed: int = 0, **extra) -> dict:
    run = {"sweep": sweep, "schedule": schedule, "tokens": tokens, "val_loss": loss,
            "optimizer": "adamw", "data_name": "stdlib", "vocab_size": 2048, "width": 64,
            "depth": 2, "seq_len": 64, "batch_size": 8, "base_lr": 1.5e-3, "seed": seed,
            "status": "completed", "wall_time_s": 10.0, **extra}
    return {**run, "lr": run["base_lr"]}  # the baseline batch: the lr used is the base lr


def test_branches_are_compared_budget_by_budget_with_the_seed_scatter():
    runs = [
        _run("batch", "wsd", 1000, 4.0),  # the main run
        _run("batch", "wsd", 500, 4.5, branch_of="main", branch_at_tokens=400,
             wall_time_s=2.0),
        _run("batch", "wsd", 1000, 4.02, seed=1),
        _run("batch", "wsd", 500, 4.48, seed=1, branch_of="main1", branch_at_tokens=400),
        _run("branch_check", "wsd", 500, 4.5), _run("branch_check", "cosine", 500, 4.4),
        _run("branch_check", "wsd", 1000, 4.0), _run("branch_check", "cosine", 1000, 3.99),
    ]
    rows = compare(runs)
    assert [(r["tokens"], r["branch_of"]) for r in rows] == [(500, "main"), (1000, None)]
    half = rows[0]
    assert half["branch_minus_wsd"] == 0.0
    assert half["branch_minus_cosine"] == pytest.approx(0.1)
    assert half["branch_token_share"] == pytest.approx(0.2)
    assert half["branch_wall_s"] / half["separate_wall_s"] == pytest.approx(0.2)
    scatter = seed_scatter(runs)
    sd, dof = scatter["adamw"]
    assert dof == 2 and sd == pytest.approx(0.02 / 2**0.5)
    lines = verdict(rows, scatter)
    assert any("cosine" in line and "worse than" in line for line in lines)
    assert any("separate wsd" in line and "within the seed scatter" in line for line in lines)
    better = verdict([{**r, "branch_minus_cosine": -0.2} for r in rows], scatter)
    assert any("cosine" in line and "better than" in line for line in better)


def test_the_seed_scatter_counts_the_best_lr_only():
    """An unstable lr's seeds (0.3 apart) do not inflate the noise of the cells' best lr."""
    runs = [_run("batch", "wsd", 1000, 4.0), _run("batch", "wsd", 1000, 4.02, seed=1),
            _run("batch", "wsd", 1000, 4.5, base_lr=6e-3),
            _run("batch", "wsd", 1000, 4.8, seed=1, base_lr=6e-3)]
    sd, dof = seed_scatter(runs)["adamw"]
    assert dof == 1 and sd == pytest.approx(0.02 / 2**0.5)
