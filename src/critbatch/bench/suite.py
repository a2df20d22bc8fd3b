"""Throughput benchmarks: `python -m critbatch.bench [--only SECTION ...] [hydra overrides]`.

Measures, on the current device, how fast critbatch trains and how close that is to the
device's limit; prints a table and writes every figure to bench.json (`--json`). Each
section is a function `(Options) -> dict` registered in `SECTIONS`, run in this order:

- `peak`: the physical limit, a large matmul in fp32 and bf16 (GFLOP/s);
- `train`: per width preset (the scale's, and on CPU the smoke and cpu presets plus
  width 256) the real trainer's tokens/s against a minimal eager loop written here,
  interleaved in one process; the step split into data, forward+backward, optimizer,
  noise tracking and logging; model FLOPs utilisation (6N + attention FLOPs per token
  over the measured peak);
- `variants`: step times of eager vs torch.compile, fp32 vs bf16 autocast, foreach vs
  fused AdamW, AdamW vs Muon, and torch threads, each pair interleaved step by step;
- `data`: the data path alone (batches/s) against the training step it feeds;
- `analysis`: loading and analysing ~1,000 synthetic runs (bcrit.benchmark), and
  `fit_bcrit.py --table` and `recommend.py --table` each on a generated 2,000-row table;
- `share`: several training jobs at once (1, 2, 4 on a GPU; on CPU one per core with the
  threads split, and unsplit): aggregate tokens/s;
- `gns`: the cost of online gradient-noise-scale tracking (train.gns) in tokens/s.

Every timing is a median over short, warmed-up, interleaved repeats: the machine may be
shared, and interleaving lets load from other processes hit both sides of a comparison.
The speed targets (trainer overhead <= 5%, data path >= 20x the step, noise tracking < 3%,
analysis < 10 s, each table command on 2,000 rows < 30 s, MFU, sharing a GPU >= 2x) are
printed at the end as met / not met with the measured figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import torch

from critbatch.analysis.bcrit.report import run_analysis
from critbatch.analysis.bcrit.synthetic import benchmark, synthetic_table
from critbatch.analysis.recommend.report import run as recommend_run
from critbatch.bench.table import table, targets
from critbatch.results import files, runs
from critbatch.results.errors import fail, user_errors
from critbatch.science.model_size import flops_per_token, param_count
from critbatch.training.cli import check_overrides
from critbatch.training.data import sample_batch
from critbatch.training.gns import MicroGradNorms
from critbatch.training.loop import train
from critbatch.training.memory import reuse_freed_memory
from critbatch.training.metrics import WARMUP_STEPS_EXCLUDED, StepRecord, metrics_rows
from critbatch.training.model import GPT
from critbatch.training.optim import adamw_options, lr_factor
from critbatch.training.step import (
    Stepper,
    StepResult,
    autocast_for,
    build_stepper,
    resolve_device,
    train_step,
)
from critbatch.training.token_cache import prepare_data

# The cpu preset's reference shape (width 128, depth 4, seq_len 128, batch 32), pinned so the
# number stays comparable when the preset changes, as 4 micro-batches of 8.
GNS_SHAPE = (
    "scale=cpu", "model.width=128", "model.depth=4", "model.heads=4", "model.seq_len=128",
    "train.batch_size=32", "train.micro_batch_size=8",
)
WARMUP_STEPS = 3  # steps left out of the rate (first-call allocations, caches)


def step_seconds(run_dir: Path, skip: int = WARMUP_STEPS) -> list[float]:
    """Wall seconds of each optimizer step after the first `skip`, from metrics.jsonl's clock."""
    times = [row["time_s"] for row in runs.read_metrics(run_dir)]
    return [b - a for a, b in zip(times[skip - 1 : -1], times[skip:], strict=True)]


