"""The offline gradient noise scale B_noise = tr(Sigma) / |G|^2 at a run's checkpoint.

    python -m critbatch.noise RUN_DIR [--micro-batches K] [--micro-batch-size b] [--seed S]

measures B_noise at a run's checkpoint, prints one row of science.md's reference table and
writes `RUN_DIR/noise.json` (keys: `runs.NOISE_KEYS`).

The estimator is science/noise.py's. The maths (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", App. A; science.md section 2): G is the true gradient, Sigma the
per-example gradient covariance. The gradient of a batch of B i.i.d. examples satisfies

    E |g_B|^2 = |G|^2 + tr(Sigma) / B

so squared norms measured at two batch sizes b < B solve to unbiased estimates

    |G|^2     ~ (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(Sigma) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B).

With K micro-batches of b sequences, |g_b|^2 is the mean of their squared norms and g_B the
mean of their gradients (B = K b). The |G|^2 estimate is then exactly the mean over i != j of
<g_i, g_j> (a U-statistic): unbiased, and negative when noise dominates. Each estimate is
unbiased, their ratio is not; so average the two separately and divide last. A non-positive
|G|^2 (or tr(Sigma)) estimate means "not resolved, increase K": B_noise is then reported as
missing (None), never as a negative or infinite number.

Assumptions: an example is one sequence of seq_len tokens and the loss is its mean token
loss, so B_noise is in sequences (x seq_len for tokens); examples are i.i.d. (windows at
random offsets of the token stream, drawn with replacement); the parameters do not move
between the two measurements (true offline; online, within one optimizer step).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from critbatch.results import files, runs, shortcut
from critbatch.results.errors import ConfigError, DataError, ResultsError, fail, user_errors
from critbatch.science.noise import JACKKNIFE_GROUPS, ema_interval, estimate
from critbatch.training.branches import PEAK_CHECKPOINT
from critbatch.training.config import total_steps, wandb_group
from critbatch.training.data import sample_batch, val_windows
from critbatch.training.evaluation import evaluate
from critbatch.training.gns import (
    group_sums,
    hessian_group_sums,
    hessian_vector_product,
    micro_batch_gradients,
)
from critbatch.training.model import GPT
from critbatch.training.saved_config import config_from_saved
from critbatch.training.schedule import lr_factor
from critbatch.training.step import autocast_for, resolve_device
from critbatch.training.token_cache import prepare_data

CHECKPOINTS = {"final": ("checkpoint.pt", "noise.json"),
               "peak_lr": (PEAK_CHECKPOINT, "noise_peak_lr.json")}


def load_checkpoint(run_dir: Path, name: str = "checkpoint.pt") -> tuple:
    """(Config, state_dict, step) from `run_dir/<name>`; ResultsError if unusable."""
    path = run_dir / name
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir} is not a directory; pass a run directory (runs/...)")
    if name == PEAK_CHECKPOINT and not path.exists():
        raise ResultsError(f"{run_dir} has no {name}: train with train.gns.peak_checkpoint=true "
                           "(a wsd or constant lr, two or more micro-batches a step)")
    if not path.exists():
        raise ResultsError(f"{run_dir} has no checkpoint.pt; pass a finished run's directory "
                           "or train one first (make train)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        cfg = config_from_saved(ckpt["config"])
    except Exception as err:  # truncated file, old or foreign format
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ResultsError(f"{path} cannot be loaded ({first}); rerun the training") from None
    return cfg, ckpt["model"], int(ckpt["step"])


def measure_run(run_dir: Path, micro_batches: int = 128, micro_batch_size: int = 4,
                seed: int | None = None, device_name: str = "auto",
                cache_dir: str | None = None, full: int = 0,
                ratio_from: Path | None = None, which: str = "final") -> dict:
    """Measure B_noise at `run_dir`'s checkpoint; write noise.json; return its dict.

    Windows come from the train split, drawn like training step `step` (the checkpoint's)
    would draw them with seed `seed` (default: the run's): data the model has not yet
    trained on, from the distribution it trains on. `full` > 0 also measures B_full =
    tr(H Sigma) / G'HG with H the Hessian on `full` other windows (`b_full_fields`).
    The B_crit it implies (`results.shortcut`) uses the ratio of `ratio_from` (a fits.json;
    default: the run's sweep's report). `which`: the run's final checkpoint (noise.json) or
    its last peak-lr one (`train.gns.peak_checkpoint`; noise_peak_lr.json, beside the online
    tracker's reading there with its interval, `tracker_fields`).
    """
    if micro_batches < 2:
        raise ConfigError(f"--micro-batches {micro_batches}: the estimator needs K >= 2 "
                          "micro-batches (the reference uses 128)")
    if micro_batch_size < 1:
        raise ConfigError(f"--micro-batch-size {micro_batch_size} must be at least 1")
    checkpoint_name, out_name = CHECKPOINTS[which]
    cfg, state, step = load_checkpoint(run_dir, checkpoint_name)
    cfg.train.device = device_name
    if cache_dir:
        cfg.data.cache_dir = cache_dir
    device, amp_dtype, _ = resolve_device(cfg)
    autocast = autocast_for(device, amp_dtype)
    m, t = cfg.model, cfg.train
    data = prepare_data(cfg.data)
    needed = micro_batch_size * (m.seq_len + 1)
    if needed > data.train.size:
        raise DataError(
            f"--micro-batch-size {micro_batch_size} needs {needed:,} distinct train tokens "
            f"(b x (seq_len + 1)) but the corpus has {data.train.size:,}; lower it"
        )
    seed = t.seed if seed is None else seed
    k, b = micro_batches, micro_batch_size
    t0 = time.perf_counter()
    model = GPT(m, cfg.data.vocab_size).to(device)
    model.load_state_dict(state)
    windows = sample_batch(data.train, m.seq_len, k * b, seed, step)  # (K b, T+1)
    gradients = micro_batch_gradients(model, windows.split(b), device, autocast)
    est = estimate(group_sums(gradients, min(k, JACKKNIFE_GROUPS)), b)
    hessian = (b_full_fields(model, data, m.seq_len, k, b, seed, step, full, device, autocast)
               if full else {})
    val = val_windows(data.val, m.seq_len, t.eval_tokens)
    val_loss = evaluate(model, val, max(b, t.micro_batch_size or t.batch_size), device,
                        autocast)
    bpt = data.bytes_per_token
    summary_path = run_dir / "summary.json"
    summary = runs.read_summary(run_dir) if summary_path.exists() else {}
    online = summary.get("b_noise")

    def tokens_or_none(x: float | None) -> float | None:
        return None if x is None else x * m.seq_len

    record = {
        "schema_version": runs.SCHEMA_VERSION,
        "step": step,
        "tokens": step * t.batch_size * m.seq_len,
        "seq_len": m.seq_len,
        "micro_batches": k,
        "micro_batch_size": b,
        "val_loss": val_loss,
        "val_loss_per_byte": val_loss / bpt,
        "g2": est.g2,
        "trace": est.trace,
        "b_noise": est.b_noise,
        "b_noise_tokens": tokens_or_none(est.b_noise),
        "b_noise_low": est.b_noise_low,
        "b_noise_high": est.b_noise_high,
        "resolved": est.b_noise is not None,
        # beyond the required keys
        "loss": est.loss,  # on the K b measured windows (train split), nats/token
        "loss_per_byte": est.loss / bpt,
        "g2_stderr": est.g2_stderr,
        "trace_stderr": est.trace_stderr,
        "b_noise_tokens_low": tokens_or_none(est.b_noise_low),
        "b_noise_tokens_high": tokens_or_none(est.b_noise_high),
        "interval": f"68%: jackknife over {est.groups} groups of micro-batches, log B_noise",
        "online_b_noise": online,
        "width": m.width,
        "seed": seed,
        "device": str(device),
        "dtype": str(amp_dtype).removeprefix("torch."),
        "wall_time_s": time.perf_counter() - t0,
        "git_revision": runs.git_revision(),
        **hessian,
        "checkpoint": which,
        **(tracker_fields(run_dir, summary, step, cfg.train.gns.ema, est)
           if which == "peak_lr" else {}),
    }
    record.update(b_crit_fields(cfg, run_dir, record, ratio_from))
    files.write_json_atomic(run_dir / out_name, record)
    print(TABLE_HEADER)
    print(table_row(record))
    print(shortcut.line(record))
    if which == "peak_lr":
        print(tracker_line(record))
    _log_wandb(cfg, wandb_group(cfg), run_dir, record)
    return record


def tracker_fields(run_dir: Path, summary: dict, step: int, ema: float, est) -> dict:
    """The online tracker at the checkpoint's step (its peak-lr reading) with a 68% interval
    from its per-step estimates in metrics.jsonl (`science.noise.ema_interval`), and whether
    it and the noise program's interval overlap (`tracker_agrees`)."""
    rows = [r for r in runs.read_metrics(run_dir) if r["step"] <= step
            and r.get("gns_g2_step") is not None]
    interval = ema_interval([r["gns_g2_step"] for r in rows],
                            [r["gns_trace_step"] for r in rows], ema) if rows else None
    reading = next((r for r in summary.get("noise_readings") or [] if r["step"] == step), {})
    low, high = (interval[1], interval[2]) if interval else (None, None)
    agrees = (None if low is None or est.b_noise_low is None
              else bool(low <= est.b_noise_high and est.b_noise_low <= high))
    return {"online_b_noise": reading.get("b_noise"), "online_b_noise_low": low,
            "online_b_noise_high": high, "online_steps": len(rows), "tracker_agrees": agrees}


def tracker_line(r: dict) -> str:
    """The online tracker beside the noise program at a peak-lr checkpoint."""
    if r.get("online_b_noise") is None or r.get("online_b_noise_low") is None:
        return "online tracker at this step: no reading"
    verdict = {True: "the intervals overlap", False: "the intervals do NOT overlap",
               None: "no interval to compare"}[r["tracker_agrees"]]
    return (f"online tracker at step {r['step']:,} (the peak lr): {r['online_b_noise']:,.0f} "
            f"sequences, 68%: {r['online_b_noise_low']:,.0f}-{r['online_b_noise_high']:,.0f}; "
            f"the noise program {r['b_noise'] or 0:,.0f}: {verdict}")


def b_crit_fields(cfg, run_dir: Path, record: dict, ratio_from: Path | None) -> dict:
    """The shortcut's fields (`results.shortcut.estimate`) for this checkpoint."""
    path = ratio_from or shortcut.sweep_fits(run_dir)
    if ratio_from is None and not path.exists():
        ratio, why = None, (f"no sweep report beside the run ({path}): pass --ratio-from "
                            "<a sweep's report/fits.json>, from fit_bcrit on a sweep")
    else:
        ratio, why = shortcut.ratio_from(path, cfg.optim.name)
    step = record["step"]
    decayed = step > 0 and lr_factor(step - 1, total_steps(cfg), cfg.train) < 1.0
    return shortcut.estimate(record["b_noise"], record["b_noise_high"], record["val_loss"],
                             decayed, ratio, str(path), why)


def b_full_fields(model, data, seq_len: int, k: int, b: int, seed: int, step: int,
                  hessian_sequences: int, device, autocast) -> dict:
    """noise.json's B_full fields: McCandlish et al.'s B_full = tr(H Sigma) / G'HG from the
    same K micro-batches' gradients (`hessian_group_sums`), H the Hessian of the loss on
    `hessian_sequences` windows drawn with another seed (independent of the gradients),
    with the same 68% jackknife interval as B_noise's."""
    windows = sample_batch(data.train, seq_len, k * b, seed, step)
    other = sample_batch(data.train, seq_len, hessian_sequences, seed + 1_000_003, step)
    hvp = hessian_vector_product(model, other, device)
    full = estimate(hessian_group_sums(micro_batch_gradients(model, windows.split(b), device,
                                                             autocast), hvp,
                                       min(k, JACKKNIFE_GROUPS)), b)
    return {"b_full": full.b_noise, "b_full_low": full.b_noise_low,
            "b_full_high": full.b_noise_high, "g_h_g": full.g2, "trace_h_sigma": full.trace,
            "hessian_sequences": hessian_sequences}


TABLE_HEADER = ("| model | loss (nats/byte) | tr(Sigma) | abs(G)^2 | B_noise | micro-batches |\n"
                "|---|---|---|---|---|---|")


def table_row(r: dict) -> str:
    """One row in the form of science.md's reference table (plus K x b)."""
    if r["resolved"]:
        b_noise = f"{r['b_noise']:,.0f} sequences ({_si(r['b_noise_tokens'])} tokens)"
        if r["b_noise_low"] is not None:
            b_noise += f", 68%: {r['b_noise_low']:,.0f}-{r['b_noise_high']:,.0f}"
        else:
            b_noise += ", 68%: unbounded above (increase K)"
    else:
        b_noise = "not resolved (abs(G)^2 <= 0), increase K"
    return (f"| width {r['width']}, {r['step']:,} steps | {r['val_loss_per_byte']:.3f} | "
            f"{r['trace']:#.3g} | {r['g2']:#.3g} | {b_noise} | "
            f"{r['micro_batches']} x {r['micro_batch_size']} |")


def full_line(r: dict) -> str:
    """B_full beside B_simple, one line."""
    if r.get("b_full") is None:
        return ("B_full: not resolved (G'HG <= 0: the Hessian is not positive along G here, "
                "or increase K)")
    interval = ("" if r["b_full_low"] is None
                else f", 68%: {r['b_full_low']:,.0f}-{r['b_full_high']:,.0f}")
    simple = f"{r['b_noise']:,.0f}" if r["b_noise"] is not None else "not resolved"
    return (f"B_full = tr(H Sigma) / G'HG: {r['b_full']:,.0f} sequences{interval} (Hessian on "
            f"{r['hessian_sequences']} windows); B_simple {simple}")


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _log_wandb(cfg, group: str, run_dir: Path, record: dict) -> None:
    if cfg.logger.mode == "disabled":
        return
    import wandb

    numbers = {k: v for k, v in record.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    with wandb.init(
        mode=cfg.logger.mode, project=cfg.logger.project, group=group, job_type="noise",
        name=f"noise-{run_dir.name}", dir=str(run_dir), config=record,
        settings=wandb.Settings(console="off", silent=True),
    ) as run:
        run.log(numbers)
        run.summary.update(numbers)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every critbatch error
        fail(f"{message} (see python -m critbatch.noise --help)")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m critbatch.noise",
                     description="Measure the gradient noise scale at a run's checkpoint.")
    parser.add_argument("run_dir", type=Path, help="a run directory holding checkpoint.pt")
    parser.add_argument("--micro-batches", "-K", type=int, default=128,
                        help="K micro-batches (default 128); the big batch is K x b")
    parser.add_argument("--micro-batch-size", "-b", type=int, default=4,
                        help="b sequences per micro-batch (default 4)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the drawn windows (default: the run's train.seed)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--cache-dir", default=None,
                        help="token cache folder (default: the run's data.cache_dir)")
    parser.add_argument("--ratio-from", type=Path, default=None, metavar="FITS",
                        help="a sweep's report/fits.json whose noise_ratio turns B_noise into "
                             "B_crit (default: the run's own sweep's report)")
    parser.add_argument("--checkpoint", choices=sorted(CHECKPOINTS), action="append",
                        help="final (the default: checkpoint.pt, writes noise.json) or peak_lr "
                             "(checkpoint_peak_lr.pt of train.gns.peak_checkpoint, writes "
                             "noise_peak_lr.json beside the online tracker's reading); given "
                             "twice, both in one process, in the order given")
    parser.add_argument("--full", type=int, default=0, metavar="N",
                        help="also B_full = tr(H Sigma) / G'HG, the Hessian on N other "
                             "windows (e.g. 64; K Hessian-vector products: several times "
                             "the cost of B_noise)")
    args = parser.parse_args(argv)
    with user_errors():
        for which in args.checkpoint or ["final"]:
            record = measure_run(args.run_dir, args.micro_batches, args.micro_batch_size,
                                 args.seed, args.device, args.cache_dir, args.full,
                                 args.ratio_from, which)
            if args.full:
                print(full_line(record))


if __name__ == "__main__":
    sys.exit(main())
