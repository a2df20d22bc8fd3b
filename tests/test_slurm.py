"""SLURM as an array of worker pools: the planned runs sharded into array tasks, longest first,
each task a worker pool; failures read from the run folders. submitit is the engine: its local
executor runs the tasks here as processes of their own, as SLURM would run them on nodes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from critbatch.orchestration import launch, scheduler, slurm, stages, sweep, workers
from critbatch.results.errors import ConfigError
from critbatch.training.checkpoint import sole_writer


def test_shards_take_the_longest_runs_first_each_onto_the_least_loaded():
    costs = {"a": 5, "b": 4, "c": 3, "d": 3, "e": 3, "f": 2}
    assert workers.balance(costs, 2) == [["a", "d", "f"], ["b", "c", "e"]]  # 10 | 10
    assert workers.balance(costs, 4) == [["a"], ["b"], ["c", "e"], ["d", "f"]]  # 5 4 6 5
    assert workers.balance({"x": 1.0}, 3) == [["x"]]  # no empty tasks
    assert workers.makespan(list(costs.values()), 2) == 10


def _tiny(corpus_dir: Path, cache_dir: Path, *launcher: str) -> list[str]:
    return ["data=text_files", f"data.paths=[{corpus_dir}/*.txt]", f"data.cache_dir={cache_dir}",
            "data.vocab_size=512", "logger.mode=disabled", "model.width=32", "train.tokens=4096",
            "train.eval_tokens=512", "grid.batch_sizes='4,8,16'", "grid.lrs.adamw=4e-3",
            *launcher]


LOCAL = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
         "hydra.launcher.cpus_per_task=1"]


@pytest.mark.slow
def test_tasks_auto_give_each_worker_about_four_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    plan = stages.plan_stage("widths", "smoke", "adamw",
                            ["hydra/launcher=slurm", "hydra.launcher.array_parallelism=3"])
    array = launch.submitit_array(plan)
    assert array.cluster == "slurm" and array.launcher["gpus_per_node"] == 1
    per_task = workers.runs_per_gpu(max(j.cfg.model.width for j in plan))  # one GPU a task
    wanted = math.ceil(len(plan) / (slurm.RUNS_PER_WORKER * per_task))
    assert slurm.task_count(plan, array, "cuda") == min(wanted, 3)
    array.launcher["array_parallelism"] = 1000
    assert slurm.task_count(plan, array, "cuda") == wanted
    array.tasks = 10**6  # --tasks N: never more tasks than runs
    assert slurm.task_count(plan, array, "cuda") == len(plan)
    local = launch.submitit_array(stages.plan_stage("batch", "smoke", "adamw", LOCAL))
    assert local.cluster == "local" and slurm.task_count(plan, local, "cpu") == 1  # one machine
    assert launch.submitit_array(stages.plan_stage("batch", "smoke", "adamw",
                                                 ["hydra/launcher=joblib"])) is None  # a multirun


@pytest.mark.slow
def test_the_slurm_launcher_fields_become_the_sbatch_script(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    plan = stages.plan_stage("batch", "smoke", "adamw", [
        "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=lab",
        "hydra.launcher.timeout_min=90"])
    array = launch.submitit_array(plan)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="hydra/launcher=slurm needs SLURM on this machine"):
        array.executor()
    bin_dir = tmp_path / "bin"  # submitit looks for srun before it writes anything
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    script = array.executor()._executor._make_submission_file_text("python -m x", "uid")
    array.launcher["tasks_per_node"] = 2
    with pytest.raises(ConfigError, match="tasks_per_node=2: each array task of the sweep is one"):
        array.executor()
    for line in ("--partition=gpu", "--account=lab", "--gpus-per-node=1", "--cpus-per-task=8",
                 "--mem=32GB", "--time=90"):
        assert f"#SBATCH {line}\n" in script, script
    assert str(tmp_path / "runs/batch/smoke/.submitit") in script  # the logs in the sweep folder


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/home /home nfs4 rw,vers=4.2,local_lock=none 0 0
server:/old /old nfs rw,vers=3,nolock 0 0
mds@tcp:/scratch /scratch lustre rw,localflock 0 0
mds@tcp:/fast /fast lustre rw,flock 0 0
beegfs_nodev /beegfs beegfs rw 0 0
"""


