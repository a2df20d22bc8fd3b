"""The benchmarks' timing primitives, shared by every section: the command line's `Options`,
the width presets per device, one trainer step timed (`timed_step`, `step_timer`), several
set-ups stepped in turn (`interleaved`), the matmul rate (`matmul_gflops`, `matmul_ladder`,
`dtype_gflops`), model FLOPs utilisation (`mfu`) and the steps a timed run takes."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import torch

from critbatch.results import runs
from critbatch.science.model_size import flops_per_token
from critbatch.training.cli import check_overrides
from critbatch.training.gns import MicroGradNorms
from critbatch.training.step import Stepper, StepResult, build_stepper, train_step

WARMUP_STEPS = 3  # steps left out of the rate (first-call allocations, caches)


def step_seconds(run_dir: Path, skip: int = WARMUP_STEPS) -> list[float]:
    """Wall seconds of each optimizer step after the first `skip`, from metrics.jsonl's clock."""
    times = [row["time_s"] for row in runs.read_metrics(run_dir)]
    return [b - a for a, b in zip(times[skip - 1 : -1], times[skip:], strict=True)]


@dataclass
class Options:
    """What every section is run with (from the command line)."""

    overrides: list[str] = field(default_factory=list)  # hydra overrides, after each preset's
    repeats: int | None = None  # interleaved repeats; None = each section's default
    steps: int | None = None  # optimizer steps per timed run; None = each section's default
    compile: bool = True  # include the torch.compile variant (the slow one to set up)
    analysis_runs: int = 1000  # synthetic runs for the analysis section
    analysis_rows: int = 2000  # rows of the generated results table for the analysis section
    analysis_resamples: int | None = None  # the two commands' --resamples; None: their own
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


def run_steps(cfg, peak: dict | None, seconds: float = 1.0) -> int:
    """Steps for a timed run of about `seconds` (12 to 60), guessing 25% of the fp32 peak."""
    m = cfg.model
    flops = flops_per_token(m.width, m.depth, m.seq_len, cfg.data.vocab_size)
    flops *= cfg.train.batch_size * m.seq_len  # per step
    guess_s = flops / (0.25 * 1e9 * (peak or {}).get("float32_gflops", 100.0))
    return max(12, min(60, round(seconds / guess_s)))


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


def dtype_gflops(opts: Options, device: torch.device) -> dict[str, float]:
    """Matmul GFLOP/s per dtype name: the peak section's, else a probe at n = 256 (cached)."""
    peak = opts.results.get("peak") or opts.probe
    if not peak:
        peak = opts.probe = {f"{str(d).removeprefix('torch.')}_gflops": matmul_gflops(
            device, d, 256, 3) for d in (torch.float32, torch.bfloat16)}
    return {k.removesuffix("_gflops"): v for k, v in peak.items() if k.endswith("_gflops")}
