"""When to evaluate, the validation loss, and the divergence rule."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager

import numpy as np
import torch
import torch.nn.functional as F


def eval_steps(steps: int, points: int) -> list[int]:
    """Optimizer-step counts after which to evaluate: log-spaced, always ending at `steps`."""
    if points <= 1:
        return [steps]
    spaced = np.round(np.geomspace(1, steps, num=points)).astype(int)
    return sorted(set(spaced.tolist()) | {steps})


def eval_tokens(budget: int, first_batch_tokens: int, points: int) -> list[int]:
    """Token counts after which to evaluate: log-spaced, at the steps `eval_steps` picks for
    a constant batch of `first_batch_tokens` (a scheduled batch's first)."""
    return [s * first_batch_tokens
            for s in eval_steps(budget // first_batch_tokens, points)]


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, chunk: int, device: torch.device,
             autocast: AbstractContextManager) -> float:
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


@torch.no_grad()
def evaluate_per_sequence(model, windows: torch.Tensor, chunk: int, device: torch.device,
                          autocast: AbstractContextManager) -> list[float]:
    """Mean cross-entropy (nats/token) of each validation window, in the windows' order."""
    model.eval()
    losses = []
    for i in range(0, len(windows), chunk):
        batch = windows[i : i + chunk].to(device, non_blocking=True)  # (b, T+1)
        with autocast:
            logits = model(batch[:, :-1])  # (b, T, V)
        token_loss = F.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:],
                                     reduction="none")  # (b, T)
        losses.append(token_loss.double().mean(dim=1).cpu())
    model.train()
    return torch.cat(losses).tolist()


def is_diverged(losses: list[float], first: float, factor: float, window: int) -> str | None:
    """A reason if the run diverged: a non-finite loss, or `window` steps above factor x first."""
    if any(not math.isfinite(x) for x in losses[-window:]):
        return "non-finite train loss"
    tail = losses[-window:]
    if len(tail) == window and all(x > factor * first for x in tail):
        return f"train loss above {factor} x its first value ({first:.3f}) for {window} steps"
    return None
