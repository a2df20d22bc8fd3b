"""Gradient-noise hooks: per-micro-batch squared norms during training, and per-micro-batch
gradients for the offline measurement."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from critbatch.science.noise import GroupSums, NoiseEMA


class MicroGradNorms:
    """Each micro-batch's own squared gradient norm during accumulation, at no extra pass.

    A hook on every parameter sees the gradient that micro-batch i's backward of
    (loss_i / accum) is about to add into .grad, which is g_i / accum, so

        |g_i|^2 = accum^2 sum_params |incoming grad|^2.

    The hooks only collect these incoming gradients (a list append: the gradient and its
    accumulation are unchanged); `pop`, right after the micro-batch's backward, takes their
    total norm in one multi-tensor kernel (`torch.nn.utils.get_total_norm`) on the device, no
    host sync: one launch per micro-batch rather than one per parameter, for one gradient's
    worth of memory held until then.
    The big batch costs nothing: |g_B|^2 is the square of the pre-clipping norm that
    `clip_grad_norm_` returns anyway. Under torchrun the hooks are off: each rank's share of
    the batch is the small batch instead (`distributed.average_gradients`).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], accum: int) -> None:
        self.accum = accum
        self.grads: list[torch.Tensor] = []  # incoming gradients of the running backward
        self.handles = [p.register_hook(self.grads.append) for p in params if p.requires_grad]

    @torch.no_grad()
    def pop(self) -> torch.Tensor:
        """|g_i|^2 (0-d tensor) of the micro-batch whose backward just ran."""
        norm = torch.nn.utils.get_total_norm(self.grads, norm_type=2.0)
        self.grads.clear()
        return norm.float().square() * self.accum**2

    def remove(self) -> None:
        """Detach the hooks (the model is then as if never tracked)."""
        for handle in self.handles:
            handle.remove()


def micro_batch_gradients(model: torch.nn.Module, micro_batches: Iterable[torch.Tensor],
                          device: torch.device, autocast) -> Iterator[tuple]:
    """(flat gradient (P,), loss) of each micro-batch (b, T+1) of token ids: one fwd + bwd."""
    params = [p for p in model.parameters() if p.requires_grad]
    for batch in micro_batches:
        batch = batch.to(device, non_blocking=True)
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        yield torch.cat([p.grad.flatten() for p in params]), loss.detach()
    model.zero_grad(set_to_none=True)


def group_sums(gradients: Iterable[tuple], groups: int) -> GroupSums:
    """Deal (gradient, loss) pairs round-robin into `groups` groups; their `GroupSums`."""
    sums = sq_sums = loss_sums = None
    counts = np.zeros(groups, dtype=np.int64)
    for i, (grad, loss) in enumerate(gradients):
        if sums is None:
            sums = torch.zeros(groups, grad.numel(), device=grad.device)  # (m, P): T_k
            sq_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
            loss_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
        k = i % groups
        sums[k] += grad
        sq_sums[k] += grad.double().square().sum()
        loss_sums[k] += loss
        counts[k] += 1
    sums64 = sums.double()
    return GroupSums(gram=(sums64 @ sums64.T).cpu().numpy(), sq_sums=sq_sums.cpu().numpy(),
                     counts=counts, loss_sums=loss_sums.cpu().numpy())


