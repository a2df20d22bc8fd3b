"""Batch-size schedules: the lr-scaling rule, ramp and adaptive batches, exact accounting."""

from __future__ import annotations

import json
import math

import pytest

from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.science.rules import (
    AdaptiveBatch,
    lr_multiplier,
    pow2_floor,
    pow2_nearest,
    ramp_batch_size,
)
from critbatch.training.batching import BatchPlan
from critbatch.training.loop import train
from critbatch.training.optim import batch_lr_ratio
from critbatch.training.schedule import lr_factor, lr_factor_by_tokens


def test_lr_scaling_rule_values():
    assert lr_multiplier("none", 256, 64) == 1.0
    assert lr_multiplier("sqrt", 256, 64) == 2.0
    assert lr_multiplier("sqrt", 1, 64) == 0.125
    assert lr_multiplier("linear", 16, 64) == 0.25
    assert lr_multiplier("linear", 256, 64) == 4.0


def test_batch_lr_ratio_is_exactly_one_at_the_built_batch(tiny_cfg):
    optim = tiny_cfg("optim.lr_scaling=sqrt").optim
    assert batch_lr_ratio(optim, 32, 32) == 1.0
    assert batch_lr_ratio(optim, 8, 32) == pytest.approx(0.5)
    linear = tiny_cfg("optim.lr_scaling=linear").optim
    assert batch_lr_ratio(linear, 128, 32) == pytest.approx(4.0)


def test_powers_of_two_of_the_micro_batch():
    assert [pow2_floor(x, 4) for x in (1, 4, 7.9, 8, 15, 16, 100)] == [4, 4, 4, 8, 8, 16, 64]
    assert [pow2_nearest(x, 4) for x in (2, 4, 5.6, 5.7, 11, 12, 300)] == [4, 4, 4, 8, 8, 16, 256]


def test_ramp_follows_the_line_rounded_down_to_doublings():
    # 8 -> 64 over the first half of 1000 tokens, micro-batch 8
    sizes = [ramp_batch_size(t, 1000, 8, 64, 0.5, 8) for t in range(0, 1001, 50)]
    assert sizes[0] == 8 and sizes[-1] == 64
    assert sizes == sorted(sizes)  # never shrinks
    assert set(sizes) == {8, 16, 32, 64}
    # the line reaches 16 at 8/56 of the ramp (71 tokens), 32 at 24/56 (214), 64 at the end
    assert ramp_batch_size(71, 1000, 8, 64, 0.5, 8) == 8
    assert ramp_batch_size(72, 1000, 8, 64, 0.5, 8) == 16
    assert ramp_batch_size(214, 1000, 8, 64, 0.5, 8) == 16
    assert ramp_batch_size(215, 1000, 8, 64, 0.5, 8) == 32
    assert ramp_batch_size(499, 1000, 8, 64, 0.5, 8) == 32
    assert ramp_batch_size(500, 1000, 8, 64, 0.5, 8) == 64


def test_adaptive_controller_follows_clips_and_waits():
    ctl = AdaptiveBatch(low=8, high=128, unit=4, interval=10)
    script = {  # step -> scripted B_noise (sequences)
        0: 40.0, 5: 40.0,  # before the first decision: stays at 8
        10: 40.0,  # follows: nearest doubling of 40 is 32
        12: 200.0,  # wants 128, but only every 10 steps is a decision
        20: 200.0,  # clipped to the cap
        30: 1.0,  # clipped to the floor
        40: None, 50: math.nan,  # no estimate: unchanged
        51: 24.0,  # not a decision step
        60: 5.9,  # rounds to 8 = the current batch: no change counted
        70: 24.0,  # 24 is 2^2.58 x 4 -> 32 (nearest in log)
    }
    seen = {step: ctl.update(step, b) for step, b in script.items()}
    assert seen == {0: 8, 5: 8, 10: 32, 12: 32, 20: 128, 30: 8, 40: 8, 50: 8, 51: 8, 60: 8,
                    70: 32}
    assert ctl.last_change == 70
    # every batch it chose is a power of two of the micro-batch inside the bounds
    assert all(8 <= b <= 128 and math.log2(b / 4).is_integer() for b in seen.values())


