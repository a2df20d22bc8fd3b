"""What `train()` sets up before its first step, and the lines it logs about it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from critbatch.results.errors import ConfigError
from critbatch.science.model_size import param_count
from critbatch.science.noise import NoiseEMA
from critbatch.science.rules import decay_at, decay_half_life_tokens
from critbatch.training import checkpoint
from critbatch.training.batching import BatchPlan
from critbatch.training.checkpoint import TrainState
from critbatch.training.config import (
    Config,
    lr_batch_size,
    micro_batch_size,
    plain,
    total_steps,
)
from critbatch.training.data import check_seq_len, coverage_warnings, val_windows
from critbatch.training.distributed import Ranks, init_ranks
from critbatch.training.memory import reuse_freed_memory
from critbatch.training.optim import used_lr
from critbatch.training.step import Stepper, build_stepper, resolve_device
from critbatch.training.token_cache import TokenData, prepare_data

log = logging.getLogger("critbatch")


@dataclass
class Trainer:
    """One run's pieces: config, data, device, the step's model and optimizers, the batch
    plan, the noise tracker and the state carried from step to step (and checkpoints)."""

    cfg: Config
    run_dir: Path
    overrides: list[str]  # the command line's, saved beside the run
    resolved: dict  # asdict(cfg): config.json, W&B, and every checkpoint
    data: TokenData
    val: torch.Tensor  # (n_windows, T+1) the fixed validation windows
    device: torch.device
    dtype: torch.dtype  # autocast dtype (float32: none)
    compile: bool
    ranks: Ranks
    stepper: Stepper
    params: int
    params_nonembedding: int
    lr: float  # peak lr the optimizers were built with (config.lr_batch_size; lr_scaling applied)
    plan: BatchPlan  # the batch of every step
    steps: int | None  # optimizer steps of a constant batch; None: known at a schedule's end
    gns: NoiseEMA  # the online noise scale (updated only when gns_on)
    gns_on: bool
    state: TrainState  # updated in place as training goes; what a checkpoint saves
    resumed: bool  # the state came from a checkpoint

    @property
    def scheduled(self) -> bool:
        return self.plan.kind != "constant"

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


def build_trainer(cfg: Config, run_dir: Path, overrides: list[str]) -> Trainer:
    """Everything before the first step; resumes the state of a checkpoint in `run_dir`
    (refusing one that another config wrote) and checks the batch splits into ranks."""
    run_dir.mkdir(parents=True, exist_ok=True)
    reuse_freed_memory()  # before the model and its first step allocate
    t = cfg.train
    resolved = plain(cfg)
    ckpt = checkpoint.load(run_dir / "checkpoint.pt", resolved)
    device, dtype, compiled = resolve_device(cfg)
    ranks = init_ranks(device.type)  # one process, or torchrun's data-parallel ranks
    if ranks.parallel and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    data = prepare_data(cfg.data)
    check_seq_len(data, cfg.model.seq_len)
    plan = BatchPlan(cfg)
    micro = micro_batch_size(cfg)
    if ranks.parallel and plan.kind != "constant":
        raise ConfigError(f"train.batch_schedule={t.batch_schedule} runs in one process; "
                          "use train.batch_schedule=constant under torchrun")
    if t.batch_size % ranks.world:
        raise ConfigError(f"train.batch_size={t.batch_size} does not split into {ranks.world} "
                          f"ranks; pick a multiple of {ranks.world}")
    if t.batch_size % (ranks.world * micro):
        raise ConfigError(
            f"train.batch_size={t.batch_size} does not split into {ranks.world} ranks x "
            f"micro-batches of {micro}; pick a batch size divisible by {ranks.world * micro}, "
            f"or set train.micro_batches (a multiple of {ranks.world}) or train.micro_batch_size"
        )
    # gradient noise scale: the step's batch is the big batch; the small one is each rank's
    # share under torchrun, else each micro-batch of gradient accumulation
    gns_on = t.gns.enabled and (ranks.parallel or plan.end // micro >= 2)
    small = t.batch_size // ranks.world if ranks.parallel else micro
    stepper = build_stepper(cfg, device, dtype, compiled, ranks=ranks,
                            track_micro_norms=gns_on and not ranks.parallel)
    params, params_nonembedding = param_count(cfg.model.width, cfg.model.depth,
                                              cfg.model.seq_len, cfg.data.vocab_size)
    assert params == sum(p.numel() for p in stepper.model.parameters())
    gns = NoiseEMA(t.gns.ema, b=small, big=t.batch_size)
    if ckpt:
        state = checkpoint.restore(ckpt, stepper.model, stepper.optimizers, gns)
    else:
        state = TrainState()
    if state.step and not state.tokens:  # a checkpoint from before token counting: constant
        state.tokens = state.step * t.batch_size * cfg.model.seq_len
    plan.restore(state.batch_plan)
    return Trainer(
        cfg=cfg, run_dir=run_dir, overrides=overrides, resolved=resolved, data=data,
        val=val_windows(data.val, cfg.model.seq_len, t.eval_tokens), device=device,
        dtype=dtype, compile=compiled, ranks=ranks, stepper=stepper, params=params,
        params_nonembedding=params_nonembedding, lr=used_lr(cfg.optim, lr_batch_size(cfg)),
        plan=plan, steps=None if plan.kind != "constant" else total_steps(cfg), gns=gns,
        gns_on=gns_on, state=state, resumed=ckpt is not None,
    )


def log_start(tr: Trainer) -> None:
    """What the run derived from its config: data, model, lr, steps and batch, device."""
    cfg, t, m, data = tr.cfg, tr.cfg.train, tr.cfg.model, tr.data
    log.info(
        f"data={cfg.data.name}: {data.train.size / 1e6:.2f}M train tokens, "
        f"{data.val.size / 1e6:.3f}M val tokens, {data.bytes_per_token:.3f} bytes/token"
    )
    for line in coverage_warnings(data, cfg.data.name, tr.plan.budget, t.eval_tokens):
        log.warning(line)
    log.info(
        f"model: width {m.width}, depth {m.depth}, heads {m.heads}, seq_len {m.seq_len} -> "
        f"{tr.params / 1e6:.3f}M params ({tr.params_nonembedding / 1e6:.3f}M non-embedding)"
    )
    log.info(f"optim: {cfg.optim.name}, {lr_words(cfg, tr.lr, lr_batch_size(cfg))}; "
             f"{decay_words(cfg, 'beta2', lr_batch_size(cfg))}; "
             + (f"{decay_words(cfg, 'momentum', lr_batch_size(cfg))}; " if cfg.optim.name == "muon"
                else "")
             + f"{t.schedule} schedule, warmup {t.warmup_steps} steps")
    micro, local = tr.stepper.micro, t.batch_size // tr.ranks.world
    where = f"device {tr.device}, {dtype_name(tr.dtype)}, compile {tr.compile}"
    if tr.scheduled:
        how = {"ramp": f"linear in tokens over the first {t.ramp_fraction:.0%} of them",
               "adaptive": f"following {t.adaptive.noise_factor:g} x B_noise, decided every "
                           f"{t.adaptive.interval_steps} steps",
               "switch": f"switching after {(t.switch_at_tokens or 0) / 1e6:.3f}M tokens",
               "measured": f"doubled while the measured B_crit > {t.measured.factor:g} x it"
               }[t.batch_schedule]
        log.info(f"train: {t.batch_schedule} batch {tr.plan.start} -> {t.batch_size} sequences "
                 f"({how}) x {m.seq_len} tokens, {tr.plan.budget / 1e6:.3f}M tokens; "
                 f"micro-batches of {micro}; lr x {cfg.optim.lr_scaling} rule at each change; "
                 f"{where}")
    else:
        log.info(
            f"train: {tr.steps} steps x {t.batch_size} sequences x {m.seq_len} tokens = "
            f"{tr.plan.budget / 1e6:.3f}M tokens; {local // micro} micro-batch(es) of {micro}; "
            f"{where}"
        )
    if t.batch_schedule == "measured":
        points = ", ".join(f"{b:g} at {tokens / 1e6:.3g}M" for tokens, b in tr.plan.curve)
        source = "the checkpoint's copy" if tr.resumed else t.measured.fits
        log.info(f"measured: B_crit (sequences) at tokens from {source}: {points}")
    if t.data_chunk:
        log.info(f"data: each step's batch is chunks of {t.data_chunk} sequences, numbered by the "
                 "sequences trained so far (train.data_chunk)")
    if tr.ranks.parallel:
        log.info(f"data-parallel: {tr.ranks.world} ranks x {local} sequences, "
                 f"{tr.ranks.backend} backend")
    log.info(f"gns: B_noise tracked from small batches of {tr.gns.b} (ema {t.gns.ema})"
             if tr.gns_on else "gns: off (needs train.gns.enabled and >= 2 micro-batches a step)")
    if tr.resumed:
        log.info(f"resumed from {tr.checkpoint_path} at step {tr.state.step}/{tr.steps or '?'} "
                 f"({tr.state.tokens / 1e6:.3f}M tokens)")


def lr_words(cfg: Config, lr: float, batch_size: int) -> str:
    """The peak lr trained at `batch_size` and where it came from, for the log: run folders
    are named by optim.lr, the base lr, which `optim.lr_scaling` carries to the batch."""
    o = cfg.optim
    if o.lr_scaling == "none":
        return f"lr {lr:.3g} (optim.lr; optim.lr_scaling=none)"
    if batch_size == o.base_batch_size:
        return f"lr {lr:.3g} (optim.lr, trained as given at its base batch {batch_size})"
    return (f"base lr {o.lr:g} (optim.lr, at batch {o.base_batch_size}), trained at {lr:.3g} "
            f"by the {o.lr_scaling} rule at batch {batch_size}")


def decay_words(cfg: Config, key: str, batch_size: int) -> str:
    """A per-step decay (`optim.beta2`: AdamW's, `optim.momentum`: Muon's) at `batch_size`, its
    half-life in tokens, and where it came from (as given, or carried from the base batch by
    `optim.<key>_scaling=tokens`)."""
    o = cfg.optim
    given, rule = getattr(o, key), getattr(o, f"{key}_scaling")
    value = decay_at(given, rule, batch_size, o.base_batch_size)
    half = decay_half_life_tokens(value, batch_size, cfg.model.seq_len)
    which = ("Muon" if key == "momentum" else
             "AdamW" if o.name == "adamw" else "AdamW on embeddings and gains")
    source = (f"optim.{key}" if rule == "none" or batch_size == o.base_batch_size
              else f"optim.{key} {given:g} at batch {o.base_batch_size}, carried by "
                   f"optim.{key}_scaling=tokens")
    return f"{which} {key} {value:.4g} ({source}; half-life {half:,.0f} tokens)"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
