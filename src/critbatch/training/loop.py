"""One training run: `python -m critbatch.train [hydra overrides]`.

The whole step sequence -- lr, micro-steps, noise measurement, clipping, optimizer
step, eval, log -- is in `train()`, top to bottom. Everything it calls is a small pure
helper or a module of the package (data, model, optim, noise, runs).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from critbatch import files
from critbatch.analysis import results as runs
from critbatch.errors import ConfigError
from critbatch.science.noise import NoiseEMA
from critbatch.training import checkpoint
from critbatch.training.batching import BatchPlan
from critbatch.training.config import (
    Config,
    micro_batch_size,
    total_steps,
    wandb_group,
)
from critbatch.training.data import check_seq_len, prepare_data, sample_batch, val_windows
from critbatch.training.distributed import (
    average_gradients,
    init_ranks,
    mean_over_ranks,
    shutdown,
)
from critbatch.training.gns import MicroGradNorms
from critbatch.training.model import GPT, param_count
from critbatch.training.optim import (
    batch_lr_ratio,
    build_optimizers,
    lr_factor,
    lr_factor_by_tokens,
    set_lr,
    used_lr,
)

log = logging.getLogger("critbatch")


def resolve_device(cfg: Config) -> tuple[torch.device, torch.dtype, bool]:
    """(device, autocast dtype, compile) from the `auto` settings."""
    name = cfg.train.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available; use train.device=cpu")
    device = torch.device(name)
    dtype_name = cfg.train.dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device.type == "cuda" else "float32"
    compile_model = cfg.train.compile if cfg.train.compile is not None else device.type == "cuda"
    return device, getattr(torch, dtype_name), compile_model


def eval_steps(steps: int, points: int) -> list[int]:
    """Optimizer-step counts after which to evaluate: log-spaced, always ending at `steps`."""
    if points <= 1:
        return [steps]
    spaced = np.round(np.geomspace(1, steps, num=points)).astype(int)
    return sorted(set(spaced.tolist()) | {steps})


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, chunk: int, device, autocast) -> float:
    """Mean cross-entropy (nats/token) over the fixed validation windows."""
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    for i in range(0, len(windows), chunk):
        batch = windows[i : i + chunk].to(device, non_blocking=True)
        with autocast:
            loss = model(batch[:, :-1], batch[:, 1:])
        total += loss.double() * len(batch)
    model.train()
    return float(total.item() / len(windows))


def is_diverged(losses: list[float], first: float, factor: float, window: int) -> str | None:
    """A reason if the run diverged: a non-finite loss, or `window` steps above factor x first."""
    if any(not math.isfinite(x) for x in losses[-window:]):
        return "non-finite train loss"
    tail = losses[-window:]
    if len(tail) == window and all(x > factor * first for x in tail):
        return f"train loss above {factor} x its first value ({first:.3f}) for {window} steps"
    return None


def train(cfg: Config, run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Train one model as `cfg` says, write the run directory, and return summary.json's dict."""
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides or [])
    t, m = cfg.train, cfg.model
    resolved = asdict(cfg)
    ckpt_path = run_dir / "checkpoint.pt"
    ckpt = checkpoint.load(ckpt_path, resolved)  # refuses one of another config
    device, amp_dtype, compile_model = resolve_device(cfg)
    ranks = init_ranks(device.type)  # one process, or torchrun's data-parallel ranks
    if ranks.parallel and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    use_amp = amp_dtype != torch.float32
    autocast = torch.autocast(device.type, dtype=amp_dtype) if use_amp else nullcontext()
    data = prepare_data(cfg.data)
    check_seq_len(data, m.seq_len)

    torch.manual_seed(t.seed)
    model = GPT(m, cfg.data.vocab_size).to(device)
    params, params_nonembedding = param_count(m.width, m.depth, m.seq_len, cfg.data.vocab_size)
    assert params == sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if compile_model else model
    optimizers = build_optimizers(model, cfg.optim, t.batch_size, device.type)
    lr = used_lr(cfg.optim, t.batch_size)

    scheduled = t.batch_schedule != "constant"
    plan = BatchPlan(cfg)  # the batch of every step (constant, ramp or adaptive)
    budget = plan.budget  # tokens
    steps = total_steps(cfg) if not scheduled else None  # a scheduled run's: known at its end
    micro = micro_batch_size(cfg)
    if ranks.parallel and scheduled:
        raise ConfigError(f"train.batch_schedule={t.batch_schedule} runs in one process; "
                          "use train.batch_schedule=constant under torchrun")
    if t.batch_size % (ranks.world * micro):
        raise ConfigError(
            f"train.batch_size={t.batch_size} does not split into {ranks.world} ranks x "
            f"micro-batches of {micro}; pick a batch size divisible by {ranks.world * micro}"
        )
    local = t.batch_size // ranks.world  # sequences this rank trains on per step (constant)
    accum = local // micro
    # evaluations: log-spaced in tokens; at the steps eval_steps picks for a constant batch
    eval_at = [s * plan.start * m.seq_len
               for s in eval_steps(budget // (plan.start * m.seq_len), t.eval_points)]
    val = val_windows(data.val, m.seq_len, t.eval_tokens)
    # gradient noise scale: the step's batch is the big batch; the small one is each rank's
    # share under torchrun, else each micro-batch of gradient accumulation
    gns_on = t.gns.enabled and (ranks.parallel or plan.end // micro >= 2)
    small = local if ranks.parallel else micro
    micro_norms = MicroGradNorms(model.parameters(), accum) if gns_on and not ranks.parallel \
        else None
    gns = NoiseEMA(t.gns.ema, b=small, big=t.batch_size)
    state = checkpoint.restore(ckpt, model, optimizers, gns) if ckpt else checkpoint.TrainState()
    if state.step and not state.tokens:  # a checkpoint from before token counting: constant
        state.tokens = state.step * t.batch_size * m.seq_len
    plan.restore(state.batch_plan)

    log.info(
        f"data={cfg.data.name}: {data.train.size / 1e6:.2f}M train tokens, "
        f"{data.val.size / 1e6:.3f}M val tokens, {data.bytes_per_token:.3f} bytes/token"
    )
    log.info(
        f"model: width {m.width}, depth {m.depth}, heads {m.heads}, seq_len {m.seq_len} -> "
        f"{params / 1e6:.3f}M params ({params_nonembedding / 1e6:.3f}M non-embedding)"
    )
    log.info(
        f"optim: {cfg.optim.name}, lr {lr:.3g} (optim.lr {cfg.optim.lr:g}, scaling "
        f"{cfg.optim.lr_scaling}), {t.schedule} schedule, warmup {t.warmup_steps} steps"
    )
    where = (f"device {device}, {str(amp_dtype).removeprefix('torch.')}, "
             f"compile {compile_model}")
    if scheduled:
        how = (f"linear in tokens over the first {t.ramp_fraction:.0%} of them"
               if t.batch_schedule == "ramp" else
               f"following {t.adaptive.noise_factor:g} x B_noise, decided every "
               f"{t.adaptive.interval_steps} steps")
        log.info(f"train: {t.batch_schedule} batch {plan.start} -> {t.batch_size} sequences "
                 f"({how}) x {m.seq_len} tokens, {budget / 1e6:.3f}M tokens; micro-batches of "
                 f"{micro}; lr x {cfg.optim.lr_scaling} rule at each change; {where}")
    else:
        log.info(
            f"train: {steps} steps x {t.batch_size} sequences x {m.seq_len} tokens = "
            f"{budget / 1e6:.3f}M tokens; {accum} micro-batch(es) of {micro}; {where}"
        )
    if ranks.parallel:
        log.info(f"data-parallel: {ranks.world} ranks x {local} sequences")
    log.info(f"gns: B_noise tracked from small batches of {small} (ema {t.gns.ema})"
             if gns_on else "gns: off (needs train.gns.enabled and >= 2 micro-batches a step)")
    if ckpt:
        log.info(f"resumed from {ckpt_path} at step {state.step}/{steps or '?'} "
                 f"({state.tokens / 1e6:.3f}M tokens)")

    metrics_path = run_dir / "metrics.jsonl"
    if ranks.main:
        files.write_json_atomic(run_dir / "config.json",
                               {"config": resolved, "overrides": overrides})
        runs.truncate_metrics(metrics_path, state.step)  # rows after the checkpoint go

    import wandb
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    name = cfg.logger.name or (",".join(o for o in overrides if not o.startswith("hydra")) or
                               "defaults")
    wandb_run = wandb.init(
        id=state.wandb_run_id,  # a resumed run continues its W&B run
        resume="allow" if state.wandb_run_id else None,
        mode=cfg.logger.mode if ranks.main else "disabled",
        project=cfg.logger.project,
        group=wandb_group(cfg),
        job_type=cfg.logger.job_type,
        name=name,
        dir=str(run_dir),
        config=resolved,
        tags=[cfg.optim.name, f"width{m.width}", cfg.scale],
        settings=wandb.Settings(console="off", silent=True),
    )
    curve, losses = state.curve, state.losses  # eval points; train loss per step
    pending: list[tuple] = []  # per step: step, tokens, batch, lr, loss, grad norm, |g_b|^2, time
    status, reason, diverged_step = state.status, state.status_reason, state.diverged_step
    saver = checkpoint.Every(t.checkpoint_every_steps, t.checkpoint_every_minutes, state.step)
    t0 = time.perf_counter() - state.elapsed_s
    step, tokens_done, changes = state.step, state.tokens, state.batch_changes
    eval_at = [x for x in eval_at if x > tokens_done]
    batch_size = plan.next(step, tokens_done, gns.b_noise) if status == "completed" else 0
    with finishing(wandb_run), logging_redirect_tqdm():
        # the bar counts tokens when the step count is not known ahead
        bar = tqdm(total=steps or budget, initial=state.step if steps else tokens_done,
                   desc="train", unit="step" if steps else "tok", unit_scale=not steps,
                   disable=None if ranks.main else True)
        while batch_size:  # 0 once the budget is spent or the run diverged
            if scheduled:
                factor = lr_factor_by_tokens(step, tokens_done + batch_size * m.seq_len, budget, t)
                factor *= batch_lr_ratio(cfg.optim, batch_size, t.batch_size)
            else:
                factor = lr_factor(step, steps, t)
            set_lr(optimizers, factor)
            local = batch_size // ranks.world
            accum = local // micro
            batch = sample_batch(data.train, m.seq_len, batch_size, t.seed, step)  # (B, T+1)
            batch = batch[ranks.rank * local : (ranks.rank + 1) * local]  # this rank's share
            batch = batch.to(device, non_blocking=True)
            loss_sum = torch.zeros((), device=device)
            micro_sq = torch.zeros((), device=device)  # sum over micro-batches of |g_b|^2
            if micro_norms is not None:
                micro_norms.accum = accum
            for i in range(accum):
                x = batch[i * micro : (i + 1) * micro, :-1]  # (micro, T)
                y = batch[i * micro : (i + 1) * micro, 1:]
                with autocast:
                    loss = step_model(x, y)
                (loss / accum).backward()
                loss_sum += loss.detach()
                if micro_norms is not None:
                    micro_sq += micro_norms.pop()
            if ranks.parallel:  # average gradients (and losses) over ranks: the global step
                small_sq = average_gradients(list(model.parameters()), ranks)
                loss_sum = mean_over_ranks(loss_sum, ranks)
            else:
                small_sq = micro_sq / accum  # mean |g_b|^2 over the micro-batches
            max_norm = t.grad_clip if t.grad_clip > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            step, tokens_done = step + 1, tokens_done + batch_size * m.seq_len
            pending.append((step, tokens_done, batch_size, accum, factor * lr, loss_sum / accum,
                            grad_norm, small_sq, time.perf_counter() - t0))
            bar.update(1 if steps else batch_size * m.seq_len)

            last = plan.is_last(tokens_done)
            eval_now = last or (eval_at and tokens_done >= eval_at[0])
            save_now = ranks.main and not last and saver.due(step)  # after a flush
            if save_now or eval_now or step % t.log_every == 0 or last or plan.decides(step):
                rows = _flush(pending)
                pending.clear()
                for row in rows:
                    g2_small, row_accum = row.pop("small_grad_sq"), row.pop("accum")
                    if gns_on and (ranks.parallel or row_accum >= 2):
                        # |g_B|^2 is the pre-clipping norm of the accumulated gradient
                        row.update(gns.update(g2_small, row["grad_norm"] ** 2, row["train_loss"],
                                              big=row["batch_size"]))
                if ranks.main:
                    files.append_jsonl(metrics_path, rows)
                for row in rows:
                    wandb_run.log({k: v for k, v in row.items() if k != "step" and v is not None},
                                  step=row["step"])
                losses.extend(row["train_loss"] for row in rows)
                bar.set_postfix(train_loss=f"{losses[-1]:.3f}")
                reason = is_diverged(losses, losses[0], t.diverge_factor, t.diverge_window)
                if reason:
                    status, diverged_step = "diverged", step
                    log.warning(f"step:{step}/{steps or '?'} diverged: {reason}; stopping")
            if eval_now and status == "completed":
                eval_at = [x for x in eval_at if x > tokens_done]
                t_eval = time.perf_counter()
                val_loss = evaluate(step_model, val, micro, device, autocast)
                point = {
                    "step": step,
                    "tokens": tokens_done,
                    "val_loss": val_loss,
                    "val_loss_per_byte": val_loss / data.bytes_per_token,
                    "eval_time_s": time.perf_counter() - t_eval,
                }
                curve.append(point)
                wandb_run.log({k: point[k] for k in ("tokens", "val_loss", "val_loss_per_byte")},
                              step=step)
                log.info(
                    f"step:{step}/{steps or '?'} tokens:{point['tokens'] / 1e6:.3f}M "
                    f"val_loss:{val_loss:.4f} val_loss_per_byte:{point['val_loss_per_byte']:.4f} "
                    f"train_loss:{losses[-1]:.4f} lr:{factor * lr:.3g}"
                    + (f" batch:{batch_size}" if scheduled else "")
                )
            if status == "diverged":
                break
            previous, batch_size = batch_size, plan.next(step, tokens_done, gns.b_noise)
            if scheduled and batch_size and batch_size != previous:
                changes.append({"step": step, "tokens": tokens_done, "batch_size": batch_size})
                log.info(f"step:{step} tokens:{tokens_done / 1e6:.3f}M batch {previous} -> "
                         f"{batch_size} sequences" + (f" (B_noise {gns.b_noise:.0f})"
                                                      if gns.b_noise is not None else ""))
            if save_now:
                snap = checkpoint.TrainState(step, curve, losses, status, reason, diverged_step,
                                             time.perf_counter() - t0, wandb_run.id,
                                             state.resumed_at, tokens_done, changes, plan.state())
                saver.record(step, checkpoint.save(ckpt_path, model, optimizers, resolved, gns,
                                                   snap))
        bar.close()

        wall_time = time.perf_counter() - t0
        done_steps = step
        if ranks.main:  # the final checkpoint: the weights other programs read, and the state
            snap = checkpoint.TrainState(done_steps, curve, losses, status, reason, diverged_step,
                                         wall_time, wandb_run.id, state.resumed_at, tokens_done,
                                         changes, plan.state())
            saver.record(done_steps, checkpoint.save(ckpt_path, model, optimizers, resolved, gns,
                                                     snap))
        train_seconds = max(1e-9, wall_time - _eval_time(curve))
        final = curve[-1] if curve and status == "completed" else None
        versions = runs.package_versions()
        summary = {
            "schema_version": runs.SCHEMA_VERSION,
            "status": status,
            "sweep": cfg.sweep,
            "seed": t.seed,
            "optimizer": cfg.optim.name,
            "lr": lr,
            "width": m.width,
            "depth": m.depth,
            "heads": m.heads,
            "seq_len": m.seq_len,
            "vocab_size": cfg.data.vocab_size,
            "params": params,
            "params_nonembedding": params_nonembedding,
            "batch_size": t.batch_size,
            "micro_batch_size": micro,
            "steps": done_steps,
            "tokens": tokens_done,
            "warmup_steps": t.warmup_steps,
            "schedule": t.schedule,
            "bytes_per_token": data.bytes_per_token,
            "val_loss": final["val_loss"] if final else float("nan"),
            "val_loss_per_byte": final["val_loss_per_byte"] if final else float("nan"),
            "curve": [{k: p[k] for k in runs.CURVE_KEYS} for p in curve],
            "wall_time_s": wall_time,
            "tokens_per_s": tokens_done / train_seconds,
            "data_name": cfg.data.name,
            "data_fingerprint": data.fingerprint,
            "git_revision": runs.git_revision(),
            "critbatch_version": versions["critbatch"],
            # beyond the required keys
            "scale": cfg.scale,
            "status_reason": reason,
            "diverged_step": diverged_step,
            "lr_scaling": cfg.optim.lr_scaling,
            "base_lr": cfg.optim.lr,  # the lr at base_batch_size, before lr_scaling
            "base_batch_size": cfg.optim.base_batch_size,
            # batch schedule (constant: start = final = mean = batch_size, no changes)
            "batch_schedule": t.batch_schedule,
            "batch_size_start": plan.start,
            "batch_size_final": _final_batch(plan.start, changes),  # the last step's
            "batch_size_max": max([plan.start] + [c["batch_size"] for c in changes]),
            "batch_size_mean": tokens_done / max(1, done_steps) / m.seq_len,
            "batch_changes": changes,  # {step, tokens, batch_size}: the batch from `step` on
            "min_lr_ratio": t.min_lr_ratio,
            "device": str(device),
            "dtype": str(amp_dtype).removeprefix("torch."),
            "compile": compile_model,
            "overrides": overrides,
            "versions": versions,
            "wandb_run_id": wandb_run.id if cfg.logger.mode != "disabled" else None,
            # online gradient noise scale (EMA at the end; None when off or not resolved)
            "b_noise": gns.b_noise,  # sequences
            "b_noise_tokens": gns.b_noise * m.seq_len if gns.b_noise is not None else None,
            "b_noise_loss": gns.loss,  # train loss (nats/token, same EMA) it was measured at
            "b_noise_loss_per_byte": (gns.loss / data.bytes_per_token
                                      if gns.loss is not None else None),
            "gns_g2": gns.g2,
            "gns_trace": gns.trace,
            "gns_steps": gns.steps,
            "gns_skipped": gns.skipped,  # gradient spikes left out of the averages
            "gns_ema": t.gns.ema if gns_on else None,
            "world_size": ranks.world,
            "resumed_at": state.resumed_at,  # steps this run was resumed from (killed before)
            "checkpoint_saves": saver.saves,  # by this process, the final one included
            "checkpoint_time_s": saver.seconds,  # their total time
        }
        if ranks.main:
            files.write_json_atomic(run_dir / "summary.json", summary)
        wandb_run.summary.update(
            {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
        )
    shutdown(ranks)
    log.info(
        f"{status}: val_loss {summary['val_loss']:.4f} nats/token "
        f"({summary['val_loss_per_byte']:.4f} nats/byte) after {summary['tokens'] / 1e6:.3f}M "
        f"tokens in {wall_time:.1f}s ({summary['tokens_per_s']:,.0f} tokens/s); {run_dir}"
    )
    return summary


@contextmanager
def finishing(wandb_run):
    """Finish the W&B run on the way out; after an error, marked failed and without the
    traceback that wandb's own `with` prints (the error itself becomes one line)."""
    try:
        yield wandb_run
    except BaseException:
        wandb_run.finish(exit_code=1)
        raise
    wandb_run.finish()


def _eval_time(curve: list[dict]) -> float:
    return sum(p["eval_time_s"] for p in curve)


def _final_batch(start: int, changes: list[dict]) -> int:
    return changes[-1]["batch_size"] if changes else start


def _flush(pending: list[tuple]) -> list[dict]:
    """Turn buffered per-step tensors into metrics rows with one host sync."""
    if not pending:
        return []
    values = torch.stack([torch.stack([p[5].float(), p[6].float(), p[7].float()])
                          for p in pending]).tolist()
    return [
        {
            "step": step,
            "tokens": tokens,
            "batch_size": batch_size,  # sequences this step
            "lr": lr,
            "train_loss": loss,
            "grad_norm": gnorm,
            "time_s": elapsed,
            "accum": accum,  # micro-batches this step (used, then dropped)
            "small_grad_sq": small_sq,  # mean |g_b|^2 over the small batches (0 when gns off)
        }
        for (step, tokens, batch_size, accum, lr, *_, elapsed), (loss, gnorm, small_sq)
        in zip(pending, values, strict=True)
    ]


# ---------------------------------------------------------------------------
# Entry point

















