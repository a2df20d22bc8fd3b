"""Optimizers (AdamW, Muon) and the learning-rate schedule as a pure function of the step."""

from __future__ import annotations

import math

import torch

from critbatch.science.rules import decay_at, lr_multiplier
from critbatch.training.config import OptimConfig, TrainConfig
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


def lr_factor(step: int, total_steps: int, train: TrainConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based), a pure function.

    Linear warmup over `warmup_steps` optimizer steps (counted in steps, never
    rescaled with the batch size), then:
      cosine   -- half cosine from 1 to min_lr_ratio at the last step;
      linear   -- straight line from 1 to min_lr_ratio;
      constant -- 1;
      wsd      -- 1 until `wsd_decay_start`, then a 1-sqrt cooldown to min_lr_ratio at the
                  last step (`cooldown`).
    """
    warmup = train.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if train.schedule == "wsd":
        start = wsd_decay_start(total_steps, train)
        if step < start:
            return 1.0
        return cooldown((step - start + 1) / max(1, total_steps - start), train.min_lr_ratio)
    span = max(1, total_steps - 1 - warmup)
    return _decay(min(1.0, (step - warmup) / span), train)


# where in the constant-lr phase the online noise tracker is read with a validation loss
# (`constant_lr_reading_steps`): a quarter of the way, half, three quarters and its end
READING_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def constant_lr_reading_steps(total_steps: int, train: TrainConfig) -> list[int]:
    """Step counts (steps taken) at which every step so far since the warmup ran at the peak
    lr: READING_FRACTIONS of the way from the warmup's end to the last peak-lr step (a wsd
    run's cooldown start, a constant run's end). Empty for schedules with no constant phase
    (cosine, linear). The online B_noise read there has not seen a decaying lr, which moves
    |G|^2 and so B_noise (docs/science.md, the noise scale checked)."""
    if train.schedule == "wsd":
        last = wsd_decay_start(total_steps, train)
    elif train.schedule == "constant":
        last = total_steps
    else:
        return []
    first = train.warmup_steps
    if last - first < 2 * len(READING_FRACTIONS):
        return []
    return sorted({first + round(f * (last - first)) for f in READING_FRACTIONS})


def wsd_decay_start(total_steps: int, train: TrainConfig) -> int:
    """The first step of a wsd run's cooldown: the last `cooldown_fraction` of the steps
    (never inside the warmup). Steps before it run at the peak lr whatever the budget, so
    a shorter run is a prefix of a longer one up to here (what a branch forks at), and
    it never decreases as the budget grows."""
    decay_steps = max(1, round(train.cooldown_fraction * total_steps))
    return max(train.warmup_steps, total_steps - decay_steps)


def cooldown(progress: float, floor: float) -> float:
    """The wsd cooldown's multiplier at `progress` in (0, 1]: 1 - sqrt, from 1 to `floor`.

    1-sqrt keeps the lr high for longer than a straight line and drops it fast at the end;
    Hagele et al. 2024 (arXiv 2405.18392) found it matches or beats a linear cooldown and
    a cosine run of the same length.
    """
    return floor + (1.0 - floor) * (1.0 - math.sqrt(min(1.0, progress)))


def lr_factor_by_tokens(step: int, tokens_after: int, budget: int, train: TrainConfig) -> float:
    """Multiplier of the peak lr for a scheduled batch, whose step count is not known ahead.

    Warmup is still linear over `warmup_steps` optimizer steps; after it the decay follows
    the share of the token budget trained by the end of this step, `tokens_after / budget`,
    in place of the share of the steps (so the last step reaches min_lr_ratio; wsd:
    constant until 1 - cooldown_fraction of it).
    """
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    progress = min(1.0, tokens_after / budget)
    if train.schedule == "wsd":
        start = 1.0 - train.cooldown_fraction
        if progress < start:
            return 1.0
        return cooldown((progress - start) / train.cooldown_fraction, train.min_lr_ratio)
    return _decay(progress, train)


def _decay(progress: float, train: TrainConfig) -> float:
    """cosine, linear or constant from 1 at progress 0 to min_lr_ratio at progress 1."""
    floor = train.min_lr_ratio
    if train.schedule == "constant":
        return 1.0
    if train.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


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
