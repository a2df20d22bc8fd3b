"""Where a plan trains: on this machine's worker pool (`pool.train_here`), as a SLURM array
of worker pools when the Hydra launcher is a submitit one (`submitit_array`,
`slurm.train_array`), or as one Hydra multirun per stage under any other launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from critbatch.orchestration import pool, slurm, workers
from critbatch.orchestration.experiments import SWEEPS_DIR
from critbatch.orchestration.planned import Job
from critbatch.orchestration.pool import job_threads
from critbatch.orchestration.stages import sweep_composer


def hydra_launcher(jobs: list[Job]) -> bool:
    """The user chose a Hydra launcher (`hydra/launcher=slurm`, ...): the runs train elsewhere,
    as a submitit job array (`launcher_config`) or as Hydra multiruns, not on this machine."""
    return any(o.startswith(("hydra/launcher=", "hydra.launcher.")) for j in jobs
               for o in j.extra)


def submitit_array(jobs: list[Job], tasks: int | None = None) -> slurm.Array | None:
    """The array the sweep shards its runs into when the chosen Hydra launcher is a submitit
    one (`hydra/launcher=slurm`, `submitit_slurm`, `submitit_local`), with its fields
    (hydra.launcher, resolved); None for no launcher or another one (joblib), whose stages go
    to Hydra as multiruns."""
    if not hydra_launcher(jobs):
        return None
    job = jobs[0]
    with sweep_composer() as compose:
        root = compose(job.stage, [f"scale={job.cfg.scale}", f"optim={job.optimizer}",
                                   *job.extra])
        launcher = OmegaConf.to_container(root.hydra.launcher, resolve=True)
    return slurm.Array(launcher, tasks) if slurm.is_submitit(launcher) else None


def train_jobs(jobs: list[Job], jobs_at_once: int, device: str, seconds: dict[Path, float],
               array: slurm.Array | None = None) -> list[workers.Outcome]:
    """Train the jobs not done on `jobs_at_once` workers here (pool.train_here), or as one
    `array` of worker pools (slurm.train_array), or, with another Hydra launcher, as one
    multirun per stage and optimizer."""
    todo = [j for j in jobs if not j.done]
    if not todo:
        return []
    if array is not None:
        return slurm.train_array(todo, array, device, seconds)
    if hydra_launcher(todo):
        grid = [j for j in todo if not j.search_round]
        for stage, optimizer in dict.fromkeys((j.stage, j.optimizer) for j in grid):
            part = next(j for j in grid if (j.stage, j.optimizer) == (stage, optimizer))
            report_code(launch_stage(stage, part.cfg.scale, optimizer, part.extra,
                                     jobs_at_once, device), stage, optimizer)
        for job in todo:  # an lr the search added: a multirun of that one job
            if job.search_round:
                own = [o for o in job.overrides if not o.startswith(("scale=", "optim="))]
                report_code(launch_stage(job.stage, job.cfg.scale, job.optimizer,
                                         own + [o for o in job.extra if o not in own],
                                         jobs_at_once, device), job.stage, job.optimizer)
        return []
    return pool.train_here(todo, jobs_at_once, device, seconds)


def report_code(code: int, stage: str, optimizer: str) -> None:
    """Say when a multirun exited with an error (its unfinished runs are listed at the end)."""
    if code:
        print(f"== the {stage} multirun (optim={optimizer}) exited with status {code}; "
              "the runs it did not finish are listed at the end", flush=True)


def launch_stage(stage: str, scale: str, optimizer: str, extra: list[str], jobs_at_once: int,
                 device: str) -> int:
    """Run one Hydra multirun in a child process (its launcher from `extra`); its jobs skip
    runs already complete and train missing branches."""
    cmd = [sys.executable, "-m", "critbatch.train", "--config-dir", str(SWEEPS_DIR),
           "--config-name", stage, f"scale={scale}", f"optim={optimizer}", *extra]
    env = dict(os.environ)
    if device == "cpu" and jobs_at_once > 1:  # split the cores between the jobs
        threads = job_threads(jobs_at_once)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    print(f"\n== {stage} (optim={optimizer}): python {' '.join(cmd[1:])}", flush=True)
    return subprocess.call(cmd, env=env)
