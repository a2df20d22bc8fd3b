"""Throughput benchmarks: `python -m critbatch.bench [--only SECTION ...] [hydra overrides]`.

Each section is a function `(overrides, repeats, steps) -> dict` registered in `SECTIONS`;
it prints its own result line. Sections so far:

- `gns`: the cost of online gradient-noise-scale tracking (train.gns) in tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from critbatch import runs
from critbatch.errors import fail, user_errors

# The cpu preset's reference shape (width 128, depth 4, seq_len 128, batch 32), pinned so the
# number stays comparable when the preset changes, as 4 micro-batches of 8.
GNS_SHAPE = (
    "scale=cpu", "model.width=128", "model.depth=4", "model.heads=4", "model.seq_len=128",
    "train.batch_size=32", "train.micro_batch_size=8",
)
WARMUP_STEPS = 3  # steps left out of the rate (first-call allocations, caches)


def steady_tokens_per_s(run_dir: Path, skip: int = WARMUP_STEPS) -> float:
    """Training tokens/s between step `skip` and the last step, from metrics.jsonl's clock."""
    rows = runs.read_metrics(run_dir)
    first, last = rows[skip - 1], rows[-1]
    return (last["tokens"] - first["tokens"]) / (last["time_s"] - first["time_s"])


def bench_gns(overrides: list[str], repeats: int = 3, steps: int = 30) -> dict:
    """tokens/s with train.gns.enabled true vs false, interleaved in one process.

    Each repeat trains both variants from the same seed (same batches, same arithmetic apart
    from the tracking), alternating which goes first so drifts in machine load cancel. The
    cost is 1 - median over repeats of (tokens/s on) / (tokens/s off).
    """
    from critbatch.train import check_overrides, train

    base = [*GNS_SHAPE, f"train.tokens={steps * 32 * 128}", "train.eval_points=1",
            "train.eval_tokens=1024", "train.warmup_steps=2", "logger.mode=disabled", *overrides]
    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="critbatch-bench-") as tmp:
        for r in range(repeats):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                cfg = check_overrides([*base, f"train.gns.enabled={str(enabled).lower()}"])
                run_dir = Path(tmp) / f"{r}-{enabled}"
                summary = train(cfg, run_dir)
                assert (summary["b_noise"] is not None or summary["gns_ema"] is None)
                rates[enabled].append(steady_tokens_per_s(run_dir))
    ratios = [on / off for on, off in zip(rates[True], rates[False], strict=True)]
    result = {
        "tokens_per_s_on": statistics.median(rates[True]),
        "tokens_per_s_off": statistics.median(rates[False]),
        "ratio": statistics.median(ratios),
        "overhead_percent": 100 * (1 - statistics.median(ratios)),
        "ratios": ratios,
        "repeats": repeats,
        "steps": steps,
        "overrides": [*GNS_SHAPE, *overrides],
    }
    print(f"gns: {result['tokens_per_s_on']:,.0f} tokens/s tracking vs "
          f"{result['tokens_per_s_off']:,.0f} without; ratio {result['ratio']:.4f} "
          f"(pairs {', '.join(f'{x:.3f}' for x in ratios)}) -> overhead "
          f"{result['overhead_percent']:.2f}% (goal < 3%)", flush=True)
    return result


SECTIONS: dict[str, Callable[..., dict]] = {"gns": bench_gns}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m critbatch.bench", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per timed run")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. data.cache_dir=...")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS or args.repeats < 1:
        fail(f"--steps must exceed {WARMUP_STEPS} and --repeats be >= 1")
    results = {}
    with user_errors():
        for name in args.only or sorted(SECTIONS):
            results[name] = SECTIONS[name](args.overrides, repeats=args.repeats,
                                           steps=args.steps)
    if args.json:
        runs.write_json_atomic(args.json, results)
    print(json.dumps({k: {m: v for m, v in r.items() if not isinstance(v, list)}
                      for k, r in results.items()}))


if __name__ == "__main__":
    main()
