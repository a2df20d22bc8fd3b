"""The GPT's parameter count and training FLOPs in closed form (no torch): what training
reports and what `recommend` turns a width into."""

from __future__ import annotations


def param_count(width: int, depth: int, seq_len: int, vocab_size: int) -> tuple[int, int]:
    """(params, params_nonembedding) in closed form.

    Per block: qkv 3d^2 + proj d^2 + fc 4d^2 + proj 4d^2 = 12 d^2, plus two gains (2d);
    a final gain d; token (V d) and position (T d) embeddings, the output tied to wte.
    Non-embedding excludes both embeddings (Kaplan et al. 2020).
    """
    nonembedding = depth * (12 * width**2 + 2 * width) + width
    return nonembedding + vocab_size * width + seq_len * width, nonembedding


def flops_per_token(width: int, depth: int, seq_len: int, vocab_size: int) -> int:
    """Training FLOPs per token: 6 N (N with the tied output matrix) + 6 L T d attention."""
    params, nonemb = param_count(width, depth, seq_len, vocab_size)
    n = nonemb + vocab_size * width  # the output projection is a matmul too
    return 6 * n + 6 * depth * seq_len * width
