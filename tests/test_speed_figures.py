"""Honest speed figures: summary.json's tokens_per_s leaves out a session's warm-up steps
(compilation, first allocations), the whole-run rate and the warm-up's seconds sit beside it,
and W&B gets every step once, logged at the flushes of metrics.jsonl."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from test_wandb_axis import wandb_records

from critbatch.results import runs
from critbatch.training import loop as train_loop
from critbatch.training.loop import train
from critbatch.training.metrics import WARMUP_STEPS_EXCLUDED, SpeedClock

SPEED_KEYS = ("tokens_per_s", "tokens_per_s_with_warmup", "warmup_s")


def test_speed_fields_known_answer():
    """A resumed session from step 10 (20 s on the clock): warm-up to step 13 at 26 s, with an
    eval of 1 s at step 12 inside it and evals of 2 s and 3 s at steps 13 and 20 after it;
    the run ends at step 20 (2000 tokens, 700 at step 13) at 46 s. The eval at step 10 is the
    previous session's."""
    clock = SpeedClock(t0=0.0, start_step=10, start_s=20.0, end_step=13, end_tokens=700,
                       end_s=26.0)
    curve = [{"step": 10, "eval_time_s": 100.0}, {"step": 12, "eval_time_s": 1.0},
             {"step": 13, "eval_time_s": 2.0}, {"step": 20, "eval_time_s": 3.0}]
    got = clock.fields(46.0, 2000, curve, with_warmup_tokens_per_s=42.0)
    # steady: (2000 - 700) tokens over 46 - 26 - (2 + 3) = 15 s; warm-up: 26 - 20 - 1 = 5 s
    assert got == {"tokens_per_s": pytest.approx(1300 / 15), "tokens_per_s_with_warmup": 42.0,
                   "warmup_s": pytest.approx(5.0)}


def test_a_session_without_a_step_after_its_warm_up_reports_the_whole_run_rate():
    clock = SpeedClock(t0=0.0, start_step=0, start_s=0.0)
    for step in range(1, WARMUP_STEPS_EXCLUDED):
        clock.tick(step, 100 * step, torch.device("cpu"))
    assert clock.end_step is None
    got = clock.fields(9.0, 200, [{"step": 2, "eval_time_s": 1.0}], 25.0)
    assert got == {"tokens_per_s": 25.0, "tokens_per_s_with_warmup": 25.0, "warmup_s": 8.0}
    clock.tick(WARMUP_STEPS_EXCLUDED, 300, torch.device("cpu"))  # ended exactly at its end
    assert clock.end_step == WARMUP_STEPS_EXCLUDED
    assert clock.fields(9.0, 300, [], 25.0)["tokens_per_s"] == 25.0


@pytest.fixture
def clocks(monkeypatch) -> list[SpeedClock]:
    """The SpeedClock of each train() call (the real one, kept for the test to read)."""
    made = []

    class Kept(SpeedClock):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(train_loop, "SpeedClock", Kept)
    return made


def check_speed(summary: dict, clock: SpeedClock, rows: list[dict], start_step: int,
                curve_eval_s: float, steady_eval_s: float) -> None:
    """The figures are finite and positive, and tokens_per_s counts the tokens of the steps
    after the session's first WARMUP_STEPS_EXCLUDED (as metrics.jsonl has them) over the
    time after the warm-up's end, which lies between those steps' rows."""
    assert all(math.isfinite(summary[k]) and summary[k] > 0 for k in SPEED_KEYS)
    end = start_step + WARMUP_STEPS_EXCLUDED
    by_step = {r["step"]: r for r in rows}
    assert clock.start_step == start_step and clock.end_step == end
    assert clock.end_tokens == by_step[end]["tokens"]
    assert by_step[end]["time_s"] <= clock.end_s <= by_step[end + 1]["time_s"]
    steady_s = summary["wall_time_s"] - clock.end_s - steady_eval_s
    assert summary["tokens_per_s"] == pytest.approx(
        (summary["tokens"] - by_step[end]["tokens"]) / steady_s, rel=1e-9)
    assert summary["tokens_per_s_with_warmup"] == pytest.approx(
        summary["tokens"] / (summary["wall_time_s"] - curve_eval_s), rel=1e-9)


def eval_seconds(clock: SpeedClock, first_step: int) -> float:
    """The eval seconds the run recorded from `first_step` on (its state's curve)."""
    return sum(p["eval_time_s"] for p in clock.curve if p["step"] >= first_step)