def gns_step_cost(cfg, iters: int = 40) -> dict:
    """Median seconds of the accumulation part of the trainer's step (all micro-batches'
    fwd + bwd) with and without `MicroGradNorms`, alternating every iteration.

    A second view of the same cost, interleaved step by step so that load from other
    processes hits both sides alike; conservative, since the optimizer step and clipping
    (equal on both sides) are left out of the denominator.
    """
    device, dtype, compiled = resolve_device(cfg)
    stepper = build_stepper(cfg, device, dtype, compiled)
    batch = random_batch(cfg, device)
    for track in (True, False):  # warm-up
        timed_step(stepper, batch, track_noise=track)
    times = {True: [], False: []}
    for it in range(iters):
        for track in ((True, False) if it % 2 == 0 else (False, True)):
            times[track].append(timed_step(stepper, batch, track_noise=track)[0])
    on, off = (statistics.median(times[k]) for k in (True, False))
    return {"accum_ms_on": 1e3 * on, "accum_ms_off": 1e3 * off,
            "accum_overhead_percent": 100 * (on / off - 1)}


def bench_gns(overrides: list[str], repeats: int = 6, steps: int = 12) -> dict:
    """tokens/s with train.gns.enabled true vs false, interleaved in one process.

    Each repeat trains both variants from the same seed (same batches, same arithmetic apart
    from the tracking), alternating which goes first so drifts in machine load cancel; many
    short runs interleave finer than a few long ones. tokens/s = tokens per step / median
    step time over all repeats (a median shrugs off steps slowed by other processes); the
    cost is 1 - (tokens/s on) / (tokens/s off). Also reported: the per-micro-batch cost of
    the measurement alone (`gns_step_cost`).
    """
    base = [*GNS_SHAPE, f"train.tokens={steps * 32 * 128}", "train.eval_points=1",
            "train.eval_tokens=1024", "train.warmup_steps=2", "logger.mode=disabled", *overrides]
    seconds: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        for r in range(repeats):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                cfg = check_overrides([*base, f"train.gns.enabled={str(enabled).lower()}"])
                run_dir = Path(tmp) / f"{r}-{enabled}"
                summary = train(cfg, run_dir)
                assert (summary["b_noise"] is not None or summary["gns_ema"] is None)
                seconds[enabled].append(step_seconds(run_dir))
    tokens_per_step = 32 * 128
    on, off = (tokens_per_step / statistics.median(sum(seconds[k], [])) for k in (True, False))
    per_repeat = [statistics.median(b) / statistics.median(a)
                  for a, b in zip(seconds[True], seconds[False], strict=True)]
    component = gns_step_cost(check_overrides(base))
    result = {
        "tokens_per_s_on": on,
        "tokens_per_s_off": off,
        "ratio": on / off,
        "overhead_percent": 100 * (1 - on / off),
        "ratios": per_repeat,
        "repeats": repeats,
        "steps": steps,
        "overrides": [*GNS_SHAPE, *overrides],
        **component,
    }
    print(f"gns: {result['tokens_per_s_on']:,.0f} tokens/s tracking vs "
          f"{result['tokens_per_s_off']:,.0f} without; ratio {result['ratio']:.4f} "
          f"(per repeat {', '.join(f'{x:.3f}' for x in per_repeat)}) -> overhead "
          f"{result['overhead_percent']:.2f}% (goal < 3%); accumulation alone, step by step: "
          f"{component['accum_ms_on']:.1f} vs {component['accum_ms_off']:.1f} ms = "
          f"{component['accum_overhead_percent']:+.2f}%", flush=True)
    return result


# ---------------------------------------------------------------------------
# Helpers shared by the sections below


@dataclass
class Options:
    """What every section is run with (from the command line)."""

    overrides: list[str] = field(default_factory=list)  # hydra overrides, after each preset's
    repeats: int | None = None  # interleaved repeats; None = each section's default
    steps: int | None = None  # optimizer steps per timed run; None = each section's default
    compile: bool = True  # include the torch.compile variant (the slow one to set up)
    analysis_runs: int = 1000  # synthetic runs for the analysis section
    analysis_rows: int = 2000  # rows of the generated results table for the analysis section
    results: dict = field(default_factory=dict)  # sections already measured (peak, train)
    probe: dict = field(default_factory=dict)  # matmul GFLOP/s per dtype when peak did not run


