"""The benchmark's training-speed sections: `train` (the real trainer against a minimal eager
loop, its step split into parts, MFU), `variants` (one setting changed at a time, stepped in
turn) and `gns` (what online gradient-noise-scale tracking costs in tokens/s)."""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from critbatch.bench.timing import (
    Options,
    bench_device,
    compose,
    dtype_gflops,
    interleaved,
    mfu,
    presets,
    random_batch,
    run_steps,
    step_seconds,
    step_timer,
    sync,
    timed_step,
)
from critbatch.results import files
from critbatch.science.model_size import flops_per_token, param_count
from critbatch.training.cli import check_overrides
from critbatch.training.data import sample_batch
from critbatch.training.loop import train
from critbatch.training.metrics import WARMUP_STEPS_EXCLUDED, StepRecord, metrics_rows
from critbatch.training.model import GPT
from critbatch.training.optim import adamw_options
from critbatch.training.schedule import lr_factor
from critbatch.training.step import autocast_for, build_stepper, resolve_device
from critbatch.training.token_cache import prepare_data


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


# The cpu preset's reference shape (width 128, depth 4, seq_len 128, batch 32), pinned so the
# number stays comparable when the preset changes, as 4 micro-batches of 8.
GNS_SHAPE = (
    "scale=cpu", "model.width=128", "model.depth=4", "model.heads=4", "model.seq_len=128",
    "train.batch_size=32", "train.micro_batch_size=8",
)


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