@pytest.mark.slow
def test_adaptive_choices_do_not_depend_on_the_logging_cadence(tiny_cfg, tmp_path):
    """The controller decides on fixed steps, after bringing B_noise up to date there."""
    common = ("train.batch_schedule=adaptive", "train.batch_size_start=8",
              "train.batch_size=64", "train.micro_batch_size=4", "train.tokens=24576",
              "train.adaptive.interval_steps=4", "train.eval_points=3")
    a = train(tiny_cfg(*common, "train.log_every=1"), tmp_path / "every_step")
    b = train(tiny_cfg(*common, "train.log_every=7"), tmp_path / "every_7")
    assert a["batch_changes"] and a["batch_changes"] == b["batch_changes"]
    assert all(c["step"] % 4 == 0 for c in a["batch_changes"][:-2])  # the fill may come anytime
    assert a["val_loss"] == b["val_loss"]


def test_noise_factor_scales_the_target():
    ctl = AdaptiveBatch(low=4, high=256, unit=4, interval=1, factor=0.5)
    assert ctl.target(128.0) == 64


def test_lr_factor_by_tokens_warms_up_by_steps_then_decays_by_tokens(tiny_cfg):
    t = tiny_cfg("train.warmup_steps=10", "train.min_lr_ratio=0.1").train
    assert lr_factor_by_tokens(0, 0, 1000, t) == 0.1
    assert lr_factor_by_tokens(9, 50, 1000, t) == 1.0
    assert lr_factor_by_tokens(10, 500, 1000, t) == pytest.approx(0.55)  # half the cosine
    assert lr_factor_by_tokens(99, 1000, 1000, t) == pytest.approx(0.1)
    # at a constant batch the token share is the step share: the two schedules agree
    steps = 101
    for step in (10, 40, 70, 100):
        by_steps = lr_factor(step, steps, t)
        by_tokens = lr_factor_by_tokens(step, (step - 10) * 1000 // (steps - 11), 1000, t)
        assert by_tokens == pytest.approx(by_steps, abs=1e-3)


def test_plan_accounts_every_token(tiny_cfg):
    cfg = tiny_cfg("train.batch_schedule=ramp", "train.batch_size_start=4",
                   "train.batch_size=32", "train.micro_batch_size=4", "train.tokens=20000",
                   "train.ramp_fraction=0.5")
    plan, step, tokens, sizes = BatchPlan(cfg), 0, 0, []
    while batch := plan.next(step, tokens):
        sizes.append(batch)
        step, tokens = step + 1, tokens + batch * cfg.model.seq_len
    # 20000 tokens = 625 sequences of 32; the last steps shrink to fill all but < 4 of them
    assert tokens == 20000 // (4 * 32) * 4 * 32 and plan.is_last(tokens)
    assert all(math.log2(b / 4).is_integer() for b in sizes)
    assert sizes[0] == 4 and max(sizes) == 32


def test_schedule_config_errors_are_one_line(tiny_cfg):
    cases = {
        ("train.batch_schedule=ramp",): "needs train.batch_size_start",
        ("train.batch_schedule=ramp", "train.batch_size_start=12", "train.batch_size=48",
         "train.micro_batch_size=4"): "not a power of two times train.micro_batch_size=4",
        ("train.batch_schedule=ramp", "train.batch_size_start=64",
         "train.batch_size=32"): "must lie in [1, train.batch_size=32]",
        ("train.batch_schedule=adaptive", "train.batch_size_start=8", "train.batch_size=64",
         "train.micro_batch_size=8"): "set train.micro_batch_size=4",
        ("train.batch_schedule=ramp", "train.batch_size_start=4", "train.steps=10"):
            "takes a token budget",
        ("train.batch_schedule=grow",): "is not one of constant, ramp, adaptive",
        ("train.steps=0",): "train.steps=0 must be >= 1",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError) as err:
            tiny_cfg(*overrides)
        assert message in str(err.value) and "\n" not in str(err.value)


def test_train_steps_fixes_the_step_count(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.steps=12", "train.batch_size=4", "train.tokens=1")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 4 * 32


def _metrics(run_dir):
    return runs.read_metrics(run_dir)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_ramp_run_trains_what_it_reports(tiny_cfg, tmp_path, optimizer):
    cfg = tiny_cfg(f"optim={optimizer}", "optim.lr_scaling=sqrt", "optim.base_batch_size=4",
                   "train.batch_schedule=ramp", "train.batch_size_start=4",
                   "train.batch_size=32", "train.micro_batch_size=4", "train.tokens=24576",
                   "train.ramp_fraction=0.5", "train.warmup_steps=2", "train.eval_points=4")
    summary = train(cfg, tmp_path / "run")
    rows = _metrics(tmp_path / "run")
    assert summary["status"] == "completed" and math.isfinite(summary["val_loss"])
    # exact accounting: steps, tokens and the per-step batch agree with each other
    assert summary["steps"] == len(rows) == rows[-1]["step"]
    assert summary["tokens"] == rows[-1]["tokens"] == sum(r["batch_size"] for r in rows) * 32
    assert summary["tokens"] == 24576  # a multiple of micro x seq_len: filled exactly
    steps_tokens = zip(rows, rows[1:], strict=False)
    assert all(b["tokens"] - a["tokens"] == b["batch_size"] * 32 for a, b in steps_tokens)
    sizes = [r["batch_size"] for r in rows]
    # the batch sequence: 4 until the line reaches 8, ..., 32 from half the tokens on
    expected = []
    tokens = 0
    while tokens < 24576:
        b = min(ramp_batch_size(tokens, 24576, 4, 32, 0.5, 4),
                pow2_floor((24576 - tokens) // 32, 4))
        expected.append(b)
        tokens += b * 32
    assert sizes == expected
    assert summary["batch_size_start"] == 4 and summary["batch_size_max"] == 32
    assert summary["batch_size_mean"] == pytest.approx(24576 / len(rows) / 32)
    changes = summary["batch_changes"]
    assert [c["batch_size"] for c in changes][:3] == [8, 16, 32]
    for change in changes:  # each change names the step after which the new batch starts
        assert rows[change["step"]]["batch_size"] == change["batch_size"]
        assert rows[change["step"] - 1]["tokens"] == change["tokens"]
    # the lr follows sqrt(batch / 4) after warmup (cosine decay by tokens on top)
    for row in rows[3:]:
        base = lr_factor_by_tokens(row["step"] - 1, row["tokens"], 24576, cfg.train)
        peak = summary["lr"] * math.sqrt(row["batch_size"] / 32)
        assert row["lr"] == pytest.approx(peak * base, rel=1e-9)
    assert [p["tokens"] for p in summary["curve"]][-1] == 24576
    json.dumps(summary)  # strict JSON


def test_adaptive_run_follows_its_online_noise_scale(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.batch_schedule=adaptive", "train.batch_size_start=8",
                   "train.batch_size=64", "train.micro_batch_size=4", "train.tokens=32768",
                   "train.adaptive.interval_steps=5", "train.log_every=5")
    summary = train(cfg, tmp_path / "run")
    rows = _metrics(tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["tokens"] == sum(r["batch_size"] for r in rows) * 32 == 32768
    changes = summary["batch_changes"]
    assert changes, "the batch never moved"
    steps = [c["step"] for c in changes]
    # decisions every 5 steps only, except the final fill of the budget
    fills = [c for c in changes if c["tokens"] + c["batch_size"] * 32 * 2 > 32768]
    regular = [s for s, c in zip(steps, changes, strict=True) if c not in fills]
    assert all(s % 5 == 0 for s in regular) and regular[0] >= 5
    assert all(8 <= r["batch_size"] <= 64 for r in rows[: regular[-1]])
    assert summary["b_noise"] is not None


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_accumulation_reproduces_the_plain_batch(tiny_cfg, tmp_path, optimizer):
    """16 sequences as 4 micro-batches of 4 = one batch of 16, step for step (science.md 6)."""
    common = (f"optim={optimizer}", "train.batch_size=16", "train.steps=12",
              "train.warmup_steps=3", "train.gns.enabled=false")
    assert train(tiny_cfg(*common), tmp_path / "plain")["micro_batch_size"] == 16
    assert train(tiny_cfg(*common, "train.micro_batch_size=4"),
                 tmp_path / "accum")["micro_batch_size"] == 4
    plain, accum = _metrics(tmp_path / "plain"), _metrics(tmp_path / "accum")
    assert len(plain) == len(accum) == 12
    for p, a in zip(plain, accum, strict=True):
        assert a["train_loss"] == pytest.approx(p["train_loss"], rel=1e-5, abs=0)
        # Muon's Newton-Schulz iteration amplifies float differences in the update a little
        assert a["grad_norm"] == pytest.approx(p["grad_norm"], rel=1e-3)
