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


def step_seconds(run_dir: Path, skip: int = WARMUP_STEPS) -> list[float]:
    """Wall seconds of each optimizer step after the first `skip`, from metrics.jsonl's clock."""
    times = [row["time_s"] for row in runs.read_metrics(run_dir)]
    return [b - a for a, b in zip(times[skip - 1 : -1], times[skip:], strict=True)]


def gns_step_cost(cfg, iters: int = 40) -> dict:
    """Median seconds of the accumulation part of a step (all micro-batches' fwd + bwd) with
    and without `MicroGradNorms`, alternating every iteration.

    A second view of the same cost, interleaved step by step so that load from other
    processes hits both sides alike; conservative, since the optimizer step and clipping
    (equal on both sides) are left out of the denominator.
    """
    import time

    import torch

    from critbatch.model import GPT
    from critbatch.noise import MicroGradNorms

    torch.manual_seed(0)
    m, micro = cfg.model, cfg.train.micro_batch_size
    accum = cfg.train.batch_size // micro
    model = GPT(m, cfg.data.vocab_size)
    batch = torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, m.seq_len + 1))

    def accumulate(track: bool) -> float:
        norms = MicroGradNorms(model.parameters(), accum) if track else None
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for i in range(accum):
            x = batch[i * micro : (i + 1) * micro]
            (model(x[:, :-1], x[:, 1:]) / accum).backward()
            if norms:
                norms.pop()
        elapsed = time.perf_counter() - t0
        if norms:
            norms.remove()
        return elapsed

    accumulate(True), accumulate(False)  # warm-up
    times = {True: [], False: []}
    for it in range(iters):
        for track in ((True, False) if it % 2 == 0 else (False, True)):
            times[track].append(accumulate(track))
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
    from critbatch.train import check_overrides, train

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


SECTIONS: dict[str, Callable[..., dict]] = {"gns": bench_gns}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m critbatch.bench", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved repeats")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per timed run")
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
