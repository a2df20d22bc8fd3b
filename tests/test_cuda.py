"""What only a GPU can show: a run compiled (inductor) in bf16 with each optimizer, fused AdamW
resumed from a CUDA checkpoint, the noise program on a CUDA checkpoint, and two runs sharing
one GPU. Skipped without CUDA; each test trains tiny models (width 32, a few hundred steps at
most) and should take well under 30 s on a GPU.

On CUDA `train.device=auto` gives bf16 autocast and torch.compile, so these tests leave them
at auto: they train what a gpu-scale run trains, on the tiny model of the CPU tests.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from test_branches import Interrupted, interrupt_at

from critbatch.orchestration import workers
from critbatch.results import runs
from critbatch.training.cli import check_overrides
from critbatch.training.loop import train
from critbatch.training.noise_program import measure_run
from critbatch.training.step import resolve_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_a_run_trains_compiled_in_bf16_on_cuda(tiny_cfg, tmp_path, dynamo_warnings, optim):
    cfg = tiny_cfg(f"optim={optim}", "train.batch_size=8", "train.tokens=8192",
                   "train.warmup_steps=4")
    device, dtype, compiled = resolve_device(cfg)
    assert (device.type, dtype, compiled) == ("cuda", torch.bfloat16, True)
    summary = train(cfg, tmp_path / optim)
    assert summary["status"] == "completed", summary.get("status_reason")
    assert summary["device"].startswith("cuda") and summary["dtype"] == "bfloat16"
    assert summary["compile"] is True
    assert summary["val_loss"] < math.log(512) - 0.3  # below the uniform guess: it learnt
    assert not [m for m in dynamo_warnings if "recompile_limit" in m or "cache_size" in m]


def test_fused_adamw_resumes_a_cuda_checkpoint_within_run_to_run_noise(tiny_cfg, tmp_path,
                                                                       monkeypatch):
    """As tests/test_reliability.py on the CPU, stopped in step 24 and resumed from step 21;
    on CUDA the result matches to 1e-3 relative (checkpoint.py: kernels and bf16 may differ
    after a restart), not bitwise."""
    cfg = tiny_cfg("optim=adamw", "train.batch_size=8", "train.micro_batch_size=4",
                   "train.tokens=10240", "train.warmup_steps=5",
                   "train.checkpoint_every_steps=7", "train.eval_points=5")
    reference = train(cfg, tmp_path / "reference")
    interrupt_at(monkeypatch, 23)
    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "resumed")
    ckpt = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 21 and "cuda" in ckpt["rng"]
    (adamw,) = ckpt["optimizers"]
    assert all(group["fused"] for group in adamw["param_groups"])  # the fused CUDA kernel
    monkeypatch.undo()
    summary = train(cfg, tmp_path / "resumed")
    assert summary["resumed_at"] == [21] and summary["status"] == "completed"
    assert summary["steps"] == reference["steps"]
    assert summary["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-3)
    assert summary["b_noise"] is not None


def test_the_noise_program_measures_a_cuda_checkpoint_on_cuda_as_on_the_cpu(tiny_cfg, tmp_path):
    """The same checkpoint, the same windows: bf16 autocast on CUDA against float32 on the
    CPU agree on the loss to 2% and on tr(Sigma) to 10%."""
    run_dir = tmp_path / "run"
    train(tiny_cfg("train.batch_size=16", "train.micro_batch_size=4", "train.tokens=20480"),
          run_dir)
    on_gpu = measure_run(run_dir, micro_batches=32, micro_batch_size=4, device_name="cuda")
    on_cpu = measure_run(run_dir, micro_batches=32, micro_batch_size=4, device_name="cpu")
    assert on_gpu["step"] == on_cpu["step"] == 40
    assert on_gpu["val_loss"] == pytest.approx(on_cpu["val_loss"], rel=2e-2)
    assert on_gpu["trace"] == pytest.approx(on_cpu["trace"], rel=0.1)
    assert runs.read_noise(run_dir)["val_loss"] == on_cpu["val_loss"]  # the last one written


def _log_span(run_dir: Path) -> tuple[datetime, datetime]:
    """First and last timestamp of a run's train.log (`[2026-12-01 18:29:44,113][INFO] ...`)."""
    stamps = [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
              for line in (run_dir / "train.log").read_text().splitlines()
              if line.startswith("[20")]
    return stamps[0], stamps[-1]


def test_two_runs_share_one_gpu_side_by_side(tiny_overrides, tmp_path):
    """JOBS=2 on one GPU: two workers pinned to the same device train at the same time."""
    gpu = workers.visible_gpus()[0]
    jobs = [(check_overrides([*tiny_overrides, "train.batch_size=8", "train.tokens=16384",
                              f"train.seed={seed}"]), tmp_path / f"seed{seed}",
             [f"train.seed={seed}"]) for seed in (0, 1)]
    start = time.perf_counter()
    outcomes = workers.run_jobs(jobs, 2, None, {}, gpus=[gpu])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert [o.gpu for o in outcomes] == [gpu, gpu]
    for _, run_dir, _ in jobs:
        summary = runs.read_summary(run_dir)
        assert summary["device"].startswith("cuda") and summary["status"] == "completed"
    (a0, a1), (b0, b1) = (_log_span(run_dir) for _, run_dir, _ in jobs)
    assert max(a0, b0) < min(a1, b1), "the two runs did not overlap"
    assert time.perf_counter() - start < 120
