"""AdamW's beta2 by optim.beta2_scaling=tokens: the same half-life in tokens at every batch."""

import math

import pytest
import torch

from critbatch.orchestration.stages import plan_stage
from critbatch.results.errors import ConfigError
from critbatch.science.rules import decay_half_life_tokens
from critbatch.training.cli import check_overrides
from critbatch.training.config import OptimConfig
from critbatch.training.model import GPT
from critbatch.training.optim import build_optimizers, used_beta2


def test_the_half_life_in_tokens_is_the_same_at_every_batch():
    optim = OptimConfig(beta2=0.999, beta2_scaling="tokens", base_batch_size=8)
    halves = [decay_half_life_tokens(used_beta2(optim, b), b, 64) for b in (4, 8, 16, 128)]
    assert halves[1] == pytest.approx(math.log(0.5) / math.log(0.999) * 8 * 64)
    assert halves == pytest.approx([halves[1]] * 4, rel=1e-9)
    assert used_beta2(optim, 16) == pytest.approx(0.999**2)
    assert used_beta2(OptimConfig(beta2=0.95), 128) == 0.95  # none: as given


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_optimizers_are_built_with_the_batch_s_beta2(name):
    optim = OptimConfig(name=name, beta2=0.99, beta2_scaling="tokens", base_batch_size=8)
    model = GPT(check_overrides(["scale=smoke"]).model, 260)
    adamw = [o for o in build_optimizers(model, optim, 32, "cpu")
             if isinstance(o, torch.optim.AdamW)]
    assert len(adamw) == 1
    assert adamw[0].defaults["betas"] == (0.9, pytest.approx(0.99**4))


@pytest.mark.slow
def test_the_batch_sweep_carries_beta2_to_each_batch():
    jobs = plan_stage("batch", "cpu", "adamw", [])
    grid = check_overrides(["scale=cpu"]).grid
    for job in jobs:
        o = job.cfg.optim
        assert (o.beta2, o.beta2_scaling, o.base_batch_size) == (grid.beta2, "tokens", 8)
    big = next(j for j in jobs if j.cfg.train.batch_size == 128)
    assert used_beta2(big.cfg.optim, 128) == pytest.approx(grid.beta2**16)
    assert check_overrides(["scale=cpu"]).optim.beta2_scaling == "none"  # single runs: as given


def test_a_batch_schedule_with_token_scaled_beta2_is_refused_by_name():
    with pytest.raises(ConfigError, match="optim.beta2_scaling=none"):
        check_overrides(["scale=smoke", "optim.beta2_scaling=tokens", "train.batch_schedule=ramp",
                         "train.batch_size_start=4"])


def test_a_run_records_the_beta2_it_trained_with(tiny_cfg, tmp_path, caplog):
    from critbatch.training.loop import train

    cfg = tiny_cfg("train.tokens=4096", "train.batch_size=8", "train.eval_points=1",
                   "optim.beta2=0.99", "optim.beta2_scaling=tokens", "optim.base_batch_size=2")
    with caplog.at_level("INFO", logger="critbatch"):
        summary = train(cfg, tmp_path / "run")
    assert summary["beta2"] == pytest.approx(0.99**4)
    assert summary["beta2_scaling"] == "tokens"
    log = caplog.text
    assert "AdamW beta2 0.9606 (optim.beta2 0.99 at batch 2, carried by optim.beta2_scaling" in log


def test_recommend_reads_the_sweep_s_beta2_rule_from_its_runs():
    from critbatch.analysis.recommend.recommend import beta2_of, beta2_rule

    kept = [{"beta2": 0.999 ** (b / 8), "beta2_scaling": "tokens", "batch_size": b,
             "seq_len": 64} for b in (8, 16, 128)]
    rule = beta2_rule(kept)
    assert rule["scaling"] == "tokens"
    assert rule["half_life_tokens"] == pytest.approx(math.log(0.5) / math.log(0.999) * 512,
                                                     rel=1e-5)
    assert beta2_of(rule, 32, 64) == pytest.approx(0.999**4, rel=1e-6)
    fixed = [{"beta2": 0.95, "beta2_scaling": "none", "batch_size": b, "seq_len": 64}
             for b in (8, 128)]
    assert beta2_of(beta2_rule(fixed), 64, 64) == 0.95
    assert beta2_rule(kept + fixed) is None  # two rules: no answer rather than a wrong one
    assert beta2_rule([{"batch_size": 8, "seq_len": 64}]) is None  # older folders
    assert beta2_of(None, 64, 64) is None


def test_a_table_with_a_bad_beta2_is_refused_by_row_and_column(tmp_path):
    from critbatch.analysis.bcrit.tables import read_table
    from critbatch.results.errors import ResultsError

    path = tmp_path / "runs.csv"
    path.write_text("optimizer,batch_size,seq_len,tokens,loss,beta2\nadamw,8,64,1000,4.0,1.5\n")
    with pytest.raises(ResultsError, match="row 2, column beta2: 1.5 is not a number in"):
        read_table(path)
    path.write_text("optimizer,batch_size,seq_len,tokens,loss,beta2_scaling\n"
                    "adamw,8,64,1000,4.0,sqrt\n")
    with pytest.raises(ResultsError, match="column beta2_scaling: 'sqrt' is not one of"):
        read_table(path)


def test_an_older_run_folder_gets_its_beta2_from_its_config(tiny_cfg, tmp_path):
    import json

    from critbatch.results.runs import load_runs
    from critbatch.training.loop import train

    cfg = tiny_cfg("train.tokens=4096", "train.batch_size=8", "train.eval_points=1",
                   "optim.beta2=0.99", "optim.beta2_scaling=tokens", "optim.base_batch_size=2")
    train(cfg, tmp_path / "run")
    path = tmp_path / "run" / "summary.json"
    older = {k: v for k, v in json.loads(path.read_text()).items()
             if k not in ("beta2", "beta2_scaling")}
    path.write_text(json.dumps(older))  # as written before the keys existed
    run = load_runs([tmp_path])["runs"][0]
    assert run["beta2"] == pytest.approx(0.99**4) and run["beta2_scaling"] == "tokens"