@pytest.mark.parametrize(("folder", "note"), [
    ("/home/me/critbatch/runs", None),
    ("/old/critbatch/runs", "NFS mounted nolock"),
    ("/scratch/me/runs", "Lustre mounted without `flock`"),
    ("/fast/me/runs", None),
    ("/beegfs/me/runs", "tuneUseGlobalFileLocks"),
    ("/tmp/critbatch/runs", "on / (ext4), a file system of this machine"),
])
def test_the_sweep_says_when_the_run_folder_lock_cannot_work_across_nodes(folder, note):
    notes = slurm.lock_notes(Path(folder), MOUNTS)
    assert notes == [] if note is None else note in " ".join(notes), notes


def test_a_folder_without_flock_stops_the_sweep_before_it_submits(tmp_path, monkeypatch):
    import errno
    import fcntl

    slurm.check_flock(tmp_path / "runs/batch")  # a real flock, on the nearest folder that exists
    assert list(tmp_path.iterdir()) == []  # its probe file removed

    def no_flock(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)  # as Lustre mounted without flock answers
    with pytest.raises(ConfigError, match="does not support flock"):
        slurm.check_flock(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_task_that_dies_leaves_its_state_in_the_folders_of_its_runs(tmp_path, monkeypatch):
    """A task killed before it could report (here it exits at once, as on a lost node): its
    runs say so in their failed.txt, with the task and its log."""
    import submitit

    monkeypatch.chdir(tmp_path)
    job = stages.plan_stage("batch", "smoke", "adamw", [])[0]
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="local")
    task = executor.submit(os._exit, 3)
    task._results_timeout_s = 1  # submitit waits 15 s for a result on a slow shared disk
    task.wait()
    assert slurm.task_outcomes(task, [job], scheduler.TaskState(task.state)) == []
    why = job.failure
    assert f"its array task {task.job_id} ended" in why and str(task.paths.stdout) in why


@pytest.mark.slow
def test_an_array_of_two_worker_pools_trains_the_plan_and_reads_failures_from_the_folders(
        corpus_dir, cache_dir, tmp_path, monkeypatch, capsys):
    """Four runs by estimated seconds 4, 3, 2, 1 in two tasks: {4, 1} and {3, 2}. The test
    holds the lock of the 1-second run, as another process training it would: its worker
    fails, says why in the run's folder, and the other three complete."""
    monkeypatch.chdir(tmp_path)
    extra = _tiny(corpus_dir, cache_dir, *LOCAL)
    plan = stages.plan_stage("batch", "smoke", "adamw", extra) + stages.plan_stage(
        "batch_seeds", "smoke", "adamw", extra)
    assert len(plan) == 4
    seconds = {j.run_dir: s for j, s in zip(plan, [4.0, 3.0, 2.0, 1.0], strict=True)}
    array = launch.submitit_array(plan, tasks=2)
    array.poll_s = 0.5
    held = plan[3]
    with sole_writer(held.run_dir):
        outcomes = launch.train_jobs(plan, 1, "cpu", seconds, array)
    out = capsys.readouterr().out
    assert "4 runs in 2 array task(s) (submitit local" in out
    assert "task 0: 2 run(s), 50% of the estimated time" in out
    assert "task 1: 2 run(s), 50% of the estimated time" in out
    assert [j.done for j in plan] == [True, True, True, False]
    assert sorted(o.ok for o in outcomes) == [False, True, True, True]
    assert f"is in use by process {os.getpid()}" in held.failure
    assert held.failure.split(": ", 1)[0].endswith(os.uname().nodename)  # when, and where
    # each task trained its own shard in a pool of its own
    logs = sorted((tmp_path / "runs/batch/smoke/.submitit").glob("*/*_log.out"))
    name = [str(j.run_dir.relative_to("runs")) + ":" for j in plan]  # as the pools print them
    shards = {frozenset(i for i in range(4) if name[i] in log.read_text()) for log in logs}
    assert shards == {frozenset({0, 3}), frozenset({1, 2})}
    assert not list(tmp_path.glob("runs/**/.critbatch-failed-*"))
    saved = json.loads((plan[0].run_dir / "config.json").read_text())["overrides"]
    assert "train.batch_size=4" in saved and not [o for o in saved if o.startswith("hydra")]