def presets(device_type: str) -> dict[str, list[str]]:
    """The width presets measured on this device: name -> overrides."""
    if device_type == "cuda":  # the gpu scale and the widest model of the targets, offline data
        return {"gpu": ["scale=gpu", "data=stdlib"],
                "gpu-w384": ["scale=gpu", "data=stdlib", "model.width=384", "model.heads=6"]}
    return {"smoke": ["scale=smoke"], "cpu": ["scale=cpu"],
            "cpu-w256": ["scale=cpu", "model.width=256", "model.heads=4"]}


def bench_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name(device: torch.device) -> str:
    """The processor's model name (what `lscpu` shows), or the GPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compose(preset: list[str], opts: Options, *extra: str):
    """A validated Config: the preset, the command line's overrides, then `extra`."""
    return check_overrides([*preset, "logger.mode=disabled", *opts.overrides, *extra])


def random_batch(cfg, device: torch.device) -> torch.Tensor:
    """(batch_size, seq_len + 1) random token ids on `device`."""
    return torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, cfg.model.seq_len + 1),
                         device=device)


def timed_step(stepper: Stepper, batch: torch.Tensor, lr_factor: float = 1.0,
               track_noise: bool = False) -> tuple[float, float, StepResult]:
    """One `train_step`, the trainer's: seconds of (forward+backward, lr+clipping+optimizer)
    and its result. `track_noise` hooks `MicroGradNorms` on for this step only."""
    device = batch.device
    if track_noise:
        stepper.micro_norms = MicroGradNorms(stepper.model.parameters(), 1)
    clock: list[float] = []

    def mark() -> None:
        sync(device)
        clock.append(time.perf_counter())

    mark()
    try:
        result = train_step(stepper, batch, lr_factor, mark)
    finally:
        if track_noise:
            stepper.micro_norms.remove()
            stepper.micro_norms = None
    mark()
    return clock[1] - clock[0], clock[2] - clock[1], result


def step_timer(cfg, device: torch.device, *, dtype=torch.float32, compiled=False,
               optim=None, track_micro_norms: bool = False) -> Callable[[], tuple[float, float]]:
    """A function timing one trainer step (fwd+bwd s, optimizer s) of a fresh model of `cfg`
    on one random batch, each call another step (with the online B_noise's per-micro-batch
    gradient norms when `track_micro_norms`)."""
    stepper = build_stepper(cfg, device, dtype, compiled, optim=optim,
                            track_micro_norms=track_micro_norms)
    batch = random_batch(cfg, device)
    return lambda: timed_step(stepper, batch)[:2]


def interleaved(steppers: dict[str, Callable[[], tuple[float, float]]], iters: int,
                warmup: int = 2, box_s: float | None = None) -> dict[str, dict]:
    """Median step times of several setups, stepped in turn (order reversed every iteration).
    With `box_s`, the timed iterations shrink (to 2 at least) so that they fit in the seconds
    the warm-up steps predict."""
    names = list(steppers)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    it = 0
    while it < warmup + iters:
        clock = time.perf_counter()
        for name in (names if it % 2 == 0 else names[::-1]):
            timing = steppers[name]()
            if it >= warmup:
                times[name].append(timing)
        if box_s is not None and it == warmup - 1:  # the last warm-up: steps are warm now
            iters = max(2, min(iters, int(box_s / (time.perf_counter() - clock))))
        it += 1
    return {name: {"fwd_bwd_ms": 1e3 * statistics.median(t[0] for t in ts),
                   "optim_ms": 1e3 * statistics.median(t[1] for t in ts),
                   "step_ms": 1e3 * statistics.median(a + b for a, b in ts)}
            for name, ts in times.items()}


def mfu(tokens_per_s: float, cfg, peak_gflops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the measured peak."""
    m = cfg.model
    return tokens_per_s * flops_per_token(m.width, m.depth, m.seq_len, cfg.data.vocab_size) / (
        peak_gflops * 1e9)


# ---------------------------------------------------------------------------
# peak


def matmul_gflops(device: torch.device, dtype: torch.dtype, n: int, iters: int) -> float:
    """GFLOP/s of an (n x n) @ (n x n) matmul: 2 n^3 FLOPs over the median time."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.matmul(a, b, out=out)
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b, out=out)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


