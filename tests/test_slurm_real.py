"""The sweep on a real SLURM (slurm_cluster.local_cluster: munged, slurmctld and slurmd on this
machine, no accounting), as a CPU-cluster user meets it: the documented command, a task
cancelled mid-way, a task killed with no result, the rerun, and sbatch's refusals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster
from test_sweep import make_command

from critbatch.orchestration import launch, scheduler, slurm, stages
from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.training import failures

pytestmark = pytest.mark.skipif(
    bool(slurm_cluster.missing()),
    reason=f"SLURM is not installed ({', '.join(slurm_cluster.missing())} missing); "
           "`make test` installs it with apt-get where it runs as root")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The test cluster; a machine where SLURM is installed but its daemons cannot start (no
    resolvable host name, a container without the privileges) skips with their reason."""
    stack = contextlib.ExitStack()
    try:
        root = tmp_path_factory.mktemp("slurm")
        running = stack.enter_context(slurm_cluster.local_cluster(root))
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        stack.close()
        why = " ".join(str(err).split())[-400:]
        pytest.skip(f"the test SLURM did not start on this machine: {why}")
    with stack:
        yield running


def test_the_scheduler_states_are_parsed_as_slurm_prints_them():
    sacct = "7_0|CANCELLED by 0|0:15\n7_[2-3%2]|PENDING|0:0\n7_1|OUT_OF_MEMORY|0:125\n"
    states = scheduler.parse_sacct(sacct + "8|TIMEOUT|0:0\n")
    assert states["7_0"] == scheduler.TaskState("CANCELLED", "0:15")
    assert states["7_0"].describe() == "CANCELLED (signal 15)"
    assert states["7_1"].describe() == "OUT_OF_MEMORY (signal 125)" and states["7_1"].ended
    assert states["7_2"] == states["7_3"] == scheduler.TaskState("PENDING", "0:0")
    assert not states["7_2"].ended and states["8"].describe() == "TIMEOUT"
    scontrol = ("JobId=7 ArrayJobId=7 ArrayTaskId=3 JobState=PENDING ExitCode=0:0\n"
                "JobId=9 ArrayJobId=7 ArrayTaskId=2 JobState=FAILED ExitCode=1:0\n"
                "JobId=10 JobName=x JobState=COMPLETED Reason=None ExitCode=0:0\n")
    states = scheduler.parse_scontrol(scontrol)
    assert states["7_2"].describe() == "FAILED (exit code 1)" and not states["7_3"].ended
    assert states["10"].state == "COMPLETED" and set(states) == {"7_2", "7_3", "10"}
    assert scheduler.task_ids("[0,2-4%1]") == [0, 2, 3, 4]


def test_sbatch_refusals_name_the_field_to_change():
    said = "sbatch: error: Invalid generic resource (gres) specification\n"
    line = scheduler.explain_sbatch(f"Command '['sbatch', 'x']' returned 1.\n{said}")
    assert "hydra/launcher=slurm_cpu" in line and "gpus_per_node" in line and "\n" not in line
    line = scheduler.explain_sbatch("sbatch: error: invalid partition specified: gpu\n"
                                    "sbatch: error: Batch job submission failed: Invalid "
                                    "partition name specified")
    assert "hydra.launcher.partition" in line and "invalid partition specified: gpu" in line


def _array(tmp_path: Path, *overrides: str) -> slurm.Array:
    plan = stages.plan_stage("batch", "smoke", "adamw",
                             [f"hydra.sweep.dir={tmp_path / 'runs'}", *overrides])
    return launch.submitit_array(plan)


