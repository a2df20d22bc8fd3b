"""Every GPU, several runs each: JOBS=auto on CUDA puts k workers on each visible GPU, each
pinned by CUDA_VISIBLE_DEVICES before CUDA starts in it. Tested with a faked device list: the
workers train on the CPU, and report the GPU they were pinned to."""

from __future__ import annotations

import pytest

from critbatch.orchestration import workers
from critbatch.training.cli import check_overrides


def test_slots_put_k_workers_on_each_gpu():
    assert workers.gpu_slots(["0", "1"], 4) == ["0", "1", "0", "1"]
    assert workers.gpu_slots(["7"], 3) == ["7", "7", "7"]
    assert [workers.runs_per_gpu(w) for w in (128, 192, 256, 320, 384)] == [4, 4, 2, 2, 1]


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert workers.visible_gpus() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert workers.visible_gpus() == []


@pytest.mark.slow
def test_each_worker_is_pinned_to_its_own_gpu(tiny_overrides, tmp_path):
    jobs = []
    for i in range(4):
        cfg = check_overrides([*tiny_overrides, "train.device=cpu", "train.tokens=4096",
                               "train.batch_size=8", "train.eval_points=1",
                               "train.eval_tokens=64", f"train.seed={i}"])
        jobs.append((cfg, tmp_path / f"run{i}", [f"train.seed={i}"]))
    outcomes = workers.run_jobs(jobs, 2, 1, {}, gpus=["3", "5"])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(o.gpu in ("3", "5") for o in outcomes)  # every run on a pinned worker


def test_the_initializer_takes_one_gpu_from_the_queue(monkeypatch):
    import queue

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    slots = queue.Queue()
    for gpu in workers.gpu_slots(["2", "3"], 2):
        slots.put(gpu)
    workers.init_worker(None, slots)
    assert workers.visible_gpus() == ["2"]
    workers.init_worker(None, slots)
    assert workers.visible_gpus() == ["3"]


@pytest.mark.slow
def test_the_cuda_decisions_run_on_the_cpu(monkeypatch):
    """What a GPU machine decides, checked here with CUDA's presence faked (nothing touches a
    device): auto picks cuda, bfloat16 autocast and torch.compile; an explicit dtype or compile
    setting wins; a bad compile backend is one line; JOBS=auto packs each visible GPU by the
    widest model (gpu scale: width 256, two a GPU)."""
    import torch

    from critbatch.orchestration.pool import gpu_jobs
    from critbatch.orchestration.stages import plan_stage
    from critbatch.results.errors import ConfigError
    from critbatch.training.step import autocast_for, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device, dtype, compiled = resolve_device(check_overrides(["scale=gpu"]))
    assert (device.type, dtype, compiled) == ("cuda", torch.bfloat16, True)
    assert resolve_device(check_overrides(["scale=gpu", "train.dtype=float32",
                                           "train.compile=false"]))[1:] == (torch.float32, False)
    assert isinstance(autocast_for(torch.device("cpu"), dtype), torch.autocast)  # bf16: on
    with pytest.raises(ConfigError, match="compile_backend=nope is not one of"):
        resolve_device(check_overrides(["scale=gpu", "train.compile_backend=nope"]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    plan = plan_stage("batch", "gpu", "adamw", [])
    assert max(j.cfg.model.width for j in plan) == 256
    assert gpu_jobs(plan) == 2 * workers.runs_per_gpu(256) == 4
