"""Gradient-noise hooks: per-micro-batch squared norms during training, and per-micro-batch
gradients for the offline measurement."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from critbatch.science.noise import GroupSums


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