def test_the_launchers_write_the_documented_sbatch_scripts(cluster, tmp_path, monkeypatch):
    """hydra/launcher=slurm asks for one GPU, 8 CPUs, 32 GB and 4 h a task (docs/running.md);
    slurm_cpu no GPU and the scale's CPUs and memory (smoke: 2 and 4 GB)."""
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", cluster.env["PATH"])
    gpu = _array(tmp_path, "hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    text = gpu.executor()._executor._make_submission_file_text("python task.py", "uid")
    for line in ("#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=32GB",
                 "#SBATCH --time=240", "#SBATCH --partition=gpu", "#SBATCH --ntasks-per-node=1"):
        assert line in text, (line, text)
    cpu = _array(tmp_path, "hydra/launcher=slurm_cpu", "hydra.launcher.partition=cpu")
    text = cpu.executor()._executor._make_submission_file_text("python task.py", "uid")
    assert "--gpus" not in text and "gres" not in text
    for line in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=4GB", "#SBATCH --partition=cpu"):
        assert line in text, (line, text)
    # and sbatch itself refuses the GPU one here in one line that names the fix
    with pytest.raises(ConfigError) as err:
        slurm.submit(gpu.executor(), time.sleep, [0])
    assert "gpus_per_node" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_task_killed_or_cancelled_without_a_result_is_failed_with_its_state(
        cluster, tmp_path, monkeypatch):
    """Task 0 is killed outright (SIGKILL, as the OOM killer would): FAILED with signal 9.
    Task 1 is cancelled while it waits. Neither is waited on for ever (the cluster has no
    accounting: sacct says nothing), and each run's failed.txt says why."""
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", cluster.env["PATH"])
    monkeypatch.chdir(tmp_path)
    array = _array(tmp_path, "hydra/launcher=slurm_cpu", "hydra.launcher.array_parallelism=1",
                   "hydra.launcher.timeout_min=5")
    array.poll_s, array.gone_grace_s = 0.5, 3.0
    tasks = slurm.submit(array.executor(), time.sleep, [600, 600])
    array_id = tasks[0].job_id.split("_")[0]
    deadline = time.monotonic() + 60
    while cluster.states().get(f"{array_id}_0") != "RUNNING":
        assert time.monotonic() < deadline, cluster.states()
        time.sleep(0.2)
    time.sleep(1.0)  # the task's python is up and sleeping
    cluster.run("scancel", f"{array_id}_1")  # pending: it leaves no record
    for pid in cluster.pids(array_id, 0):  # killed outright, as the OOM killer does
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    plan = stages.plan_stage("batch", "smoke", "adamw", [])[:2]
    start = time.monotonic()
    states = slurm.wait(tasks, [[], []], array)
    assert time.monotonic() - start < 30
    assert states[0].describe() == "FAILED (signal 9)", states
    assert states[1].state == "CANCELLED"
    for task, job, state in zip(tasks, plan, states, strict=True):
        assert slurm.task_outcomes(task, [job], state) == []
    why = [failures.reason(job.run_dir) for job in plan]
    assert f"its array task {array_id}_0 ended FAILED (signal 9)" in why[0]
    assert f"its array task {array_id}_1 ended CANCELLED" in why[1]


def _documented(*extra: str) -> list[str]:
    """docs/running.md's CPU-cluster command at the smoke scale, with the test's grid."""
    cmd = make_command("sweep-batch", "SCALE=smoke",
                       'ARGS=hydra/launcher=slurm_cpu hydra.launcher.partition=cpu')
    assert cmd[1:3] == ["-m", "critbatch.sweep"] and "hydra/launcher=slurm_cpu" in cmd, cmd
    return [*cmd, *extra]


TINY = ["logger.mode=disabled", "--opt", "adamw", "train.tokens=8192", "train.warmup_steps=2",
        "grid.batch_sizes='4,8'", "grid.lrs.adamw='4e-3,1e-2'", "grid.lr_search_rounds=1",
        "grid.lr_search_budget=0.5", "train.eval_tokens=1024"]


def _final_losses(folder: Path) -> dict[str, float]:
    return {p.parent.name: runs.read_summary(p.parent)["val_loss"]
            for p in folder.glob("*/summary.json")}


def _numbers(value, path: str = "") -> dict[str, float]:
    """The numbers of a fits.json by their path in it (times and folders aside)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() if not any(
            w in key for w in ("time", "dir", "path", "wall")) for k, v in
            _numbers(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in
                _numbers(item, f"{path}/{i}").items()}
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return {path: value} if is_number else {}


@pytest.mark.slow
def test_the_documented_cpu_cluster_sweep_survives_a_cancelled_task(cluster, tmp_path,
                                                                     cache_dir):
    """`make sweep-batch ARGS="hydra/launcher=slurm_cpu hydra.launcher.partition=cpu"` on the
    test cluster: one array task cancelled while it trains leaves failed.txt saying CANCELLED
    and no lr search on the holed grid; the rerun trains what is left, and its report equals
    the same sweep's trained on this machine without SLURM."""
    env = {**cluster.env, "CRITBATCH_POLL_S": "1", "CRITBATCH_GONE_GRACE_S": "5"}
    # one CPU a task (the preset's smoke task asks for 2, the test node has 2): both tasks run
    # at once, as on a cluster with room for them
    cmd = _documented(f"data.cache_dir={cache_dir}", *TINY, "--tasks", "2",
                      "hydra.launcher.cpus_per_task=1")
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    victim = None
    while victim is None and first.poll() is None:
        running = [j for j, state in cluster.states().items() if state == "RUNNING"]
        if running:
            victim = running[0]
            cluster.run("scancel", victim)
        assert time.monotonic() < deadline
        time.sleep(0.2)
    out, _ = first.communicate(timeout=600)
    assert victim and first.returncode != 0, out[-3000:]
    assert "ended: CANCELLED" in out, out[-3000:]
    failed = [failures.reason(d) for d in (tmp_path / "runs/batch/smoke").glob("*/")
              if failures.reason(d)]
    assert failed and all("CANCELLED" in why for why in failed), failed
    assert "lr search: not started" in out and "lr search round" not in out

    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert again.stdout.count("Bypassing sacct error") <= 1  # submitit's warning, folded

    local = tmp_path / "local"
    local.mkdir()
    here = [sys.executable, "-m", "critbatch.sweep", "batch", "--scale", "smoke", "--jobs", "2",
            f"data.cache_dir={cache_dir}", *TINY]
    alone = subprocess.run(here, cwd=local, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stdout[-3000:]
    on_slurm = _final_losses(tmp_path / "runs/batch/smoke")
    assert on_slurm.keys() == _final_losses(local / "runs/batch/smoke").keys()
    for name, loss in _final_losses(local / "runs/batch/smoke").items():
        assert on_slurm[name] == pytest.approx(loss, rel=1e-5), name
    slurm_fits, local_fits = (_numbers(json.loads((d / "runs/batch/smoke/report/fits.json")
                                                  .read_text())) for d in (tmp_path, local))
    assert slurm_fits.keys() == local_fits.keys() and len(slurm_fits) > 50
    assert slurm_fits == pytest.approx(local_fits, rel=1e-4, nan_ok=True)