def test_a_run_writes_its_steady_rate_beside_the_whole_run_rate(tiny_cfg, tmp_path, clocks,
                                                                  monkeypatch):
    cfg = tiny_cfg("train.batch_size=8", "train.tokens=5120", "train.eval_points=4")  # 20 steps
    curves = keep_curves(monkeypatch)
    summary = train(cfg, tmp_path / "run")
    (clock,) = clocks
    clock.curve = curves[-1]
    assert runs.read_summary(tmp_path / "run") == json.loads(json.dumps(summary))
    rows = runs.read_metrics(tmp_path / "run")
    assert len(rows) == summary["steps"] == 20
    check_speed(summary, clock, rows, 0, eval_seconds(clock, 1),
                eval_seconds(clock, WARMUP_STEPS_EXCLUDED))
    # a run folder written before these keys existed still loads
    older = {k: v for k, v in summary.items() if k not in SPEED_KEYS[1:]}
    (tmp_path / "run" / "summary.json").write_text(json.dumps(older))
    assert runs.read_summary(tmp_path / "run") == json.loads(json.dumps(older))


def keep_curves(monkeypatch) -> list[list[dict]]:
    """The eval points (with their eval_time_s, which summary.json leaves out) that each
    summarize() call saw."""
    seen = []
    real = train_loop.summarize

    def summarize(tr, *args):
        seen.append([dict(p) for p in tr.state.curve])
        return real(tr, *args)

    monkeypatch.setattr(train_loop, "summarize", summarize)
    return seen


def test_a_resumed_run_reports_the_speed_of_its_last_session(tiny_cfg, tmp_path, clocks,
                                                             monkeypatch):
    """Stopped while drawing step 13's batch, resumed from the checkpoint at step 10: the
    steady rate counts from step 13 (the resumed session's third), the whole-run rate is
    every token over the run's wall time (both sessions')."""
    cfg = tiny_cfg("train.batch_size=8", "train.tokens=5120", "train.eval_points=4",
                   "train.checkpoint_every_steps=5")
    real = train_loop.sample_batch

    class Interrupted(Exception):
        pass

    def stop_at_13(ids, seq_len, batch_size, seed, step):
        if step == 12:  # the batch of step 13 (drawn by the steps taken before it)
            raise Interrupted
        return real(ids, seq_len, batch_size, seed, step)

    monkeypatch.setattr(train_loop, "sample_batch", stop_at_13)
    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "run")
    monkeypatch.setattr(train_loop, "sample_batch", real)
    curves = keep_curves(monkeypatch)
    summary = train(cfg, tmp_path / "run")
    assert summary["resumed_at"] == [10]
    clock = clocks[-1]
    clock.curve = curves[-1]
    assert clock.start_s > 0
    check_speed(summary, clock, runs.read_metrics(tmp_path / "run"), 10, eval_seconds(clock, 1),
                eval_seconds(clock, 10 + WARMUP_STEPS_EXCLUDED))


def finished_records(run_dir) -> list:
    """The records of the run's offline W&B file once its `exit` record is there: W&B's
    service process writes the file after `finish()` returns (waits up to a minute)."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60.0
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after a minute"
        time.sleep(0.1)


def history_steps(run_dir) -> list[int]:
    """The `_step` of every history row of the run's offline W&B file that holds a train
    loss (one row per logged step; an eval at the same step joins its row)."""
    steps = []
    for record in finished_records(run_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                 for i in record.history.item}
        if "train_loss" in items:
            steps.append(items["_step"])
    return steps


def test_wandb_gets_every_step_once_logged_at_the_flushes(tiny_cfg, tmp_path, monkeypatch):
    cfg = tiny_cfg("logger.mode=offline", "train.batch_size=8", "train.tokens=10240",
                   "train.log_every=10", "train.eval_points=3")  # 40 steps
    calls = []
    real = train_loop.log_wandb_rows

    def log_wandb_rows(run, rows):
        calls.append([r["step"] for r in rows])
        real(run, rows)

    monkeypatch.setattr(train_loop, "log_wandb_rows", log_wandb_rows)
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 40
    assert [s for c in calls for s in c] == list(range(1, 41))
    assert len(calls) < 40 and max(len(c) for c in calls) == 10  # batched, not per step
    assert sorted(history_steps(tmp_path / "run")) == list(range(1, 41))
