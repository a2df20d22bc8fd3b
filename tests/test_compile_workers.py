"""One long-lived worker trains a widths grid compiled: every run compiles afresh, and dynamo
never hits its recompile limit (after which it silently trains in eager mode). Uses the
cheap `eager` backend: dynamo traces and guards as with inductor, without generating kernels."""

from __future__ import annotations

import pytest

from critbatch.training.cli import check_overrides
from critbatch.training.loop import train

WIDTHS = (16, 24, 32, 40, 48, 56, 64, 72, 80, 88)  # > recompile_limit (8) shapes


@pytest.mark.slow
def test_a_widths_grid_in_one_process_trains_every_width_compiled(tiny_overrides, tmp_path,
                                                                   dynamo_warnings):
    """Each width's run compiles graphs of its own (dynamo's counters), not eager mode: the
    faults guarded are a recompile limit hit in a long-lived worker and a compile switched
    off (torch.compile returning the model unchanged)."""
    from torch._dynamo.utils import counters

    for width in WIDTHS:
        counters.clear()
        cfg = check_overrides([*tiny_overrides, f"model.width={width}", "model.depth=1",
                               "model.seq_len=16", "train.compile=true",
                               "train.compile_backend=eager", "train.tokens=2048",
                               "train.batch_size=8", "train.eval_points=1",
                               "train.eval_tokens=64", "train.warmup_steps=2"])
        summary = train(cfg, tmp_path / f"w{width}")
        assert summary["compile"] is True
        assert counters["stats"]["unique_graphs"] >= 1, (width, dict(counters["stats"]))
    assert not [m for m in dynamo_warnings if "recompile_limit" in m or "cache_size" in m]
