"""Batches: random windows of seq_len + 1 tokens drawn from the cached token ids by a generator
seeded with (seed, step), so a step's batch is a pure function of the step and micro-batches
are exact slices of it; the fixed validation windows; and the checks of a corpus's size
against a run. The token ids come from training/token_cache.py.
"""

from __future__ import annotations

import numpy as np
import torch

from critbatch.results.errors import DataError
from critbatch.training.token_cache import TokenData


def check_seq_len(tokens: TokenData, seq_len: int) -> None:
    for split, ids in (("train", tokens.train), ("val", tokens.val)):
        if ids.size < seq_len + 1:
            raise DataError(
                f"model.seq_len={seq_len} needs at least {seq_len + 1} {split} tokens but the "
                f"corpus has {ids.size}; lower model.seq_len or use a larger corpus"
            )


def coverage_warnings(tokens: TokenData, name: str, train_tokens: int, eval_tokens: int
                      ) -> list[str]:
    """One line each on a corpus too small for the run: the passes that `train_tokens` make over
    the train split (batches are random windows, so each token is seen that many times on
    average), and a val split shorter than `train.eval_tokens` (its windows then overlap: an
    evaluation reads every val token, some of them twice)."""
    lines = []
    if train_tokens > tokens.train.size:
        lines.append(
            f"warning: data={name} has {tokens.train.size:,} train tokens, fewer than the run's "
            f"{train_tokens:,}: it makes {train_tokens / tokens.train.size:.1f} passes over the "
            "data (text repeats; a larger corpus avoids it)")
    if eval_tokens > tokens.val.size:
        lines.append(
            f"warning: data={name} has {tokens.val.size:,} val tokens, fewer than "
            f"train.eval_tokens={eval_tokens:,}: each evaluation reads all of them in overlapping "
            "windows (lower train.eval_tokens, or give the corpus more text or a larger "
            "data.val_fraction)")
    return lines


def sample_batch(
    ids: np.ndarray, seq_len: int, batch_size: int, seed: int, step: int
) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens for optimizer step `step`: (B, T + 1) int64.

    The generator is seeded from (seed, step), so the batch does not depend on
    who computes it or on what was drawn before (resume and accumulation safe).
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, ids.size - seq_len, size=batch_size)  # last start: size - seq_len - 1
    window = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    return torch.from_numpy(ids[window].astype(np.int64))


def sample_chunks(ids: np.ndarray, seq_len: int, batch_size: int, seed: int,
                  sequences_done: int, chunk: int) -> torch.Tensor:
    """A step's batch as `batch_size / chunk` chunks of `chunk` windows: (B, T + 1) int64.

    Chunk i is `sample_batch(..., chunk, seed, c0 + i)` with c0 = sequences_done / chunk, so
    the sequences a run sees depend on how many it has trained, not on how they were split
    into steps: a run at batch k x chunk sees, over a window, exactly the sequences a run at
    batch chunk sees (`train.data_chunk`). With batch = chunk, c0 is the step, and the batch
    is `sample_batch`'s of that step.
    """
    assert batch_size % chunk == 0 and sequences_done % chunk == 0, (batch_size, chunk)
    first = sequences_done // chunk
    return torch.cat([sample_batch(ids, seq_len, chunk, seed, first + i)
                      for i in range(batch_size // chunk)])


def val_windows(ids: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """The fixed validation set: evenly spaced windows, (n_windows, seq_len + 1) int64."""
    n_windows = max(1, eval_tokens // seq_len)
    starts = np.linspace(0, ids.size - seq_len - 1, n_windows).astype(np.int64)
    window = starts[:, None] + np.arange(seq_len + 1)
    return torch.from_numpy(ids[window].astype(np.int64))
