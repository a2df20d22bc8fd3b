"""Checkpoint retention (`train.keep_checkpoint`, branches.retire): each policy keeps exactly
the checkpoint.pt files it promises once a run and its branches are finished, never one still
needed (a run or branch killed mid-way resumes), and the sweep's disk plan is its peak."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_branches import BRANCHED, Interrupted, interrupt_at
from test_local_cbs_training import BASE, LOCAL

from critbatch.orchestration import estimate, stages, sweep
from critbatch.orchestration.experiments import EXPERIMENTS
from critbatch.results import runs
from critbatch.science.model_size import param_count
from critbatch.training import branches as branching
from critbatch.training.cli import finished_run
from critbatch.training.loop import train, train_with_branches

FOLDERS = ("", "branches/tokens=2560", "branches/tokens=5120")  # the run, its two branches
KEPT = {"all": FOLDERS, "final": ("",), "none": ()}


def checkpoints(run_dir: Path) -> set[str]:
    """The folders under `run_dir` (relative, "" itself) that hold a checkpoint.pt."""
    return {"" if p.parent == run_dir else str(p.parent.relative_to(run_dir))
            for p in run_dir.rglob("checkpoint.pt")}


@pytest.mark.parametrize("keep", ["all", "final", "none"])
@pytest.mark.slow
def test_each_policy_keeps_what_it_promises_and_a_finished_run_stays_finished(
        tiny_cfg, tmp_path, keep):
    cfg = tiny_cfg(*BRANCHED, f"train.keep_checkpoint={keep}")
    run_dir = tmp_path / "run"
    assert len(train_with_branches(cfg, run_dir)) == 3
    assert checkpoints(run_dir) == set(KEPT[keep])
    for sub in FOLDERS:  # every result is there, whatever went
        assert runs.read_summary(run_dir / sub)["status"] == "completed"
    # without its checkpoint a run still counts as finished: skipped on a rerun
    assert finished_run(run_dir, cfg)
    assert train_with_branches(cfg, run_dir, skip_finished=True) == []
    assert not branching.pending(cfg, run_dir, [])


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_and_nothing_is_deleted_before_the_end(
        tiny_cfg, tmp_path, monkeypatch):
    """Under `none`, killed in the run after its first fork and then in the second branch's
    cooldown: every checkpoint it needs is still there each time, and it ends with the
    val_loss of an uninterrupted run and no checkpoint left."""
    cfg = tiny_cfg("optim=muon", *BRANCHED, "train.checkpoint_every_steps=7",
                   "train.keep_checkpoint=none")
    reference = [s["val_loss"] for s in train_with_branches(cfg, tmp_path / "reference")]
    killed = tmp_path / "killed"
    interrupt_at(monkeypatch, 12)
    with pytest.raises(Interrupted):
        train_with_branches(cfg, killed)
    monkeypatch.undo()
    assert checkpoints(killed) == {"", "branches/tokens=2560"}  # step 7's and the first fork
    interrupt_at(monkeypatch, 18, nth=2)
    with pytest.raises(Interrupted):
        train_with_branches(cfg, killed)
    monkeypatch.undo()
    assert (killed / "summary.json").exists() and checkpoints(killed) == set(FOLDERS)
    assert [s["tokens"] for s in train_with_branches(cfg, killed)] == [5120]
    assert [runs.read_summary(killed / sub)["val_loss"] for sub in FOLDERS] == reference
    assert checkpoints(killed) == set()


@pytest.mark.slow
def test_a_local_cbs_branch_trained_alone_drops_its_own_and_the_base_keeps_its_own(
        tiny_cfg, tmp_path):
    """As the sweep trains them (`pool.train_split`): the base alone, then each branch as a
    job of its own. Under `final` a branch deletes its checkpoint when it ends; the base keeps
    its own, which `none` deletes once every branch is finished (not before)."""
    for keep in ("final", "none"):
        cfg = tiny_cfg(*BASE, *LOCAL, f"train.keep_checkpoint={keep}")
        base = tmp_path / keep
        train(cfg, base)
        forked = branching.plan_branches(cfg, base, [])
        assert all((b.run_dir / "checkpoint.pt").exists() for b in forked)
        first, *rest = forked
        train_with_branches(first.cfg, first.run_dir, first.overrides)
        assert not (first.run_dir / "checkpoint.pt").exists()
        assert branching.retire(cfg, base, []) == []  # branches still to train: nothing goes
        for b in rest:
            train_with_branches(b.cfg, b.run_dir, b.overrides)
        branching.retire(cfg, base, [])
        assert checkpoints(base) == ({""} if keep == "final" else set())


@pytest.mark.slow
def test_the_plan_estimates_the_peak_disk_of_each_policy(tmp_path, monkeypatch):
    """A job holds the checkpoints of its run and branches until all are finished: the peak
    is what the jobs keep plus what the `jobs_at_once` largest hold meanwhile."""
    monkeypatch.chdir(tmp_path)  # an empty runs/: every run and branch still to train
    peaks = {}
    for keep in ("all", "final", "none"):
        jobs = stages.plan_stage("batch", "smoke", "adamw", [f"train.keep_checkpoint={keep}"])
        m, vocab = jobs[0].cfg.model, jobs[0].cfg.data.vocab_size
        size = param_count(m.width, m.depth, m.seq_len, vocab)[0] * 12
        per_job = 1 + len(jobs[0].cfg.train.branch_budgets)
        peaks[keep] = estimate.checkpoint_bytes(jobs, jobs_at_once=2)
        kept = {"all": per_job, "final": 1, "none": 0}[keep] * len(jobs) * size
        assert peaks[keep] == (kept + 2 * (per_job * size - kept // len(jobs)), kept)
    assert peaks["all"][0] > peaks["final"][0] > peaks["none"][0]


@pytest.mark.slow
def test_the_sweep_holds_the_noise_programs_checkpoints_under_none_until_it_has_read_them(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = EXPERIMENTS["batch"]
    plan = stages.plan_experiment(exp, "smoke", ["adamw"], ["train.keep_checkpoint=none"])
    held = sweep.hold_for_noise(exp, plan)
    smallest = min(j.cfg.train.batch_size for j in plan)
    assert held and {(j.stage, j.cfg.train.batch_size) for j in held} == {("batch", smallest)}
    assert {str(j.cfg.train.keep_checkpoint) for j in plan} == {"none", "final"}
    assert all(j.cfg.train.keep_checkpoint == "final" for j in held)
    for job in held:
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "checkpoint.pt").write_bytes(b"weights")
    sweep.release_after_noise(held)  # no noise.json yet (not measured, or it failed): kept
    assert all((j.run_dir / "checkpoint.pt").exists() for j in held)
    (held[0].run_dir / "noise.json").write_text("{}")
    sweep.release_after_noise(held)
    assert not any((j.run_dir / "checkpoint.pt").exists() for j in held)
    with pytest.raises(sweep.ConfigError, match="Hydra launcher"):
        sweep.hold_for_noise(exp, stages.plan_experiment(
            exp, "smoke", ["adamw"], ["train.keep_checkpoint=none", "hydra/launcher=joblib"]))


def test_another_policy_is_one_line():
    from critbatch.results.errors import ConfigError
    from critbatch.training.cli import check_overrides

    with pytest.raises(ConfigError, match="keep_checkpoint=some is not one of all, final, none"):
        check_overrides(["train.keep_checkpoint=some"])
