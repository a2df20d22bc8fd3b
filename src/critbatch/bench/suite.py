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
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch

from critbatch.analysis.render import resamples_error
from critbatch.bench.capacity import bench_peak, bench_share
from critbatch.bench.data_and_analysis import bench_analysis, bench_data
from critbatch.bench.table import table, targets
from critbatch.bench.timing import WARMUP_STEPS, Options, bench_device, device_name
from critbatch.bench.training_speed import bench_gns, bench_train, bench_variants
from critbatch.results import files
from critbatch.results.errors import fail, user_errors
from critbatch.training.memory import reuse_freed_memory

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
    parser.add_argument("--analysis-resamples", type=int, default=None, metavar="N",
                        help="the bootstrap refits of those two commands (their --resamples; "
                             "default: their own, as a user runs them)")
    parser.add_argument("--json", type=Path, default=Path("bench.json"),
                        help="where to write the results (default: ./bench.json)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. data.cache_dir=...")
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps <= WARMUP_STEPS) or (
            args.repeats is not None and args.repeats < 1):
        fail(f"--steps must exceed {WARMUP_STEPS} and --repeats be >= 1")
    if message := resamples_error("--analysis-resamples", args.analysis_resamples):
        fail(message)
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
                   analysis_rows=args.analysis_rows,
                   analysis_resamples=args.analysis_resamples, results=results)
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
