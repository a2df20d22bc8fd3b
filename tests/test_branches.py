"""Cooldown branches (training/branches.py): a branch is the separate run of its budget, and a
run with branches survives being killed anywhere."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.training import loop as train_loop
from critbatch.training.branches import plan_branches
from critbatch.training.loop import train, train_with_branches

TIMING_KEYS = {"wall_time_s", "tokens_per_s", "tokens_per_s_with_warmup", "warmup_s",
               "resumed_at", "checkpoint_saves", "checkpoint_time_s", "wandb_run_id",
               "git_revision"}
# a branch keeps its trunk's peak-lr noise readings (taken at the trunk's fractions of its
# constant phase), a separate run reads at its own: both are the tracker at the peak lr
BRANCH_KEYS = {"branch_of", "branch_at_tokens", "overrides", "curve", "noise_readings"}

# 40 steps of 8 x 32 tokens; branches of 10 and 20 steps fork at steps 8 and 16
BRANCHED = ["train.schedule=wsd", "train.branch_budgets=[0.25,0.5]", "train.batch_size=8",
            "train.micro_batches=2", "train.tokens=10240", "train.warmup_steps=5",
            "train.log_every=5", "train.eval_points=4"]


def comparable(run_dir: Path, leave_out: set[str] = frozenset()) -> tuple[dict, list[dict]]:
    """summary.json and metrics.jsonl without what depends on wall time or restarts."""
    summary = {k: v for k, v in runs.read_summary(run_dir).items()
               if k not in TIMING_KEYS | leave_out}
    rows = [{k: v for k, v in r.items() if k != "time_s"} for r in runs.read_metrics(run_dir)]
    return summary, rows


@pytest.mark.parametrize("optim", ["adamw", "muon"])
@pytest.mark.slow
def test_a_branch_is_the_separate_run_of_its_budget(tiny_cfg, tmp_path, optim):
    """Each branch's summary and per-step metrics equal those of a run trained alone at its
    budget (same seed and batches); only the eval points before the fork differ (the
    parent's), and the final one is the same."""
    cfg = tiny_cfg(f"optim={optim}", *BRANCHED)
    trained = train_with_branches(cfg, tmp_path / "run")
    assert [s["tokens"] for s in trained] == [10240, 2560, 5120]
    for branch in plan_branches(cfg, tmp_path / "run", []):
        alone = tmp_path / f"alone-{branch.tokens}"
        train(tiny_cfg(f"optim={optim}", *BRANCHED, f"train.tokens={branch.tokens}",
                       "train.branch_budgets=[]"), alone)
        assert comparable(branch.run_dir, BRANCH_KEYS) == comparable(alone, BRANCH_KEYS)
        got, want = runs.read_summary(branch.run_dir), runs.read_summary(alone)
        assert got["curve"][-1] == want["curve"][-1]
        assert got["branch_of"] == "run" and want["branch_of"] is None
        assert got["branch_at_tokens"] == branch.fork_step * 8 * 32
        assert got["b_noise"] is not None and "b_noise" in got["curve"][-1]
    assert [b.fork_step for b in plan_branches(cfg, tmp_path, [])] == [8, 16]


class Interrupted(Exception):
    pass


def interrupt_at(monkeypatch, step: int, nth: int = 1) -> None:
    """Stop train() (like a kill) the `nth` time a batch of `step` is drawn."""
    real, seen = train_loop.sample_batch, []

    def sample(ids, seq_len, batch_size, seed, s):
        if s == step:
            seen.append(s)
            if len(seen) == nth:
                raise Interrupted(s)
        return real(ids, seq_len, batch_size, seed, s)

    monkeypatch.setattr(train_loop, "sample_batch", sample)


@pytest.mark.slow
def test_a_run_with_branches_resumes_bitwise_after_kills_in_the_run_and_in_a_branch(
        tiny_cfg, tmp_path, monkeypatch):
    """Killed in step 12 (after the first fork, last checkpoint at step 7: the fork is made
    again), then in the second branch's cooldown (step 18, drawn by the run first): the run
    and both branches end exactly as the uninterrupted ones."""
    cfg = tiny_cfg("optim=muon", *BRANCHED, "train.checkpoint_every_steps=7")
    train_with_branches(cfg, tmp_path / "reference")
    interrupt_at(monkeypatch, 12)
    with pytest.raises(Interrupted):
        train_with_branches(cfg, tmp_path / "killed")
    monkeypatch.undo()
    assert (tmp_path / "killed/branches/tokens=2560/checkpoint.pt").exists()
    interrupt_at(monkeypatch, 18, nth=2)
    with pytest.raises(Interrupted):
        train_with_branches(cfg, tmp_path / "killed")
    monkeypatch.undo()
    assert (tmp_path / "killed/summary.json").exists()
    assert not (tmp_path / "killed/branches/tokens=5120/summary.json").exists()
    assert [s["tokens"] for s in train_with_branches(cfg, tmp_path / "killed")] == [5120]
    assert train_with_branches(cfg, tmp_path / "killed") == []  # all done: nothing to train
    for sub in ("", "branches/tokens=2560", "branches/tokens=5120"):
        assert (comparable(tmp_path / "killed" / sub, {"branch_of"})
                == comparable(tmp_path / "reference" / sub, {"branch_of"}))


def _cli(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "critbatch.train", *overrides,
                             f"hydra.run.dir={run_dir}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _steps_logged(run_dir: Path) -> int:
    """Metrics rows written so far by the run and its branches together."""
    total = 0
    for path in [run_dir, *run_dir.glob("branches/*")]:
        with contextlib.suppress(OSError):
            total += len(runs.read_metrics(path))
    return total


@pytest.mark.slow
def test_sigkill_anywhere_in_a_run_with_branches_then_resume_is_bitwise(tiny_overrides,
                                                                        tmp_path):
    """`python -m critbatch.train` with branches, SIGKILLed at three seeded points spread over
    the run and its branches' cooldowns, restarted each time, against an uninterrupted run."""
    overrides = [*tiny_overrides, *BRANCHED, "train.tokens=30720",
                 "train.branch_budgets=[0.125,0.25,0.5]", "train.checkpoint_every_steps=4"]
    reference = _cli(tmp_path / "reference", overrides)
    assert reference.wait(timeout=600) == 0, reference.stdout.read()[-2000:]
    total = _steps_logged(tmp_path / "reference")  # 120 + the branches' rows
    run_dir = tmp_path / "killed"
    for target in sorted(random.Random(3).sample(range(10, total - 5), 3)):
        proc = _cli(run_dir, overrides)
        while _steps_logged(run_dir) < target and proc.poll() is None:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    final = _cli(run_dir, overrides)
    out = final.communicate(timeout=600)[0]
    assert final.returncode == 0, out[-2000:]
    subs = ["", *(f"branches/tokens={t}" for t in (3840, 7680, 15360))]
    for sub in subs:
        assert (comparable(run_dir / sub, {"branch_of"})
                == comparable(tmp_path / "reference" / sub, {"branch_of"})), sub


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.branch_budgets=[0.5]"], "needs train.schedule=wsd"),
    (["train.schedule=wsd", "train.branch_budgets=[0.5,0.25]"], "must be increasing"),
    (["train.schedule=wsd", "train.branch_budgets=[1.5]"], "in (0, 1)"),
    (["train.schedule=wsd", "train.branch_budgets=[0.5]", "train.steps=100"],
     "constant batch and a token budget"),
])
def test_bad_branch_settings_are_one_line(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_cfg(*overrides)


def test_a_branch_without_its_checkpoint_is_one_line(tiny_cfg, tmp_path):
    import shutil

    from critbatch.results.errors import ResultsError

    cfg = tiny_cfg("optim=adamw", *BRANCHED)
    train(cfg, tmp_path / "run")  # the run alone: it forks, its branches are not trained
    shutil.rmtree(tmp_path / "run/branches/tokens=2560")
    with pytest.raises(ResultsError, match="has no checkpoint to cool down from") as err:
        train_with_branches(cfg, tmp_path / "run")
    assert "\n" not in str(err.value)
