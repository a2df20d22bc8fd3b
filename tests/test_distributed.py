"""Data-parallel training: 2 gloo processes under torchrun match one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from critbatch.results import runs
from critbatch.training.loop import train


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_with_the_same_global_batch(
    tiny_cfg, tiny_overrides, tmp_path
):
    """Same global batch of 16: one process (2 micro-batches of 8) vs 2 ranks x 8, the ranks
    started by docs/running.md's command (`torchrun --nproc_per_node=2 -m critbatch.train
    hydra.run.dir=...`), the micro-batch following from the world size.

    Both compute the mean gradient over the same 16 sequences; only the order of the
    floating-point sums differs (all-reduce vs accumulation), so per-step losses agree
    to ~1e-6 relative; 1e-4 leaves room for that drift to compound over 20 steps.
    """
    common = ["train.batch_size=16", "train.tokens=10240", "train.warmup_steps=2"]  # 20 steps
    single = train(tiny_cfg(*common, "train.micro_batch_size=8"), tmp_path / "single")

    run_dir = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2", "-m",
         "critbatch.train", f"hydra.run.dir={run_dir}", *tiny_overrides, *common],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = runs.read_summary(run_dir)
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert ddp["backend"] == "gloo" and single["backend"] is None
    assert ddp["micro_batch_size"] == 8  # one micro-batch of 8 on each rank
    assert "data-parallel: 2 ranks x 8 sequences, gloo backend" in (run_dir / "train.log"
                                                                    ).read_text()
    assert ddp["steps"] == single["steps"] == 20 and ddp["tokens"] == single["tokens"]
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-4)
    a, b = runs.read_metrics(tmp_path / "single"), runs.read_metrics(run_dir)
    assert len(a) == len(b) == 20
    for ra, rb in zip(a, b, strict=True):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-4)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-3)
    # rank 0 alone wrote: one metrics line per step, one summary, one .hydra
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [".hydra", ".lock", "checkpoint.pt", "config.json", "metrics.jsonl", "summary.json",
         "train.log"]
    )
    # each rank's local gradient is a small batch for B_noise (b = 8, B = 16)
    assert ddp["gns_steps"] > 0


@pytest.mark.slow
def test_torchrun_without_a_run_dir_is_refused(tiny_overrides, tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-m", "critbatch.train", *tiny_overrides],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("critbatch: error: under torchrun")


def test_a_constant_batch_takes_one_micro_batch_per_rank_at_least(tiny_cfg, monkeypatch):
    """Under torchrun (WORLD_SIZE) batch 16 on 2 ranks is two micro-batches of 8 whether
    train.micro_batches is 1 or 2; 4 micro-batches are 2 a rank. One process: unchanged."""
    from critbatch.training.config import micro_batch_size

    cfg = tiny_cfg("train.batch_size=16")
    assert micro_batch_size(cfg) == 16
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert micro_batch_size(cfg) == 8
    assert micro_batch_size(tiny_cfg("train.batch_size=16", "train.micro_batches=4")) == 4
    assert micro_batch_size(tiny_cfg("train.batch_size=15")) == 15  # the ranks' check says why
