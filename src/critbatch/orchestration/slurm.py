"""SLURM as an array of worker pools, not of runs: the sweep's runs sharded into array tasks.

With a submitit launcher (`hydra/launcher=slurm`, `submitit_slurm`, or `submitit_local` to do
the same on this machine) the sweep drives submitit itself instead of handing each stage to
Hydra as a multirun of one job per run:

- the runs still to train are split into `--tasks` shards, longest first, each to the shard
  with the least work so far (`workers.balance`, by the planner's estimated seconds or, where
  nothing was timed -- a login node times nothing -- by the FLOPs left, `Job.flops_to_train`);
- the shards are the tasks of one job array (`executor.map_array`); each task is a worker
  pool on its node (`pool.train_here`: k workers on each of its GPUs by width, or one per CPU
  of the task), so a queue wait is paid per task, torch is imported once per task (the
  workers fork from a server that has it, `workers.worker_context`) and CUDA starts once per
  worker, not once per run;
- the sweep waits for the array, printing a line per finished run (read from its folder) and
  per ended task. Everything the experiment can train at once is one array; stages that carry
  a tuned lr are a second array, after the tuning stage's alone. The noise measurements are
  an array of their own, on the same resources, after the runs they read;
- a run that did not complete is reported from its folder: the worker's failed.txt
  (`failures.record`), or, when its whole task died (time limit, memory, a lost node), the
  task's state and log, written there by the sweep.

The resources are the launcher's own fields (conf/hydra/launcher/slurm.yaml, overridden as
`hydra.launcher.<field>=...`), handed to submitit as hydra-submitit-launcher hands them. Two
tasks never train one run together: the run folder's lock (`checkpoint.sole_writer`) is an
flock, which the sweep folder's file system must honour across nodes (`lock_notes`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from critbatch.analysis.parallel import cores
from critbatch.orchestration import pool, scheduler, workers
from critbatch.orchestration.planned import Job
from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.training import failures

PLUGIN = "hydra_plugins.hydra_submitit_launcher."
# fields that hydra-submitit-launcher passes to submitit without a `<cluster>_` prefix
BASE_FIELDS = ("timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb",
               "nodes", "name", "stderr_to_stdout")
RUNS_PER_WORKER = 4  # --tasks auto: about this many runs per worker, sharing its start-up
POLL_S = 10.0  # seconds between looks at the run folders and the tasks while the array runs


def is_submitit(launcher: dict) -> bool:
    """The Hydra launcher config (hydra.launcher) is hydra-submitit-launcher's."""
    return str(launcher.get("_target_", "")).startswith(PLUGIN)


@dataclass
class Array:
    """How the sweep trains elsewhere: the submitit launcher's fields and the tasks wanted."""

    launcher: dict  # hydra.launcher, resolved (submitit_folder, timeout_min, partition, ...)
    tasks: int | None = None  # array tasks per array; None: `task_count` decides
    # seconds between looks at the tasks, and before a task gone from the queue with no result
    # is failed (scheduler.GONE_GRACE_S); the environment may shorten both (the tests do)
    poll_s: float = field(default_factory=lambda: float(os.environ.get("CRITBATCH_POLL_S",
                                                                       POLL_S)))
    gone_grace_s: float = field(default_factory=lambda: float(
        os.environ.get("CRITBATCH_GONE_GRACE_S", scheduler.GONE_GRACE_S)))

    @property
    def cluster(self) -> str:
        return "slurm" if self.launcher["_target_"].endswith("SlurmLauncher") else "local"

    @property
    def folder(self) -> Path:
        """submitit's folder for job files and task logs (`%j`: the job id)."""
        return Path(self.launcher["submitit_folder"]).absolute()

    def executor(self):
        """A submitit executor for the launcher's cluster and fields; a one-line error where
        SLURM is asked for and not here."""
        import submitit

        params = {k: v for k, v in self.launcher.items()
                  if k not in ("_target_", "submitit_folder") and v is not None}
        several = [k for k in ("nodes", "tasks_per_node") if (params.get(k) or 1) > 1]
        if several:  # each process would train the whole shard: two pools on every run
            raise ConfigError(f"hydra.launcher.{several[0]}={params[several[0]]}: each array task "
                              "of the sweep is one worker pool on one node; keep nodes and "
                              "tasks_per_node at 1 and ask for more GPUs with gpus_per_node or "
                              "more tasks with --tasks")
        init = {f"{self.cluster}_max_num_timeout": params.pop("max_num_timeout")} \
            if "max_num_timeout" in params else {}
        try:
            executor = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster, **init)
        except RuntimeError as err:  # submitit: 'Could not detect "srun"'
            raise ConfigError(f"hydra/launcher=slurm needs SLURM on this machine ({err}); start "
                              "the sweep on the cluster's login node, or use "
                              "hydra/launcher=submitit_local to run the same array here") from None
        executor.update_parameters(**{k if k in BASE_FIELDS else f"{self.cluster}_{k}": v
                                      for k, v in params.items()})
        return executor