@pytest.mark.slow
def test_make_sweep_on_submitit_local_reports_the_failed_run_from_its_folder(
        corpus_dir, cache_dir, tmp_path):
    """The whole experiment through `python -m critbatch.sweep ... hydra/launcher=submitit_local
    --tasks 2`: the runs as an array of two pools, the report; one run held by this process
    fails, so B_noise (the best of a grid with a hole) waits, and the sweep's last lines name
    the run with the reason from its folder."""
    extra = _tiny(corpus_dir, cache_dir, *LOCAL)
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        held = next(j for j in stages.plan_stage("batch", "smoke", "adamw", extra)
                    if j.cfg.train.batch_size == 16)
    finally:
        os.chdir(cwd)
    cmd = [sys.executable, "-m", "critbatch.sweep", "batch", "--scale", "smoke", "--opt", "adamw",
           "--tasks", "2", *extra]
    with sole_writer(tmp_path / held.run_dir):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    assert "4 runs in 2 array task(s) (submitit local" in out
    assert "the noise measurement did not start: 1 run(s) failed" in out
    assert "== noise" not in out
    assert "sweep-batch scale=smoke: 3/4 runs complete" in out
    (line,) = [x for x in out.splitlines() if x.startswith("warning: run did not complete")]
    assert held.run_dir.name in line and f"in use by process {os.getpid()}" in line
    assert (tmp_path / "runs/batch/smoke/report/report.md").exists()


@pytest.mark.slow
def test_a_dry_run_shows_the_split_and_submits_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")  # no SLURM here: the plan needs none
    with pytest.raises(SystemExit) as stop:
        sweep.main(["batch", "--scale", "smoke", "--opt", "adamw", "--dry-run",
                    "hydra/launcher=slurm", "--tasks", "2"])
    out = capsys.readouterr().out
    assert stop.value.code == 0, out
    assert "SLURM array (submitit slurm) task 0: " in out and "task 1: " in out
    assert "task 2: " not in out and "of the FLOPs" in out
    assert list(tmp_path.iterdir()) == []


def test_a_task_gone_from_the_queue_with_no_result_fails_after_the_grace_time(tmp_path,
                                                                             monkeypatch):
    """SLURM forgets a task (cancelled while pending, or ended long ago) and it left no result:
    the wait does not hang on it, it ends GONE once the grace time has passed; a result file
    that appears meanwhile ends it COMPLETED."""
    from types import SimpleNamespace

    def task(job_id: str) -> SimpleNamespace:
        paths = SimpleNamespace(result_pickle=tmp_path / f"{job_id}_result.pkl")
        return SimpleNamespace(job_id=job_id, paths=paths)

    tasks = [task("5_0"), task("5_1")]
    monkeypatch.setattr(scheduler, "job_states",
                        lambda ids: dict.fromkeys(ids, scheduler.TaskState(scheduler.GONE)))
    array = slurm.Array({"_target_": slurm.PLUGIN + "submitit_launcher.SlurmLauncher"},
                        poll_s=0.0, gone_grace_s=0.3)
    gone_since = {}
    assert slurm.ended_tasks(tasks, array, gone_since) == {}  # just missed: not yet
    tasks[1].paths.result_pickle.write_bytes(b"")  # its result arrives late: it ended well
    assert slurm.ended_tasks(tasks, array, gone_since) == {1: scheduler.TaskState("COMPLETED")}
    time.sleep(0.35)
    ended = slurm.ended_tasks(tasks, array, gone_since)
    assert ended[0].state == scheduler.GONE and "no result" in ended[0].describe()


def test_submitit_s_repeated_warnings_are_folded_into_one_line():
    import logging

    fold = scheduler.FoldRepeats()
    record = logging.LogRecord("submitit", logging.WARNING, __file__, 1,
                               "Call #%d - Bypassing sacct error", (3,), None)
    other = logging.LogRecord("submitit", logging.WARNING, __file__, 1, "another", (), None)
    assert fold.filter(record) and fold.filter(other)
    record.args = (4,)
    assert not fold.filter(record) and not fold.filter(record)
    assert fold.folded() == 2


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789_-[],%|=: \nJobIdArayTskStaeExCCANCELD", max_size=80))
@example("0| |")  # a state of blanks only: indexed its first word, an IndexError
def test_the_scheduler_s_output_of_any_shape_parses_without_a_traceback(text):
    """sacct and scontrol lines cut short or garbled (a range "1-", "2-x", a field with no
    value) are skipped, never a traceback that would stop the sweep's wait."""
    for states in (scheduler.parse_sacct(text), scheduler.parse_scontrol(text)):
        assert all(isinstance(s, scheduler.TaskState) for s in states.values())
    assert all(i >= 0 for i in scheduler.task_ids(text))