# Seconds each dtype's matmul ladder may take. A CPU without bf16 matrix instructions runs bf16
# on torch's reference gemm at ~1.5 GFLOP/s (fp32 ~30-200): one n = 4096 product would then take
# 90 s, and the ladder stops growing n once the next size is predicted to pass this box.
PEAK_BOX_S = {"cpu": 4.0, "cuda": 10.0}


def matmul_ladder(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...], iters: int,
                  box_s: float) -> tuple[dict[str, float], list[int]]:
    """GFLOP/s of square matmuls at growing n, the first a cheap probe: a size is measured only
    while (iters + 2 warmup) products at the best rate so far fit in what is left of `box_s`.
    Returns ({n: GFLOP/s} measured, the sizes skipped)."""
    by_size: dict[str, float] = {}
    skipped: list[int] = []
    spent = 0.0
    for n in sizes:
        best = max(by_size.values(), default=None)
        if best is not None and (iters + 2) * 2 * n**3 / (best * 1e9) > box_s - spent:
            skipped.append(n)
            continue
        clock = time.perf_counter()
        by_size[str(n)] = matmul_gflops(device, dtype, n, iters)
        spent += time.perf_counter() - clock
    return by_size, skipped


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


def dtype_gflops(opts: Options, device: torch.device) -> dict[str, float]:
    """Matmul GFLOP/s per dtype name: the peak section's, else a probe at n = 256 (cached)."""
    peak = opts.results.get("peak") or opts.probe
    if not peak:
        peak = opts.probe = {f"{str(d).removeprefix('torch.')}_gflops": matmul_gflops(
            device, d, 256, 3) for d in (torch.float32, torch.bfloat16)}
    return {k.removesuffix("_gflops"): v for k, v in peak.items() if k.endswith("_gflops")}


# ---------------------------------------------------------------------------
# train: the real trainer against a minimal loop, the step split, MFU


def minimal_loop(cfg, data, steps: int) -> float:
    """tokens/s of a minimal eager training loop: the same model, batches, clipping and
    AdamW as the trainer, in plain PyTorch -- no schedule, logging, noise tracking or eval.
    Like the trainer's `tokens_per_s`, it leaves out the first WARMUP_STEPS_EXCLUDED steps
    (compilation, first allocations)."""
    device, dtype, compiled = resolve_device(cfg)
    m, t, o = cfg.model, cfg.train, cfg.optim
    torch.manual_seed(t.seed)
    model = GPT(m, cfg.data.vocab_size).to(device)
    step_model = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay,
                            **adamw_options(o, device.type))
    autocast = autocast_for(device, dtype)
    skip = WARMUP_STEPS_EXCLUDED if steps > WARMUP_STEPS_EXCLUDED else 0
    sync(device)
    t0 = time.perf_counter()
    for step in range(steps):
        if step == skip and skip:
            sync(device)
            t0 = time.perf_counter()
        batch = sample_batch(data.train, m.seq_len, t.batch_size, t.seed, step)  # (B, T+1)
        batch = batch.to(device, non_blocking=True)
        with autocast:
            loss = step_model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)
    return (steps - skip) * t.batch_size * m.seq_len / (time.perf_counter() - t0)


