"""End-to-end training: accumulation equivalence, run directory, determinism, the smoke CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from critbatch.results import runs
from critbatch.training.config import ModelConfig
from critbatch.training.data import val_windows
from critbatch.training.evaluation import eval_steps, evaluate, is_diverged
from critbatch.training.loop import train
from critbatch.training.model import GPT
from critbatch.training.token_cache import prepare_data


def metrics(run_dir: Path) -> list[dict]:
    return runs.read_metrics(run_dir)


def test_gradient_accumulation_is_exactly_a_larger_batch(tiny_cfg, tmp_path):
    common = ["train.batch_size=16", "train.tokens=5120", "train.warmup_steps=2"]  # 10 steps
    plain = train(tiny_cfg(*common, "train.micro_batch_size=16"), tmp_path / "plain")
    accum = train(tiny_cfg(*common, "train.micro_batch_size=4"), tmp_path / "accum")
    assert plain["steps"] == accum["steps"] == 10
    assert accum["micro_batch_size"] == 4
    a, b = metrics(tmp_path / "plain"), metrics(tmp_path / "accum")
    assert len(a) == len(b) == 10
    for ra, rb in zip(a, b, strict=True):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-5)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
    assert accum["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)


def test_run_directory_is_complete_and_self_describing(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.tokens=20480", "train.batch_size=8", "train.eval_points=4")
    summary = train(cfg, tmp_path / "run", overrides=["train.tokens=20480"])
    on_disk = runs.read_summary(tmp_path / "run")
    assert on_disk == json.loads(json.dumps(summary))
    assert set(runs.SUMMARY_KEYS) <= set(summary)
    assert summary["status"] == "completed"
    assert summary["steps"] == 80 and summary["tokens"] == 80 * 8 * 32
    assert summary["val_loss"] == pytest.approx(
        summary["val_loss_per_byte"] * summary["bytes_per_token"], rel=1e-12)
    curve = summary["curve"]
    assert [p["step"] for p in curve] == eval_steps(80, 4) and curve[-1]["step"] == 80
    assert curve[-1]["val_loss"] == summary["val_loss"]
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 81))
    assert set(rows[0]) == {"step", "tokens", "batch_size", "lr", "train_loss", "grad_norm",
                            "time_s"}
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["config"]["train"]["tokens"] == 20480
    assert saved["overrides"] == ["train.tokens=20480"]
    assert summary["git_revision"] and summary["critbatch_version"] == "0.1.0"
    assert len(summary["data_fingerprint"]) == 64


def test_a_run_that_logs_nowhere_never_imports_wandb(tiny_cfg, tmp_path, monkeypatch):
    """logger.mode=disabled trains without wandb: importing it and starting its disabled run
    cost about 1 s of CPU in every training process. Fails if the run imports wandb (made
    unimportable here)."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    summary = train(tiny_cfg("train.tokens=2048", "train.batch_size=8"), tmp_path / "run")
    assert summary["status"] == "completed" and summary["wandb_run_id"] is None


def test_checkpoint_reloads_to_the_same_val_loss(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.tokens=10240", "train.batch_size=8")
    summary = train(cfg, tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    model = GPT(ModelConfig(**ckpt["config"]["model"]), ckpt["config"]["data"]["vocab_size"])
    model.load_state_dict(ckpt["model"])
    tokens = prepare_data(cfg.data)
    windows = val_windows(tokens.val, cfg.model.seq_len, cfg.train.eval_tokens)
    loss = evaluate(model, windows, 8, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    assert loss == pytest.approx(summary["val_loss"], rel=1e-6)


def test_same_seed_same_run_and_other_seed_differs(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.tokens=5120", "train.batch_size=8")
    a = train(cfg, tmp_path / "a")
    b = train(cfg, tmp_path / "b")
    assert a["val_loss"] == b["val_loss"]
    assert [r["train_loss"] for r in metrics(tmp_path / "a")] == [
        r["train_loss"] for r in metrics(tmp_path / "b")]
    c = train(tiny_cfg("train.tokens=5120", "train.batch_size=8", "train.seed=1"), tmp_path / "c")
    assert c["val_loss"] != a["val_loss"]


@pytest.mark.parametrize("width", (128, 192, 256, 320, 384))
def test_every_width_builds_and_takes_a_step(tiny_cfg, tmp_path, width):
    cfg = tiny_cfg(f"model.width={width}", "model.heads=4", "model.depth=4",
                   "model.seq_len=64", "train.batch_size=4", "train.tokens=256",
                   "train.eval_tokens=256")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 1 and math.isfinite(summary["val_loss"])
    assert summary["width"] == width


@pytest.mark.slow
def test_muon_trains(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("optim=muon", "train.tokens=40960", "train.batch_size=8",
                             "train.micro_batch_size=4"), tmp_path / "run")
    assert summary["optimizer"] == "muon"
    assert summary["val_loss"] < summary["curve"][0]["val_loss"] - 0.5


def test_divergence_rule():
    assert is_diverged([5.0, float("nan")], 5.0, 2.0, 3) == "non-finite train loss"
    assert is_diverged([5.0, 11.0, 11.0], 5.0, 2.0, 3) is None  # first value is 5 -> 3 steps
    assert is_diverged([5.0, 11.0, 11.0, 12.0], 5.0, 2.0, 3) is not None
    assert is_diverged([5.0, 11.0, 4.0, 12.0], 5.0, 2.0, 3) is None


def test_huge_lr_is_reported_as_diverged(tiny_cfg, tmp_path):
    cfg = tiny_cfg("optim.lr=30", "train.grad_clip=0", "train.warmup_steps=0",
                   "train.diverge_window=5", "train.tokens=40960", "train.batch_size=8")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "diverged"
    assert summary["diverged_step"] < 160 and summary["status_reason"]
    assert math.isnan(summary["val_loss"])
    runs.read_summary(tmp_path / "run")  # still a valid results file


def test_eval_steps_are_log_spaced_and_end_at_the_last_step():
    assert eval_steps(1000, 4) == [1, 10, 100, 1000]
    assert eval_steps(5, 10) == [1, 2, 3, 4, 5]
    assert eval_steps(7, 1) == [7]


@pytest.mark.slow
def test_smoke_run_through_the_cli(tmp_path, cache_dir):
    """`python -m critbatch.train scale=smoke` on the embedded corpus, W&B offline."""
    run_dir = tmp_path / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "critbatch.train", "scale=smoke", f"data.cache_dir={cache_dir}",
         f"hydra.run.dir={run_dir}", "logger.mode=offline"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = runs.read_summary(run_dir)
    assert summary["status"] == "completed" and summary["data_name"] == "stdlib"
    assert summary["val_loss"] == pytest.approx(
        summary["val_loss_per_byte"] * summary["bytes_per_token"], rel=1e-12)
    first = summary["curve"][0]["val_loss"]
    assert summary["val_loss"] < first - 1.0, (first, summary["val_loss"])
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert (run_dir / ".hydra" / "overrides.yaml").exists()
    assert (run_dir / "checkpoint.pt").exists()
    assert "val_loss:" in proc.stdout + proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_scale_without_cuda_stops_unless_the_cpu_is_asked_for():
    from critbatch.results.errors import ConfigError
    from critbatch.training.cli import check_overrides
    from critbatch.training.step import resolve_device

    with pytest.raises(ConfigError, match="train.device=cpu"):
        resolve_device(check_overrides(["scale=gpu"]))
    device, _, _ = resolve_device(check_overrides(["scale=gpu", "train.device=cpu"]))
    assert device.type == "cpu"
