"""`train.batch_schedule=measured`: the batch follows a local-CBS report's B_crit curve.

Its bitwise resume (also after the report is written again) is tested beside ramp's and
adaptive's in tests/test_reliability.py."""

from __future__ import annotations

import json
import math

import pytest

from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.science.rules import log_interp, measured_batch_size
from critbatch.training.batching import BatchPlan
from critbatch.training.loop import train
from critbatch.training.schedule import lr_factor_by_tokens

SEQ = 32  # tokens per sequence of tiny_cfg


def write_fits(path, rows: list[dict]):
    path.write_text(json.dumps({"local_cbs": rows, "rule": {}}))
    return path


def rows(optimizer="adamw", lr_scaling="sqrt", points=((2048, 8), (8192, 64))) -> list[dict]:
    """fits.json rows as the local-CBS report writes them (b_crit in sequences)."""
    return [{"optimizer": optimizer, "lr_scaling": lr_scaling, "tokens": t, "val_loss": 5.0,
             "b_crit": b, "b_crit_tokens": b * SEQ, "base_batch_size": 4,
             "first_step_rejected": False, "lower_bound_only": False} for t, b in points]


def measured(tiny_cfg, fits, *extra):
    return tiny_cfg("optim.lr_scaling=sqrt", "optim.base_batch_size=4",
                    "train.batch_schedule=measured", "train.batch_size_start=4",
                    "train.batch_size=32", "train.micro_batch_size=4", "train.tokens=16384",
                    f"train.measured.fits={fits}", *extra)


def test_log_interp_is_a_power_law_between_points_and_flat_beyond():
    points = [(100.0, 2.0), (400.0, 8.0), (1600.0, 8.0)]
    assert log_interp(1, points) == 2.0 and log_interp(100, points) == 2.0
    assert log_interp(200, points) == pytest.approx(4.0)  # slope 1 in log-log
    assert log_interp(400, points) == pytest.approx(8.0)
    assert log_interp(800, points) == pytest.approx(8.0) and log_interp(1e9, points) == 8.0
    # a slope of 1.5: y = 8 (x / 2048)^1.5
    assert log_interp(4096, [(2048, 8), (8192, 64)]) == pytest.approx(8 * 2 ** 1.5)


def test_the_batch_doubles_while_b_crit_exceeds_factor_times_it():
    assert measured_batch_size(8, 4, 32, 2.0) == 4  # 8 is not above 2 x 4
    assert measured_batch_size(8.01, 4, 32, 2.0) == 8
    assert measured_batch_size(100, 4, 32, 2.0) == 32  # capped
    assert measured_batch_size(100, 4, 32, 1.0) == 32
    assert measured_batch_size(20, 4, 32, 1.0) == 32  # 20 > 16: one more doubling
    assert measured_batch_size(1, 16, 32, 2.0) == 16  # never shrinks


def test_the_plan_follows_a_planted_curve(tiny_cfg, tmp_path):
    """B_crit = 8 (tokens / 2048)^1.5 from 2048 tokens: the batch of 4 becomes 8 at the first
    step after 2048 tokens, 16 once tokens > 2048 x 2^(2/3) = 3251, 32 once tokens >
    2048 x 4^(2/3) = 5161; the last steps shrink by halvings to fill the 16384 tokens."""
    cfg = measured(tiny_cfg, write_fits(tmp_path / "fits.json", rows()))
    plan, step, tokens, sizes = BatchPlan(cfg), 0, 0, []
    while batch := plan.next(step, tokens):
        sizes.append(batch)
        step, tokens = step + 1, tokens + batch * SEQ
    assert sizes == [4] * 17 + [8] * 5 + [16] * 4 + [32] * 10 + [16, 4]
    assert tokens == 16384
    assert plan.curve == [[2048.0, 8.0], [8192.0, 64.0]]


@pytest.mark.slow
def test_a_measured_run_trains_its_plan_and_scales_the_lr(tiny_cfg, tmp_path):
    fits = write_fits(tmp_path / "fits.json",
                      rows() + rows(optimizer="muon") + rows(lr_scaling="linear",
                                                             points=((1, 1000),)))
    cfg = measured(tiny_cfg, fits, "train.warmup_steps=2", "train.eval_points=3",
                   "train.schedule=wsd")
    summary = train(cfg, tmp_path / "run")
    rows_ = runs.read_metrics(tmp_path / "run")
    assert [r["batch_size"] for r in rows_] == [4] * 17 + [8] * 5 + [16] * 4 + [32] * 10 + [16, 4]
    assert summary["tokens"] == 16384 and summary["batch_schedule"] == "measured"
    assert [(c["step"], c["batch_size"]) for c in summary["batch_changes"]] == [
        (17, 8), (22, 16), (26, 32), (36, 16), (37, 4)]
    assert summary["measured_curve"] == {"fits": str(fits), "factor": 2.0,
                                         "tokens": [2048.0, 8192.0], "b_crit": [8.0, 64.0]}
    for row in rows_[2:]:  # after warmup: sqrt(batch / 32) x the wsd factor by tokens
        base = lr_factor_by_tokens(row["step"] - 1, row["tokens"], 16384, cfg.train)
        assert row["lr"] == pytest.approx(summary["lr"] * math.sqrt(row["batch_size"] / 32)
                                          * base, rel=1e-9)


@pytest.mark.parametrize("case", ["missing", "not json", "no rows", "other rule", "unset",
                                  "factor"])
def test_a_bad_fits_file_is_one_line(tiny_cfg, tmp_path, case):
    path = tmp_path / "fits.json"
    extra = []
    if case == "not json":
        path.write_text("{")
    elif case == "no rows":
        write_fits(path, rows(optimizer="muon"))
    elif case == "other rule":
        write_fits(path, rows(lr_scaling="linear"))
    elif case in ("unset", "factor"):
        write_fits(path, rows())
        extra = ["train.measured.fits=null"] if case == "unset" else ["train.measured.factor=0"]
    with pytest.raises(ConfigError) as err:
        measured(tiny_cfg, path, *extra)
    message = str(err.value)
    assert "\n" not in message
    expected = {"missing": "does not exist", "not json": "is not a local-CBS report's fits.json",
                "no rows": "has no row for optim=adamw with lr_scaling=sqrt (it holds "
                           "optimizer/lr_scaling muon/sqrt)",
                "other rule": "adamw/linear", "unset": "needs train.measured.fits",
                "factor": "train.measured.factor=0.0 must be positive"}[case]
    assert expected in message
    if case != "factor":
        assert "make sweep-local-cbs SCALE=smoke" in message


def test_rows_without_an_lr_rule_match_any(tiny_cfg, tmp_path):
    old = [{k: v for k, v in r.items() if k != "lr_scaling"} for r in rows()]
    cfg = measured(tiny_cfg, write_fits(tmp_path / "fits.json", old))
    assert BatchPlan(cfg).curve == [[2048.0, 8.0], [8192.0, 64.0]]
