"""Muon's momentum by optim.momentum_scaling=tokens: the same half-life in tokens at every
batch, as optim.beta2_scaling does for Adam's second moment."""

import math

import pytest

from critbatch.results.errors import ConfigError
from critbatch.science.rules import decay_half_life_tokens
from critbatch.training.cli import check_overrides
from critbatch.training.config import OptimConfig
from critbatch.training.model import GPT
from critbatch.training.optim import Muon, build_optimizers, used_momentum


def test_the_momentum_s_half_life_in_tokens_is_the_same_at_every_batch():
    # 0.95 at batch 32 from 0.95^(1/4) at batch 8
    optim = OptimConfig(name="muon", momentum=0.95 ** 0.25, momentum_scaling="tokens",
                        base_batch_size=8)
    assert used_momentum(optim, 32) == pytest.approx(0.95)
    assert used_momentum(optim, 128) == pytest.approx(0.95**4)
    halves = [decay_half_life_tokens(used_momentum(optim, b), b, 64) for b in (8, 32, 128)]
    assert halves == pytest.approx([math.log(0.5) / math.log(0.95) * 32 * 64] * 3)
    assert used_momentum(OptimConfig(name="muon", momentum=0.95), 128) == 0.95  # none


def test_muon_is_built_with_the_batch_s_momentum():
    optim = OptimConfig(name="muon", momentum=0.9, momentum_scaling="tokens", base_batch_size=8)
    model = GPT(check_overrides(["scale=smoke"]).model, 260)
    (muon,) = [o for o in build_optimizers(model, optim, 16, "cpu") if isinstance(o, Muon)]
    assert muon.param_groups[0]["momentum"] == pytest.approx(0.81)


def test_a_bad_momentum_or_a_batch_schedule_with_token_scaled_momentum_is_refused():
    with pytest.raises(ConfigError, match=r"optim.momentum=1.0 must lie in \[0, 1\)"):
        check_overrides(["scale=smoke", "optim=muon", "optim.momentum=1.0"])
    with pytest.raises(ConfigError, match="optim.momentum_scaling=none"):
        check_overrides(["scale=smoke", "optim=muon", "optim.momentum_scaling=tokens",
                         "train.batch_schedule=ramp", "train.batch_size_start=4"])


def test_a_muon_run_records_and_logs_the_momentum_it_trained_with(tiny_cfg, tmp_path, caplog):
    from critbatch.training.loop import train

    cfg = tiny_cfg("optim=muon", "train.tokens=4096", "train.batch_size=8",
                   "train.eval_points=1", "optim.momentum=0.9", "optim.momentum_scaling=tokens",
                   "optim.base_batch_size=4")
    with caplog.at_level("INFO", logger="critbatch"):
        summary = train(cfg, tmp_path / "run")
    assert summary["momentum"] == pytest.approx(0.81)
    assert summary["momentum_scaling"] == "tokens"
    assert ("Muon momentum 0.81 (optim.momentum 0.9 at batch 4, carried by "
            "optim.momentum_scaling=tokens" in caplog.text)
    adamw = train(tiny_cfg("train.tokens=4096", "train.batch_size=8", "train.eval_points=1"),
                  tmp_path / "adamw")
    assert adamw["momentum"] is None and adamw["momentum_scaling"] is None