def step_split(cfg, data, iters: int, warmup: int = 2) -> dict:
    """Milliseconds per step of each part of the trainer's step, timed one by one.

    data: sample_batch + copy to the device; fwd_bwd: all micro-batches; noise: what the
    MicroGradNorms hooks add to fwd_bwd (hooked and plain steps alternate; counted in the
    step only where the trainer enables it: >= 2 micro-batches); optimizer: lr, clipping,
    step, zero_grad; logging: the trainer's buffered metrics flush (one host sync and a
    jsonl append every `train.log_every` steps), averaged per step.
    """
    device, dtype, compiled = resolve_device(cfg)
    t, seq_len = cfg.train, cfg.model.seq_len
    stepper = build_stepper(cfg, device, dtype, compiled)
    steps = warmup + 2 * iters
    parts: dict[str, list[float]] = {k: [] for k in ("data", "fwd_bwd", "noise_on", "optimizer")}
    logging_s, pending = 0.0, []
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        for step in range(steps):
            clock = time.perf_counter()
            batch = sample_batch(data.train, seq_len, t.batch_size, t.seed, step)
            batch = batch.to(device, non_blocking=True)
            sync(device)
            t_data = time.perf_counter() - clock
            tracked = step % 2 == 1
            t_fwd_bwd, t_optim, result = timed_step(stepper, batch, lr_factor(step, steps, t),
                                                    track_noise=tracked)
            clock = time.perf_counter()
            pending.append(StepRecord(step + 1, (step + 1) * t.batch_size * seq_len,
                                      t.batch_size, 1.0, 0.0, result))
            if (step + 1) % t.log_every == 0:
                files.append_jsonl(metrics, metrics_rows(pending, None, False))
                pending.clear()
            t_log = time.perf_counter() - clock
            if step < warmup:
                continue
            logging_s += t_log
            parts["data"].append(t_data)
            parts["optimizer"].append(t_optim)
            parts["noise_on" if tracked else "fwd_bwd"].append(t_fwd_bwd)
    ms = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
    gns_on = t.gns.enabled and t.batch_size // stepper.micro >= 2
    split = {"data_ms": ms["data"], "fwd_bwd_ms": ms["fwd_bwd"],
             "noise_ms": ms["noise_on"] - ms["fwd_bwd"], "noise_counted": gns_on,
             "optimizer_ms": ms["optimizer"], "logging_ms": 1e3 * logging_s / (2 * iters)}
    split["total_ms"] = (split["data_ms"] + split["fwd_bwd_ms"] + split["optimizer_ms"]
                         + split["logging_ms"] + (split["noise_ms"] if gns_on else 0.0))
    return split


