"""The benchmark's sections on what the device can give: its matmul peak in fp32 and bf16
(`peak`, time-boxed per dtype) and the aggregate tokens/s of several training jobs sharing it
(`share`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from critbatch.bench.timing import Options, bench_device, compose, matmul_ladder, presets, run_steps
from critbatch.orchestration.workers import worker_context
from critbatch.training.cli import check_overrides
from critbatch.training.loop import train
from critbatch.training.token_cache import prepare_data

# Seconds each dtype's matmul ladder may take. A CPU without bf16 matrix instructions runs bf16
# on torch's reference gemm at ~1.5 GFLOP/s (fp32 ~30-200): one n = 4096 product would then take
# 90 s, and the ladder stops growing n once the next size is predicted to pass this box.
PEAK_BOX_S = {"cpu": 4.0, "cuda": 10.0}


def bench_peak(opts: Options) -> dict:
    """The device's limit: the best of a few large square matmuls, fp32 and bf16, each dtype
    time-boxed (`matmul_ladder`): where a dtype is slow (bf16 on a CPU without bf16 matrix
    instructions) only the small sizes run, and the skipped ones are listed."""
    device = bench_device()
    sizes = (1024, 4096, 8192) if device.type == "cuda" else (256, 1024, 2048, 4096)
    iters = opts.repeats or (20 if device.type == "cuda" else 5)
    result = {}
    notes = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        by_size, skipped = matmul_ladder(device, dtype, sizes, iters, PEAK_BOX_S[device.type])
        result[f"{name}_gflops"] = max(by_size.values())
        result[f"{name}_by_size"] = by_size
        result[f"{name}_skipped_sizes"] = skipped
        if skipped:
            notes.append(f"{name} n = {', '.join(map(str, skipped))} skipped (predicted past the "
                         f"{PEAK_BOX_S[device.type]:.0f} s box at {result[f'{name}_gflops']:,.1f} "
                         f"GFLOP/s)")
    print(f"peak: matmul {result['float32_gflops']:,.0f} GFLOP/s fp32 (n = "
          f"{', '.join(result['float32_by_size'])}), {result['bfloat16_gflops']:,.1f} GFLOP/s bf16 "
          f"(n = {', '.join(result['bfloat16_by_size'])})"
          + "".join(f"; {note}" for note in notes), flush=True)
    return result


def _share_worker(overrides: list[str], threads: int | None, run_dir: str, barrier,
                  queue) -> None:
    """One of several concurrent training jobs: set up, wait for the others, train."""
    if threads:
        torch.set_num_threads(threads)
    cfg = check_overrides(overrides)
    prepare_data(cfg.data)
    barrier.wait()
    queue.put(train(cfg, Path(run_dir))["tokens_per_s"])


def bench_share(opts: Options) -> dict:
    """Aggregate tokens/s of k training jobs (the real trainer, main preset) run at once.

    On CUDA, 1, 2 and 4 jobs share the card. On CPU, k = 1 and k = the core count, with the
    torch threads split among the jobs (threads / k each) and, for comparison, not split
    (every job with all the threads, what happens when nothing sets them). Each job is a
    fresh process that sets up, waits at a barrier for the others, then trains;
    speedup = aggregate tokens/s / the single job's.
    """
    device = bench_device()
    name, preset = next(iter(presets(device.type).items())) if device.type == "cuda" else (
        "cpu", presets("cpu")["cpu"])
    cfg = compose(preset, opts)
    b, seq = cfg.train.batch_size, cfg.model.seq_len
    steps = opts.steps or 3 * run_steps(cfg, opts.results.get("peak"))
    overrides = [*preset, "logger.mode=disabled", *opts.overrides,
                 f"train.tokens={steps * b * seq}", "train.eval_points=1",
                 f"train.eval_tokens={seq}", "train.warmup_steps=2"]
    threads = torch.get_num_threads()
    if device.type == "cuda":
        layouts = [(k, None) for k in (1, 2, 4)]
    else:
        cores = max(2, os.cpu_count() or 1)
        layouts = [(1, threads), (cores, max(1, threads // cores)), (cores, threads)]
    # forked from the sweeps' fork server (torch imported once there), as the sweeps' own
    # workers are: a spawned job imported torch anew, ~2.5 s of a core apiece
    ctx = worker_context()
    out = {"preset": name, "steps": steps, "layouts": []}
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        for i, (jobs, job_threads) in enumerate(layouts):
            barrier, queue = ctx.Barrier(jobs), ctx.Queue()
            procs = [ctx.Process(target=_share_worker, args=(
                overrides, job_threads, f"{tmp}/{i}-{j}", barrier, queue)) for j in range(jobs)]
            for proc in procs:
                proc.start()
            rates = [queue.get(timeout=600) for _ in procs]
            for proc in procs:
                proc.join()
            out["layouts"].append({"jobs": jobs, "threads_per_job": job_threads,
                                   "tokens_per_s": rates, "aggregate_tokens_per_s": sum(rates)})
    single = out["layouts"][0]["aggregate_tokens_per_s"]
    for layout in out["layouts"]:
        layout["speedup"] = layout["aggregate_tokens_per_s"] / single
        print(f"share {name}: {layout['jobs']} job(s) x "
              f"{layout['threads_per_job'] or 'default'} threads: "
              f"{layout['aggregate_tokens_per_s']:,.0f} tokens/s in all "
              f"({layout['speedup']:.2f}x one job)", flush=True)
    return out
