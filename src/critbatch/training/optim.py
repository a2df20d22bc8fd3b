"""Optimizers (AdamW, Muon), their lr, beta2 and momentum at a batch size, and setting the lr
the schedule (`training.schedule`) gives."""

from __future__ import annotations

import math

import torch

from critbatch.science.rules import decay_at, lr_multiplier
from critbatch.training.config import OptimConfig
from critbatch.training.model import GPT


def used_lr(optim: OptimConfig, batch_size: int) -> float:
    """The peak lr actually used: `optim.lr * f(batch_size / optim.base_batch_size)`."""
    return optim.lr * lr_multiplier(optim.lr_scaling, batch_size, optim.base_batch_size)


def used_beta2(optim: OptimConfig, batch_size: int) -> float:
    """AdamW's beta2 at `batch_size` by `optim.beta2_scaling` (`science.rules.decay_at`)."""
    return decay_at(optim.beta2, optim.beta2_scaling, batch_size, optim.base_batch_size)


def used_momentum(optim: OptimConfig, batch_size: int) -> float:
    """Muon's momentum at `batch_size` by `optim.momentum_scaling` (`science.rules.decay_at`)."""
    return decay_at(optim.momentum, optim.momentum_scaling, batch_size, optim.base_batch_size)


def build_optimizers(model: GPT, optim: OptimConfig, batch_size: int, device_type: str) -> list:
    """The optimizers of a run; every param group carries its `peak_lr` for the schedule.

    adamw: one AdamW over everything; weight decay only on the 2D hidden matrices
    (never on gains or embeddings).

    muon: `Muon` (`torch.optim.Muon`, Jordan et al. 2024) on the 2D hidden matrices of the
    blocks -- Nesterov momentum whose update is orthogonalised by five Newton-Schulz
    iterations (in `optim.ns_dtype`), scaled by sqrt(max(1, rows/cols)) ("original"
    adjustment), with decoupled weight decay. Muon assumes 2D parameters and is not meant for
    embeddings or the (tied) output layer, whose rows are per-token vectors, nor
    for gains; those go to an AdamW with its own lr (`optim.aux_lr`) and no decay.
    The attention's fused qkv matrix is orthogonalised as one (3d x d) matrix.
    Both lrs follow the same lr-scaling rule and schedule.
    """
    scale = used_lr(optim, batch_size) / optim.lr
    hidden = model.hidden_matrices()
    hidden_ids = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if id(p) not in hidden_ids]
    adam_kw = adamw_options(optim, device_type, batch_size)
    if optim.name == "adamw":
        lr = optim.lr * scale
        groups = [
            {"params": hidden, "weight_decay": optim.weight_decay, "lr": lr, "peak_lr": lr},
            {"params": rest, "weight_decay": 0.0, "lr": lr, "peak_lr": lr},
        ]
        return [torch.optim.AdamW(groups, **adam_kw)]
    muon_lr, aux_lr = optim.lr * scale, optim.aux_lr * scale
    muon = Muon(
        [{"params": hidden, "lr": muon_lr, "peak_lr": muon_lr}],
        ns_dtype=ns_dtype(optim, device_type),
        lr=muon_lr,
        weight_decay=optim.weight_decay,
        momentum=used_momentum(optim, batch_size),
        nesterov=True,
        adjust_lr_fn="original",
    )
    aux = torch.optim.AdamW(
        [{"params": rest, "weight_decay": 0.0, "lr": aux_lr, "peak_lr": aux_lr}], **adam_kw
    )
    return [muon, aux]


def ns_dtype(optim: OptimConfig, device_type: str) -> torch.dtype:
    """Muon's Newton-Schulz precision: `optim.ns_dtype`, auto = bfloat16 on CUDA, else float32."""
    name = str(optim.ns_dtype)
    if name == "auto":
        name = "bfloat16" if device_type == "cuda" else "float32"
    return getattr(torch, name)


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` with its Newton-Schulz iteration in `ns_dtype`; the same step
    otherwise (momentum, torch's own lr adjustment, decay, state), so checkpoints load either
    way. torch's iterates in bfloat16, which a CPU without bf16 instructions emulates."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **kw) -> None:
        super().__init__(params, **kw)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"],
                                       group["eps"], self.ns_dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-muon_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


def muon_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """Muon's lr for a (rows, cols) matrix, by torch.optim.Muon's `adjust_lr_fn`: "original"
    (Jordan et al. 2024, the default) scales by sqrt(max(1, rows/cols)); "match_rms_adamw"
    (Liu et al. 2025, Moonlight) by 0.2 sqrt(max(rows, cols)), which gives the update AdamW's
    RMS; anything else leaves `lr` as it is."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def newton_schulz(grad: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of Muon (Jordan et al. 2024) in `dtype`: an
    approximate orthogonalisation U S' V^T of grad = U S V^T, S' near 1. As torch's, on the
    wide orientation of the matrix, after scaling its Frobenius norm to at most 1."""
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adamw_options(optim: OptimConfig, device_type: str, batch_size: int | None = None) -> dict:
    """AdamW's keyword arguments: betas (beta2 by `used_beta2` at `batch_size`; None: as
    given), eps, and the fused (one kernel over every tensor) or foreach (a few ops per tensor
    list) implementation -- fused unless `optim.fused` says otherwise; `make bench` measures
    both on the current device."""
    fused = optim.fused if optim.fused is not None else device_type in ("cpu", "cuda")
    impl = {"fused": True} if fused else {"foreach": True}
    beta2 = optim.beta2 if batch_size is None else used_beta2(optim, batch_size)
    return dict(betas=(optim.beta1, beta2), eps=optim.eps, **impl)


def batch_lr_ratio(optim: OptimConfig, batch_size: int, built_for: int) -> float:
    """lr at `batch_size` over the lr the optimizers were built for (batch `built_for`), by
    `optim.lr_scaling`; 1.0 exactly when the two batches agree."""
    if batch_size == built_for:
        return 1.0
    return lr_multiplier(optim.lr_scaling, batch_size, built_for)


def set_lr(optimizers: list, factor: float) -> None:
    """Set every param group's lr to its `peak_lr` x `factor`."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["peak_lr"] * factor
