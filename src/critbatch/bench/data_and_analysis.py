"""The benchmark's sections beside the training step: the data path alone against the step it
feeds (`data`), and loading and analysing synthetic runs plus the two table commands on a
generated results table (`analysis`)."""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

from critbatch.analysis.bcrit.report import run_analysis
from critbatch.analysis.bcrit.synthetic import benchmark, synthetic_table
from critbatch.analysis.recommend.report import run as recommend_run
from critbatch.bench.timing import Options, bench_device, compose, presets, step_timer, sync
from critbatch.training.data import sample_batch
from critbatch.training.step import resolve_device
from critbatch.training.token_cache import prepare_data


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
    4 sizes, 5 budgets, 10 batches, 5 lrs, seeds), timed end to end without W&B, with
    `opts.analysis_resamples` bootstrap refits (None: the commands' defaults)."""
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        result = benchmark(tmp, opts.analysis_runs)
        result["total_s"] = result["load_s"] + result["analyse_s"]
        print(f"analysis: {result['n_runs']} synthetic runs loaded in {result['load_s']:.2f} s "
              f"and analysed in {result['analyse_s']:.2f} s", flush=True)
        table = synthetic_table(Path(tmp) / "table.csv", opts.analysis_rows)
        rows = sum(1 for _ in table.open()) - 1
        refits = opts.analysis_resamples
        commands = {
            "fit_bcrit": lambda: run_analysis(tables=[str(table)], out=f"{tmp}/fit",
                                              wandb_mode="disabled", resamples=refits),
            "recommend": lambda: recommend_run([], [str(table)], None, None, params=3.2e7,
                                               tokens=2e7, out=f"{tmp}/recommend",
                                               wandb_mode="disabled", resamples=refits)}
        result["table"] = {"rows": rows, "resamples": refits}
        for name, command in commands.items():
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                command()
            seconds = time.perf_counter() - t0
            result["table"][name] = {"seconds": seconds, "rows_per_s": rows / seconds}
            print(f"analysis: {name} --table on {rows:,} generated rows in {seconds:.1f} s "
                  f"({rows / seconds:,.0f} rows/s)", flush=True)
    return result
