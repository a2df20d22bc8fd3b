"""One optimizer step, the one the trainer (loop.py) takes and the benchmark (bench/) times.

    micro-batches  forward, backward of loss / accum (gradient accumulation into .grad),
                   and each micro-batch's |g_b|^2 for the noise scale (gns.MicroGradNorms)
    torchrun       gradients and loss averaged over ranks; each rank's |g|^2 taken first
    lr             every param group's peak lr x the schedule's factor
    clip, step     the pre-clipping norm |g_B| (the noise scale's big batch), clipping,
                   every optimizer's step, gradients dropped
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch

from critbatch.results.errors import ConfigError
from critbatch.training.config import Config, OptimConfig, lr_batch_size, micro_batch_size
from critbatch.training.distributed import Ranks, average_gradients, mean_over_ranks
from critbatch.training.gns import MicroGradNorms
from critbatch.training.model import GPT
from critbatch.training.optim import build_optimizers, set_lr

COMPILE_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")  # torch.compile's own


def resolve_device(cfg: Config) -> tuple[torch.device, torch.dtype, bool]:
    """(device, autocast dtype, compile) from the `auto` settings. The gpu scale on a machine
    without CUDA is an error (it would train for hours on the CPU) unless train.device=cpu
    asks for it."""
    name = cfg.train.device
    if name == "auto" and cfg.scale == "gpu" and not torch.cuda.is_available():
        raise ConfigError("scale=gpu needs CUDA and none is available here; use scale=cpu "
                          "(SCALE=cpu) for this machine, or train.device=cpu to force the gpu "
                          "scale onto the CPU")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available; use train.device=cpu")
    device = torch.device(name)
    dtype_name = cfg.train.dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device.type == "cuda" else "float32"
    compile_model = cfg.train.compile if cfg.train.compile is not None else device.type == "cuda"
    if compile_model and cfg.train.compile_backend not in COMPILE_BACKENDS:
        raise ConfigError(f"train.compile_backend={cfg.train.compile_backend} is not one of "
                          f"{', '.join(COMPILE_BACKENDS)}")
    return device, getattr(torch, dtype_name), compile_model


def autocast_for(device: torch.device, dtype: torch.dtype) -> AbstractContextManager:
    """Mixed-precision autocast to `dtype`, or nothing for float32 (reusable across steps)."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)


@dataclass
class Stepper:
    """What an optimizer step works on; `build_stepper` makes one from a config."""

    model: GPT  # the parameters that are clipped and stepped
    forward: Callable  # the model, or its torch.compile: (x, y) -> mean loss (nats/token)
    optimizers: list
    autocast: AbstractContextManager
    micro: int  # sequences per forward/backward
    grad_clip: float  # max global gradient norm; 0 = no clipping
    ranks: Ranks = field(default_factory=Ranks)
    micro_norms: MicroGradNorms | None = None  # set: each micro-batch's |g_b|^2 is measured


def build_stepper(cfg: Config, device: torch.device, dtype: torch.dtype, compiled: bool, *,
                  optim: OptimConfig | None = None, ranks: Ranks | None = None,
                  track_micro_norms: bool = False) -> Stepper:
    """The model (initialised from `train.seed`), its optimizers and precision for `cfg`;
    `optim` replaces `cfg.optim` (the benchmark's variants).

    A compiled model starts from an empty dynamo cache: dynamo keys its cache on the code of
    `GPT.forward`, shared by every model a worker trains, and after `recompile_limit` (8)
    entries it falls back to eager for good. Each run compiles train and eval (grad mode is a
    guard), so without the reset a long-lived worker trained later shapes uncompiled (ten tiny
    widths in one process hit the limit: tests/test_compile_workers.py).
    """
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model, cfg.data.vocab_size).to(device)
    optimizers = build_optimizers(model, optim or cfg.optim, lr_batch_size(cfg), device.type)
    if compiled:
        torch._dynamo.reset()
    return Stepper(
        model=model,
        forward=torch.compile(model, backend=cfg.train.compile_backend) if compiled else model,
        optimizers=optimizers,
        autocast=autocast_for(device, dtype),
        micro=micro_batch_size(cfg),
        grad_clip=cfg.train.grad_clip,
        ranks=ranks or Ranks(),
        micro_norms=MicroGradNorms(model.parameters(), 1) if track_micro_norms else None,
    )


@dataclass
class StepResult:
    """What a step measured, as 0-d tensors on the device (read later, in one host sync)."""

    loss: torch.Tensor  # mean train loss over the step's batch (all ranks), nats/token
    grad_norm: torch.Tensor  # global gradient norm before clipping: |g_B|
    small_grad_sq: torch.Tensor  # mean |g_b|^2 over the small batches; 0 when not measured
    accum: int  # micro-batches this rank took


def _nothing() -> None:
    pass


def train_step(s: Stepper, batch: torch.Tensor, lr_factor: float,
               mark: Callable[[], None] = _nothing) -> StepResult:
    """One optimizer step on `batch`, this rank's (B, T+1) token ids on the device.

    The small batches of the noise scale: each rank's share under torchrun, else each
    micro-batch when `s.micro_norms` is set. `mark` is called once, when the gradient is
    ready and before the lr, clipping and update (the benchmark's clock).
    """
    accum = len(batch) // s.micro
    loss_sum = torch.zeros((), device=batch.device)
    micro_sq = torch.zeros((), device=batch.device)  # sum over micro-batches of |g_b|^2
    if s.micro_norms is not None:
        s.micro_norms.accum = accum
    for i in range(accum):
        x = batch[i * s.micro : (i + 1) * s.micro, :-1]  # (micro, T)
        y = batch[i * s.micro : (i + 1) * s.micro, 1:]
        with s.autocast:
            loss = s.forward(x, y)
        (loss / accum).backward()
        loss_sum += loss.detach()
        if s.micro_norms is not None:
            micro_sq += s.micro_norms.pop()
    if s.ranks.parallel:  # average gradients (and losses) over ranks: the global step
        small_sq = average_gradients(list(s.model.parameters()), s.ranks)
        loss_sum = mean_over_ranks(loss_sum, s.ranks)
    else:
        small_sq = micro_sq / accum  # mean |g_b|^2 over the micro-batches
    mark()
    set_lr(s.optimizers, lr_factor)
    max_norm = s.grad_clip if s.grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), max_norm)
    for opt in s.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return StepResult(loss=loss_sum / accum, grad_norm=grad_norm, small_grad_sq=small_sq,
                      accum=accum)
