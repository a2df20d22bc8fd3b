"""Local-CBS branches (training/local_cbs.py): the same data at every k, a switch run that is the
base run up to its fork, branch folders with the analysis's contract, bitwise resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.science.rules import lr_multiplier
from critbatch.training import loop as train_loop
from critbatch.training.branches import plan_branches
from critbatch.training.data import sample_batch, sample_chunks
from critbatch.training.local_cbs import VAL_SEQUENCES
from critbatch.training.local_cbs import plan as local_plan
from critbatch.training.loop import train, train_with_branches

TIMING_KEYS = {"wall_time_s", "tokens_per_s", "tokens_per_s_with_warmup", "warmup_s",
               "resumed_at", "checkpoint_saves", "checkpoint_time_s", "wandb_run_id",
               "git_revision"}
LOCAL_KEYS = {"local_cbs_of", "local_cbs_at_tokens", "local_cbs_multiplier",
              "local_cbs_window_tokens", "base_batch_size"}
BRANCH_KEYS = {"branch_of", "branch_at_tokens", "overrides", "curve", *LOCAL_KEYS}

# a base of 80 steps of 4 x 32 tokens at a constant lr; forks after steps 20 and 40, windows of
# 2048 tokens: 16 steps at k = 1, 4 at k = 4
BASE = ["train.batch_size=4", "train.tokens=10240", "train.schedule=constant",
        "train.warmup_steps=5", "train.log_every=5", "train.eval_points=3",
        "optim.lr_scaling=sqrt", "optim.base_batch_size=4"]
LOCAL = ["train.local_cbs.at_fractions=[0.25,0.5]", "train.local_cbs.multipliers=[1,2,4]",
         "train.local_cbs.window_tokens=2048", "train.local_cbs.replicate_seeds=[1]",
         "train.local_cbs.replicate_ladder=false"]
FORKS = (2560, 5120)  # tokens at the forks
NAMES = ("k=1", "k=2", "k=4", "k=1,seed=1")


def comparable(run_dir: Path, leave_out: set[str] = frozenset()) -> tuple[dict, list[dict]]:
    """summary.json and metrics.jsonl without what depends on wall time or restarts."""
    summary = {k: v for k, v in runs.read_summary(run_dir).items()
               if k not in TIMING_KEYS | leave_out}
    rows = [{k: v for k, v in r.items() if k != "time_s"} for r in runs.read_metrics(run_dir)]
    return summary, rows


def test_chunks_of_the_base_batch_are_the_same_sequences_at_every_k():
    """Over a window, k steps of chunk-sized batches and one step of k chunks hold the same
    sequences in the same order, and a one-chunk step is sample_batch's batch of that step."""
    ids = np.arange(5000, dtype=np.uint16)
    for step in (0, 7):
        assert torch.equal(sample_chunks(ids, 16, 4, 3, 4 * step, 4),
                           sample_batch(ids, 16, 4, 3, step))
    done = 4 * 12  # sequences trained before the window (12 base steps)
    small = torch.cat([sample_chunks(ids, 16, 4, 3, done + 4 * i, 4) for i in range(8)])
    for k in (2, 4, 8):
        big = torch.cat([sample_chunks(ids, 16, 4 * k, 3, done + 4 * k * i, 4)
                         for i in range(8 // k)])
        assert torch.equal(big, small)
    assert not torch.equal(sample_chunks(ids, 16, 4, 4, done, 4), small[:4])  # seed matters


def test_data_chunk_at_the_batch_leaves_a_constant_run_unchanged(tiny_cfg, tmp_path):
    train(tiny_cfg(*BASE, "train.tokens=2560"), tmp_path / "today")
    train(tiny_cfg(*BASE, "train.tokens=2560", "train.data_chunk=4"), tmp_path / "chunked")
    assert comparable(tmp_path / "chunked") == comparable(tmp_path / "today")


def test_micro_batches_are_slices_of_the_chunked_batch(tiny_cfg, tmp_path):
    """Accumulating micro-batches of 2 over a chunked batch of 8 is the batch of 8 (to float
    rounding): each micro-batch is a slice of the same sequences."""
    common = [*BASE, "train.tokens=2560", "train.batch_size=8", "train.data_chunk=4",
              "train.gns.enabled=false"]
    train(tiny_cfg(*common), tmp_path / "whole")
    train(tiny_cfg(*common, "train.micro_batch_size=2"), tmp_path / "micro")
    whole, micro = runs.read_metrics(tmp_path / "whole"), runs.read_metrics(tmp_path / "micro")
    assert [r["train_loss"] for r in micro] == pytest.approx([r["train_loss"] for r in whole],
                                                             rel=1e-4)


def switch_overrides(at_tokens: int, k: int, window: int = 2048) -> list[str]:
    return ["train.batch_schedule=switch", "train.batch_size_start=4",
            f"train.batch_size={4 * k}", f"train.switch_at_tokens={at_tokens}",
            f"train.tokens={at_tokens + window}", "train.data_chunk=4"]


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_a_switch_run_is_the_base_run_up_to_its_switch(tiny_cfg, tmp_path, optim):
    """Bitwise the base's metrics (loss, lr, tokens) up to the switch, then k x the batch at
    the lr scaled by optim.lr_scaling, ending on its token budget."""
    common = [f"optim={optim}", *BASE, "train.gns.enabled=false"]
    train(tiny_cfg(*common, "train.tokens=5120"), tmp_path / "base")
    summary = train(tiny_cfg(*common, *switch_overrides(2560, 4)), tmp_path / "switch")
    base, switch = runs.read_metrics(tmp_path / "base"), runs.read_metrics(tmp_path / "switch")
    drop = {"time_s"}
    prefix = [{k: v for k, v in r.items() if k not in drop} for r in switch if r["step"] <= 20]
    assert prefix == [{k: v for k, v in r.items() if k not in drop} for r in base[:20]]
    after = [r for r in switch if r["step"] > 20]
    assert [r["batch_size"] for r in after] == [16] * 4
    assert after[0]["lr"] == pytest.approx(base[0]["lr"] * 5 * lr_multiplier("sqrt", 16, 4))
    assert summary["tokens"] == 2560 + 2048 and summary["batch_size_start"] == 4
    assert summary["lr"] == pytest.approx(base[-1]["lr"] * 2)
    written = json.loads((tmp_path / "switch" / VAL_SEQUENCES).read_text())
    assert written["tokens"] == 4608 and written["seq_len"] == 32
    assert len(written["val_loss_per_sequence"]) == 2048 // 32
    assert np.mean(written["val_loss_per_sequence"]) == pytest.approx(summary["val_loss"],
                                                                      rel=1e-6)


@pytest.mark.slow
def test_local_branches_write_the_contract_folders(tiny_cfg, tmp_path):
    """Every branch folder: summary.json with the local_cbs fields, val_sequences.json over
    the same windows, the window trained at k x the batch; the k = 1 branch is bitwise the
    base continued (same data), its replicate is not; a second call trains nothing."""
    cfg = tiny_cfg(*BASE, *LOCAL)
    base = tmp_path / "base"
    trained = train_with_branches(cfg, base)
    assert len(trained) == 1 + 2 * 4
    base_rows = runs.read_metrics(base)
    for at in FORKS:
        for name in NAMES:
            folder = base / "local_cbs" / f"tokens={at}" / name
            summary = runs.read_summary(folder)
            k = int(name.split(",")[0].removeprefix("k="))
            assert {key: summary[key] for key in LOCAL_KEYS} == {
                "local_cbs_of": "base", "local_cbs_at_tokens": at, "local_cbs_multiplier": k,
                "local_cbs_window_tokens": 2048, "base_batch_size": 4}
            assert summary["tokens"] == at + 2048 and summary["batch_size"] == 4 * k
            assert summary["branch_of"] == "base" and summary["branch_at_tokens"] == at
            losses = json.loads((folder / VAL_SEQUENCES).read_text())
            assert losses["tokens"] == at + 2048 and len(losses["val_loss_per_sequence"]) == 64
            rows = runs.read_metrics(folder)
            assert [r["step"] for r in rows] == list(range(1, at // 128 + 2048 // (128 * k) + 1))
            if name == "k=1":
                same = [{x: y for x, y in r.items() if x != "time_s"} for r in rows]
                assert same == [{x: y for x, y in r.items() if x != "time_s"}
                                for r in base_rows[:len(rows)]]
            if name == "k=1,seed=1":
                assert rows[-1]["train_loss"] != base_rows[len(rows) - 1]["train_loss"]
                assert runs.read_config(folder)["train"]["seed"] == 1
    assert train_with_branches(cfg, base) == []


@pytest.mark.slow
def test_a_resumed_branch_is_the_switch_run_trained_from_scratch(tiny_cfg, tmp_path):
    """The k = 4 branch, resumed from the base's fork, equals the switch run of the same
    config trained from step 0 (summary, metrics, per-sequence losses; bitwise on CPU)."""
    cfg = tiny_cfg(*BASE, *LOCAL, "train.gns.enabled=false",
                   "train.local_cbs.at_fractions=[0.5]", "train.local_cbs.replicate_seeds=[]")
    train_with_branches(cfg, tmp_path / "base")
    branch = next(b for b in plan_branches(cfg, tmp_path / "base", [])
                  if b.fields["local_cbs_multiplier"] == 4 and b.fork_tokens == 5120)
    train(branch.cfg, tmp_path / "alone")
    assert (comparable(branch.run_dir, BRANCH_KEYS | {"resumed_from"})
            == comparable(tmp_path / "alone", BRANCH_KEYS | {"resumed_from"}))
    got, want = runs.read_summary(branch.run_dir), runs.read_summary(tmp_path / "alone")
    assert got["curve"][-1] == want["curve"][-1]
    assert ((branch.run_dir / VAL_SEQUENCES).read_text()
            == (tmp_path / "alone" / VAL_SEQUENCES).read_text())


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_a_killed_branch_resumes_bitwise(tiny_cfg, tmp_path, monkeypatch):
    """Killed in the third step of the first k = 4 branch (its last checkpoint two steps in),
    then restarted: every folder ends exactly as in an uninterrupted run."""
    cfg = tiny_cfg(*BASE, *LOCAL, "train.checkpoint_every_steps=2",
                   "train.local_cbs.at_fractions=[0.25]")
    train_with_branches(cfg, tmp_path / "reference")
    real, seen = train_loop.sample_chunks, []

    def sample(ids, seq_len, batch_size, seed, done, chunk):
        if batch_size == 16:
            seen.append(done)
            if len(seen) == 3:
                raise Interrupted(done)
        return real(ids, seq_len, batch_size, seed, done, chunk)

    monkeypatch.setattr(train_loop, "sample_chunks", sample)
    with pytest.raises(Interrupted):
        train_with_branches(cfg, tmp_path / "killed")
    monkeypatch.undo()
    killed = tmp_path / "killed" / "local_cbs" / "tokens=2560" / "k=4"
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()
    assert len(train_with_branches(cfg, tmp_path / "killed")) == 2  # k=4 and k=1,seed=1
    for at in FORKS[:1]:
        for name in NAMES:
            sub = Path("local_cbs") / f"tokens={at}" / name
            parent = {"branch_of", "local_cbs_of"}  # the base folders' names differ
            assert (comparable(tmp_path / "killed" / sub, parent)
                    == comparable(tmp_path / "reference" / sub, parent)), sub
            assert ((tmp_path / "killed" / sub / VAL_SEQUENCES).read_text()
                    == (tmp_path / "reference" / sub / VAL_SEQUENCES).read_text())
    assert runs.read_summary(killed)["resumed_at"] == [2560 // 128, 2560 // 128 + 2]


def test_the_ladder_is_repeated_at_every_replicate_seed(tiny_cfg):
    """replicate_ladder (the default): each replicate seed trains every k again, from the
    same fork, at that seed; without it only k = 1 is repeated."""
    cfg = tiny_cfg(*BASE, *LOCAL[:-1], "train.local_cbs.replicate_seeds=[1,2]")
    planned = local_plan(cfg, [])
    at_first = [b.folder.split("/")[-1] for b in planned if b.at_tokens == FORKS[0]]
    assert at_first == ["k=1", "k=2", "k=4", "k=1,seed=1", "k=2,seed=1", "k=4,seed=1",
                        "k=1,seed=2", "k=2,seed=2", "k=4,seed=2"]
    repeat = next(b for b in planned if b.folder.endswith("tokens=5120/k=4,seed=2"))
    assert repeat.cfg.train.seed == 2 and repeat.cfg.train.batch_size == 16
    assert "train.seed=2" in repeat.overrides
    only_k1 = local_plan(tiny_cfg(*BASE, *LOCAL), [])
    assert [b.folder.split("/")[-1] for b in only_k1 if b.at_tokens == FORKS[0]] == list(NAMES)


def test_a_branch_cooldown_anneals_the_end_of_its_window_only(tiny_cfg, tmp_path):
    """local_cbs.cooldown_fraction=0.5: the k = 2 branch forked at 2560 tokens keeps the
    base's constant lr up to the fork and the switch's scaled lr for the first half of its
    2048-token window, then decays (1-sqrt) to min_lr_ratio of it at its last step."""
    cfg = tiny_cfg(*BASE, *LOCAL, "train.gns.enabled=false", "train.local_cbs.at_fractions=[0.25]",
                   "train.local_cbs.cooldown_fraction=0.5", "train.local_cbs.replicate_seeds=[]")
    branch = next(b for b in local_plan(cfg, []) if b.multiplier == 2)
    assert branch.cfg.train.schedule == "wsd"
    assert branch.cfg.train.cooldown_fraction == pytest.approx(0.5 * 2048 / (2560 + 2048))
    assert f"train.cooldown_fraction={branch.cfg.train.cooldown_fraction!r}" in branch.overrides
    train(branch.cfg, tmp_path / "branch")
    rows = runs.read_metrics(tmp_path / "branch")
    peak = rows[10]["lr"]  # after the 5-step warmup, before the fork at step 20
    assert [r["lr"] for r in rows[5:20]] == [peak] * 15
    window = [r["lr"] for r in rows[20:]]  # 8 steps of 8 sequences x 32 tokens
    scaled = peak * lr_multiplier("sqrt", 8, 4)
    assert window[:4] == pytest.approx([scaled] * 4)
    assert all(b < a for a, b in zip(window[3:], window[4:], strict=False))
    assert window[-1] == pytest.approx(scaled * 0.1)


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.local_cbs.cooldown_fraction=1.5"], "cooldown_fraction=1.5 must lie in"),
    (["train.local_cbs.at_fractions=[0.5,1.2]"], "must be increasing fractions"),
    (["train.local_cbs.at_fractions=[0.5,0.25]"], "must be increasing fractions"),
    (["train.local_cbs.multipliers=[1,3,9]"], "ascending powers of two starting at 1"),
    (["train.local_cbs.multipliers=[2,4]"], "ascending powers of two starting at 1"),
    (["train.schedule=cosine"], "constant lr"),
    (["train.local_cbs.window_tokens=100"], "less than one step of the largest branch"),
    (["train.local_cbs.replicate_seeds=[0]"], "distinct seeds other than train.seed=0"),
    (["train.local_cbs.at_fractions=[0.01,0.5]"], "inside the 5-step warmup"),
    (["train.local_cbs.at_fractions=[0.25,0.251]"], "the same fork step twice"),
    (["train.data_chunk=2"], "set it to train.batch_size=4"),
])
def test_bad_local_settings_are_one_line(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        tiny_cfg(*BASE, *LOCAL, *overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.batch_schedule=switch", "train.batch_size_start=4", "train.batch_size=16"],
     "needs train.switch_at_tokens"),
    (["train.batch_schedule=switch", "train.batch_size_start=4", "train.batch_size=16",
      "train.switch_at_tokens=100"], "a whole number of first steps"),
    (["train.batch_size=6", "train.data_chunk=4"], "not a multiple of train.data_chunk=4"),
    (["train.data_chunk=0"], "must be >= 1"),
])
def test_bad_switch_and_chunk_settings_are_one_line(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        tiny_cfg(*BASE, *overrides)
    assert "\n" not in str(err.value)


def test_the_entry_point_refuses_a_run_without_local_branches(tiny_cfg, tmp_path, capsys):
    from critbatch.local_cbs import main

    train(tiny_cfg(*BASE, "train.tokens=1280"), tmp_path / "plain")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "plain")])
    assert exit_.value.code != 0
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "trained without local-CBS branches" in err[0]


@pytest.mark.slow
def test_the_entry_point_trains_a_base_and_its_branches_then_resumes_nothing(
        tiny_overrides, tmp_path, capsys):
    """Overrides of sweeps/local_cbs.yaml train the base and its branches into
    <sweep dir>/<overrides>; given that folder, a second call finds everything done."""
    from critbatch.local_cbs import main

    short = [o for o in tiny_overrides if not o.startswith("model.")]  # smoke's model
    grid = ["grid.local_cbs.tokens=5120", "grid.local_cbs.multipliers=[1,2]",
            "grid.local_cbs.window_tokens=1024", f"hydra.sweep.dir={tmp_path}"]
    main([*short, *grid])
    base = next(p.parent for p in tmp_path.glob("*/summary.json"))
    names = sorted(str(p.parent.relative_to(base / "local_cbs"))
                   for p in base.glob("local_cbs/*/*/summary.json"))
    assert names == sorted(f"tokens={t}/{k}" for t in (512, 2560)
                           for k in ("k=1", "k=1,seed=1", "k=2", "k=2,seed=1"))
    capsys.readouterr()
    main([str(base)])
    assert "0 run(s) trained" in capsys.readouterr().out


def test_a_branch_keeps_its_bases_resolved_warmup(tiny_cfg):
    """A base with a token floor on its warmup (train.warmup_tokens) resolves it at its own
    batch; a branch, a switch of batch, keeps those steps and drops the floor, in its config
    and in the overrides its folder records (the floor is refused with a batch schedule)."""
    floor = ["train.warmup_tokens=640"]  # 640 / (4 x 32) = 5 steps, as BASE's warmup_steps
    cfg = tiny_cfg(*BASE, *LOCAL, "train.warmup_steps=2", *floor)
    assert cfg.train.warmup_steps == 5
    for branch in local_plan(cfg, [*BASE, *LOCAL, "train.warmup_steps=2", *floor]):
        assert branch.cfg.train.warmup_steps == 5 and branch.cfg.train.warmup_tokens is None
        assert {"train.warmup_steps=5", "train.warmup_tokens=null"} <= set(branch.overrides)
        assert not any(o in branch.overrides for o in ("train.warmup_steps=2", *floor))