def task_count(todo: list[Job], array: Array, device: str) -> int:
    """Array tasks for `todo`: `--tasks` when given; on the local executor one, the machine
    being one node; else enough for about RUNS_PER_WORKER runs per worker (gpus_per_node x
    `workers.runs_per_gpu` workers a task on CUDA, cpus_per_task on CPUs), at most
    `array_parallelism`, so that every task can start at once."""
    if array.tasks:
        return max(1, min(array.tasks, len(todo)))
    if array.cluster == "local":
        return 1
    launcher = array.launcher
    per_task = ((launcher.get("gpus_per_node") or 1)
                * workers.runs_per_gpu(max(j.cfg.model.width for j in todo))
                if device == "cuda" else launcher.get("cpus_per_task") or 1)
    tasks = math.ceil(len(todo) / (RUNS_PER_WORKER * per_task))
    return max(1, min(tasks, launcher.get("array_parallelism") or tasks))


def run_task(jobs: list[Job], device: str, seconds: dict[Path, float], cwd: str,
             cpus: int | None) -> list[workers.Outcome]:
    """One array task, on its node: its shard on a worker pool there (k workers on each GPU
    the task holds by the widest model, or one worker per CPU of the task, `cpus` or the
    cores it may use, the CPUs split between them when there are fewer runs)."""
    os.chdir(cwd)  # the plan's run folders are relative to where the sweep started
    if device == "cuda":
        return pool.train_here(jobs, pool.gpu_jobs(jobs), device, seconds)
    cpus = cpus or cores()
    at_once = max(1, min(len(jobs), cpus))
    return pool.train_here(jobs, at_once, device, seconds, threads=max(1, cpus // at_once))


def shard(todo: list[Job], array: Array, device: str,
          seconds: dict[Path, float]) -> tuple[list[list[Job]], list[str]]:
    """`todo` in `task_count` shards of about equal work (`workers.balance`: by the estimated
    seconds when every job has one, else by the FLOPs left), and a line on each shard."""
    timed = all(seconds.get(j.run_dir) for j in todo)
    cost = {i: seconds[j.run_dir] if timed else j.flops_to_train for i, j in enumerate(todo)}
    parts = workers.balance(cost, task_count(todo, array, device))
    total = sum(cost.values()) or 1.0
    lines = [f"task {i}: {len(part)} run(s), {sum(cost[k] for k in part) / total:.0%} of the "
             f"{'estimated time' if timed else 'FLOPs'}" for i, part in enumerate(parts)]
    return [[todo[i] for i in part] for part in parts], lines


def train_array(todo: list[Job], array: Array, device: str,
                seconds: dict[Path, float]) -> list[workers.Outcome]:
    """Train `todo` as one job array of worker pools (see the module docstring) and wait for
    it; the runs that did not complete say why in their folders."""
    executor = array.executor()
    for note in shared_folder_notes(sorted({j.run_dir.parent for j in todo}), array.cluster):
        print(f"note: {note}", flush=True)
    workers.prepare_data_first([j.cfg for j in todo])  # here: compute nodes may be offline
    shards, lines = shard(todo, array, device, seconds)
    for job in todo:  # a reason left by an earlier attempt is not this one's
        for folder in [job.run_dir, *(b.run_dir for b in job.branches if not b.done)]:
            failures.clear(folder)
    cpus = array.launcher.get("cpus_per_task")
    tasks = submit(executor, run_task, shards, [device] * len(shards),
                   [{j.run_dir: seconds.get(j.run_dir, 0.0) for j in s} for s in shards],
                   [os.getcwd()] * len(shards), [cpus] * len(shards))
    logs = array.folder.parent if "%" in array.folder.name else array.folder
    print(f"\n== {len(todo)} runs in {len(tasks)} array task(s) (submitit {array.cluster}, job "
          f"{tasks[0].job_id.split('_')[0]}); each task's log is under {logs}", flush=True)
    for line in lines:
        print(f"  {line}", flush=True)
    ended = wait(tasks, shards, array)
    return [o for task, part, state in zip(tasks, shards, ended, strict=True)
            for o in task_outcomes(task, part, state)]


def submit(executor, fn, *args: list) -> list:
    """`executor.map_array(fn, *args)`; sbatch's refusal becomes one line naming the launcher
    field to change (scheduler.explain_sbatch)."""
    from submitit.core.utils import FailedJobError

    try:
        return executor.map_array(fn, *args)
    except FailedJobError as err:
        raise ConfigError(scheduler.explain_sbatch(str(err))) from None


def task_outcomes(task, part: list[Job], state: scheduler.TaskState) -> list[workers.Outcome]:
    """What an ended task reports. A task that died (cancelled, out of memory or time, a lost
    node) reports nothing: each of its runs not done and without a reason of its own gets the
    task's state (exit code or signal), the error it raised if any, and its log as failed.txt."""
    why = ""
    if task.paths.result_pickle.exists():
        try:
            return task.result()
        except Exception as err:
            why = f": {last_line(err)}"
    for job in part:
        if not job.done and job.failure is None:
            failures.record(job.run_dir, f"its array task {task.job_id} ended "
                            f"{state.describe()} before the run finished{why}; the task's log: "
                            f"{task.paths.stdout}")
    return []


def ended_tasks(tasks: list, array: Array, gone_since: dict[int, float]
                ) -> dict[int, scheduler.TaskState]:
    """The tasks that have ended, with their states: on SLURM as the scheduler says now
    (`scheduler.job_states`; a task gone from its lists ends `gone_grace_s` after it was
    first missed, unless its result appears), on the local executor as submitit says."""
    if array.cluster != "slurm":
        return {i: scheduler.TaskState(task.state) for i, task in enumerate(tasks) if task.done()}
    states = scheduler.job_states([task.job_id for task in tasks])
    ended, now = {}, time.monotonic()
    for i, task in enumerate(tasks):
        state = states[task.job_id]
        if task.paths.result_pickle.exists() and (state.state == scheduler.GONE
                                                  or not state.ended):
            state = scheduler.TaskState("COMPLETED")  # the state lags (or forgot) the result
        elif state.state == scheduler.GONE \
                and now - gone_since.setdefault(i, now) < array.gone_grace_s:
            continue
        if state.ended:
            ended[i] = state
    return ended


def wait(tasks: list, shards: list[list[Job]], array: Array) -> list[scheduler.TaskState]:
    """Wait for every task, printing a line per run finished (from its folder) and per task
    ended; returns each task's final state. Ctrl-C cancels the tasks."""
    left = [j for part in shards for j in part]
    total, ended, gone_since = len(left), {}, {}
    fold = scheduler.FoldRepeats()
    logging.getLogger("submitit").addFilter(fold)
    try:
        while True:
            for i, state in ended_tasks(tasks, array, gone_since).items():
                if i not in ended:
                    ended[i] = state
                    print(f"== array task {i} ({tasks[i].job_id}) ended: {state.describe()}",
                          flush=True)
            for job in [j for j in left if j.done]:
                left.remove(job)
                print(f"[{total - len(left)}/{total}] {run_line(job)}", flush=True)
            if len(ended) == len(tasks):
                return [ended[i] for i in range(len(tasks))]
            time.sleep(array.poll_s)
    except KeyboardInterrupt:
        for task in tasks:
            with contextlib.suppress(Exception):
                task.cancel(check=False)
        print("interrupted: the array tasks are cancelled; start the sweep again to train what "
              "is left (the runs resume from their checkpoints)", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        logging.getLogger("submitit").removeFilter(fold)
        if fold.folded():
            print(f"note: submitit repeated {fold.folded()} log line(s), each shown once",
                  flush=True)


def run_line(job: Job) -> str:
    summary = runs.read_summary(job.run_dir)
    branches = len(job.branches)
    return (f"{workers.run_name(job.run_dir)}: {summary.get('status', 'completed')}, val_loss "
            f"{summary['val_loss']:.4f} nats/token"
            + (f", +{branches} branch(es)" if branches else ""))


def last_line(err: BaseException) -> str:
    """The line of a task's error that says what happened (submitit puts the worker's
    traceback, last line last, under a first line of its own)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if len(lines) > 1 and "trace" in lines[0] else lines[0]


def noise_args(run_dir: str | Path) -> list[str]:
    """The noise program's arguments for `run_dir`: the run's final checkpoint, and in the
    same process its peak-lr one where it kept one (`--checkpoint final --checkpoint
    peak_lr`: torch, the data and the model loaded once)."""
    from critbatch.training.branches import PEAK_CHECKPOINT

    peak = (Path(run_dir) / PEAK_CHECKPOINT).exists()
    return [str(run_dir), *(["--checkpoint", "final", "--checkpoint", "peak_lr"] if peak
                            else [])]


def noise_command(run_dir: str | Path) -> list[str]:
    """`python -m critbatch.noise` with `noise_args(run_dir)`."""
    return [sys.executable, "-m", "critbatch.noise", *noise_args(run_dir)]


def noise_task(run_dir: str, cwd: str) -> int:
    """`noise_command` on a node (as the sweep runs it on its own machine), its output in the
    run's noise.log; its exit code."""
    os.chdir(cwd)
    with open(Path(run_dir) / "noise.log", "w") as log:
        return subprocess.call(noise_command(run_dir), stdout=log, stderr=subprocess.STDOUT)


def measure_noise(array: Array, run_dirs: list[Path]) -> list[bool]:
    """The noise program on each of `run_dirs`, as one array on the launcher's resources;
    whether each succeeded."""
    if not run_dirs:
        return []
    tasks = submit(array.executor(), noise_task, [str(d) for d in run_dirs],
                   [os.getcwd()] * len(run_dirs))
    print(f"== noise: {len(tasks)} array task(s) of job {tasks[0].job_id}", flush=True)
    wait(tasks, [[] for _ in tasks], array)  # the scheduler's states: none waited on forever
    done = []
    for task in tasks:
        try:
            done.append(task.paths.result_pickle.exists() and task.result() == 0)
        except Exception:
            done.append(False)
    return done


# File systems whose flock() a node takes for itself alone, or which are not shared at all.
LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "f2fs", "zfs"}


def mount_of(folder: Path, mounts: str) -> tuple[str, str, set[str]]:
    """(mount point, file system type, options) of the mount holding `folder`, from the text
    of /proc/mounts (the longest mount point above it)."""
    path = str(folder)
    best = ("/", "", set())
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, parts[2], set(parts[3].split(",")))
    return best


def check_flock(folder: Path) -> None:
    """ConfigError when flock() fails on the file system of `folder` (or of the nearest folder
    above it that exists): the run folders' lock is an flock (`checkpoint.sole_writer`), and
    without it filelock would fall back to a marker file that a killed task leaves behind."""
    import fcntl

    where = folder
    while not where.exists():
        where = where.parent
    probe = where / f".critbatch-flock-test.{os.getpid()}"
    try:
        with open(probe, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as err:
        if err.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
            raise ConfigError(f"{where} does not support flock ({err.strerror}), which the run "
                              "folders' lock needs to keep two tasks out of one run; mount it "
                              "with flock (Lustre: -o flock) or start the sweep from a folder "
                              "that has it") from None
    finally:
        probe.unlink(missing_ok=True)


def lock_notes(folder: Path, mounts: str) -> list[str]:
    """Why the run folders' lock may not keep two array tasks on different nodes out of one
    run, from the mount holding `folder` in `mounts` (the text of /proc/mounts): a disk of
    this machine, NFS mounted `nolock` or `local_lock=flock|all`, Lustre without `flock`,
    BeeGFS (global locks are a client setting, off by default). Empty when none applies."""
    point, kind, options = mount_of(folder, mounts)
    local = sorted(o for o in options if o in ("nolock", "local_lock=flock", "local_lock=all"))
    if kind in LOCAL_FS:
        return [f"{folder} is on {point} ({kind}), a file system of this machine: array tasks "
                "on other nodes do not see it; start the sweep from a checkout on shared storage"]
    if kind.startswith("nfs") and local:
        return [f"{folder} is on NFS mounted {local[0]}: each node's flock is its own, so the "
                "run folders' lock cannot keep two tasks out of one run"]
    if kind == "lustre" and "flock" not in options:
        return [f"{folder} is on Lustre mounted without `flock`: the run folders' lock works "
                "across nodes only with -o flock"]
    if kind == "beegfs":
        return [f"{folder} is on BeeGFS: the run folders' lock works across nodes only with "
                "tuneUseGlobalFileLocks=true in the client config"]
    return []


def shared_folder_notes(folders: list[Path], cluster: str) -> list[str]:
    """`check_flock` on each folder, then, on SLURM, `lock_notes` from this machine's mounts
    (a folder that is a link counts where it leads)."""
    for folder in folders:
        check_flock(folder)
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:  # not Linux
        return []
    if cluster != "slurm":
        return []
    notes = []
    for folder in folders:
        while not folder.exists():
            folder = folder.parent
        notes += [n for n in lock_notes(folder.resolve(), mounts) if n not in notes]
    return notes