def hessian_vector_product(model: torch.nn.Module, batch: torch.Tensor, device: torch.device):
    """v -> H v, H the Hessian of the mean loss on `batch` (n, T+1) at the model's weights:
    one forward and backward with its graph kept, then a double backward per product
    (Pearlmutter 1994). In float32, attention by its math kernel (the fused kernels have
    no double backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    params = [p for p in model.parameters() if p.requires_grad]
    batch = batch.to(device)
    with sdpa_kernel(SDPBackend.MATH):
        loss = model(batch[:, :-1], batch[:, 1:])
        grads = torch.autograd.grad(loss, params, create_graph=True)

    def product(v: torch.Tensor) -> torch.Tensor:
        parts = [c.view_as(p) for c, p in zip(v.split([p.numel() for p in params]), params,
                                               strict=True)]
        with sdpa_kernel(SDPBackend.MATH):
            hv = torch.autograd.grad(grads, params, grad_outputs=parts, retain_graph=True)
        return torch.cat([h.flatten() for h in hv])

    return product


def hessian_group_sums(gradients: Iterable[tuple], hvp, groups: int) -> GroupSums:
    """`group_sums` with every inner product taken in H: <T_k, H T_l> and sum g_i' H g_i.
    Fed to `science.noise.estimate`, the two-batch estimators then give G'HG and tr(H Sigma)
    (E g_b' H g_b = G'HG + tr(H Sigma) / b, as for the plain norms), whose ratio is
    McCandlish et al.'s B_full = tr(H Sigma) / (G'HG). `hvp`: v -> H v with H estimated on
    other data than the gradients (`hessian_vector_product`), so that it is independent of
    them."""
    sums = hsums = sq_sums = loss_sums = None
    counts = np.zeros(groups, dtype=np.int64)
    for i, (grad, loss) in enumerate(gradients):
        hgrad = hvp(grad).to(torch.float64)
        if sums is None:
            sums = torch.zeros(groups, grad.numel(), dtype=torch.float64, device=grad.device)
            hsums = torch.zeros_like(sums)
            sq_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
            loss_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
        k = i % groups
        sums[k] += grad.double()
        hsums[k] += hgrad
        sq_sums[k] += grad.double() @ hgrad
        loss_sums[k] += loss
        counts[k] += 1
    gram = sums @ hsums.T
    return GroupSums(gram=((gram + gram.T) / 2).cpu().numpy(), sq_sums=sq_sums.cpu().numpy(),
                     counts=counts, loss_sums=loss_sums.cpu().numpy())


class NoiseTracker:
    """B_noise from the micro-batch gradients of a training loop (module docstring).

    `micro_batch_size`: examples per micro-batch (b); `ema`: the per-step decay of the
    averages of |G|^2 and tr(Sigma) (bias-corrected, ratio taken last). Read `b_noise`,
    `g2`, `trace` after any `step`. The hooks only read gradients; `close` removes them.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], micro_batch_size: int,
                 ema: float = 0.95) -> None:
        if micro_batch_size < 1 or not 0 <= ema < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1 and "
                             f"ema={ema} in [0, 1)")
        self.params = [p for p in params if p.requires_grad]
        self.norms = MicroGradNorms(self.params, accum=1)
        self.average = NoiseEMA(ema, b=micro_batch_size, big=2 * micro_batch_size)
        self.small: list[torch.Tensor] = []  # |g_i|^2 of this step's micro-batches

    def micro_batch(self) -> None:
        """After a micro-batch's backward: record its own squared gradient norm."""
        self.small.append(self.norms.pop())

    @torch.no_grad()
    def step(self, loss: float = float("nan")) -> float | None:
        """After the step's last backward, before clipping: fold in the step from the
        micro-batches recorded and the accumulated gradient; return B_noise (None until
        resolved). The gradient is taken to be the mean of the micro-batches' (each loss
        divided by their number before its backward)."""
        k = len(self.small)
        if k < 2:
            raise ValueError(f"{k} micro-batch(es) recorded this step: the estimator needs "
                             "two or more (call micro_batch() after each backward)")
        # the hooks saw each gradient already divided by k: undo it
        small = float(torch.stack(self.small).mean()) * k**2
        grads = [p.grad for p in self.params if p.grad is not None]
        big = float(torch.nn.utils.get_total_norm(grads, norm_type=2.0)) ** 2
        self.small.clear()
        return self.update(small, big, big=k * self.average.b, loss=loss)

    def update(self, small_sq_norm: float, big_sq_norm: float, big: int,
               loss: float = float("nan")) -> float | None:
        """Fold in one step from the mean squared norm of the small-batch gradients and the
        squared norm of the big batch's (`big` examples); return B_noise."""
        loss = loss if loss == loss else 0.0  # the EMA's loss is optional here
        self.average.update(small_sq_norm, big_sq_norm, loss, big=big)
        return self.b_noise

    @property
    def b_noise(self) -> float | None:
        """tr(Sigma) / |G|^2 in examples; None while |G|^2 is not resolved."""
        return self.average.b_noise

    @property
    def g2(self) -> float | None:
        return self.average.g2

    @property
    def trace(self) -> float | None:
        return self.average.trace

    def close(self) -> None:
        """Remove the gradient hooks."""
        self.norms.remove()
