"""The synthetic McCandlish world: losses generated from the model that the fits assume,
so tests and the benchmark know the answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SyntheticTruth:
    """The model a synthetic sweep is generated from (losses in nats/token)."""

    b_crit: float = 200.0  # sequences
    l_inf: float = 2.0  # L(E_min) = l_inf + a (E_min / 1e6)^-alpha
    a: float = 1.5
    alpha: float = 0.35
    lr_base: float = 1e-3  # best lr at batch 16
    lr_exponent: float = 0.7  # best lr grows as B^lr_exponent
    lr_curvature: float = 0.05  # loss penalty per (ln lr - ln lr*)^2, nats/token
    seq_len: int = 64
    bytes_per_token: float = 3.0
    small_batch_penalty: float = 0.0  # nats/token added as penalty x 16 / B: a U-shaped E(B)

    def loss_of_min_tokens(self, e_min_tokens: float) -> float:
        return self.l_inf + self.a * (e_min_tokens / 1e6) ** -self.alpha

    def final_loss(self, batch_size: float, tokens: float) -> float:
        """L(E / (1 + B / B_crit)): McCandlish et al.'s E = E_min (1 + B/B_crit), plus the
        small-batch penalty (zero by default) that makes the smallest batches less
        token-efficient than larger ones, against the model."""
        return (self.loss_of_min_tokens(tokens / (1 + batch_size / self.b_crit))
                + self.small_batch_penalty * 16 / batch_size)

    def best_lr(self, batch_size: float) -> float:
        return self.lr_base * (batch_size / 16) ** self.lr_exponent