def bench_train(opts: Options) -> dict:
    """Per preset: the trainer's tokens/s next to the minimal loop's, the split, the MFU.

    Each repeat runs `train()` (W&B logging on, offline, as in a sweep; one tiny eval, which
    tokens_per_s leaves out with the warm-up steps) and the minimal loop for the same number
    of steps from the same seed, alternating which goes first.
    overhead = 1 - median(trainer tokens/s) / median(minimal tokens/s).
    """
    repeats = opts.repeats or 3
    rows = {}
    peak = opts.results.get("peak")
    for name, preset in presets(bench_device().type).items():
        cfg = compose(preset, opts)
        b, seq = cfg.train.batch_size, cfg.model.seq_len
        steps = opts.steps or run_steps(cfg, peak)
        cfg = compose(preset, opts, f"train.tokens={steps * b * seq}", "train.eval_points=1",
                      "logger.mode=offline",
                      f"train.eval_tokens={seq}", "train.warmup_steps=2")
        data = prepare_data(cfg.data)
        if resolve_device(cfg)[2]:  # compiled: fill the compile caches before timing
            minimal_loop(cfg, data, 2)
        trainer, minimal = [], []
        with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
            for r in range(repeats):
                for which in (("trainer", "minimal") if r % 2 == 0 else ("minimal", "trainer")):
                    if which == "trainer":
                        summary = train(cfg, Path(tmp) / f"{name}-{r}")
                        trainer.append(summary["tokens_per_s"])
                    else:
                        minimal.append(minimal_loop(cfg, data, steps))
        split = step_split(cfg, data, iters=max(4, steps // 2))
        device, dtype, compiled = resolve_device(cfg)
        row = {
            "overrides": preset, "width": cfg.model.width, "depth": cfg.model.depth,
            "heads": cfg.model.heads, "seq_len": seq, "batch_size": b,
            "micro_batch_size": cfg.train.micro_batch_size or b, "vocab_size": cfg.data.vocab_size,
            "params": param_count(cfg.model.width, cfg.model.depth, seq, cfg.data.vocab_size)[0],
            "dtype": str(dtype).removeprefix("torch."), "compile": compiled, "steps": steps,
            "repeats": repeats,
            "tokens_per_s": statistics.median(trainer),
            "minimal_tokens_per_s": statistics.median(minimal),
            "trainer_tokens_per_s_runs": trainer, "minimal_tokens_per_s_runs": minimal,
            **split,
        }
        row["overhead_percent"] = 100 * (1 - row["tokens_per_s"] / row["minimal_tokens_per_s"])
        row["step_ms"] = 1e3 * b * seq / row["tokens_per_s"]
        if peak:
            key = "float32_gflops" if dtype == torch.float32 else "bfloat16_gflops"
            row["peak_gflops"] = peak[key]
            row["mfu"] = mfu(row["tokens_per_s"], cfg, peak[key])
            row["minimal_mfu"] = mfu(row["minimal_tokens_per_s"], cfg, peak[key])
        rows[name] = row
        print(f"train {name}: width {row['width']}, {row['tokens_per_s']:,.0f} tokens/s trainer vs "
              f"{row['minimal_tokens_per_s']:,.0f} minimal loop (overhead "
              f"{row['overhead_percent']:+.1f}%); step {row['step_ms']:.1f} ms = data "
              f"{row['data_ms']:.2f} + fwd/bwd {row['fwd_bwd_ms']:.1f} + optimizer "
              f"{row['optimizer_ms']:.2f} + noise {row['noise_ms']:.2f}"
              f"{'' if row['noise_counted'] else ' (off)'} + logging {row['logging_ms']:.3f}"
              + (f"; MFU {100 * row['mfu']:.1f}%" if peak else ""), flush=True)
    return {"presets": rows}


def run_steps(cfg, peak: dict | None, seconds: float = 1.0) -> int:
    """Steps for a timed run of about `seconds` (12 to 60), guessing 25% of the fp32 peak."""
    m = cfg.model
    flops = flops_per_token(m.width, m.depth, m.seq_len, cfg.data.vocab_size)
    flops *= cfg.train.batch_size * m.seq_len  # per step
    guess_s = flops / (0.25 * 1e9 * (peak or {}).get("float32_gflops", 100.0))
    return max(12, min(60, round(seconds / guess_s)))


# ---------------------------------------------------------------------------
# variants: one setting changed at a time, stepped in turn


def variant_pairs(cfg, device: torch.device, compiled_too: bool) -> dict[str, dict]:
    """name -> {label: step function} for each A/B comparison, on the device's defaults."""
    _, dtype, _ = resolve_device(cfg)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32

    def plain(**kw):
        return step_timer(cfg, device, **{"dtype": dtype, **kw})

    pairs = {
        "dtype": {str(dtype).removeprefix("torch."): plain(),
                  str(other).removeprefix("torch."): plain(dtype=other)},
        "adamw": {"foreach": plain(optim=replace(cfg.optim, name="adamw", fused=False)),
                  "fused": plain(optim=replace(cfg.optim, name="adamw", fused=True))},
        "optimizer": {"adamw": plain(optim=replace(cfg.optim, name="adamw")),
                      "muon": plain(optim=replace(cfg.optim, name="muon"))},
    }
    if compiled_too:
        pairs["compile"] = {"eager": plain(), "compile": plain(compiled=True)}
    if device.type == "cpu" and torch.get_num_threads() > 1:
        step, threads = plain(), torch.get_num_threads()

        def with_threads(n):
            def run():
                torch.set_num_threads(n)
                try:
                    return step()
                finally:
                    torch.set_num_threads(threads)
            return run

        pairs["threads"] = {f"{threads} threads": with_threads(threads),
                            "1 thread": with_threads(1)}
    return pairs


VARIANT_BOX_S = 30.0  # seconds one variant pair may take, warm-up aside (compile's aside too)


def bench_variants(opts: Options) -> dict:
    """Step times (medians, interleaved step by step) of each variant pair, per shape.

    The scale's main preset gets every pair, torch.compile included (its first step, the
    compilation, is warm-up); the widest preset every pair but compile. ratio = B / A of
    the step time (optimizer time for the AdamW and optimizer pairs), < 1 when B is faster.
    """
    device = bench_device()
    names = list(presets(device.type))
    shapes = names[-2:] if device.type == "cpu" else names  # cpu and cpu-w256 / gpu, gpu-w384
    iters = opts.steps or 8
    rates = dtype_gflops(opts, device)
    out = {}
    for i, name in enumerate(shapes):
        cfg = compose(presets(device.type)[name], opts)
        m = cfg.model
        step_gflop = flops_per_token(m.width, m.depth, m.seq_len, cfg.data.vocab_size) * (
            cfg.train.batch_size * m.seq_len) / 1e9
        default = str(resolve_device(cfg)[1]).removeprefix("torch.")
        out[name] = {}
        for pair, steppers in variant_pairs(cfg, device, opts.compile and i == 0).items():
            # at the matmul peak, a floor: 2 warm-up and 2 timed rounds of every setup
            floor_s = 4 * sum(step_gflop / rates.get(label, rates[default]) for label in steppers)
            if floor_s > VARIANT_BOX_S:
                slowest = min(steppers, key=lambda label: rates.get(label, rates[default]))
                reason = (f"{slowest} would take >= {floor_s:,.0f} s here (matmul "
                          f"{rates.get(slowest, rates[default]):,.1f} GFLOP/s; box "
                          f"{VARIANT_BOX_S:.0f} s)")
                out[name][pair] = {"skipped": reason}
                print(f"variants {name} {pair}: skipped: {reason}", flush=True)
                continue
            timed = interleaved(steppers, iters, box_s=VARIANT_BOX_S)
            a, b = list(timed)
            key = "optim_ms" if pair in ("adamw", "optimizer") else "step_ms"
            timed["compared"] = key
            timed["ratio"] = timed[b][key] / timed[a][key]
            out[name][pair] = timed
            print(f"variants {name} {pair}: {a} {timed[a][key]:.2f} ms vs {b} "
                  f"{timed[b][key]:.2f} ms ({key.removesuffix('_ms')}); ratio "
                  f"{timed['ratio']:.2f}", flush=True)
            del steppers
    return out


# ---------------------------------------------------------------------------
# data, analysis, gns


def bench_data(opts: Options) -> dict:
    """Batches/s of the data path alone (sample_batch + copy to the device) per preset, and
    how many times faster it is than the training step it feeds (the trainer's step time
    from the `train` section, else a few timed steps here)."""
    device = bench_device()
    trained = opts.results.get("train", {}).get("presets", {})
    out = {}
    for name, preset in presets(device.type).items():
        cfg = compose(preset, opts)
        data, m, t = prepare_data(cfg.data), cfg.model, cfg.train
        times = []
        for step in range(200):
            sync(device)
            t0 = time.perf_counter()
            batch = sample_batch(data.train, m.seq_len, t.batch_size, t.seed, step)
            batch.to(device, non_blocking=True)
            sync(device)
            times.append(time.perf_counter() - t0)
        batch_s = statistics.median(times[10:])
        if name in trained:
            step_s = trained[name]["step_ms"] / 1e3
        else:
            _, dtype, compiled = resolve_device(cfg)
            step = step_timer(cfg, device, dtype=dtype, compiled=compiled)
            step_s = statistics.median(sum(step()) for _ in range(5))
        out[name] = {"batches_per_s": 1 / batch_s, "batch_ms": 1e3 * batch_s,
                     "step_ms": 1e3 * step_s, "ratio": step_s / batch_s}
        print(f"data {name}: {1 / batch_s:,.0f} batches/s ({1e3 * batch_s:.3f} ms) vs a "
              f"{1e3 * step_s:.1f} ms training step: {step_s / batch_s:,.0f}x", flush=True)
    return out


def bench_analysis(opts: Options) -> dict:
    """Loading and analysing ~`opts.analysis_runs` synthetic runs (bcrit.benchmark), then the
    two table commands, fit_bcrit (report, plots and every bootstrap) and recommend, each on
    a generated results table of `opts.analysis_rows` rows (`synthetic.synthetic_table`:
    4 sizes, 5 budgets, 10 batches, 5 lrs, seeds), timed end to end without W&B."""
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        result = benchmark(tmp, opts.analysis_runs)
        result["total_s"] = result["load_s"] + result["analyse_s"]
        print(f"analysis: {result['n_runs']} synthetic runs loaded in {result['load_s']:.2f} s "
              f"and analysed in {result['analyse_s']:.2f} s", flush=True)
        table = synthetic_table(Path(tmp) / "table.csv", opts.analysis_rows)
        rows = sum(1 for _ in table.open()) - 1
        commands = {
            "fit_bcrit": lambda: run_analysis(tables=[str(table)], out=f"{tmp}/fit",
                                              wandb_mode="disabled"),
            "recommend": lambda: recommend_run([], [str(table)], None, None, params=3.2e7,
                                               tokens=2e7, out=f"{tmp}/recommend",
                                               wandb_mode="disabled")}
        result["table"] = {"rows": rows}
        for name, command in commands.items():
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                command()
            seconds = time.perf_counter() - t0
            result["table"][name] = {"seconds": seconds, "rows_per_s": rows / seconds}
            print(f"analysis: {name} --table on {rows:,} generated rows in {seconds:.1f} s "
                  f"({rows / seconds:,.0f} rows/s)", flush=True)
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
    ctx = multiprocessing.get_context("spawn")
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


SECTIONS: dict[str, Callable[[Options], dict]] = {
    "peak": bench_peak,
    "train": bench_train,
    "variants": bench_variants,
    "data": bench_data,
    "analysis": bench_analysis,
    "share": bench_share,
    "gns": lambda opts: bench_gns(opts.overrides, repeats=opts.repeats or 6,
                                  steps=opts.steps or 12),
}


def main(argv: list[str] | None = None) -> None:
    reuse_freed_memory()  # as the trainer does: the minimal loop and the trainer alike
    parser = argparse.ArgumentParser(prog="python -m critbatch.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved repeats (default: per section, 3 to 6)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per timed run (default: per section)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip the torch.compile variant (slow to set up: it compiles first)")
    parser.add_argument("--analysis-runs", type=int, default=1000,
                        help="synthetic runs for the analysis section")
    parser.add_argument("--analysis-rows", type=int, default=2000,
                        help="rows of the generated table fit_bcrit and recommend are timed on")
    parser.add_argument("--json", type=Path, default=Path("bench.json"),
                        help="where to write the results (default: ./bench.json)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. data.cache_dir=...")
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps <= WARMUP_STEPS) or (
            args.repeats is not None and args.repeats < 1):
        fail(f"--steps must exceed {WARMUP_STEPS} and --repeats be >= 1")
    device = bench_device()
    results: dict = {"meta": {
        "device": device_name(device), "device_type": device.type,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(), "argv": list(argv if argv is not None else sys.argv[1:]),
    }}
    print(f"critbatch bench on {results['meta']['device']} ({device.type}, "
          f"{torch.get_num_threads()} threads), torch {torch.__version__}", flush=True)
    opts = Options(overrides=args.overrides, repeats=args.repeats, steps=args.steps,
                   compile=args.compile, analysis_runs=args.analysis_runs,
                   analysis_rows=args.analysis_rows, results=results)
    t0, seconds = time.perf_counter(), {}
    with user_errors():
        for name in [s for s in SECTIONS if s in (args.only or SECTIONS)]:
            clock = time.perf_counter()
            results[name] = SECTIONS[name](opts)
            seconds[name] = time.perf_counter() - clock
    results["meta"]["seconds"] = time.perf_counter() - t0
    results["meta"]["section_seconds"] = seconds
    results["targets"] = targets(results, device.type)
    files.write_json_atomic(args.json, results)
    print(f"\n{table(results)}\n\n{results['meta']['seconds']:.0f} s; wrote {args.json}",
          flush=True)


if __name__ == "__main__":
    main()
