"""The adaptive lr search (`science.lr_search`): which lrs it adds and why, and a planted world
whose best lr drifts out of the starting grid with the batch and the budget, where the search
brackets every cell and the joint model then recovers the planted exponent."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from critbatch.analysis.bcrit import bcrit
from critbatch.analysis.bcrit.tables import load_tables
from critbatch.science.joint_planted import PlantedWorld
from critbatch.science.lr_search import additions, bracketed, grid_step, lattice

INF = math.inf


def test_an_edge_optimum_adds_the_next_lr_on_its_side_and_an_interior_one_nothing():
    losses = {1e-3: {100: 4.0, 200: 3.5}, 2e-3: {100: 3.9, 200: 3.6}, 4e-3: {100: 3.8, 200: 3.7}}
    adds = additions(losses, 2.0)
    assert [(a.lr, a.side, a.budgets) for a in adds] == [(5e-4, "low", (200,)),
                                                         (8e-3, "high", (100,))]
    assert adds[1].best_lr == 4e-3 and "highest lr tried" in adds[1].reason()
    assert bracketed(losses) == {100: False, 200: False}
    interior = {1e-3: {100: 4.0}, 2e-3: {100: 3.9}, 4e-3: {100: 4.1}}
    assert additions(interior, 2.0) == [] and bracketed(interior) == {100: True}


def test_a_diverged_lr_above_the_best_is_split_once_and_all_diverged_adds_nothing():
    losses = {1e-3: {100: 4.0}, 2e-3: {100: 3.9}, 4e-3: {100: INF}}
    (gap,) = additions(losses, 2.0)
    assert gap.side == "gap" and gap.lr == lattice(math.sqrt(2e-3 * 4e-3)) == 2.8e-3
    losses[2.8e-3] = {100: INF}  # the half step diverged too: nothing left to try
    assert additions(losses, 2.0) == []
    assert additions({1e-3: {100: INF}, 2e-3: {100: INF}}, 2.0) == []


def test_the_grid_step_and_the_lattice_give_every_draw_the_same_names():
    assert grid_step([6e-4, 9.5e-4, 1.5e-3, 2.4e-3]) == pytest.approx(1.587, abs=1e-3)
    assert grid_step([4e-3]) == 2.0
    assert lattice(2.4e-3 * 1.587) == 3.8e-3 and lattice(6e-4 / 1.587) == 3.8e-4


def test_budgets_asking_for_one_lr_from_two_sides_get_one_addition():
    # budget 1 tried 1e-4 (diverged) and 2e-4: wants 4e-4 above; budget 2 tried only 8e-4:
    # wants 4e-4 below
    (add,) = additions({1e-4: {1: INF}, 2e-4: {1: 1.0}, 8e-4: {2: 1.0}}, 2.0)
    assert (add.lr, add.side, add.budgets) == (4e-4, "high+low", (1, 2))
    assert "the highest lr tried or the lowest lr tried at 2 budget(s)" in add.reason()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3, 3.2e-3]),
                       st.dictionaries(st.sampled_from([1, 2, 3]),
                                       st.one_of(st.floats(0.5, 10), st.just(INF)),
                                       min_size=1), min_size=1))
def test_additions_never_repeat_an_lr_and_only_edges_ask(losses):
    adds = additions(losses, 2.0)
    assert len({a.lr for a in adds}) == len(adds)
    assert not any(math.isclose(a.lr, lr) for a in adds for lr in losses)
    for a in adds:
        for budget in a.budgets:
            # a bracketed budget asks only for the gap below a diverged lr (one addition may
            # serve another budget's edge too: side "gap+low")
            assert not bracketed(losses).get(budget, False) or "gap" in a.side.split("+")


# ---------------------------------------------------------------------------------------------
# A planted world whose optimum drifts out of the grid

GAMMA = 4.8  # the planted exponent 1/alpha_B
WORLD = PlantedWorld(l_inf=(1.0, 0.9, 0.8, 0.7), a=(3.3,) * 4, alpha=(0.16,) * 4, gamma=GAMMA)
BATCHES = (8, 16, 32, 64, 128)
BUDGETS = tuple(int(1.5e6 * 2.0**k) for k in range(-2, 3))
START = (7e-4, 1.4e-3, 2.8e-3)  # the starting grid (step x2)
CURVATURE = 0.05  # nats/token per (ln lr)^2 away from the best lr
SEEDS = 2


def best_lr(batch: int, tokens: float) -> float:
    """The planted optimum: up with the batch, down with the budget; from 5.7e-4 (batch 8,
    6M tokens) to 7e-3 (batch 128, 375k), outside the starting grid at both ends."""
    return 1e-3 * (batch / 8) ** 0.5 * (tokens / 1.5e6) ** -0.4


def planted_runs(rng: np.random.Generator, search: bool) -> tuple[list[dict], int]:
    """Every run of the planted sweep (the starting grid, and with `search` every lr the
    search adds, round by round) and the rounds it took."""
    truth, rows, rounds = WORLD.fit(), [], 0
    for size in range(len(WORLD.l_inf)):
        for batch in BATCHES:
            exact = {t: float(truth.predict_loss(size, batch, t)[0]) for t in BUDGETS}
            trunk: dict[float, dict[int, list[float]]] = {}

            def train(lr: float, size=size, batch=batch, exact=exact, trunk=trunk) -> None:
                trunk[lr] = {}
                for tokens in BUDGETS:
                    loss = exact[tokens] + CURVATURE * math.log(lr / best_lr(batch, tokens)) ** 2
                    trunk[lr][tokens] = [loss + 0.003 * rng.standard_normal()
                                         for _ in range(SEEDS)]
                    rows.extend({"run": f"w{size}_b{batch}_t{tokens}_lr{lr:g}_s{s}",
                                 "group": "planted", "optimizer": "adamw", "lr": lr, "seed": s,
                                 "batch_size": batch, "seq_len": 64, "tokens": tokens,
                                 "params": int(1e6 * 2**size), "loss": value}
                                for s, value in enumerate(trunk[lr][tokens]))

            def means(trunk=trunk) -> dict[float, dict[int, float]]:
                return {lr: {t: float(np.mean(v)) for t, v in per.items()}
                        for lr, per in trunk.items()}

            for lr in START:
                train(lr)
            for round_no in range(1, 9 if search else 1):
                new = additions(means(), grid_step(list(START)))
                if not new:
                    break
                rounds = max(rounds, round_no)
                for add in new:
                    train(add.lr)
            if search:
                assert all(bracketed(means()).values()), (size, batch, sorted(trunk))
    return rows, rounds


def analysed(rows: list[dict], path) -> dict:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    loaded = load_tables([path])
    return bcrit.analyse(loaded["runs"], **loaded["analyse_kwargs"])["fits"]


@pytest.mark.slow
def test_the_search_brackets_a_drifting_optimum_and_the_joint_fit_recovers_the_law(tmp_path):
    """The optimum leaves the starting grid above at large batches and small budgets and below
    at batch 8's largest budgets: the fixed grid leaves cells on its edges (bounds), the search
    brackets every cell, and the joint model's 95% interval then covers the planted 4.8."""
    rng = np.random.default_rng(3)
    fixed, _ = planted_runs(rng, search=False)
    fixed_fits = analysed(fixed, tmp_path / "fixed.csv")
    assert fixed_fits["lr_edge_cells"]["adamw"] >= 20  # 67 of 100 cells (2026-12-04)
    loose = fixed_fits["joint"]["adamw"]

    searched, rounds = planted_runs(np.random.default_rng(3), search=True)
    assert rounds >= 2 and len(searched) > len(fixed)
    fits = analysed(searched, tmp_path / "searched.csv")
    assert fits["lr_edge_cells"] == {"adamw": 0}
    doc = fits["joint"]["adamw"]
    assert doc["exponent_low"] <= GAMMA <= doc["exponent_high"], doc
    assert doc["exponent_high"] - doc["exponent_low"] < 1.0  # 0.11 (2026-12-04)
    assert loose["exponent_high"] - loose["exponent_low"] > 2 * (
        doc["exponent_high"] - doc["exponent_low"])  # the bounds' 3.56


def test_the_search_ignores_budgets_the_analysis_leaves_out():
    """Muon's 40-step cpu warmup: a batch-128 run of 64-token sequences is measured from 120
    steps (983,040 tokens) up; the search adds no lr for a shorter budget."""
    from types import SimpleNamespace

    from critbatch.orchestration.lr_search import measured

    job = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(batch_size=128,
                                                                    warmup_steps=40),
                                              model=SimpleNamespace(seq_len=64)))
    assert measured(job, 120 * 128 * 64) and not measured(job, 119 * 128 * 64)
    job.cfg.train.warmup_steps = None  # a run that recorded no warmup is always measured
    assert measured(job, 128 * 64)
