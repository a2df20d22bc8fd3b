"""`make gpu-check`: does this GPU run the gpu-scale sweeps as they are meant to run?

`python -m critbatch.bench.gpu_check [--device cuda|cpu] [--quick] [--json FILE]` prints, each
part time-boxed, then one PASS/FAIL line:

- the device (name, memory, torch and CUDA versions) and its bf16 matmul peak;
- the gpu scale's widths (128-384, context 512) trained in ONE process, each compiled, with
  its tokens/s, MFU against the bf16 peak and peak memory; a width that fell back to eager
  (dynamo's recompile limit) fails the check;
- the packing speed-up: aggregate tokens/s of k = 1, 2, 4 runs sharing the card
  (`capacity.bench_share`);
- a short branched smoke sweep (`make sweep-batch SCALE=smoke`, AdamW) in a temporary folder.

Without CUDA it says so in one line and exits 0. `--device cpu --quick` runs the same
mechanism on small shapes with bf16 autocast and a cheap compile backend (what the tests
exercise); its figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from critbatch.bench import capacity, timing
from critbatch.science.model_size import flops_per_token, param_count

GPU_WIDTHS = (128, 192, 256, 320, 384)
QUICK_WIDTHS = (32, 48, 64)
STEPS = 20  # timed steps per width after 3 warm-up (compilation) steps
SECTION_BOX_S = 90.0  # each part stops adding work once it has run this long


class FallbackWatch(logging.Handler):
    """Collects dynamo's warnings: a recompile-limit one means a model trained in eager."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def width_overrides(width: int, quick: bool, extra: list[str]) -> list[str]:
    heads = max(1, width // 64) if not quick else 2
    base = (["scale=smoke", "data=stdlib", "train.compile_backend=eager",
             "train.dtype=bfloat16", "train.compile=true", "train.device=cpu", "model.depth=2",
             "model.seq_len=64"] if quick else ["scale=gpu", "data=stdlib"])
    return [*base, f"model.width={width}", f"model.heads={heads}", "logger.mode=disabled",
            *extra]


def check_widths(device: torch.device, quick: bool, peak_gflops: float,
                 extra: list[str]) -> list[dict]:
    """Each width trained compiled in this one process: tokens/s, MFU, peak memory, and
    whether dynamo fell back to eager."""
    watch = FallbackWatch()
    logging.getLogger("torch._dynamo").addHandler(watch)
    rows, start = [], time.perf_counter()
    try:
        for width in QUICK_WIDTHS if quick else GPU_WIDTHS:
            if time.perf_counter() - start > SECTION_BOX_S * (1 if quick else 2):
                rows.append({"width": width, "skipped": "time box"})
                continue
            cfg = timing.compose(width_overrides(width, quick, extra), timing.Options())
            before = len(watch.messages)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            step = timing.step_timer(cfg, device, dtype=torch.bfloat16, compiled=True)
            for _ in range(3):
                step()
            steps = 5 if quick else STEPS
            seconds = sum(sum(step()) for _ in range(steps))
            m, t = cfg.model, cfg.train
            tokens_per_s = steps * t.batch_size * m.seq_len / seconds
            flops = flops_per_token(m.width, m.depth, m.seq_len, cfg.data.vocab_size)
            fell_back = [x for x in watch.messages[before:] if "recompile_limit" in x]
            rows.append({
                "width": width, "params": param_count(m.width, m.depth, m.seq_len,
                                                      cfg.data.vocab_size)[0],
                "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops / (peak_gflops * 1e9),
                "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30
                if device.type == "cuda" else None,
                "compiled": not fell_back})
            print(f"width {width}: {tokens_per_s:,.0f} tokens/s, MFU "
                  f"{100 * rows[-1]['mfu']:.1f}% of bf16 peak, compiled: "
                  f"{'yes' if not fell_back else 'NO (fell back to eager)'}"
                  + (f", peak memory {rows[-1]['peak_memory_gb']:.2f} GB"
                     if rows[-1]["peak_memory_gb"] is not None else ""), flush=True)
    finally:
        logging.getLogger("torch._dynamo").removeHandler(watch)
    return rows


def smoke_sweep(quick: bool, extra: list[str]) -> dict:
    """`python -m critbatch.sweep batch --scale smoke --opt adamw` in a temporary folder."""
    cmd = [sys.executable, "-m", "critbatch.sweep", "batch", "--scale", "smoke", "--opt",
           "adamw", "logger.mode=disabled", "data=stdlib", *extra]
    if quick:  # a CPU check of the mechanism: two batch sizes at a short budget, evaluated
        # on a quarter of the smoke scale's validation tokens
        cmd += ["train.tokens=16384", "train.eval_tokens=1024", "grid.batch_sizes='4,8'",
                "grid.lrs.adamw=4e-3", "train.device=cpu"]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="critbatch-gpu-check-") as tmp:
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600)
        runs = len(list(Path(tmp).glob("runs/batch/smoke/*/summary.json")))
        branches = len(list(Path(tmp).glob("runs/batch/smoke/*/branches/*/summary.json")))
    result = {"returncode": proc.returncode, "runs": runs, "branches": branches,
              "seconds": time.perf_counter() - start,
              "tail": (proc.stdout + proc.stderr)[-600:] if proc.returncode else ""}
    print(f"smoke sweep: {runs} runs + {branches} branches in {result['seconds']:.0f} s, exit "
          f"{proc.returncode}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m critbatch.bench.gpu_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="small shapes (the CPU test)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every run checked")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}); nothing to check")
        return 0
    device = torch.device(args.device)
    print(f"gpu-check on {timing.device_name(device)} ({device.type}), torch {torch.__version__}"
          + (f", CUDA {torch.version.cuda}, "
             f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.0f} GB"
             if device.type == "cuda" else ""), flush=True)
    sizes = (256, 1024) if args.quick else (1024, 4096, 8192)
    by_size, _ = timing.matmul_ladder(device, torch.bfloat16, sizes, 5, 10.0)
    peak = max(by_size.values())
    print(f"bf16 matmul peak: {peak:,.0f} GFLOP/s", flush=True)
    results = {"device": timing.device_name(device), "bf16_gflops": peak,
               "widths": check_widths(device, args.quick, peak, args.overrides)}
    if device.type == "cuda":
        results["packing"] = capacity.bench_share(timing.Options(overrides=["data=stdlib"],
                                                             steps=40))
    results["smoke_sweep"] = smoke_sweep(args.quick, args.overrides)
    measured = [w for w in results["widths"] if "skipped" not in w]
    failures = [f"width {w['width']} trained uncompiled" for w in measured if not w["compiled"]]
    if not measured:
        failures.append("no width was measured")
    if results["smoke_sweep"]["returncode"] != 0:
        failures.append("the smoke sweep failed")
    results["passed"] = not failures
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("gpu-check: PASS" if not failures else f"gpu-check: FAIL ({'; '.join(failures)})")
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
