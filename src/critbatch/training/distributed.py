"""Data-parallel training under torchrun: `torchrun --nproc_per_node=N -m critbatch.train ...`.

Every rank draws the same global batch (it is a pure function of seed and step) and
trains on its own contiguous slice of it; the gradients are then averaged with one
all-reduce, so N ranks compute exactly the step a single process computes with the
same global batch (up to the order of floating-point sums). NCCL on CUDA, gloo on CPU.
Rank 0 alone writes the run directory and logs to W&B.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from critbatch.training.config import launched_world


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # this process's rank among all processes
    world: int = 1  # number of processes
    local_rank: int = 0  # rank on this machine (picks the GPU)

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes files and logs."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1

    @property
    def backend(self) -> str | None:
        """The process group's backend (nccl on GPUs, gloo on CPUs); None for one process."""
        return dist.get_backend() if self.parallel and dist.is_initialized() else None


def launched_ranks() -> Ranks:
    """The ranks torchrun announces in the environment (one process: rank 0 of 1)."""
    return Ranks(
        rank=int(os.environ.get("RANK", 0)),
        world=launched_world(),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def init_ranks(device_type: str) -> Ranks:
    """Join the process group when launched by torchrun; a no-op for one process."""
    ranks = launched_ranks()
    if ranks.parallel and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return ranks


def rank_share(batch: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """This rank's contiguous slice of the global batch (all of it in one process)."""
    local = len(batch) // ranks.world
    return batch[ranks.rank * local : (ranks.rank + 1) * local]


def average_gradients(params: list[torch.nn.Parameter], ranks: Ranks) -> torch.Tensor:
    """Average the gradients over ranks with one all-reduce of a flat buffer.

    Returns the mean over ranks of each rank's *local* squared gradient norm, taken
    before averaging: a batch of global_batch / world sequences, the small batch of
    the gradient-noise-scale estimator, for free (McCandlish et al. 2018, App. A.1).
    """
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    local_sq = (flat.float() ** 2).sum().reshape(1)
    packed = torch.cat([flat, local_sq.to(flat.dtype)])
    dist.all_reduce(packed)
    packed /= ranks.world
    offset = 0
    for g in grads:
        g.copy_(packed[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return packed[-1]


def mean_over_ranks(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    if ranks.parallel:
        value = value.clone()
        dist.all_reduce(value)
        value /= ranks.world
    return value


def shutdown(ranks: Ranks) -> None:
    if ranks.parallel and dist.is_initialized():
        dist.destroy_process_group()
