"""Config composition and the one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from critbatch.results.errors import ConfigError
from critbatch.science.rules import lr_multiplier
from critbatch.training import cli as train_module
from critbatch.training.cli import check_overrides
from critbatch.training.config import CONF_DIR, total_steps

GROUP_OPTIONS = sorted(
    (group.name, path.stem) for group in CONF_DIR.iterdir() if group.is_dir()
    for path in group.glob("*.yaml")
)


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_file_composes(group, option):
    extra = ["data.paths=[corpus/*.txt]"] if (group, option) == ("data", "text_files") else []
    if group == "data" and option in ("hub",):
        extra = ["data.hf_path=parquet"]
    cfg = check_overrides([f"{group}={option}", *extra])
    assert cfg.model.width > 0


def test_the_schema_is_stored_once_and_composes_after(monkeypatch):
    """Every compose registers the schema; only the first call stores it (the fault guarded:
    the dataclass converted again on every compose, 30 ms each, thousands in a sweep's tests).
    """
    from hydra.core.config_store import ConfigStore

    from critbatch.training.config import register_configs

    register_configs()
    stored, store = [], ConfigStore.store

    def recorded(self, name, node, **kw):
        stored.append(name)
        return store(self, name=name, node=node, **kw)

    monkeypatch.setattr(ConfigStore, "store", recorded)
    register_configs()
    assert check_overrides(["scale=smoke"]).scale == "smoke"
    assert "critbatch_schema" not in stored


def test_defaults_are_the_cpu_preset():
    cfg = check_overrides([])
    assert cfg.scale == "cpu"
    assert cfg.data.name == "stdlib"
    assert cfg.optim.name == "adamw"
    assert total_steps(cfg) == cfg.train.tokens // (cfg.train.batch_size * cfg.model.seq_len)


def test_presets_set_their_name_and_yaml_overrides_schema():
    smoke = check_overrides(["scale=smoke"])
    assert smoke.scale == "smoke"
    assert smoke.model.width == 32
    muon = check_overrides(["optim=muon"])
    assert muon.optim.name == "muon" and muon.optim.lr == 0.02


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (["optim.lr=abc"], "optim.lr"),
        (["train.batch_sise=8"], "did you mean 'train.batch_size'"),
        (["train.batch_size=10", "train.micro_batch_size=4"], "train.micro_batch_size=4"),
        (["model.heads=3"], "model.heads=3 does not divide model.width"),
        (["data.vocab_size=70000"], "65535"),
        (["train.tokens=0"], "train.tokens=0"),
        (["train.tokens=-5"], "train.tokens=-5"),
        (["train.tokens=100"], "less than one step"),
        (["optim.name=sgd"], "optim.name=sgd"),
        (["optim.lr_scaling=cubic"], "optim.lr_scaling"),
        (["train.schedule=exp"], "train.schedule"),
        (["+train.foo=1"], "unknown config key 'train.foo'"),
        (["scale=huge"], "scale=huge is not a config option"),
        (["data=text_files"], "data.paths"),
        (["train.warmup_tokens=-1"], "train.warmup_tokens=-1 must be >= 0"),
        (["train.warmup_tokens=4096", "train.batch_schedule=ramp"], "constant batch"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    override, fragment, monkeypatch, capsys, tmp_path
):
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["critbatch.train", *override, f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exc:
        train_module.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("critbatch: error: ")
    assert fragment in err
    assert not run_dir.exists()


@pytest.mark.slow
def test_cli_error_has_no_traceback(tmp_path):
    """The real command line, as a user types it."""
    proc = subprocess.run(
        [sys.executable, "-m", "critbatch.train", "train.batch_sise=8",
         f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "critbatch: error: unknown config key 'train.batch_sise'; "
        "did you mean 'train.batch_size'?"
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()


def test_validate_raises_config_error_in_process():
    with pytest.raises(ConfigError, match="micro_batch_size"):
        check_overrides(["train.batch_size=12", "train.micro_batch_size=5"])


def test_warmup_tokens_are_a_floor_beside_the_warmup_steps():
    """train.warmup_tokens makes warmup_steps the larger of itself and those tokens in this
    run's steps (rounded up); null leaves warmup_steps as it is; a bad batch is validate's."""
    steps = {b: check_overrides([f"train.batch_size={b}", "model.seq_len=64",
                                 "train.warmup_steps=10",
                                 "train.warmup_tokens=57344"]).train.warmup_steps
             for b in (8, 32, 64, 128, 4096)}
    assert steps == {8: 112, 32: 28, 64: 14, 128: 10, 4096: 10}
    assert check_overrides(["train.warmup_tokens=0", "train.warmup_steps=3"]
                           ).train.warmup_steps == 3
    assert check_overrides(["train.warmup_steps=13"]).train.warmup_steps == 13
    assert check_overrides(["train.batch_size=24", "model.seq_len=64", "train.warmup_steps=1",
                            "train.warmup_tokens=2000"]).train.warmup_steps == 2  # 2000/1536
    with pytest.raises(ConfigError, match="batch_size"):
        check_overrides(["train.batch_size=0", "train.warmup_tokens=1000"])


def test_lr_scaling_rules():
    assert lr_multiplier("none", 256, 64) == 1.0
    assert lr_multiplier("sqrt", 256, 64) == pytest.approx(2.0)
    assert lr_multiplier("linear", 256, 64) == pytest.approx(4.0)
    assert lr_multiplier("sqrt", 16, 64) == pytest.approx(0.5)


def test_conf_dir_is_the_repository_conf():
    assert Path(__file__).resolve().parents[1] / "conf" == CONF_DIR


@pytest.mark.slow
def test_the_batch_sweep_warms_each_optimizer_up_by_its_own_key():
    """`grid.warmup_steps` is per optimizer: 10 steps for both in the cpu preset,
    `grid.warmup_steps.muon=40` changes Muon's batch sweep (and its seeded runs) alone; the
    widths sweep keeps `grid.widths_warmup_steps`; a command-line warmup still wins."""
    from critbatch.orchestration.stages import plan_stage

    def warmups(stage, optimizer, extra=()):
        return {j.cfg.train.warmup_steps for j in plan_stage(stage, "cpu", optimizer, [*extra])}

    longer = ["grid.warmup_steps.muon=40"]
    assert warmups("batch", "muon") == warmups("batch", "adamw") == {10}
    assert warmups("batch", "muon", longer) == warmups("batch_seeds", "muon", longer) == {40}
    assert warmups("batch", "adamw", longer) == {10}
    assert warmups("widths", "muon", longer) == warmups("widths", "adamw") == {10}
    assert warmups("batch", "muon", ["train.warmup_steps=12"]) == {12}
